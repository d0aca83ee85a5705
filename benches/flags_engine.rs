//! Flag evaluation throughput of the engine alone (criterion): one subject with person
//! properties against the 20-flag and 300-flag sets the load test uses, with the evaluation
//! plan built once per set, as the server builds it once per definitions snapshot.
//!
//! `evaluate_N_flags` runs with the definitions in cache, one evaluation after another;
//! `evaluate_300_flags_evicted` writes over a buffer larger than a core's own caches before
//! each one, as a server's request finds the definitions after the network stack and other
//! requests have run: there much of the cost is reading them from farther away.

use std::hint::black_box;
use std::time::Duration;

use corvid_flags::{
    evaluate_slots, CohortDefinition, Cohorts, EvaluationPlan, FlagDefinition, MatchContext,
    Subject,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};

/// `n` flags mixing rollouts, property filters, a multivariate flag and a cohort filter.
pub fn flag_set(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| match i % 5 {
            0 => json!({"id": i + 1, "key": format!("rollout-{i}"), "filters": {"groups": [{"rollout_percentage": 30 + i % 60}]}}),
            1 => json!({"id": i + 1, "key": format!("email-{i}"), "filters": {"groups": [{"properties": [{"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"}], "rollout_percentage": 80}]}}),
            2 => json!({"id": i + 1, "key": format!("plan-{i}"), "filters": {"groups": [{"properties": [{"key": "plan", "value": ["pro", "enterprise"], "operator": "exact", "type": "person"}, {"key": "age", "value": 18, "operator": "gte", "type": "person"}]}]}}),
            3 => json!({"id": i + 1, "key": format!("variant-{i}"), "filters": {"groups": [{"rollout_percentage": 100}], "multivariate": {"variants": [{"key": "control", "rollout_percentage": 50}, {"key": "test", "rollout_percentage": 50}]}, "payloads": {"test": "{\"x\": 1}"}}}),
            _ => json!({"id": i + 1, "key": format!("cohort-{i}"), "filters": {"groups": [{"properties": [{"key": "id", "value": 1, "type": "cohort", "operator": "in"}]}]}}),
        })
        .collect()
}

pub fn cohort() -> Value {
    json!({"id": 1, "name": "Pros", "filters": {"properties": {"type": "OR", "values": [{"type": "AND", "values": [{"key": "plan", "value": "pro", "type": "person"}, {"key": "country", "value": "US", "type": "person"}]}]}}})
}

/// More than a core's own caches hold (the definitions are then read from the shared cache
/// or memory, as a request finds them after the network stack has run).
const EVICTING_BYTES: usize = 4 << 20;

/// Writes over `buffer`, one byte a cache line, so what was cached before is gone.
fn evict(buffer: &mut [u8]) {
    for line in buffer.chunks_mut(64) {
        line[0] = line[0].wrapping_add(1);
    }
    black_box(&buffer);
}

fn bench(c: &mut Criterion) {
    let cohort: CohortDefinition = serde_json::from_value(cohort()).expect("cohort");
    let cohorts: Cohorts = [(1, cohort)].into_iter().collect();
    let ctx = MatchContext {
        now: chrono::Utc::now(),
        timezone: chrono_tz::UTC,
    };
    let subject = Subject {
        distinct_id: "user-42".into(),
        person_properties: json!({"email": "ann@corp.com", "plan": "pro", "age": 31, "country": "US", "distinct_id": "user-42"})
            .as_object()
            .cloned()
            .expect("object")
            .into(),
        ..Subject::default()
    };
    // One evaluation of a set for the subject, as a request evaluates it.
    let evaluate = |refs: &[&FlagDefinition], plan: &EvaluationPlan| {
        black_box(evaluate_slots(
            black_box(refs),
            plan,
            &subject,
            &cohorts,
            ctx,
        ))
    };
    let mut group = c.benchmark_group("flags");
    for n in [20, 300] {
        let flags: Vec<FlagDefinition> = flag_set(n)
            .into_iter()
            .map(|f| serde_json::from_value(f).expect("flag"))
            .collect();
        let refs: Vec<&FlagDefinition> = flags.iter().collect();
        let plan = EvaluationPlan::new(&refs);
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("evaluate_{n}_flags"), |b| {
            b.iter(|| evaluate(&refs, &plan))
        });
    }
    group.finish();

    // Evicted runs cost a buffer's writing each, untimed: a short measurement, 300 flags only
    // (where reading the definitions dominates).
    let mut group = c.benchmark_group("flags_evicted");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    let flags: Vec<FlagDefinition> = flag_set(300)
        .into_iter()
        .map(|f| serde_json::from_value(f).expect("flag"))
        .collect();
    let refs: Vec<&FlagDefinition> = flags.iter().collect();
    let plan = EvaluationPlan::new(&refs);
    let mut other = vec![0u8; EVICTING_BYTES];
    group.bench_function("evaluate_300_flags_evicted", |b| {
        b.iter_batched_ref(
            || evict(&mut other),
            |_| evaluate(&refs, &plan),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
