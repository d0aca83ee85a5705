//! The experiments facade over real storage, real flags and the real query engine.

use std::sync::Arc;

use chrono::{Duration, Utc};
use serde_json::{json, Value};

use super::*;
use crate::surface::testing::{detail, stored_flag};
use corvid_events::testing::event;
use corvid_events::StoredEvent;
use corvid_flags::{FlagDefinition, FlagStore};
use corvid_kernel::SledRecords;
use corvid_query::testing::Fixture;

struct Setup {
    experiments: Experiments,
    flags: Arc<FlagStore>,
    _fixture: Fixture,
    _dir: tempfile::TempDir,
}

fn setup(events: Vec<StoredEvent>) -> Setup {
    let fixture = Fixture::new(Vec::new(), events);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled");
    let (flags, owned) = crate::surface::testing::flags(&db);
    Setup {
        experiments: Experiments::new(
            Arc::new(SledRecords::open(&db, "experiments").expect("store")),
            Arc::new(SledRecords::open(&db, "experiment_holdouts").expect("store")),
            owned,
            Arc::clone(&fixture.engine),
        ),
        flags,
        _fixture: fixture,
        _dir: dir,
    }
}

fn changes(body: Value) -> ExperimentChanges {
    serde_json::from_value(body).expect("body")
}

fn flag(s: &Setup, id: i64) -> FlagDefinition {
    stored_flag(&s.flags, id)
}

#[tokio::test]
async fn creation_checks_variants_and_makes_an_inactive_multivariate_flag() {
    let s = setup(Vec::new());
    let bad = [
        (
            json!({"feature_flag_variants": [{"key": "control", "rollout_percentage": 100}]}),
            "at least two",
        ),
        (
            json!({"feature_flag_variants": [{"key": "test", "rollout_percentage": 50},
                                          {"key": "control", "rollout_percentage": 50}]}),
            "first variant",
        ),
        (
            json!({"feature_flag_variants": [{"key": "control", "rollout_percentage": 50},
                                          {"key": "test", "rollout_percentage": 40}]}),
            "sum to 100",
        ),
        (
            json!({"feature_flag_variants": [{"key": "control", "rollout_percentage": 50},
                                          {"key": "control", "rollout_percentage": 50}]}),
            "unique",
        ),
        (
            json!({"feature_flag_variants": [{"key": "control", "rollout_percentage": 50},
                                          {"key": "a b", "rollout_percentage": 50}]}),
            "letters",
        ),
    ];
    for (parameters, expected) in bad {
        let err = s
            .experiments
            .create(
                1,
                &corvid_activity::Actor::system(),
                changes(json!({"name": "E", "feature_flag_key": "e", "parameters": parameters})),
                None,
            )
            .await
            .expect_err("invalid variants");
        assert!(detail(err).contains(expected), "{expected}");
    }
    let err = s
        .experiments
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "E", "feature_flag_key": "e", "holdout_id": 9})),
            None,
        )
        .await
        .expect_err("holdout");
    assert_eq!(detail(err), "Holdout does not exist.");
    let err = s
        .experiments
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "E", "feature_flag_key": "e",
                                  "metrics": [{"metric_type": "ratio"}]})),
            None,
        )
        .await
        .expect_err("metric");
    assert!(detail(err).contains("metric_type"));

    let view = s
        .experiments
        .create(1, &corvid_activity::Actor::system(), changes(json!({"name": "Checkout", "feature_flag_key": "checkout",
            "parameters": {"feature_flag_variants": [{"key": "control"}, {"key": "a"}, {"key": "b"}],
                           "minimum_detectable_effect": 5}})), None)
        .await
        .expect("create");
    let e = &view.experiment;
    assert_eq!(e.status(), Status::Draft);
    let shares: Vec<f64> = e.variants.iter().map(|v| v.rollout_percentage).collect();
    assert_eq!(shares, vec![34.0, 33.0, 33.0]);
    let f = flag(&s, e.feature_flag_id);
    assert!(!f.active);
    assert_eq!(f.key, "checkout");
    assert_eq!(f.filters.multivariate.expect("variants").variants.len(), 3);
    assert_eq!(view.to_json()["parameters"]["minimum_detectable_effect"], 5);

    let err = s
        .experiments
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "Again", "feature_flag_key": "checkout"})),
            None,
        )
        .await
        .expect_err("flag in use");
    assert!(detail(err).starts_with("There is already a feature flag with this key."));
}

#[tokio::test]
async fn the_lifecycle_drives_the_flag() {
    let s = setup(Vec::new());
    let now = Utc::now();
    let id = s
        .experiments
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "E", "feature_flag_key": "e"})),
            None,
        )
        .await
        .expect("create")
        .experiment
        .id;
    let system = corvid_activity::Actor::system();
    let act = |action: Action| s.experiments.act(1, &system, id, action, now);
    let end = || Action::End {
        conclusion: Some("won".into()),
        comment: None,
    };
    assert!(detail(act(Action::Pause).await.expect_err("draft")).contains("a draft"));
    assert!(detail(act(end()).await.expect_err("draft")).contains("running or paused"));

    let launched = act(Action::Launch).await.expect("launch");
    assert_eq!(launched.experiment.status(), Status::Running);
    assert_eq!(launched.experiment.start_date, Some(now));
    let flag_id = launched.experiment.feature_flag_id;
    assert!(flag(&s, flag_id).active);
    assert!(act(Action::Launch).await.is_err());

    assert_eq!(
        act(Action::Pause).await.expect("pause").experiment.status(),
        Status::Paused
    );
    assert!(!flag(&s, flag_id).active);
    assert_eq!(
        act(Action::Resume)
            .await
            .expect("resume")
            .experiment
            .status(),
        Status::Running
    );
    assert!(flag(&s, flag_id).active);
    assert!(
        act(Action::Archive).await.is_err(),
        "only ended experiments are archived"
    );

    let ended = act(end()).await.expect("end");
    assert_eq!(ended.experiment.status(), Status::Stopped);
    assert_eq!(ended.experiment.conclusion.as_deref(), Some("won"));
    assert!(flag(&s, flag_id).active, "ending leaves the flag alone");

    let err = act(Action::ShipVariant {
        variant: "nope".into(),
        release_to_everyone: false,
        conclusion: None,
        comment: None,
    })
    .await
    .expect_err("unknown variant");
    assert!(detail(err).contains("control, test"));
    act(Action::ShipVariant {
        variant: "test".into(),
        release_to_everyone: true,
        conclusion: None,
        comment: None,
    })
    .await
    .expect("ship");
    let shipped = flag(&s, flag_id);
    let split: Vec<(String, f64)> = shipped
        .filters
        .multivariate
        .expect("variants")
        .variants
        .into_iter()
        .map(|v| (v.key, v.rollout_percentage))
        .collect();
    assert_eq!(split, vec![("control".into(), 0.0), ("test".into(), 100.0)]);
    assert_eq!(shipped.filters.groups.len(), 2, "catch-all group prepended");

    assert!(
        act(Action::Archive)
            .await
            .expect("archive")
            .experiment
            .archived
    );
    let listed = s
        .experiments
        .list(1, ListFilter::default())
        .await
        .expect("list");
    assert!(
        listed.is_empty(),
        "archived experiments are hidden by default"
    );
    let archived = ListFilter {
        archived: true,
        ..ListFilter::default()
    };
    assert_eq!(
        s.experiments.list(1, archived).await.expect("list").len(),
        1
    );
}

#[tokio::test]
async fn holdouts_reach_the_flags_of_their_experiments() {
    let s = setup(Vec::new());
    let h = s
        .experiments
        .create_holdout(
            1,
            &corvid_activity::Actor::system(),
            serde_json::from_value(json!({"name": "Global",
            "filters": [{"properties": [], "rollout_percentage": 10}]}))
            .expect("body"),
        )
        .await
        .expect("holdout");
    assert_eq!(
        h.to_json()["filters"][0]["variant"],
        format!("holdout-{}", h.id)
    );
    let e = s
        .experiments
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "E", "feature_flag_key": "e", "holdout_id": h.id})),
            None,
        )
        .await
        .expect("create")
        .experiment;
    let held = flag(&s, e.feature_flag_id)
        .filters
        .holdout
        .expect("holdout");
    assert_eq!((held.id, held.exclusion_percentage), (h.id as i64, 10.0));

    s.experiments
        .update_holdout(
            1,
            &corvid_activity::Actor::system(),
            h.id,
            serde_json::from_value(json!({
            "filters": [{"properties": [], "rollout_percentage": 25}]}))
            .expect("body"),
        )
        .await
        .expect("update");
    let held = flag(&s, e.feature_flag_id)
        .filters
        .holdout
        .expect("holdout");
    assert_eq!(held.exclusion_percentage, 25.0);
    let err = s
        .experiments
        .create_holdout(
            1,
            &corvid_activity::Actor::system(),
            serde_json::from_value(json!({"name": "Bad",
            "filters": [{"rollout_percentage": 150}]}))
            .expect("body"),
        )
        .await
        .expect_err("percentage");
    assert!(detail(err).contains("0-100"));

    s.experiments
        .delete_holdout(1, &corvid_activity::Actor::system(), h.id)
        .await
        .expect("delete");
    assert!(flag(&s, e.feature_flag_id).filters.holdout.is_none());
    assert_eq!(
        s.experiments
            .get(1, e.id)
            .await
            .expect("get")
            .experiment
            .holdout_id,
        None
    );
}

/// An event `minutes` after `base`.
fn at(
    base: chrono::DateTime<Utc>,
    minutes: i64,
    name: &str,
    who: &str,
    props: Value,
) -> StoredEvent {
    event(
        1,
        name,
        who,
        &(base + Duration::minutes(minutes)).to_rfc3339(),
        props,
    )
}

fn called(variant: &str) -> Value {
    json!({"$feature_flag": "exp", "$feature_flag_response": variant})
}

#[tokio::test]
async fn results_count_exposures_and_metrics_per_variant() {
    let base = Utc::now() - Duration::hours(2);
    let events = vec![
        at(base, 10, "$feature_flag_called", "u1", called("control")),
        at(base, 15, "add_to_cart", "u1", json!({})),
        at(base, 20, "purchase", "u1", json!({"amount": 10})),
        at(base, 30, "purchase", "u1", json!({"amount": 5})),
        at(base, 10, "$feature_flag_called", "u2", called("test")),
        at(base, 20, "purchase", "u2", json!({"amount": 20})),
        at(base, 30, "add_to_cart", "u2", json!({})),
        // Exposed through `$feature/<key>` on a server SDK's events.
        at(base, 10, "$pageview", "u3", json!({"$feature/exp": "test"})),
        at(
            base,
            20,
            "purchase",
            "u3",
            json!({"amount": 7, "$feature/exp": "test"}),
        ),
        // Seen in both variants.
        at(base, 10, "$feature_flag_called", "u4", called("control")),
        at(base, 20, "$feature_flag_called", "u4", called("test")),
        // A purchase before exposure does not count.
        at(base, 5, "purchase", "u5", json!({"amount": 100})),
        at(base, 10, "$feature_flag_called", "u5", called("control")),
        // Another flag; and an exposure before the launch.
        at(
            base,
            10,
            "$feature_flag_called",
            "u6",
            json!({"$feature_flag": "other", "$feature_flag_response": "test"}),
        ),
        at(base, -30, "$feature_flag_called", "u7", called("test")),
    ];
    let s = setup(events);
    let metrics = json!([
        {"metric_type": "mean", "source": {"kind": "EventsNode", "event": "purchase"}},
        {"metric_type": "mean", "source": {"kind": "EventsNode", "event": "purchase",
                                          "math": "sum", "math_property": "amount"}},
        {"metric_type": "funnel", "series": [{"event": "add_to_cart"}, {"event": "purchase"}]},
    ]);
    let id = s
        .experiments
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "E", "feature_flag_key": "exp", "metrics": metrics})),
            None,
        )
        .await
        .expect("create")
        .experiment
        .id;
    let draft = s
        .experiments
        .results(1, id, Utc::now())
        .await
        .expect("draft results");
    assert!(draft.exposures.is_empty(), "no results before launch");
    s.experiments
        .act(
            1,
            &corvid_activity::Actor::system(),
            id,
            Action::Launch,
            base,
        )
        .await
        .expect("launch");

    let r = s
        .experiments
        .results(1, id, Utc::now())
        .await
        .expect("results");
    let exposures: Vec<(&str, u64)> = r.exposures.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        exposures,
        vec![("$multiple", 1), ("control", 2), ("test", 2)]
    );

    let count = &r.metrics[0];
    assert_eq!(count.metric_type, "mean");
    assert_eq!(
        (
            count.baseline.number_of_samples,
            count.baseline.sum,
            count.baseline.sum_squares
        ),
        (2, 2.0, 4.0)
    );
    let t = &count.variant_results[0];
    assert_eq!(
        (t.key.as_str(), t.number_of_samples, t.sum, t.sum_squares),
        ("test", 2, 2.0, 2.0)
    );
    assert!(t.chance_to_win.is_some() || t.error.is_some());

    let sum = &r.metrics[1];
    assert_eq!((sum.baseline.sum, sum.baseline.sum_squares), (15.0, 225.0));
    assert_eq!(
        (
            sum.variant_results[0].sum,
            sum.variant_results[0].sum_squares
        ),
        (27.0, 449.0)
    );
    let expected = bayes::compare(
        bayes::MetricKind::Mean,
        &bayes::Sample {
            n: 2,
            sum: 15.0,
            sum_squares: 225.0,
        },
        &bayes::Sample {
            n: 2,
            sum: 27.0,
            sum_squares: 449.0,
        },
        0.95,
        false,
    )
    .expect("comparable");
    assert_eq!(
        sum.variant_results[0].chance_to_win,
        Some(expected.chance_to_win)
    );

    let funnel = &r.metrics[2];
    assert_eq!(funnel.metric_type, "funnel");
    assert_eq!(
        (funnel.baseline.number_of_samples, funnel.baseline.sum),
        (2, 1.0)
    );
    assert_eq!(
        funnel.variant_results[0].sum, 0.0,
        "u2 added to cart after buying"
    );
    assert!(funnel.variant_results[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("Normal approximation")));

    // Counting people by the first variant they saw puts u4 in control.
    s.experiments
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"exposure_criteria": {"multiple_variant_handling": "first_seen"}})),
        )
        .await
        .expect("update");
    let r = s
        .experiments
        .results(1, id, Utc::now())
        .await
        .expect("results");
    assert_eq!(r.exposures.get("control"), Some(&3));
    assert_eq!(r.exposures.get("$multiple"), None);
}
