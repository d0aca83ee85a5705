//! Runs of equal values in a column, and the `(value, run length)` rows both ways of counting
//! by runs produce ([`super::run_count::RunCollapseExec`] over decoded batches,
//! [`super::page_runs::PageRunsExec`] from Parquet's page index).

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringViewArray};
use arrow::compute::partition;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::Result as DfResult;

/// Name of the run-length column of collapsed rows.
pub(crate) const RUN_LENGTH: &str = "__corvid_run_length";

/// The schema of runs of a column `field`: its values, then each run's length.
pub(crate) fn collapsed_schema(field: Field) -> SchemaRef {
    Arc::new(Schema::new(vec![
        field,
        Field::new(RUN_LENGTH, DataType::Int64, false),
    ]))
}

/// The runs of equal values in `values` (nulls are equal to each other).
pub(crate) fn runs(values: &ArrayRef) -> DfResult<Vec<Range<usize>>> {
    Ok(match values.as_string_view_opt() {
        Some(views) if views.null_count() == 0 => view_runs(views),
        _ => partition(std::slice::from_ref(values))?.ranges(),
    })
}

/// The runs of equal strings in `values` (no nulls), as `partition` would find them.
///
/// `partition` compares every row with the next through the generic comparison kernel, which
/// was a third of a `GROUP BY event` count over a hundred million rows. Most neighbours within
/// a run have identical views (a view holds the length and either the whole string, up to 12
/// bytes, or its buffer and offset), so equal views settle almost every row with one 16-byte
/// comparison; only differing views compare the strings themselves. Rows go in blocks: a
/// block whose views all equal the row before it (most blocks, inside long runs) is settled by
/// one branch-free pass the compiler vectorizes.
fn view_runs(values: &StringViewArray) -> Vec<Range<usize>> {
    const BLOCK: usize = 64;
    let views = values.views();
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut i = 1;
    while i < views.len() {
        let end = (i + BLOCK).min(views.len());
        let before = views[i - 1];
        let uniform = views[i..end].iter().fold(0, |diff, v| diff | (v ^ before)) == 0;
        if !uniform {
            for j in i..end {
                if views[j] != views[j - 1] && values.value(j) != values.value(j - 1) {
                    ranges.push(start..j);
                    start = j;
                }
            }
        }
        i = end;
    }
    if !views.is_empty() {
        ranges.push(start..views.len());
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    /// String views find the runs `partition` finds: equal long strings held at different
    /// offsets are one run, and equal prefixes of different strings are not.
    #[test]
    fn view_runs_match_partition() {
        let long = "a-long-event-name-past-twelve-bytes";
        let values: Vec<String> = [long, long, "$pageview", "$pageview", long, "x"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                format!("{long}-2"),
                format!("{long}-2"),
                format!("{long}-3"),
            ])
            .collect();
        // Each value appended on its own: equal long strings get different views.
        let mut builder = arrow::array::StringViewBuilder::new();
        for v in &values {
            builder.append_value(v);
        }
        let views = builder.finish();
        let array: ArrayRef = Arc::new(views.clone());
        let expected = partition(std::slice::from_ref(&array))
            .expect("partition")
            .ranges();
        assert_eq!(view_runs(&views), expected);
        assert_eq!(expected, vec![0..2, 2..4, 4..5, 5..6, 6..8, 8..9]);
        assert!(view_runs(&StringViewArray::from(Vec::<&str>::new())).is_empty());
        // Runs longer than a block, and boundaries on and next to a block's edge.
        let long: Vec<&str> = (0..300)
            .map(|i| match i {
                0..=64 => "a",
                65..=127 => "b",
                128 => "c",
                _ => "d",
            })
            .collect();
        assert_eq!(
            view_runs(&StringViewArray::from(long)),
            vec![0..65, 65..128, 128..129, 129..300]
        );
    }
}
