//! `corvid_uniq(x)`: ClickHouse's `uniq` — the number of distinct non-null values, counted as
//! distinct 64-bit hashes.
//!
//! `count(DISTINCT x)` keeps every value and compares values byte for byte; over 36-character
//! person ids that comparison is most of a "distinct users" query. ClickHouse's `uniq` is an
//! estimate for the same reason. This one keeps only each value's 64-bit hash (a set of `u64`,
//! no value copies, no byte comparisons), so it is exact unless two different values share a
//! hash: with n distinct values the chance of any collision is about n² / 2⁶⁵ (under 10⁻⁸ for a
//! million values). `uniqExact` stays `count(DISTINCT x)`.
//!
//! Partial results move between partitions as the set's hashes in ascending order,
//! little-endian, in one binary value per group: the final phase of an ungrouped `uniq` unions
//! those sorted runs in one linear pass instead of inserting every hash into a set again.

use corvid_kernel::prehashed::PreHashed;
use std::collections::HashSet;
use std::mem::size_of;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, BooleanArray, Int64Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::hash_utils::{create_hashes, QualityRandomState};
use datafusion::common::{exec_err, Result as DfResult, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

pub const UNIQ: &str = "corvid_uniq";

/// Fixed seed: every partition (and every query) must hash a value the same way.
const HASH_STATE: QualityRandomState = QualityRandomState::with_seed(0x636f_7276_6964);

/// The set's keys are already well-mixed hashes.
type HashesSet = HashSet<u64, PreHashed>;

/// The aggregate, for registering in a session.
pub fn udaf() -> AggregateUDF {
    AggregateUDF::new_from_impl(Uniq {
        signature: Signature::any(1, Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Uniq {
    signature: Signature,
}

impl AggregateUDFImpl for Uniq {
    fn name(&self) -> &str {
        UNIQ
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Int64, like `count(DISTINCT x)`, so `uniq` and `uniqExact` columns have one type.
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
            format_state_name(args.name, "hashes"),
            DataType::Binary,
            true,
        ))])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(UniqAccumulator::default()))
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        _: AccumulatorArgs,
    ) -> DfResult<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(UniqGroups::default()))
    }
}

/// Hashes of `values` and which rows count (not null, and passing `filter` when given).
fn hashed(
    values: &ArrayRef,
    filter: Option<&BooleanArray>,
    scratch: &mut Vec<u64>,
) -> DfResult<Option<NullBuffer>> {
    scratch.clear();
    scratch.resize(values.len(), 0);
    create_hashes([values.as_ref()], &HASH_STATE, scratch.as_mut_slice())?;
    let filtered = filter.map(|f| {
        // A null filter value excludes the row, as SQL's FILTER (WHERE …) does.
        let keep = match f.nulls() {
            Some(n) => &(f.values() & n.inner()),
            None => f.values(),
        };
        NullBuffer::new(keep.clone())
    });
    Ok(NullBuffer::union(
        filtered.as_ref(),
        values.logical_nulls().as_ref(),
    ))
}

fn insert_counted(set: &mut HashesSet, hashes: &[u64], valid: Option<&NullBuffer>) {
    match valid {
        None => set.extend(hashes.iter().copied()),
        Some(v) => set.extend(v.valid_indices().map(|i| hashes[i])),
    }
}

/// The partial state of `set` ∪ `merged` (`merged` ascending, no repeats): ascending hashes.
fn serialize(set: &HashesSet, merged: &[u64], out: &mut Vec<u8>) {
    let mut hashes: Vec<u64> = set.iter().copied().collect();
    hashes.sort_unstable();
    let all = union_sorted(&hashes, merged);
    out.clear();
    out.reserve(all.len() * size_of::<u64>());
    for h in all {
        out.extend_from_slice(&h.to_le_bytes());
    }
}

fn decode(bytes: &[u8]) -> DfResult<Vec<u64>> {
    if bytes.len() % size_of::<u64>() != 0 {
        return exec_err!("{UNIQ}: partial state of {} bytes", bytes.len());
    }
    Ok(bytes
        .chunks_exact(size_of::<u64>())
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect())
}

fn strictly_ascending(v: &[u64]) -> bool {
    v.windows(2).all(|w| w[0] < w[1])
}

/// Union of two ascending runs without repeats, ascending.
fn union_sorted(a: &[u64], b: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

fn merge_serialized(set: &mut HashesSet, bytes: &[u8]) -> DfResult<()> {
    set.extend(decode(bytes)?);
    Ok(())
}

fn set_bytes(set: &HashesSet) -> usize {
    // hashbrown: one control byte per bucket besides the key.
    set.capacity() * (size_of::<u64>() + 1)
}

fn count(set: &HashesSet) -> i64 {
    i64::try_from(set.len()).unwrap_or(i64::MAX)
}

/// `uniq` without GROUP BY (one set).
#[derive(Default)]
struct UniqAccumulator {
    /// Hashes of the rows this accumulator saw.
    set: HashesSet,
    /// Union of the partial states merged in: ascending, no repeats.
    merged: Vec<u64>,
    scratch: Vec<u64>,
}

impl std::fmt::Debug for UniqAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "UniqAccumulator({} + {} hashes)",
            self.set.len(),
            self.merged.len()
        )
    }
}

impl Accumulator for UniqAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let Some(values) = values.first() else {
            return exec_err!("{UNIQ} takes one argument");
        };
        let valid = hashed(values, None, &mut self.scratch)?;
        insert_counted(&mut self.set, &self.scratch, valid.as_ref());
        Ok(())
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        let merged_only = self.merged.iter().filter(|h| !self.set.contains(h)).count();
        let n = self.set.len() + merged_only;
        Ok(ScalarValue::Int64(Some(
            i64::try_from(n).unwrap_or(i64::MAX),
        )))
    }

    fn size(&self) -> usize {
        size_of::<Self>()
            + set_bytes(&self.set)
            + (self.merged.capacity() + self.scratch.capacity()) * size_of::<u64>()
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        let mut bytes = Vec::new();
        serialize(&self.set, &self.merged, &mut bytes);
        Ok(vec![ScalarValue::Binary(Some(bytes))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let Some(states) = states.first() else {
            return exec_err!("{UNIQ}: missing partial state");
        };
        let states = states.as_binary::<i32>();
        for row in states.iter().flatten() {
            let hashes = decode(row)?;
            if strictly_ascending(&hashes) {
                self.merged = union_sorted(&self.merged, &hashes);
            } else {
                self.set.extend(hashes);
            }
        }
        Ok(())
    }
}

/// `uniq` per group.
#[derive(Default)]
struct UniqGroups {
    sets: Vec<HashesSet>,
    scratch: Vec<u64>,
    /// Bytes held by the sets, kept current so `size` is cheap.
    bytes: usize,
}

impl UniqGroups {
    fn grow(&mut self, total_num_groups: usize) {
        if self.sets.len() < total_num_groups {
            self.sets.resize_with(total_num_groups, HashesSet::default);
        }
    }

    /// Runs `change` on group `g`'s set, keeping `bytes` current.
    fn with_set(&mut self, g: usize, change: impl FnOnce(&mut HashesSet)) {
        let set = &mut self.sets[g];
        let before = set_bytes(set);
        change(set);
        self.bytes = (self.bytes + set_bytes(set)).saturating_sub(before);
    }

    fn take(&mut self, emit_to: EmitTo) -> Vec<HashesSet> {
        let taken = emit_to.take_needed(&mut self.sets);
        let freed: usize = taken.iter().map(set_bytes).sum();
        self.bytes = self.bytes.saturating_sub(freed);
        taken
    }
}

impl GroupsAccumulator for UniqGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> DfResult<()> {
        let Some(values) = values.first() else {
            return exec_err!("{UNIQ} takes one argument");
        };
        self.grow(total_num_groups);
        let mut hashes = std::mem::take(&mut self.scratch);
        let valid = hashed(values, opt_filter, &mut hashes)?;
        let mut insert = |row: usize| {
            let g = group_indices[row];
            let h = hashes[row];
            self.with_set(g, |s| {
                s.insert(h);
            });
        };
        match &valid {
            None => (0..values.len()).for_each(&mut insert),
            Some(v) => v.valid_indices().for_each(&mut insert),
        }
        self.scratch = hashes;
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> DfResult<()> {
        let Some(states) = values.first() else {
            return exec_err!("{UNIQ}: missing partial state");
        };
        self.grow(total_num_groups);
        let states = states.as_binary::<i32>();
        for (row, &g) in group_indices.iter().enumerate() {
            if states.is_valid(row) {
                let mut result = Ok(());
                self.with_set(g, |s| result = merge_serialized(s, states.value(row)));
                result?;
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> DfResult<ArrayRef> {
        let sets = self.take(emit_to);
        Ok(Arc::new(Int64Array::from_iter_values(
            sets.iter().map(count),
        )))
    }

    fn state(&mut self, emit_to: EmitTo) -> DfResult<Vec<ArrayRef>> {
        let sets = self.take(emit_to);
        let mut builder = BinaryBuilder::with_capacity(sets.len(), 0);
        let mut bytes = Vec::new();
        for set in &sets {
            serialize(set, &[], &mut bytes);
            builder.append_value(&bytes);
        }
        Ok(vec![Arc::new(builder.finish())])
    }

    /// Each row as its own group's state: its hash, or nothing when it does not count.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> DfResult<Vec<ArrayRef>> {
        let Some(values) = values.first() else {
            return exec_err!("{UNIQ} takes one argument");
        };
        let mut hashes = Vec::new();
        let valid = hashed(values, opt_filter, &mut hashes)?;
        let mut builder = BinaryBuilder::with_capacity(hashes.len(), hashes.len() * 8);
        for (row, h) in hashes.iter().enumerate() {
            if valid.as_ref().is_none_or(|v| v.is_valid(row)) {
                builder.append_value(h.to_le_bytes());
            } else {
                builder.append_value([]);
            }
        }
        Ok(vec![Arc::new(builder.finish())])
    }

    fn size(&self) -> usize {
        self.sets.capacity() * size_of::<HashesSet>()
            + self.bytes
            + self.scratch.capacity() * size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array as I64, StringArray};

    fn strings(v: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(v.to_vec()))
    }

    #[test]
    fn counts_distinct_non_null_values_and_merges_partial_states() {
        let mut a = UniqAccumulator::default();
        a.update_batch(&[strings(&[Some("x"), Some("y"), None, Some("x")])])
            .expect("update");
        let mut b = UniqAccumulator::default();
        b.update_batch(&[strings(&[Some("y"), Some("z")])])
            .expect("update");
        assert_eq!(a.evaluate().expect("a"), ScalarValue::Int64(Some(2)));
        let ScalarValue::Binary(Some(state)) = b.state().expect("state").remove(0) else {
            panic!("binary state");
        };
        let states: ArrayRef = Arc::new(arrow::array::BinaryArray::from(vec![Some(
            state.as_slice(),
        )]));
        a.merge_batch(&[states]).expect("merge");
        assert_eq!(a.evaluate().expect("merged"), ScalarValue::Int64(Some(3)));
    }

    #[test]
    fn groups_count_their_own_values_and_respect_the_filter() {
        let mut g = UniqGroups::default();
        let values: ArrayRef = Arc::new(I64::from(vec![1, 2, 1, 3, 3, 4]));
        let filter = BooleanArray::from(vec![
            Some(true),
            Some(true),
            Some(true),
            Some(true),
            None,
            Some(false),
        ]);
        g.update_batch(&[values], &[0, 0, 1, 1, 1, 1], Some(&filter), 2)
            .expect("update");
        let state = g.state(EmitTo::All).expect("state");
        let mut merged = UniqGroups::default();
        merged.merge_batch(&state, &[1, 0], 2).expect("merge");
        let out = merged.evaluate(EmitTo::All).expect("evaluate");
        let out = out.as_primitive::<arrow::datatypes::Int64Type>();
        // Group 0 of the input (values 1, 2) landed in group 1; group 1 (1, 3) in group 0.
        assert_eq!(out.values().to_vec(), vec![2, 2]);
    }

    #[test]
    fn sorted_unions_keep_each_hash_once() {
        assert_eq!(
            union_sorted(&[1, 3, 5, 9], &[2, 3, 9, 10]),
            vec![1, 2, 3, 5, 9, 10]
        );
        assert_eq!(union_sorted(&[], &[4]), vec![4]);
        assert!(strictly_ascending(&[1, 2, 7]));
        assert!(!strictly_ascending(&[1, 1]));
    }

    /// States merged into an accumulator that also saw rows itself count each value once.
    #[test]
    fn merged_states_and_own_rows_are_counted_together() {
        let state_of = |values: &[Option<&str>]| {
            let mut a = UniqAccumulator::default();
            a.update_batch(&[strings(values)]).expect("update");
            let ScalarValue::Binary(Some(bytes)) = a.state().expect("state").remove(0) else {
                panic!("binary state");
            };
            bytes
        };
        let states: ArrayRef = Arc::new(arrow::array::BinaryArray::from(vec![
            Some(state_of(&[Some("a"), Some("b")]).as_slice()),
            Some(state_of(&[Some("b"), Some("c"), None]).as_slice()),
        ]));
        let mut a = UniqAccumulator::default();
        a.update_batch(&[strings(&[Some("c"), Some("d")])])
            .expect("update");
        a.merge_batch(&[states]).expect("merge");
        assert_eq!(a.evaluate().expect("count"), ScalarValue::Int64(Some(4)));
        // Its own state carries all four on to a further merge.
        let ScalarValue::Binary(Some(bytes)) = a.state().expect("state").remove(0) else {
            panic!("binary state");
        };
        assert_eq!(decode(&bytes).expect("decodes").len(), 4);
    }

    #[test]
    fn a_truncated_partial_state_is_an_error_not_a_panic() {
        let mut set = HashesSet::default();
        assert!(merge_serialized(&mut set, &[1, 2, 3]).is_err());
    }
}
