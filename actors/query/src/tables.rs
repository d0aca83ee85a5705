//! The tables a query sees, all scoped to one project: `events` (Parquet segments plus the
//! not-yet-flushed tail), `persons`, `person_distinct_ids` and `groups` (from the person store).
//!
//! Isolation is structural: each query gets a fresh session whose only tables are these, built
//! from the project's own directory and rows. No table, function or URL in the session can
//! reach another project's files.

use std::fmt;
use std::sync::Arc;

use arrow::array::TimestampMicrosecondArray;
use arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{
    BinaryExpr, Expr, Operator, TableProviderFilterPushDown, TableType,
};
use datafusion::physical_expr::expressions::{BinaryExpr as PhysicalBinary, Column};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::FilterExecBuilder;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;

use super::erased::KeepUnerased;
use super::time_bounds::{self, time_bounds, TimeBound};
use corvid_events::StoredEvent;
use corvid_persons::{ErasedSet, Group, Person};

/// The `events` table of one project at one instant.
pub struct EventsTable {
    /// Committed segments: their day, and the URL the segment store knows them by.
    files: Vec<(NaiveDate, String)>,
    tail: Arc<MemTable>,
    schema: SchemaRef,
    /// Erasures whose events segment reads must leave out (the tail comes without them).
    erased: Option<Arc<ErasedSet>>,
}

impl fmt::Debug for EventsTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventsTable")
            .field("files", &self.files.len())
            .finish()
    }
}

impl EventsTable {
    /// `materialized`: property keys every file has as a column (the tail computes them);
    /// `erased`: events the files' rows are filtered by (`None` or empty: none).
    pub fn new(
        files: Vec<(NaiveDate, String)>,
        tail: &[StoredEvent],
        materialized: &[String],
        erased: Option<Arc<ErasedSet>>,
    ) -> DfResult<EventsTable> {
        let rows: Vec<&StoredEvent> = tail.iter().collect();
        let schema = string_views(&corvid_events::segment_schema_with(materialized));
        let batch = corvid_events::segment_batch(&rows, materialized)?;
        let columns = batch
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        let tail = Arc::new(MemTable::try_new(Arc::clone(&schema), vec![vec![batch]])?);
        Ok(EventsTable {
            files,
            tail,
            schema,
            erased: erased.filter(|e| !e.is_empty()),
        })
    }
}

/// The columns that decide whether an erasure covers a row.
const ERASURE_COLUMNS: [&str; 3] = ["person_id", "distinct_id", "created_at"];

/// `schema` with string columns as `Utf8View`: Parquet strings decode into views without
/// copying, and DataFusion groups and compares views fastest.
fn string_views(schema: &SchemaRef) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Utf8 => f.as_ref().clone().with_data_type(DataType::Utf8View),
                _ => f.as_ref().clone(),
            })
            .collect::<Vec<_>>(),
    ))
}

/// Inclusive day bounds implied by `timestamp` comparisons among the pushed-down filters.
fn day_bounds(filters: &[Expr]) -> (Option<NaiveDate>, Option<NaiveDate>) {
    let mut from: Option<NaiveDate> = None;
    let mut to: Option<NaiveDate> = None;
    let mut lower = |d: NaiveDate| from = Some(from.map_or(d, |f| f.max(d)));
    let mut upper = |d: NaiveDate| to = Some(to.map_or(d, |t| t.min(d)));
    for f in filters {
        match f {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (col, lit, op) = match (timestamp_column(left), literal_day(right)) {
                    (true, Some(d)) => (true, d, *op),
                    _ => match (literal_day(left), timestamp_column(right)) {
                        (Some(d), true) => (true, d, op.swap().unwrap_or(*op)),
                        _ => (false, NaiveDate::MIN, *op),
                    },
                };
                if !col {
                    continue;
                }
                match op {
                    Operator::Gt | Operator::GtEq => lower(lit),
                    Operator::Lt | Operator::LtEq => upper(lit),
                    Operator::Eq => {
                        lower(lit);
                        upper(lit);
                    }
                    _ => {}
                }
            }
            Expr::Between(b) if !b.negated && timestamp_column(&b.expr) => {
                if let Some(d) = literal_day(&b.low) {
                    lower(d);
                }
                if let Some(d) = literal_day(&b.high) {
                    upper(d);
                }
            }
            _ => {}
        }
    }
    (from, to)
}

fn timestamp_column(e: &Expr) -> bool {
    matches!(e, Expr::Column(c) if c.name == "timestamp")
}

fn literal_day(e: &Expr) -> Option<NaiveDate> {
    let Expr::Literal(value, _) = e else {
        return None;
    };
    let micros = match value {
        ScalarValue::TimestampMicrosecond(Some(v), _) => *v,
        ScalarValue::TimestampNanosecond(Some(v), _) => v.div_euclid(1_000),
        ScalarValue::TimestampMillisecond(Some(v), _) => v.saturating_mul(1_000),
        ScalarValue::TimestampSecond(Some(v), _) => v.saturating_mul(1_000_000),
        _ => return None,
    };
    DateTime::<Utc>::from_timestamp_micros(micros).map(|t| t.date_naive())
}

#[async_trait]
impl TableProvider for EventsTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match time_bounds(f) {
                Some(_) => TableProviderFilterPushDown::Exact,
                None => TableProviderFilterPushDown::Inexact,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let (from, to) = day_bounds(filters);
        let bounds: Vec<TimeBound> = filters.iter().filter_map(time_bounds).flatten().collect();
        let days = self
            .files
            .iter()
            .filter(|(day, _)| from.is_none_or(|f| *day >= f) && to.is_none_or(|t| *day <= t));
        // Days inside every bound are read as they are; the others are filtered by them.
        let (whole, cut): (Vec<_>, Vec<_>) =
            days.partition(|(day, _)| bounds.iter().all(|b| b.holds_all_day(*day)));
        let tail_bounds = (!bounds.is_empty()).then_some(bounds.as_slice());
        let tail = Scan {
            projection,
            bounds: tail_bounds,
            erased: None,
        };
        let read = tail.prepare(&self.schema, limit)?;
        let plan = self
            .tail
            .scan(state, read.columns.as_ref(), filters, read.limit)
            .await?;
        let mut plans = vec![read.finish(plan)?];
        for (files, bounds) in [(whole, None), (cut, Some(bounds.as_slice()))] {
            if files.is_empty() {
                continue;
            }
            let urls = files
                .iter()
                .map(|(_, url)| ListingTableUrl::parse(url))
                .collect::<DfResult<Vec<_>>>()?;
            let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
                .with_file_extension(".parquet");
            let config = ListingTableConfig::new_with_multi_paths(urls)
                .with_listing_options(options)
                .with_schema(Arc::clone(&self.schema));
            let listing = ListingTable::try_new(config)?;
            let scan = Scan {
                projection,
                bounds,
                erased: self.erased.as_ref(),
            };
            let read = scan.prepare(&self.schema, limit)?;
            let plan = listing
                .scan(state, read.columns.as_ref(), filters, read.limit)
                .await?;
            plans.push(read.finish(plan)?);
        }
        UnionExec::try_new(plans)
    }
}

/// One input of the `events` scan and the filters the table applies to it itself: time
/// bounds (for days they cut through) and erasures (for segment rows).
struct Scan<'a> {
    projection: Option<&'a Vec<usize>>,
    bounds: Option<&'a [TimeBound]>,
    erased: Option<&'a Arc<ErasedSet>>,
}

impl Scan<'_> {
    /// What to read for the statement's columns, and the filter to put over it. A filtered
    /// read scans the columns its filter needs as well, leaves them out after, and takes no
    /// limit (a limit applies after the filter).
    fn prepare(&self, schema: &SchemaRef, limit: Option<usize>) -> DfResult<Read> {
        let unfiltered = || Read {
            columns: self.projection.cloned(),
            limit,
            filter: None,
        };
        if self.bounds.is_none() && self.erased.is_none() {
            return Ok(unfiltered());
        }
        let mut scanned: Vec<usize> = self
            .projection
            .cloned()
            .unwrap_or_else(|| (0..schema.fields().len()).collect());
        let wanted = scanned.len();
        let mut position = |name: &str| -> DfResult<(usize, usize)> {
            let index = schema.index_of(name)?;
            Ok(match scanned.iter().position(|i| *i == index) {
                Some(at) => (index, at),
                None => {
                    scanned.push(index);
                    (index, scanned.len() - 1)
                }
            })
        };
        let mut predicates: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
        if let Some(bounds) = self.bounds {
            let (index, at) = position("timestamp")?;
            predicates.extend(time_bounds::predicate(
                bounds,
                "timestamp",
                at,
                schema.field(index).data_type(),
            ));
        }
        if let Some(erased) = self.erased {
            let columns = ERASURE_COLUMNS
                .iter()
                .map(|name| {
                    let (_, at) = position(name)?;
                    Ok(Arc::new(Column::new(name, at)) as Arc<dyn PhysicalExpr>)
                })
                .collect::<DfResult<Vec<_>>>()?;
            predicates.push(Arc::new(KeepUnerased::new(Arc::clone(erased), columns)));
        }
        let Some(predicate) = predicates
            .into_iter()
            .reduce(|a, b| Arc::new(PhysicalBinary::new(a, Operator::And, b)))
        else {
            return Ok(unfiltered());
        };
        Ok(Read {
            columns: Some(scanned),
            limit: None,
            filter: Some((predicate, wanted)),
        })
    }
}

/// A read of one input of the `events` scan: its columns and limit, and the filter (with the
/// number of leading columns it answers) to put over it.
struct Read {
    columns: Option<Vec<usize>>,
    limit: Option<usize>,
    filter: Option<(Arc<dyn PhysicalExpr>, usize)>,
}

impl Read {
    fn finish(self, plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let Some((predicate, wanted)) = self.filter else {
            return Ok(plan);
        };
        Ok(Arc::new(
            FilterExecBuilder::new(predicate, plan)
                .apply_projection(Some((0..wanted).collect()))?
                .build()?,
        ))
    }
}

fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn micros(values: impl Iterator<Item = DateTime<Utc>>) -> ArrayRef {
    Arc::new(
        TimestampMicrosecondArray::from_iter_values(values.map(|t| t.timestamp_micros()))
            .with_timezone("UTC"),
    )
}

fn strings<'a>(values: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(values))
}

fn table(schema: Schema, columns: Vec<ArrayRef>) -> DfResult<Arc<dyn TableProvider>> {
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// `persons(id, created_at, properties, is_identified)`.
pub fn persons_table(persons: &[Person]) -> DfResult<Arc<dyn TableProvider>> {
    let props: Vec<String> = persons
        .iter()
        .map(|p| serde_json::Value::Object(p.properties.clone()).to_string())
        .collect();
    let ids: Vec<String> = persons.iter().map(|p| p.id.to_string()).collect();
    table(
        Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("created_at", timestamp_type(), false),
            Field::new("properties", DataType::Utf8, false),
            Field::new("is_identified", DataType::Boolean, false),
        ]),
        vec![
            strings(ids.iter().map(String::as_str)),
            micros(persons.iter().map(|p| p.created_at)),
            strings(props.iter().map(String::as_str)),
            Arc::new(BooleanArray::from_iter(
                persons.iter().map(|p| Some(p.is_identified)),
            )),
        ],
    )
}

/// `person_distinct_ids(distinct_id, person_id)`.
pub fn person_distinct_ids_table(persons: &[Person]) -> DfResult<Arc<dyn TableProvider>> {
    let pairs: Vec<(&str, String)> = persons
        .iter()
        .flat_map(|p| {
            let id = p.id.to_string();
            p.distinct_ids.iter().map(move |d| (d.as_str(), id.clone()))
        })
        .collect();
    table(
        Schema::new(vec![
            Field::new("distinct_id", DataType::Utf8, false),
            Field::new("person_id", DataType::Utf8, false),
        ]),
        vec![
            strings(pairs.iter().map(|(d, _)| *d)),
            strings(pairs.iter().map(|(_, p)| p.as_str())),
        ],
    )
}

/// `groups(group_type_index, group_key, properties, created_at)`.
pub fn groups_table(groups: &[Group]) -> DfResult<Arc<dyn TableProvider>> {
    let props: Vec<String> = groups
        .iter()
        .map(|g| serde_json::Value::Object(g.properties.clone()).to_string())
        .collect();
    table(
        Schema::new(vec![
            Field::new("group_type_index", DataType::Int64, false),
            Field::new("group_key", DataType::Utf8, false),
            Field::new("properties", DataType::Utf8, false),
            Field::new("created_at", timestamp_type(), false),
        ]),
        vec![
            Arc::new(Int64Array::from_iter_values(
                groups.iter().map(|g| i64::from(g.group_type_index)),
            )),
            strings(groups.iter().map(|g| g.group_key.as_str())),
            strings(props.iter().map(String::as_str)),
            micros(groups.iter().map(|g| g.created_at)),
        ],
    )
}
