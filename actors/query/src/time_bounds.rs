//! Comparisons of `events.timestamp` with constant instants, which the `events` table applies
//! itself: only to the rows of days they cut through.
//!
//! Segments hold one UTC day each, so a bound such as `timestamp >= '2024-06-24 00:00:00'`
//! holds for every row of the days after it. A filter DataFusion applies reads the timestamp
//! column and compares and copies every row of every day; "the last 7 days" (most analytics
//! queries) paid that for seven days of rows to drop none. The table reports these filters as
//! exact and filters only the files of the days a bound falls inside (and the unflushed
//! tail); whole days inside every bound are read as they are.

use std::sync::Arc;

use chrono::{NaiveDate, NaiveTime};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};
use datafusion::physical_expr::expressions::{BinaryExpr as PhysicalBinary, Column, Literal};
use datafusion::physical_expr::PhysicalExpr;

/// One bound: `timestamp <op> at` (microseconds since the epoch, UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBound {
    op: Operator,
    at: i64,
}

impl TimeBound {
    /// Whether every instant of UTC day `day` satisfies the bound.
    pub fn holds_all_day(&self, day: NaiveDate) -> bool {
        let start = day.and_time(NaiveTime::MIN).and_utc().timestamp_micros();
        let last = start + 86_400_000_000 - 1;
        match self.op {
            Operator::GtEq => start >= self.at,
            Operator::Gt => start > self.at,
            Operator::LtEq => last <= self.at,
            Operator::Lt => last < self.at,
            _ => false,
        }
    }

    /// The bound over column `column` (at `index`) of type `timestamp_type`.
    fn physical(
        &self,
        column: &str,
        index: usize,
        timestamp_type: &arrow::datatypes::DataType,
    ) -> Arc<dyn PhysicalExpr> {
        let tz = match timestamp_type {
            arrow::datatypes::DataType::Timestamp(_, tz) => tz.clone(),
            _ => None,
        };
        Arc::new(PhysicalBinary::new(
            Arc::new(Column::new(column, index)),
            self.op,
            Arc::new(Literal::new(ScalarValue::TimestampMicrosecond(
                Some(self.at),
                tz,
            ))),
        ))
    }
}

/// The bounds `filter` is made of, when it is nothing but bounds on `timestamp` (a comparison
/// or a `BETWEEN`) whose instants are whole microseconds; `None` for any other filter.
pub fn time_bounds(filter: &Expr) -> Option<Vec<TimeBound>> {
    match filter {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let bound = match (is_timestamp(left), micros(right)) {
                (true, Some(at)) => TimeBound { op: *op, at },
                _ => match (micros(left), is_timestamp(right)) {
                    (Some(at), true) => TimeBound { op: op.swap()?, at },
                    _ => return None,
                },
            };
            matches!(
                bound.op,
                Operator::Gt | Operator::GtEq | Operator::Lt | Operator::LtEq
            )
            .then(|| vec![bound])
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) if is_timestamp(expr) => Some(vec![
            TimeBound {
                op: Operator::GtEq,
                at: micros(low)?,
            },
            TimeBound {
                op: Operator::LtEq,
                at: micros(high)?,
            },
        ]),
        _ => None,
    }
}

/// All `bounds` over column `column` at `index`, ANDed; `None` when there are none.
pub fn predicate(
    bounds: &[TimeBound],
    column: &str,
    index: usize,
    timestamp_type: &arrow::datatypes::DataType,
) -> Option<Arc<dyn PhysicalExpr>> {
    bounds
        .iter()
        .map(|b| b.physical(column, index, timestamp_type))
        .reduce(|a, b| Arc::new(PhysicalBinary::new(a, Operator::And, b)))
}

fn is_timestamp(e: &Expr) -> bool {
    matches!(e, Expr::Column(c) if c.name == "timestamp")
}

/// A constant instant in whole microseconds (a nanosecond literal between two microseconds
/// is not one: comparing it would need rounding by operator).
fn micros(e: &Expr) -> Option<i64> {
    let Expr::Literal(value, _) = e else {
        return None;
    };
    match value {
        ScalarValue::TimestampMicrosecond(Some(v), _) => Some(*v),
        ScalarValue::TimestampNanosecond(Some(v), _) if v % 1_000 == 0 => Some(v / 1_000),
        ScalarValue::TimestampMillisecond(Some(v), _) => v.checked_mul(1_000),
        ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1_000_000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{col, lit};

    fn at(text: &str) -> Expr {
        let t = chrono::DateTime::parse_from_rfc3339(text).expect("instant");
        lit(ScalarValue::TimestampMicrosecond(
            Some(t.timestamp_micros()),
            Some("UTC".into()),
        ))
    }

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("day")
    }

    fn all_day(filter: Expr, d: &str) -> bool {
        time_bounds(&filter)
            .expect("a bound")
            .iter()
            .all(|b| b.holds_all_day(day(d)))
    }

    #[test]
    fn a_bound_holds_for_whole_days_on_its_side_only() {
        let midnight = "2024-06-24T00:00:00Z";
        assert!(all_day(col("timestamp").gt_eq(at(midnight)), "2024-06-24"));
        assert!(!all_day(col("timestamp").gt_eq(at(midnight)), "2024-06-23"));
        assert!(!all_day(col("timestamp").gt(at(midnight)), "2024-06-24"));
        assert!(all_day(col("timestamp").gt(at(midnight)), "2024-06-25"));
        assert!(all_day(col("timestamp").lt(at(midnight)), "2024-06-23"));
        assert!(!all_day(col("timestamp").lt(at(midnight)), "2024-06-24"));
        assert!(!all_day(
            col("timestamp").lt_eq(at("2024-06-24T23:59:59Z")),
            "2024-06-24"
        ));
        assert!(all_day(
            col("timestamp").lt_eq(at("2024-06-24T23:59:59.999999Z")),
            "2024-06-24"
        ));
        let noon = "2024-06-24T12:00:00Z";
        assert!(!all_day(col("timestamp").gt_eq(at(noon)), "2024-06-24"));
        assert!(all_day(col("timestamp").gt_eq(at(noon)), "2024-06-25"));
        // Swapped sides mean the mirrored bound.
        assert!(all_day(at(midnight).lt_eq(col("timestamp")), "2024-06-24"));
        assert!(!all_day(at(midnight).gt(col("timestamp")), "2024-06-24"));
        let between = col("timestamp").between(at(midnight), at("2024-06-26T06:00:00Z"));
        assert!(all_day(between.clone(), "2024-06-25"));
        assert!(!all_day(between.clone(), "2024-06-26"));
        assert!(!all_day(between, "2024-06-23"));
    }

    #[test]
    fn other_filters_are_not_bounds() {
        let midnight = at("2024-06-24T00:00:00Z");
        for filter in [
            col("timestamp").eq(midnight.clone()),
            col("timestamp").not_eq(midnight.clone()),
            col("created_at").gt_eq(midnight.clone()),
            col("timestamp").not_between(midnight.clone(), midnight.clone()),
            col("timestamp").gt_eq(lit(ScalarValue::TimestampNanosecond(Some(1_500), None))),
            col("event").eq(lit("x")),
        ] {
            assert_eq!(time_bounds(&filter), None, "{filter}");
        }
    }
}
