//! Counting rows per group by runs: a physical optimizer rule for `count()` grouped by one
//! string column whose input arrives in runs of equal values.
//!
//! Segments are sorted by `(event, timestamp)`, so `SELECT event, count() … GROUP BY event`
//! reads long runs of one event name. DataFusion's hash aggregation still hashes and looks up
//! every row (most of that query's CPU; it has no grouping path that uses the column's
//! dictionary or sort order). [`RunCountRule`] rewrites such an aggregate to read through
//! [`RunCollapseExec`], which turns each run into one row `(value, run length)`, and sums run
//! lengths with [`count_runs`] in place of `count`. The aggregate then sees a few thousand
//! rows instead of millions; its output schema and results are unchanged.
//!
//! When the input does not come in runs (another column, or data that is not sorted), the
//! collapse notices after a few batches and passes rows through with a run length of one.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures_util::StreamExt;

use super::page_runs::PageRunsExec;
use super::runs::{collapsed_schema, runs, RUN_LENGTH};

/// Batches inspected before the collapse decides runs are not worth looking for.
const PROBE_BATCHES: usize = 4;

/// Rewrites `count()` grouped by one string column to count runs (see the module docs).
#[derive(Debug, Default)]
pub struct RunCountRule;

impl PhysicalOptimizerRule for RunCountRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(aggregate) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            Ok(match rewrite(aggregate)? {
                Some(rewritten) => Transformed::yes(rewritten),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "corvid_run_count"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The rewritten aggregate, or `None` when `aggregate` is not a plain `count()` by one string
/// column (the only shape whose results a run length fully determines).
fn rewrite(aggregate: &AggregateExec) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    let mode = *aggregate.mode();
    if !matches!(
        mode,
        AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
    ) || aggregate.limit_options().is_some()
        || aggregate.filter_expr().iter().any(Option::is_some)
    {
        return Ok(None);
    }
    let group_by = aggregate.group_expr();
    let [(expr, alias)] = group_by.expr() else {
        return Ok(None);
    };
    if !group_by.is_single() {
        return Ok(None);
    }
    let Some(column) = expr.downcast_ref::<Column>() else {
        return Ok(None);
    };
    let input = aggregate.input();
    let input_schema = input.schema();
    let Some(field) = input_schema.fields().get(column.index()) else {
        return Ok(None);
    };
    if !is_string(field.data_type()) || aggregate.aggr_expr().is_empty() {
        return Ok(None);
    }
    let counts_rows = |e: &datafusion::physical_expr::aggregate::AggregateFunctionExpr| {
        e.fun().name() == "count"
            && !e.is_distinct()
            && e.order_bys().is_empty()
            && e.expressions().iter().all(|arg| {
                arg.downcast_ref::<Literal>()
                    .is_some_and(|l| !l.value().is_null())
            })
    };
    if !aggregate.aggr_expr().iter().all(|e| counts_rows(e)) {
        return Ok(None);
    }

    let collapse = collapse(input, column.index())?;
    let collapsed_schema = collapse.schema();
    let run_length: Arc<dyn PhysicalExpr> = Arc::new(Column::new(RUN_LENGTH, 1));
    let udaf = Arc::new(count_runs());
    let aggr_expr = aggregate
        .aggr_expr()
        .iter()
        .map(|e| {
            let mut builder =
                AggregateExprBuilder::new(Arc::clone(&udaf), vec![Arc::clone(&run_length)])
                    .schema(Arc::clone(&collapsed_schema))
                    .alias(e.name());
            if let Some(display) = e.human_display() {
                builder = builder.human_display(display);
            }
            builder.build().map(Arc::new)
        })
        .collect::<DfResult<Vec<_>>>()?;
    let group_by = PhysicalGroupBy::new_single(vec![(
        Arc::new(Column::new(field.name(), 0)) as Arc<dyn PhysicalExpr>,
        alias.clone(),
    )]);
    let filters = vec![None; aggr_expr.len()];
    let rewritten = AggregateExec::try_new(
        mode,
        group_by,
        aggr_expr,
        filters,
        collapse,
        collapsed_schema,
    )?;
    // Only a rewrite that leaves the aggregate's output exactly as it was is kept.
    if rewritten.schema() != aggregate.schema() {
        return Ok(None);
    }
    Ok(Some(Arc::new(rewritten)))
}

/// `input` as runs of column `key`: a union collapses each of its inputs, and a Parquet scan
/// of that column alone reads its runs from the page index ([`PageRunsExec`]).
fn collapse(input: &Arc<dyn ExecutionPlan>, key: usize) -> DfResult<Arc<dyn ExecutionPlan>> {
    if let Some(union) = input.downcast_ref::<UnionExec>() {
        let inputs = union
            .inputs()
            .iter()
            .map(|child| collapse(child, key))
            .collect::<DfResult<Vec<_>>>()?;
        return UnionExec::try_new(inputs);
    }
    if key == 0 {
        if let Some(pages) = PageRunsExec::for_scan(input) {
            return Ok(Arc::new(pages));
        }
    }
    Ok(Arc::new(RunCollapseExec::new(Arc::clone(input), key)))
}

fn is_string(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, values) => is_string(values),
        _ => false,
    }
}

/// Turns each run of equal values in column `key` into one row `(value, run length)`; other
/// columns are dropped. Runs are found within a batch (a run split across batches becomes two
/// rows, which the aggregate adds up).
#[derive(Debug)]
pub struct RunCollapseExec {
    input: Arc<dyn ExecutionPlan>,
    key: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl RunCollapseExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, key: usize) -> RunCollapseExec {
        let schema = collapsed_schema(input.schema().field(key).clone());
        let input_properties = input.properties();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            input_properties.output_partitioning().clone(),
            input_properties.emission_type,
            input_properties.boundedness,
        );
        RunCollapseExec {
            input,
            key,
            schema,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for RunCollapseExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunCollapseExec: key={}", self.schema.field(0).name())
    }
}

impl ExecutionPlan for RunCollapseExec {
    fn name(&self) -> &str {
        "RunCollapseExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(child) if children.is_empty() => {
                Ok(Arc::new(RunCollapseExec::new(child, self.key)))
            }
            _ => datafusion::common::internal_err!("RunCollapseExec takes one child"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = Arc::clone(&self.schema);
        let key = self.key;
        let mut collapser = Collapser::default();
        let out_schema = Arc::clone(&schema);
        let stream = input.map(move |batch| {
            let batch = batch?;
            let (values, lengths) = collapser.collapse(batch.column(key))?;
            Ok(RecordBatch::try_new(
                Arc::clone(&out_schema),
                vec![values, Arc::new(lengths)],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Per-stream state: whether looking for runs still pays.
#[derive(Default)]
struct Collapser {
    probed: usize,
    productive: usize,
}

impl Collapser {
    fn collapse(&mut self, values: &ArrayRef) -> DfResult<(ArrayRef, Int64Array)> {
        let rows = values.len();
        let gave_up = self.probed >= PROBE_BATCHES && self.productive * 2 < self.probed;
        if rows == 0 || gave_up {
            return Ok((Arc::clone(values), Int64Array::from(vec![1i64; rows])));
        }
        let ranges = runs(values)?;
        self.probed += 1;
        // Worth it when runs average at least four rows.
        if ranges.len() * 4 > rows {
            return Ok((Arc::clone(values), Int64Array::from(vec![1i64; rows])));
        }
        self.productive += 1;
        let starts = UInt32Array::from_iter_values(ranges.iter().map(|r| r.start as u32));
        let lengths = Int64Array::from_iter_values(ranges.iter().map(|r| r.len() as i64));
        Ok((take(values.as_ref(), &starts, None)?, lengths))
    }
}

/// `count` over collapsed runs: the sum of run lengths, with `count`'s state and result types
/// (Int64, never null) so the rest of the plan is unchanged.
pub fn count_runs() -> AggregateUDF {
    AggregateUDF::from(CountRuns {
        signature: Signature::exact(vec![DataType::Int64], Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CountRuns {
    signature: Signature,
}

impl AggregateUDFImpl for CountRuns {
    fn name(&self) -> &str {
        "count"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int64)
    }

    fn is_nullable(&self) -> bool {
        false
    }

    fn default_value(&self, _: &DataType) -> DfResult<ScalarValue> {
        Ok(ScalarValue::Int64(Some(0)))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format_state_name(args.name, "count"),
            DataType::Int64,
            false,
        ))])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(RunTotal(0)))
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        _: AccumulatorArgs,
    ) -> DfResult<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(RunTotals::default()))
    }
}

fn lengths(values: &[ArrayRef]) -> DfResult<&Int64Array> {
    match values.first() {
        Some(array) => Ok(array.as_primitive::<Int64Type>()),
        None => datafusion::common::internal_err!("count over runs takes one argument"),
    }
}

/// The ungrouped accumulator.
#[derive(Debug)]
struct RunTotal(i64);

impl Accumulator for RunTotal {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        self.0 += lengths(values)?.values().iter().sum::<i64>();
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        self.update_batch(states)
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Int64(Some(self.0))])
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(ScalarValue::Int64(Some(self.0)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

/// The grouped accumulator: one running total per group.
#[derive(Debug, Default)]
struct RunTotals {
    totals: Vec<i64>,
}

impl GroupsAccumulator for RunTotals {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&arrow::array::BooleanArray>,
        total_groups: usize,
    ) -> DfResult<()> {
        self.totals.resize(total_groups, 0);
        let lengths = lengths(values)?;
        for (row, (&group, &length)) in groups.iter().zip(lengths.values()).enumerate() {
            if filter.is_none_or(|f| f.is_valid(row) && f.value(row)) {
                self.totals[group] += length;
            }
        }
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        total_groups: usize,
    ) -> DfResult<()> {
        // Partial states are run totals too: merging adds them like run lengths.
        self.update_batch(values, groups, None, total_groups)
    }

    /// A row's state is its run length (zero when the filter drops it).
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        filter: Option<&arrow::array::BooleanArray>,
    ) -> DfResult<Vec<ArrayRef>> {
        let lengths = lengths(values)?;
        let state = match filter {
            None => lengths.clone(),
            Some(f) => Int64Array::from_iter_values(lengths.values().iter().enumerate().map(
                |(row, &l)| {
                    if f.is_valid(row) && f.value(row) {
                        l
                    } else {
                        0
                    }
                },
            )),
        };
        Ok(vec![Arc::new(state)])
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> DfResult<ArrayRef> {
        Ok(Arc::new(Int64Array::from(
            emit_to.take_needed(&mut self.totals),
        )))
    }

    fn state(&mut self, emit_to: EmitTo) -> DfResult<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(emit_to)?])
    }

    fn size(&self) -> usize {
        self.totals.capacity() * std::mem::size_of::<i64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use arrow::datatypes::Schema;
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// Sorted runs, a null run, a run split across batches, and an unsorted batch.
    fn batches(schema: &SchemaRef) -> Vec<RecordBatch> {
        let batch = |keys: Vec<Option<&str>>| {
            let n = keys.len() as i64;
            RecordBatch::try_new(
                Arc::clone(schema),
                vec![
                    Arc::new(StringArray::from(keys)),
                    Arc::new(Int64Array::from_iter_values(0..n)),
                ],
            )
            .expect("batch")
        };
        let run = |k: Option<&'static str>, n: usize| std::iter::repeat_n(k, n);
        vec![
            batch(
                run(Some("a"), 50)
                    .chain(run(None, 20))
                    .chain(run(Some("b"), 30))
                    .collect(),
            ),
            batch(run(Some("b"), 40).chain(run(Some("c"), 60)).collect()),
            batch(
                (0..100)
                    .map(|i| Some(["a", "b", "c", "d"][i % 4]))
                    .collect(),
            ),
        ]
    }

    async fn run(sql: &str, with_rule: bool) -> (String, String) {
        run_on(sql, with_rule, 2).await
    }

    async fn run_on(sql: &str, with_rule: bool, partitions: usize) -> (String, String) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("event", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        // As many table partitions as target partitions (one: a single-phase aggregate).
        let all = batches(&schema);
        let layout = if partitions == 1 {
            vec![all]
        } else {
            vec![all[..2].to_vec(), all[2..].to_vec()]
        };
        let table = MemTable::try_new(Arc::clone(&schema), layout).expect("table");
        let mut builder = SessionStateBuilder::new()
            .with_config(SessionConfig::new().with_target_partitions(partitions))
            .with_default_features();
        if with_rule {
            builder = builder.with_physical_optimizer_rule(Arc::new(RunCountRule));
        }
        let ctx = SessionContext::new_with_state(builder.build());
        ctx.register_table("events", Arc::new(table))
            .expect("register");
        let df = ctx.sql(sql).await.expect("plan");
        let plan = df.clone().create_physical_plan().await.expect("physical");
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        let rows = pretty_format_batches(&df.collect().await.expect("run"))
            .expect("format")
            .to_string();
        (rows, shown)
    }

    #[tokio::test]
    async fn counts_by_runs_give_the_hash_aggregates_answer() {
        let sql = "SELECT event, count(*) AS c, count(1) FROM events GROUP BY event ORDER BY event";
        let (expected, plain) = run(sql, false).await;
        let (actual, rewritten) = run(sql, true).await;
        assert!(!plain.contains("RunCollapseExec"));
        assert!(rewritten.contains("RunCollapseExec"), "{rewritten}");
        assert_eq!(actual, expected);
        // a = 50 + 25, b = 30 + 40 + 25, c = 60 + 25, d = 25, null = 20.
        assert!(expected.contains("| a     | 75 |"), "{expected}");
        assert!(expected.contains("| b     | 95 |"), "{expected}");
        assert!(expected.contains("|       | 20 |"), "{expected}");
    }

    /// With one partition DataFusion plans a single-phase aggregate, whose output is the final
    /// count rather than a partial state: the rewrite must give the same answer there too.
    #[tokio::test]
    async fn single_phase_aggregates_count_runs_too() {
        let sql = "SELECT event, count(*) FROM events GROUP BY event ORDER BY event";
        let (expected, _) = run_on(sql, false, 1).await;
        let (actual, plan) = run_on(sql, true, 1).await;
        assert!(plan.contains("RunCollapseExec"), "{plan}");
        assert!(plan.contains("mode=Single"), "{plan}");
        assert_eq!(actual, expected);
    }

    #[tokio::test]
    async fn other_aggregates_and_filters_keep_the_hash_aggregate() {
        for sql in [
            "SELECT event, count(*), sum(n) FROM events GROUP BY event ORDER BY event",
            "SELECT event, count(n) FROM events GROUP BY event ORDER BY event",
            "SELECT event, count(DISTINCT n) FROM events GROUP BY event ORDER BY event",
            "SELECT n, count(*) FROM events GROUP BY n ORDER BY n",
            "SELECT event, count(*) FILTER (WHERE n > 3) FROM events GROUP BY event ORDER BY event",
        ] {
            let (expected, _) = run(sql, false).await;
            let (actual, plan) = run(sql, true).await;
            assert!(!plan.contains("RunCollapseExec"), "{sql}: {plan}");
            assert_eq!(actual, expected, "{sql}");
        }
    }

    #[tokio::test]
    async fn filtered_input_still_counts_exactly() {
        let sql =
            "SELECT event, count(*) FROM events WHERE n % 3 = 0 GROUP BY event ORDER BY event";
        let (expected, _) = run(sql, false).await;
        let (actual, plan) = run(sql, true).await;
        assert!(plan.contains("RunCollapseExec"), "{plan}");
        assert_eq!(actual, expected);
    }

    #[test]
    fn unsorted_input_passes_through_after_probing() {
        let mut collapser = Collapser::default();
        let unsorted: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..64).map(|i| ["x", "y"][i % 2]),
        ));
        for _ in 0..PROBE_BATCHES + 2 {
            let (values, lengths) = collapser.collapse(&unsorted).expect("collapse");
            assert_eq!(values.len(), 64);
            assert!(lengths.values().iter().all(|l| *l == 1));
        }
        assert_eq!(collapser.probed, PROBE_BATCHES);
        let sorted: ArrayRef = Arc::new(StringArray::from_iter_values((0..64).map(|i| {
            if i < 40 {
                "x"
            } else {
                "y"
            }
        })));
        let mut fresh = Collapser::default();
        let (values, lengths) = fresh.collapse(&sorted).expect("collapse");
        assert_eq!(values.len(), 2);
        assert_eq!(lengths.values().as_ref(), &[40, 24]);
    }
}
