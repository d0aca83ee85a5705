//! Hiding erased events from queries: a filter over the segment scan that keeps the rows no
//! pending (or recently verified) erasure covers. The compactor removes those rows from the
//! files later; until then every statement over `events` reads through this filter.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, Schema, TimestampMicrosecondType};
use datafusion::common::{exec_err, Result as DfResult};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;

use corvid_persons::ErasedSet;

/// `true` for each row `erased` does not cover; its children are the `person_id`,
/// `distinct_id` and `created_at` columns.
#[derive(Debug, Clone)]
pub struct KeepUnerased {
    erased: Arc<ErasedSet>,
    columns: Vec<Arc<dyn PhysicalExpr>>,
}

impl KeepUnerased {
    pub fn new(erased: Arc<ErasedSet>, columns: Vec<Arc<dyn PhysicalExpr>>) -> KeepUnerased {
        KeepUnerased { erased, columns }
    }
}

impl PartialEq for KeepUnerased {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.erased, &other.erased) && self.columns == other.columns
    }
}

impl Eq for KeepUnerased {}

impl Hash for KeepUnerased {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.erased) as usize).hash(state);
        self.columns.hash(state);
    }
}

impl fmt::Display for KeepUnerased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not_erased(")?;
        for (i, c) in self.columns.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{c}")?;
        }
        write!(f, ")")
    }
}

/// Each row's text of a string column, whichever string layout the reader produced.
fn texts(array: &ArrayRef) -> DfResult<Vec<&str>> {
    fn text(v: Option<&str>) -> &str {
        v.unwrap_or("")
    }
    if let Some(a) = array.as_string_view_opt() {
        return Ok(a.iter().map(text).collect());
    }
    if let Some(a) = array.as_string_opt::<i32>() {
        return Ok(a.iter().map(text).collect());
    }
    if let Some(a) = array.as_string_opt::<i64>() {
        return Ok(a.iter().map(text).collect());
    }
    exec_err!(
        "erasure filter: expected a string column, got {}",
        array.data_type()
    )
}

impl PhysicalExpr for KeepUnerased {
    fn data_type(&self, _input_schema: &Schema) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _input_schema: &Schema) -> DfResult<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> DfResult<ColumnarValue> {
        let [person, distinct_id, created] = self.columns.as_slice() else {
            return exec_err!("erasure filter: expected three columns");
        };
        let rows = batch.num_rows();
        let person = person.evaluate(batch)?.into_array(rows)?;
        let distinct_id = distinct_id.evaluate(batch)?.into_array(rows)?;
        let created = created.evaluate(batch)?.into_array(rows)?;
        let Some(created) = created.as_primitive_opt::<TimestampMicrosecondType>() else {
            return exec_err!("erasure filter: created_at is {}", created.data_type());
        };
        let (person, distinct_id) = (texts(&person)?, texts(&distinct_id)?);
        let keep: BooleanArray = (0..rows)
            .map(|i| {
                let at = if created.is_null(i) {
                    i64::MAX
                } else {
                    created.value(i)
                };
                Some(!self.erased.hides_text(person[i], distinct_id[i], at))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(keep)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.columns.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> DfResult<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(KeepUnerased {
            erased: Arc::clone(&self.erased),
            columns: children,
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}
