use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::physical_plan::displayable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use crate::run_count::RunCountRule;

/// A value longer than the page index keeps whole: its minimum and maximum are truncated.
fn long(tag: char) -> String {
    format!("{}{tag}", "x".repeat(70))
}

/// Runs of every kind a page can hold: long runs over many pages, short runs inside one
/// page, nulls, and values the page index truncates (two of them sharing their prefix).
fn rows() -> Vec<Option<String>> {
    let mut rows = Vec::new();
    let mut run =
        |value: Option<&str>, n: usize| rows.extend((0..n).map(|_| value.map(String::from)));
    run(Some("$pageview"), 95);
    run(Some("a"), 3);
    run(Some("b"), 1);
    run(Some(&long('1')), 27);
    run(Some(&long('2')), 14);
    run(None, 12);
    run(Some("$autocapture"), 61);
    run(Some("c"), 7);
    run(Some("$pageview"), 40);
    run(Some("d-an-event-name-over-twelve-bytes"), 52);
    rows
}

/// `rows` in a Parquet file of 10-row pages and 64-row row groups, with a second column;
/// `event` dictionary-encoded (as Parquet writes strings by default) or plain.
fn write(path: &std::path::Path, rows: &[Option<String>], dictionary: bool) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("event", DataType::Utf8, true),
        Field::new("n", DataType::Int64, false),
    ]));
    let props = WriterProperties::builder()
        .set_data_page_row_count_limit(10)
        .set_write_batch_size(10)
        .set_max_row_group_row_count(Some(64))
        .set_dictionary_enabled(dictionary)
        .build();
    let file = std::fs::File::create(path).expect("file");
    let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).expect("writer");
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter(rows.iter().map(Option::as_deref))),
            Arc::new(Int64Array::from_iter_values(0..rows.len() as i64)),
        ],
    )
    .expect("batch");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

fn expected(rows: &[Option<String>]) -> BTreeMap<Option<String>, i64> {
    let mut counts = BTreeMap::new();
    for r in rows {
        *counts.entry(r.clone()).or_insert(0) += 1;
    }
    counts
}

/// Runs `sql` over the files in `dir` (table `t`), returning the rows `(event, count)` and the
/// physical plan's text.
fn grouped(
    dir: &std::path::Path,
    sql: &str,
    partitions: usize,
) -> (BTreeMap<Option<String>, i64>, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // Splitting files into byte ranges from the smallest size makes row groups land in
        // different partitions of one file.
        let config = SessionConfig::new()
            .with_target_partitions(partitions)
            .set_usize("datafusion.optimizer.repartition_file_min_size", 1);
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(RunCountRule))
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_parquet(
            "t",
            dir.to_str().expect("path"),
            ParquetReadOptions::default(),
        )
        .await
        .expect("register");
        let frame = ctx.sql(sql).await.expect("plan");
        let plan = frame
            .clone()
            .create_physical_plan()
            .await
            .expect("physical");
        let text = displayable(plan.as_ref()).indent(true).to_string();
        let mut counts = BTreeMap::new();
        for batch in frame.collect().await.expect("run") {
            let events = arrow::compute::cast(batch.column(0), &DataType::Utf8).expect("cast");
            let events = events.as_string::<i32>();
            let n = batch.column(1).as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                let event = (!events.is_null(i)).then(|| events.value(i).to_string());
                counts.insert(event, n.value(i));
            }
        }
        (counts, text)
    })
}

#[test]
fn counts_from_the_page_index_equal_counts_of_every_row() {
    let dir = tempfile::tempdir().expect("dir");
    let first = rows();
    let mut second: Vec<Option<String>> = first.iter().rev().cloned().collect();
    second.extend((0..33).map(|_| Some("only-here".to_string())));
    write(&dir.path().join("1.parquet"), &first, true);
    write(&dir.path().join("2.parquet"), &second, false);
    // The file really has pages the index settles and pages that must be decoded.
    let bytes = bytes::Bytes::from(std::fs::read(dir.path().join("1.parquet")).expect("read"));
    let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
        .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Required);
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new_with_options(
            bytes, options,
        )
        .expect("footer");
    let metadata = reader.metadata();
    let pages: Vec<_> = (0..metadata.num_row_groups())
        .flat_map(|rg| super::page_plan(metadata, rg, 0))
        .collect();
    let settled = pages.iter().filter(|p| p.value.is_some()).count();
    assert!(metadata.num_row_groups() > 1 && settled > 10 && settled < pages.len());
    let mut all = first.clone();
    all.extend(second);
    for partitions in [1, 2, 5] {
        let (counts, plan) = grouped(
            dir.path(),
            "SELECT event, count(*) FROM t GROUP BY event",
            partitions,
        );
        assert!(plan.contains("PageRunsExec"), "{plan}");
        assert_eq!(counts, expected(&all), "{partitions} partitions");
    }
}

#[test]
fn a_scan_with_a_predicate_decodes_its_rows() {
    let dir = tempfile::tempdir().expect("dir");
    let rows = rows();
    write(&dir.path().join("1.parquet"), &rows, true);
    let (counts, plan) = grouped(
        dir.path(),
        "SELECT event, count(*) FROM t WHERE n % 3 = 0 GROUP BY event",
        2,
    );
    assert!(!plan.contains("PageRunsExec"), "{plan}");
    let every_third: Vec<Option<String>> = rows.iter().step_by(3).cloned().collect();
    assert_eq!(counts, expected(&every_third));
}
