//! Outcomes of person-property filters shared by the flags of a set that repeat them.
//!
//! A flag set often repeats one filter across many flags ("email icontains @corp.com" for
//! internal users, one country list, one sign-up date). For one request such a filter has one
//! outcome: it reads the same person properties at the same time. The plan gives every
//! distinct person filter of the set a slot, and a request matches each slot once.

use std::cell::Cell;
use std::collections::HashMap;

use super::super::model::FlagDefinition;
use super::super::properties::PropertyFilter;

/// The slot of a filter whose outcome is not shared (group, cohort and flag filters: their
/// outcome depends on more than the person's properties, or is memoized elsewhere).
pub(super) const NO_SLOT: u32 = u32::MAX;

/// An outcome not matched yet this request.
const UNKNOWN: u8 = 0;
const MATCHED: u8 = 1;
const UNMATCHED: u8 = 2;

/// Per flag, per condition, per filter: the filter's slot. Built once per definitions snapshot.
///
/// Kept as three dense arrays rather than a vector of boxed slices per condition: a request
/// reads every flag's slots, and with hundreds of flags one heap block per flag and per
/// condition was a cache miss each, a large share of evaluation's own time.
#[derive(Debug, Clone, Default)]
pub(super) struct FilterSlots {
    /// Flag `i`'s conditions are `conditions[first_condition[i]..first_condition[i + 1]]`.
    first_condition: Vec<u32>,
    /// Per condition, its filters' slots as a range of `slots`.
    conditions: Vec<(u32, u32)>,
    slots: Vec<u32>,
    distinct: usize,
}

impl FilterSlots {
    /// Slots for the person filters of `flags`' conditions: filters equal in every field
    /// (key, operator, value, type, negation, group type) share one.
    pub(super) fn new(flags: &[&FlagDefinition]) -> FilterSlots {
        let mut interned: HashMap<String, u32> = HashMap::new();
        let mut built = FilterSlots::default();
        for flag in flags {
            built
                .first_condition
                .push(index_u32(built.conditions.len()));
            for condition in &flag.filters.groups {
                let start = index_u32(built.slots.len());
                built.slots.extend(
                    condition
                        .properties
                        .iter()
                        .map(|filter| slot_of(filter, &mut interned)),
                );
                built.conditions.push((start, index_u32(built.slots.len())));
            }
        }
        built
            .first_condition
            .push(index_u32(built.conditions.len()));
        built.distinct = interned.len();
        built
    }

    /// A request's memo: every outcome unknown.
    pub(super) fn outcomes(&self) -> Vec<Cell<u8>> {
        vec![Cell::new(UNKNOWN); self.distinct]
    }

    /// The memo of flag `index`'s conditions over `outcomes`.
    pub(super) fn for_flag<'a>(&'a self, index: usize, outcomes: &'a [Cell<u8>]) -> FilterMemo<'a> {
        let range = |at: usize| self.first_condition.get(at).map(|&c| c as usize);
        let conditions = match (range(index), range(index + 1)) {
            (Some(start), Some(end)) => self.conditions.get(start..end).unwrap_or_default(),
            _ => &[],
        };
        FilterMemo {
            conditions,
            slots: &self.slots,
            outcomes,
        }
    }
}

/// An index into the slot arrays. A set never has 2^32 filters (snapshots are bounded far
/// below); saturating keeps the arrays consistent if one ever did (its slots read as empty).
fn index_u32(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

fn slot_of(filter: &PropertyFilter, interned: &mut HashMap<String, u32>) -> u32 {
    if matches!(filter.kind.as_deref(), Some("group" | "cohort" | "flag")) {
        return NO_SLOT;
    }
    // The serialized filter is its identity: equal text, equal filter (the compiled matcher
    // is never serialized).
    let Ok(text) = serde_json::to_string(filter) else {
        return NO_SLOT;
    };
    let next = u32::try_from(interned.len()).unwrap_or(NO_SLOT);
    *interned.entry(text).or_insert(next)
}

/// The shared outcomes as one flag's evaluation sees them. The default shares nothing (each
/// filter is matched where it stands).
#[derive(Debug, Clone, Copy, Default)]
pub struct FilterMemo<'a> {
    /// The flag's conditions, as ranges of `slots`.
    conditions: &'a [(u32, u32)],
    slots: &'a [u32],
    outcomes: &'a [Cell<u8>],
}

impl<'a> FilterMemo<'a> {
    /// The slots of the flag's condition `index` (empty: none shared).
    pub(super) fn condition(&self, index: usize) -> &'a [u32] {
        self.conditions
            .get(index)
            .and_then(|&(start, end)| self.slots.get(start as usize..end as usize))
            .unwrap_or_default()
    }

    /// The outcome of the filter in `slot`, matched by `compute` the first time this request.
    pub(super) fn outcome(&self, slot: u32, compute: impl FnOnce() -> bool) -> bool {
        let Some(cell) = usize::try_from(slot)
            .ok()
            .and_then(|s| self.outcomes.get(s))
        else {
            return compute();
        };
        match cell.get() {
            MATCHED => true,
            UNMATCHED => false,
            _ => {
                let matched = compute();
                cell.set(if matched { MATCHED } else { UNMATCHED });
                matched
            }
        }
    }
}
