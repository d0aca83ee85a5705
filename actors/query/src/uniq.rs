//! `corvid_uniq(x)`: ClickHouse's `uniq` — the number of distinct non-null values, estimated by
//! adaptive sampling of their 64-bit hashes.
//!
//! `count(DISTINCT x)` keeps every value and compares values byte for byte; over 36-character
//! person ids that comparison is most of a "distinct users" query. ClickHouse's `uniq` is an
//! estimate for the same reason, and this one works as ClickHouse's does ([`Sample`]): it keeps
//! the hashes of at most [`MAX_SAMPLE`] distinct values. Up to that many distinct values the
//! count is exact (unless two values share a 64-bit hash: about n² / 2⁶⁵). Past it, the sample
//! keeps only hashes whose next sampling bit is zero — half of them, then a quarter, … — and
//! the estimate is the sample's size times the inverse of that fraction, within about 1 % of
//! the true count. The sample stays small enough to live in the CPU's cache, and most rows of a
//! large scan are rejected by one mask test without touching the set at all.
//! `uniqExact` stays `count(DISTINCT x)`.
//!
//! Partial results move between partitions as the sample in one binary value per group: the
//! sampling degree (`u64`, little-endian) followed by the kept hashes (`u64` each,
//! little-endian). An empty value is an empty sample.

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

/// Most hashes a sample holds before it halves its sampling rate (ClickHouse's `uniq` keeps
/// 65,536 too): an estimate within about 1 %, in a set of about 1 MiB.
const MAX_SAMPLE: usize = 1 << 16;

/// The sampling bits start here. The set uses a hash's low bits to pick its bucket and its top
/// 7 bits as a tag, so sampling on either would crowd the kept hashes into a few buckets or
/// tags; bits 32.. are used by neither at this set size.
const SAMPLING_SHIFT: u32 = 32;

/// The highest sampling degree: bits 32..56 stay clear of the tag bits. A sample at this degree
/// stands for about 2⁴⁰ distinct values, far past any event store.
const MAX_DEGREE: u64 = 24;

/// The set's keys are already well-mixed hashes.
type HashesSet = HashSet<u64, PreHashed>;

/// A sample of distinct hashes: those whose `degree` sampling bits are all zero, one in
/// 2^`degree` of all distinct hashes.
#[derive(Default, Clone)]
struct Sample {
    degree: u64,
    /// The sampling bits of a kept hash, already shifted down: `(1 << degree) - 1`.
    mask: u64,
    set: HashesSet,
}

impl Sample {
    fn keeps(&self, hash: u64) -> bool {
        (hash >> SAMPLING_SHIFT) & self.mask == 0
    }

    fn insert(&mut self, hash: u64) {
        if self.keeps(hash) && self.set.insert(hash) && self.set.len() > MAX_SAMPLE {
            self.thin();
        }
    }

    /// Inserts the counted rows' hashes. Most rows of a big scan fall outside the sample, so
    /// the kept ones are first gathered without a branch per row (into `kept`), and only they
    /// touch the set.
    fn insert_counted(&mut self, hashes: &[u64], valid: Option<&NullBuffer>, kept: &mut Vec<u64>) {
        kept.clear();
        kept.resize(hashes.len(), 0);
        let mask = self.mask;
        let mut n = 0;
        let mut gather = |h: u64| {
            kept[n] = h;
            n += usize::from((h >> SAMPLING_SHIFT) & mask == 0);
        };
        match valid {
            None => hashes.iter().for_each(|&h| gather(h)),
            Some(v) => v.valid_indices().for_each(|i| gather(hashes[i])),
        }
        // The sample may thin itself on the way, dropping later hashes it no longer keeps.
        kept[..n].iter().for_each(|&h| self.insert(h));
    }

    /// Halves the sampling rate until the sample fits again.
    fn thin(&mut self) {
        while self.set.len() > MAX_SAMPLE && self.degree < MAX_DEGREE {
            self.raise_to(self.degree + 1);
        }
    }

    fn raise_to(&mut self, degree: u64) {
        if degree <= self.degree {
            return;
        }
        self.degree = degree;
        self.mask = (1 << degree) - 1;
        let mask = self.mask;
        self.set.retain(|h| (h >> SAMPLING_SHIFT) & mask == 0);
    }

    /// Adds a partial state (see the module docs).
    fn merge(&mut self, bytes: &[u8]) -> DfResult<()> {
        let Some((degree, hashes)) = decode(bytes)? else {
            return Ok(());
        };
        self.raise_to(degree);
        for h in hashes {
            self.insert(h);
        }
        Ok(())
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.reserve((self.set.len() + 1) * size_of::<u64>());
        out.extend_from_slice(&self.degree.to_le_bytes());
        for h in &self.set {
            out.extend_from_slice(&h.to_le_bytes());
        }
    }

    fn estimate(&self) -> i64 {
        let n = u64::try_from(self.set.len()).unwrap_or(u64::MAX);
        i64::try_from(n.saturating_mul(1 << self.degree)).unwrap_or(i64::MAX)
    }

    fn bytes(&self) -> usize {
        // hashbrown: one control byte per bucket besides the key.
        self.set.capacity() * (size_of::<u64>() + 1)
    }
}

/// A partial state's degree and hashes; `None` for the empty state.
fn decode(bytes: &[u8]) -> DfResult<Option<(u64, impl Iterator<Item = u64> + '_)>> {
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() % size_of::<u64>() != 0 {
        return exec_err!("{UNIQ}: partial state of {} bytes", bytes.len());
    }
    let mut words = bytes
        .chunks_exact(size_of::<u64>())
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
    let degree = words.next().unwrap_or_default();
    if degree > MAX_DEGREE {
        return exec_err!("{UNIQ}: partial state of sampling degree {degree}");
    }
    Ok(Some((degree, words)))
}

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
            format_state_name(args.name, "sample"),
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

fn first_arg(values: &[ArrayRef]) -> DfResult<&ArrayRef> {
    match values.first() {
        Some(v) => Ok(v),
        None => exec_err!("{UNIQ} takes one argument"),
    }
}

/// `uniq` without GROUP BY (one sample).
#[derive(Default)]
struct UniqAccumulator {
    sample: Sample,
    scratch: Vec<u64>,
    kept: Vec<u64>,
}

impl std::fmt::Debug for UniqAccumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "UniqAccumulator({} hashes at degree {})",
            self.sample.set.len(),
            self.sample.degree
        )
    }
}

impl Accumulator for UniqAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let values = first_arg(values)?;
        let valid = hashed(values, None, &mut self.scratch)?;
        self.sample
            .insert_counted(&self.scratch, valid.as_ref(), &mut self.kept);
        Ok(())
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(ScalarValue::Int64(Some(self.sample.estimate())))
    }

    fn size(&self) -> usize {
        size_of::<Self>()
            + self.sample.bytes()
            + (self.scratch.capacity() + self.kept.capacity()) * size_of::<u64>()
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        let mut bytes = Vec::new();
        self.sample.encode(&mut bytes);
        Ok(vec![ScalarValue::Binary(Some(bytes))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let Some(states) = states.first() else {
            return exec_err!("{UNIQ}: missing partial state");
        };
        for row in states.as_binary::<i32>().iter().flatten() {
            self.sample.merge(row)?;
        }
        Ok(())
    }
}

/// `uniq` per group.
#[derive(Default)]
struct UniqGroups {
    samples: Vec<Sample>,
    scratch: Vec<u64>,
    /// Bytes held by the samples, kept current so `size` is cheap.
    bytes: usize,
}

impl UniqGroups {
    fn grow(&mut self, total_num_groups: usize) {
        if self.samples.len() < total_num_groups {
            self.samples.resize_with(total_num_groups, Sample::default);
        }
    }

    /// Runs `change` on group `g`'s sample, keeping `bytes` current.
    fn with_sample<T>(&mut self, g: usize, change: impl FnOnce(&mut Sample) -> T) -> T {
        let sample = &mut self.samples[g];
        let before = sample.bytes();
        let out = change(sample);
        self.bytes = (self.bytes + sample.bytes()).saturating_sub(before);
        out
    }

    fn take(&mut self, emit_to: EmitTo) -> Vec<Sample> {
        let taken = emit_to.take_needed(&mut self.samples);
        let freed: usize = taken.iter().map(Sample::bytes).sum();
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
        let values = first_arg(values)?;
        self.grow(total_num_groups);
        let mut hashes = std::mem::take(&mut self.scratch);
        let valid = hashed(values, opt_filter, &mut hashes)?;
        let mut insert = |row: usize| {
            let h = hashes[row];
            self.with_sample(group_indices[row], |s| s.insert(h));
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
                self.with_sample(g, |s| s.merge(states.value(row)))?;
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> DfResult<ArrayRef> {
        let samples = self.take(emit_to);
        Ok(Arc::new(Int64Array::from_iter_values(
            samples.iter().map(Sample::estimate),
        )))
    }

    fn state(&mut self, emit_to: EmitTo) -> DfResult<Vec<ArrayRef>> {
        let samples = self.take(emit_to);
        let mut builder = BinaryBuilder::with_capacity(samples.len(), 0);
        let mut bytes = Vec::new();
        for sample in &samples {
            sample.encode(&mut bytes);
            builder.append_value(&bytes);
        }
        Ok(vec![Arc::new(builder.finish())])
    }

    /// Each row as its own group's state: a sample of its hash at degree 0, or the empty state
    /// when it does not count.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> DfResult<Vec<ArrayRef>> {
        let values = first_arg(values)?;
        let mut hashes = Vec::new();
        let valid = hashed(values, opt_filter, &mut hashes)?;
        let mut builder = BinaryBuilder::with_capacity(hashes.len(), hashes.len() * 16);
        for (row, h) in hashes.iter().enumerate() {
            if valid.as_ref().is_none_or(|v| v.is_valid(row)) {
                let mut state = [0u8; 16];
                state[8..].copy_from_slice(&h.to_le_bytes());
                builder.append_value(state);
            } else {
                builder.append_value([]);
            }
        }
        Ok(vec![Arc::new(builder.finish())])
    }

    fn size(&self) -> usize {
        self.samples.capacity() * size_of::<Sample>()
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

    fn numbers(range: std::ops::Range<i64>) -> ArrayRef {
        Arc::new(I64::from_iter_values(range))
    }

    fn state_of(a: &mut UniqAccumulator) -> ArrayRef {
        let ScalarValue::Binary(Some(bytes)) = a.state().expect("state").remove(0) else {
            panic!("binary state");
        };
        Arc::new(arrow::array::BinaryArray::from(vec![Some(
            bytes.as_slice(),
        )]))
    }

    fn estimate(a: &mut UniqAccumulator) -> i64 {
        match a.evaluate().expect("evaluate") {
            ScalarValue::Int64(Some(n)) => n,
            other => panic!("not a count: {other:?}"),
        }
    }

    #[test]
    fn counts_distinct_non_null_values_and_merges_partial_states() {
        let mut a = UniqAccumulator::default();
        a.update_batch(&[strings(&[Some("x"), Some("y"), None, Some("x")])])
            .expect("update");
        let mut b = UniqAccumulator::default();
        b.update_batch(&[strings(&[Some("y"), Some("z")])])
            .expect("update");
        assert_eq!(estimate(&mut a), 2);
        a.merge_batch(&[state_of(&mut b)]).expect("merge");
        assert_eq!(estimate(&mut a), 3);
    }

    /// Up to the sample's size the count is exact, however the values are split.
    #[test]
    fn up_to_the_sample_size_the_count_is_exact() {
        let n = i64::try_from(MAX_SAMPLE).expect("fits");
        let mut a = UniqAccumulator::default();
        a.update_batch(&[numbers(0..n / 2 + 100)]).expect("update");
        let mut b = UniqAccumulator::default();
        b.update_batch(&[numbers(n / 2..n)]).expect("update");
        a.merge_batch(&[state_of(&mut b)]).expect("merge");
        assert_eq!(a.sample.degree, 0);
        assert_eq!(estimate(&mut a), n);
    }

    /// Past it the sample thins itself, stays bounded, and estimates within 2 %, also when
    /// partial samples of different degrees and overlapping values are merged.
    #[test]
    fn past_the_sample_size_the_estimate_is_close_and_memory_bounded() {
        let mut a = UniqAccumulator::default();
        for start in (0..1_000_000).step_by(10_000) {
            a.update_batch(&[numbers(start..start + 10_000)])
                .expect("update");
        }
        assert!(a.sample.degree > 0, "thinned");
        assert!(a.sample.set.len() <= MAX_SAMPLE);
        let alone = estimate(&mut a);
        assert!((alone - 1_000_000).abs() < 20_000, "estimate {alone}");

        // Half the values again, plus 100,000 new ones: a sample of a lower degree.
        let mut b = UniqAccumulator::default();
        b.update_batch(&[numbers(500_000..1_100_000)])
            .expect("update");
        assert!(b.sample.degree < a.sample.degree + 2);
        a.merge_batch(&[state_of(&mut b)]).expect("merge");
        let merged = estimate(&mut a);
        assert!((merged - 1_100_000).abs() < 22_000, "estimate {merged}");
        assert!(a.size() < 4 << 20, "size {}", a.size());
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

    /// Rows turned into states one by one merge into the same count as the rows themselves.
    #[test]
    fn per_row_states_merge_like_rows() {
        let g = UniqGroups::default();
        let values = strings(&[Some("a"), None, Some("b"), Some("a")]);
        let states = g.convert_to_state(&[values], None).expect("states");
        let mut merged = UniqGroups::default();
        merged
            .merge_batch(&states, &[0, 0, 0, 1], 2)
            .expect("merge");
        let out = merged.evaluate(EmitTo::All).expect("evaluate");
        let out = out.as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(out.values().to_vec(), vec![2, 1]);
    }

    #[test]
    fn a_malformed_partial_state_is_an_error_not_a_panic() {
        let mut sample = Sample::default();
        assert!(sample.merge(&[1, 2, 3]).is_err());
        assert!(sample.merge(&(MAX_DEGREE + 1).to_le_bytes()).is_err());
        assert!(sample.merge(&[]).is_ok(), "the empty state");
    }
}
