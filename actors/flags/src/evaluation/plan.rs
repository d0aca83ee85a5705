//! Evaluation order: flags that depend on other flags are evaluated after them, once per snapshot.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};

use super::super::model::{Cohorts, FlagDefinition};
use super::super::properties::MatchContext;
use super::memo::FilterSlots;
use super::{
    evaluate_flag_into, not_enabled, reason, CohortMemo, Environment, FlagValues, ReasonCode,
};
use crate::{Evaluation, Subject};

/// The ids a flag depends on (flag filters in its conditions).
pub fn dependencies(flag: &FlagDefinition) -> Vec<i64> {
    flag.filters
        .groups
        .iter()
        .chain(flag.filters.super_groups.iter())
        .flat_map(|c| c.properties.iter())
        .filter(|f| f.kind.as_deref() == Some("flag"))
        .filter_map(|f| f.key.parse().ok())
        .collect()
}

/// How a flag is evaluated within a set: its place in dependency order, and whether its
/// dependencies are usable (`missing`: unknown or broken; `cyclic`: part of a cycle).
#[derive(Debug, Clone, Default)]
pub struct EvaluationPlan {
    /// (flag index, dependencies usable, every dependency exists) in evaluation order.
    order: Vec<(usize, bool, bool)>,
    /// Per flag index, whether other flags depend on it: only those values are kept during
    /// evaluation. By index, so a request asks no hash per flag (a set of ids cost a SipHash
    /// each, 3 % of `/flags` with 300 flags).
    depended_on: Vec<bool>,
    /// How many flags others depend on: the room a request's map of their values is made
    /// with, so it is not grown (rehashed) flag by flag.
    depended_on_count: usize,
    /// Where each person filter's outcome is kept during a request (identical filters share).
    filters: FilterSlots,
}

impl EvaluationPlan {
    /// Orders `flags` so dependencies come first; computed once per definitions snapshot.
    pub fn new(flags: &[&FlagDefinition]) -> EvaluationPlan {
        let by_id: HashMap<i64, usize> = flags.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
        let deps: Vec<Vec<i64>> = flags.iter().map(|f| dependencies(f)).collect();
        // 0 = unvisited, 1 = in progress, 2 = done; `ok[i]` is known once done.
        let mut state = vec![0u8; flags.len()];
        let mut ok = vec![false; flags.len()];
        let mut order = Vec::with_capacity(flags.len());
        fn visit(
            i: usize,
            deps: &[Vec<i64>],
            by_id: &HashMap<i64, usize>,
            state: &mut [u8],
            ok: &mut [bool],
            order: &mut Vec<(usize, bool, bool)>,
        ) -> bool {
            match state[i] {
                2 => return ok[i],
                1 => return false,
                _ => {}
            }
            state[i] = 1;
            let mut usable = true;
            let mut all_exist = true;
            for dep in &deps[i] {
                match by_id.get(dep) {
                    Some(&j) => usable &= visit(j, deps, by_id, state, ok, order),
                    None => {
                        usable = false;
                        all_exist = false;
                    }
                }
            }
            state[i] = 2;
            ok[i] = usable;
            order.push((i, usable, all_exist));
            usable
        }
        for i in 0..flags.len() {
            if state[i] == 0 {
                visit(i, &deps, &by_id, &mut state, &mut ok, &mut order);
            }
        }
        let wanted: HashSet<i64> = deps.into_iter().flatten().collect();
        let depended_on: Vec<bool> = flags.iter().map(|f| wanted.contains(&f.id)).collect();
        EvaluationPlan {
            order,
            depended_on_count: depended_on.iter().filter(|&&d| d).count(),
            depended_on,
            filters: FilterSlots::new(flags),
        }
    }
}

/// Evaluates every flag of `flags` in dependency order. Flags whose dependencies are missing
/// or cyclic come back `missing_dependency`; cycles also report an error (second value).
pub fn evaluate_all(
    flags: &[&FlagDefinition],
    subject: &Subject,
    cohorts: &Cohorts,
    ctx: MatchContext,
) -> (Vec<Evaluation>, bool) {
    let (slots, errors) = evaluate_slots(flags, &EvaluationPlan::new(flags), subject, cohorts, ctx);
    (slots.into_iter().flatten().collect(), errors)
}

/// [`evaluate_all`] with a precomputed plan for the same `flags`, as one slot per flag (same
/// index as `flags`), every slot filled, so a caller can blank the flags it does not return
/// without moving the others.
pub fn evaluate_slots<F: Borrow<FlagDefinition>>(
    flags: &[F],
    plan: &EvaluationPlan,
    subject: &Subject,
    cohorts: &Cohorts,
    ctx: MatchContext,
) -> (Vec<Option<Evaluation>>, bool) {
    let mut values =
        FlagValues::with_capacity_and_hasher(plan.depended_on_count, Default::default());
    let cohort_memo = CohortMemo::default();
    let outcomes = plan.filters.outcomes();
    // Made empty slot by slot: `vec![None; n]` cloned a whole `None` evaluation into each.
    let mut results: Vec<Option<Evaluation>> = (0..flags.len()).map(|_| None).collect();
    let mut errors = false;
    for &(i, usable, all_exist) in &plan.order {
        let Some(slot) = results.get_mut(i) else {
            continue;
        };
        // Evaluated in its slot (see `evaluate_flag_into`).
        let evaluation = slot.insert(not_enabled(reason(ReasonCode::MissingDependency, None)));
        if usable {
            let env = Environment {
                cohorts,
                flag_values: &values,
                ctx,
                cohort_memo: &cohort_memo,
                filters: plan.filters.for_flag(i, &outcomes),
            };
            evaluate_flag_into(flags[i].borrow(), subject, &env, evaluation);
        } else {
            // Every dependency exists, yet they are unusable: a cycle (an error).
            errors |= all_exist;
        }
        if plan.depended_on.get(i).copied().unwrap_or(false) {
            values.insert(flags[i].borrow().id, evaluation.value());
        }
    }
    for slot in results.iter_mut().filter(|r| r.is_none()) {
        *slot = Some(not_enabled(reason(ReasonCode::MissingDependency, None)));
    }
    (results, errors)
}
