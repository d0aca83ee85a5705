//! Runs of one string column read from Parquet's page index: a page whose statistics say every
//! row holds the same value is one run of that many rows, known without reading the page.
//!
//! Segments are sorted by `(event, timestamp)` and written in pages of a few thousand rows, so
//! nearly every page of the `event` column holds one event name. For a scan that reads only
//! that column with no predicate (`SELECT event, count() FROM events GROUP BY event` over the
//! files), [`PageRunsExec`] yields the same `(value, run length)` rows as
//! [`super::run_count::RunCollapseExec`] over the decoded column would, but decodes only the
//! pages where the value changes; the rest is the page index, which the footer cache holds.
//!
//! A page counts as one run only when its index proves it: no nulls, and a minimum equal to
//! the maximum that is shorter than the index's truncation length (so neither was shortened).
//! Files without a page index are decoded whole.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringViewBuilder};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::CachedParquetFileReaderFactory;
use datafusion::datasource::physical_plan::{
    FileScanConfig, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{Column, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures_util::StreamExt;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use parquet::file::page_index::column_index::ColumnIndexMetaData;

use super::runs::{collapsed_schema, runs};

/// Runs emitted per output batch.
const RUNS_PER_BATCH: usize = 8 * 1024;
/// Parquet's default truncation length for page-index minima and maxima: a value at least
/// this long may have been shortened, so it never settles a page.
const INDEX_TRUNCATE_LENGTH: usize = 64;

/// `(value, run length)` rows of one string column over Parquet files (see the module docs).
#[derive(Debug)]
pub struct PageRunsExec {
    /// The files of each output partition.
    groups: Vec<Vec<PartitionedFile>>,
    object_store_url: datafusion::execution::object_store::ObjectStoreUrl,
    column: String,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PageRunsExec {
    /// The runs of `scan`'s only column, when `scan` is a Parquet scan of exactly that column
    /// of string type, with no limit and no predicate but dynamic filters (which only ever
    /// spare work: the plan above applies its own conditions).
    pub fn for_scan(scan: &Arc<dyn ExecutionPlan>) -> Option<PageRunsExec> {
        let source = scan.downcast_ref::<DataSourceExec>()?;
        let config = source.data_source().downcast_ref::<FileScanConfig>()?;
        let parquet = config.file_source().downcast_ref::<ParquetSource>()?;
        let output = scan.schema();
        let [field] = output.fields().as_ref() else {
            return None;
        };
        if config.limit.is_some() || !is_string(field.data_type()) {
            return None;
        }
        if let Some(predicate) = datafusion::datasource::physical_plan::FileSource::filter(parquet)
        {
            predicate.downcast_ref::<DynamicFilterPhysicalExpr>()?;
        }
        let projection = datafusion::datasource::physical_plan::FileSource::projection(parquet)?;
        let mut exprs = projection.iter();
        let (Some(only), None) = (exprs.next(), exprs.next()) else {
            return None;
        };
        let column = only.expr.downcast_ref::<Column>()?;
        let file_field = config.file_schema().fields().get(column.index())?;
        if column.name() != field.name() || file_field.name() != field.name() {
            return None;
        }
        let groups: Vec<Vec<PartitionedFile>> = config
            .file_groups
            .iter()
            .map(|g| g.files().to_vec())
            .collect();
        let schema = collapsed_schema(field.as_ref().clone());
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(groups.len().max(1)),
            scan.properties().emission_type,
            scan.properties().boundedness,
        );
        Some(PageRunsExec {
            groups,
            object_store_url: config.object_store_url.clone(),
            column: field.name().clone(),
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

fn is_string(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

impl DisplayAs for PageRunsExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: usize = self.groups.iter().map(Vec::len).sum();
        write!(f, "PageRunsExec: column={}, files={files}", self.column)
    }
}

impl ExecutionPlan for PageRunsExec {
    fn name(&self) -> &str {
        "PageRunsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            datafusion::common::internal_err!("PageRunsExec takes no children")
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let files = self.groups.get(partition).cloned().unwrap_or_default();
        let store = context.runtime_env().object_store(&self.object_store_url)?;
        let cache = context
            .runtime_env()
            .cache_manager
            .get_file_metadata_cache();
        let factory = CachedParquetFileReaderFactory::new(store, cache);
        let metrics = self.metrics.clone();
        let column = self.column.clone();
        let schema = Arc::clone(&self.schema);
        let mut builder = RecordBatchReceiverStreamBuilder::new(Arc::clone(&schema), 2);
        let tx = builder.tx();
        builder.spawn(async move {
            let mut sink = RunSink::new(schema, tx);
            for file in files {
                if sink.tx.is_closed() {
                    // The consumer stopped reading (a limit was met, or the query ended).
                    break;
                }
                let reader = factory.create_reader(partition, file.clone(), None, &metrics)?;
                file_runs(reader, &file, &column, &mut sink).await?;
            }
            sink.flush().await
        });
        Ok(builder.build())
    }
}

/// Runs gathered for the next output batch; neighbouring runs of one value are merged.
struct RunSink {
    schema: SchemaRef,
    tx: tokio::sync::mpsc::Sender<DfResult<RecordBatch>>,
    values: Vec<Option<String>>,
    lengths: Vec<i64>,
}

impl RunSink {
    fn new(schema: SchemaRef, tx: tokio::sync::mpsc::Sender<DfResult<RecordBatch>>) -> RunSink {
        RunSink {
            schema,
            tx,
            values: Vec::new(),
            lengths: Vec::new(),
        }
    }

    async fn push(&mut self, value: Option<&str>, length: i64) -> DfResult<()> {
        if let (Some(last), Some(total)) = (self.values.last(), self.lengths.last_mut()) {
            if last.as_deref() == value {
                *total += length;
                return Ok(());
            }
        }
        if self.values.len() >= RUNS_PER_BATCH {
            self.flush().await?;
        }
        self.values.push(value.map(str::to_owned));
        self.lengths.push(length);
        Ok(())
    }

    async fn flush(&mut self) -> DfResult<()> {
        if self.values.is_empty() {
            return Ok(());
        }
        let mut values = StringViewBuilder::with_capacity(self.values.len());
        for v in self.values.drain(..) {
            values.append_option(v);
        }
        let values: ArrayRef = Arc::new(values.finish());
        let values = arrow::compute::cast(&values, self.schema.field(0).data_type())?;
        let lengths = Int64Array::from(std::mem::take(&mut self.lengths));
        let batch =
            RecordBatch::try_new(Arc::clone(&self.schema), vec![values, Arc::new(lengths)])?;
        // A closed receiver means the consumer stopped reading; the caller sees it closed.
        let _ = self.tx.send(Ok(batch)).await;
        Ok(())
    }
}

/// Pushes the runs of `column` in `file` (only the row groups its range holds) into `sink`.
async fn file_runs(
    mut reader: Box<dyn AsyncFileReader>,
    file: &PartitionedFile,
    column: &str,
    sink: &mut RunSink,
) -> DfResult<()> {
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let loaded = ArrowReaderMetadata::load_async(&mut reader, options.clone()).await?;
    let metadata = Arc::clone(loaded.metadata());
    let descr = metadata.file_metadata().schema_descr_ptr();
    let Some(leaf) = (0..descr.num_columns()).find(|&i| {
        let leaf = descr.column(i);
        let path = leaf.path().parts();
        path.len() == 1 && path[0] == column
    }) else {
        // A file without the column reads it as nulls, as the scan would.
        for rg in in_range(&metadata, file) {
            sink.push(None, metadata.row_group(rg).num_rows()).await?;
        }
        return Ok(());
    };
    let mut decode_groups = Vec::new();
    let mut selectors = Vec::new();
    for rg in in_range(&metadata, file) {
        let pages = page_plan(&metadata, rg, leaf);
        // A row group the index settles whole is not read at all; the others are read only
        // in the pages it does not settle.
        let decode = pages.iter().any(|p| p.value.is_none());
        for page in pages {
            let rows = page.rows.len();
            match page.value {
                Some(value) => {
                    sink.push(Some(value), rows as i64).await?;
                    if decode {
                        selectors.push(RowSelector::skip(rows));
                    }
                }
                None => selectors.push(RowSelector::select(rows)),
            }
        }
        if decode {
            decode_groups.push(rg);
        }
    }
    if decode_groups.is_empty() {
        return Ok(());
    }
    // The pages left are read as dictionary keys where the file is dictionary-encoded (Parquet
    // writes a string column so while its dictionary stays small): runs of keys, and one value
    // looked up per run, instead of a string built per row.
    let schema = keys_schema(loaded.schema(), column);
    let loaded = ArrowReaderMetadata::try_new(metadata, options.with_schema(schema))?;
    let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, loaded)
        .with_projection(ProjectionMask::leaves(&descr, [leaf]))
        .with_row_groups(decode_groups)
        .with_row_selection(RowSelection::from(selectors))
        .build()?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let values = batch.column(0);
        let strings = match values.as_dictionary_opt::<Int32Type>() {
            Some(dictionary) => {
                let keys: ArrayRef = Arc::new(dictionary.keys().clone());
                let words = arrow::compute::cast(dictionary.values(), &DataType::Utf8View)?;
                let words = words.as_string_view();
                for run in runs(&keys)? {
                    let key = dictionary.keys();
                    let value = (!key.is_null(run.start))
                        .then(|| words.value(key.value(run.start).max(0) as usize));
                    sink.push(value, run.len() as i64).await?;
                }
                continue;
            }
            None => arrow::compute::cast(values, &DataType::Utf8View)?,
        };
        let views = strings.as_string_view();
        for run in runs(&strings)? {
            let value = (!views.is_null(run.start)).then(|| views.value(run.start));
            sink.push(value, run.len() as i64).await?;
        }
    }
    Ok(())
}

/// `schema` with `column` read as dictionary keys over its strings.
fn keys_schema(schema: &SchemaRef, column: &str) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let field = f.as_ref().clone();
            if f.name() == column {
                let keys =
                    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
                field.with_data_type(keys)
            } else {
                field
            }
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Row groups of the file a partitioned file covers: those whose first page starts in its
/// byte range, as DataFusion's Parquet scan assigns them.
fn in_range(metadata: &ParquetMetaData, file: &PartitionedFile) -> Vec<usize> {
    (0..metadata.num_row_groups())
        .filter(|&rg| {
            let Some(range) = &file.range else {
                return true;
            };
            let first = metadata.row_group(rg).column(0);
            let offset = first
                .dictionary_page_offset()
                .unwrap_or_else(|| first.data_page_offset());
            range.contains(offset)
        })
        .collect()
}

/// One page of a column chunk: its rows within the row group and, when the page index proves
/// every row holds it, its single value.
struct Page<'a> {
    rows: Range<usize>,
    value: Option<&'a str>,
}

/// The pages of column `leaf` in row group `rg`; one page of every row with no value known
/// when the file has no page index for it.
fn page_plan(metadata: &ParquetMetaData, rg: usize, leaf: usize) -> Vec<Page<'_>> {
    let total = metadata.row_group(rg).num_rows().max(0) as usize;
    let whole = || {
        vec![Page {
            rows: 0..total,
            value: None,
        }]
    };
    let (Some(offsets), Some(indexes)) = (metadata.offset_index(), metadata.column_index()) else {
        return whole();
    };
    let (Some(offsets), Some(index)) = (
        offsets.get(rg).and_then(|c| c.get(leaf)),
        indexes.get(rg).and_then(|c| c.get(leaf)),
    ) else {
        return whole();
    };
    let ColumnIndexMetaData::BYTE_ARRAY(index) = index else {
        return whole();
    };
    let locations = offsets.page_locations();
    if locations.is_empty() || index.num_pages() as usize != locations.len() {
        return whole();
    }
    locations
        .iter()
        .enumerate()
        .map(|(i, location)| {
            let start = location.first_row_index.max(0) as usize;
            let end = locations
                .get(i + 1)
                .map_or(total, |next| next.first_row_index.max(0) as usize);
            let value = match (index.null_count(i), index.min_value(i), index.max_value(i)) {
                (Some(0), Some(min), Some(max))
                    if min == max && min.len() < INDEX_TRUNCATE_LENGTH =>
                {
                    std::str::from_utf8(min).ok()
                }
                _ => None,
            };
            Page {
                rows: start..end.max(start),
                value,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
