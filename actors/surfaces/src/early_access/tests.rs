//! The early-access facade over real storage and real flags.

use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::surface::testing::{detail, stored_flag};
use corvid_flags::FlagStore;
use corvid_kernel::SledRecords;

struct Setup {
    eaf: EarlyAccess,
    flags: Arc<FlagStore>,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled");
    let (flags, owned) = crate::surface::testing::flags(&db);
    let store =
        Arc::new(SledRecords::<Feature>::open(&db, "early_access_features").expect("store"));
    Setup {
        eaf: EarlyAccess::new(store, owned),
        flags,
        _dir: dir,
    }
}

fn changes(body: Value) -> FeatureChanges {
    serde_json::from_value(body).expect("body")
}

fn flag(s: &Setup, id: i64) -> FlagDefinition {
    stored_flag(&s.flags, id)
}

#[tokio::test]
async fn a_new_feature_gets_its_own_flag_that_honours_enrollment_in_active_stages() {
    let s = setup();
    let view = s
        .eaf
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "Dark Mode!", "stage": "beta", "description": "d"})),
        )
        .await
        .expect("create");
    let f = view.flag.expect("flag").definition;
    assert_eq!(f.key, "dark-mode");
    assert_eq!(f.name, "Feature Flag for Feature Dark Mode!");
    assert_eq!(f.filters.groups[0].rollout_percentage, Some(0.0));
    assert_eq!(f.filters.feature_enrollment, Some(true));

    let id = view.feature.id;
    s.eaf
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"stage": "concept"})),
        )
        .await
        .expect("demote");
    assert_eq!(flag(&s, f.id).filters.feature_enrollment, None);
    s.eaf
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"stage": "alpha"})),
        )
        .await
        .expect("promote");
    assert_eq!(flag(&s, f.id).filters.feature_enrollment, Some(true));

    let err = s
        .eaf
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"rollout_to_all": true})),
        )
        .await
        .expect_err("not GA");
    assert!(detail(err).contains("general-availability"));
    s.eaf
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"stage": "general-availability", "rollout_to_all": true})),
        )
        .await
        .expect("GA");
    let released = flag(&s, f.id);
    assert_eq!(released.filters.feature_enrollment, None);
    assert_eq!(released.filters.groups.len(), 1);
    assert_eq!(released.filters.groups[0].rollout_percentage, Some(100.0));
    assert!(released.filters.groups[0].properties.is_empty());

    let err = s
        .eaf
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "dark mode", "stage": "beta"})),
        )
        .await
        .expect_err("key taken");
    assert_eq!(
        detail(err),
        "There is already a feature flag with this key."
    );

    s.eaf
        .delete(1, &corvid_activity::Actor::system(), id)
        .await
        .expect("delete");
    assert!(matches!(
        s.eaf.get(1, id).await,
        Err(RecordError::NotFound { .. })
    ));
    assert!(!flag(&s, f.id).deleted, "the flag stays");
}

#[tokio::test]
async fn only_boolean_person_flags_not_yet_linked_can_be_linked() {
    let s = setup();
    let save = |key: &str, filters: Value| {
        let filters: FlagFilters = serde_json::from_value(filters).expect("filters");
        s.flags
            .create_flag(
                1,
                &corvid_activity::Actor::system(),
                FlagDefinition::new(key.into(), key.into(), filters, true),
            )
            .expect("flag")
            .definition
            .id
    };
    let plain = save("plain", json!({"groups": [{"rollout_percentage": 30}]}));
    let multi = save(
        "multi",
        json!({"groups": [], "multivariate": {"variants": [
            {"key": "a", "rollout_percentage": 50}, {"key": "b", "rollout_percentage": 50}]}}),
    );
    let grouped = save(
        "grouped",
        json!({"groups": [], "aggregation_group_type_index": 0}),
    );

    let cases = [
        (999, "Feature Flag with this ID does not exist"),
        (
            multi,
            "Multivariate feature flags are not supported for Early Access Features.",
        ),
        (
            grouped,
            "Group-based feature flags are not supported for Early Access Features.",
        ),
    ];
    for (id, expected) in cases {
        let err = s
            .eaf
            .create(
                1,
                &corvid_activity::Actor::system(),
                changes(json!({"name": "X", "stage": "beta", "feature_flag_id": id})),
            )
            .await
            .expect_err("refused");
        assert_eq!(detail(err), expected);
    }
    let linked = s
        .eaf
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "X", "stage": "alpha", "feature_flag_id": plain})),
        )
        .await
        .expect("link");
    let f = linked.flag.expect("flag").definition;
    assert_eq!(
        f.filters.groups[0].rollout_percentage,
        Some(30.0),
        "own groups kept"
    );
    assert_eq!(f.filters.feature_enrollment, Some(true));
    let err = s
        .eaf
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "Y", "stage": "beta", "feature_flag_id": plain})),
        )
        .await
        .expect_err("taken");
    assert_eq!(
        detail(err),
        "Linked feature flag plain already has a feature attached to it."
    );
    let err = s
        .eaf
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "Z", "stage": "gamma"})),
        )
        .await
        .expect_err("stage");
    assert!(detail(err).starts_with("\"gamma\" is not a valid stage"));
}

#[tokio::test]
async fn the_public_list_filters_by_stage_beta_by_default() {
    let s = setup();
    for (name, stage) in [
        ("A", "beta"),
        ("B", "alpha"),
        ("C", "concept"),
        ("D", "beta"),
    ] {
        s.eaf
            .create(
                1,
                &corvid_activity::Actor::system(),
                changes(json!({"name": name, "stage": stage, "payload": {"n": name}})),
            )
            .await
            .expect("create");
    }
    let beta = s.eaf.public(1, Vec::new()).await.expect("public");
    let names: Vec<&str> = beta.iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(names, vec!["A", "D"]);
    assert_eq!(beta[0]["flagKey"], "a");
    assert_eq!(beta[0]["payload"], json!({"n": "A"}));
    assert_eq!(beta[0]["stage"], "beta");
    assert!(beta[0].get("documentationUrl").is_some());
    let some = s
        .eaf
        .public(1, vec![Stage::Alpha, Stage::Concept])
        .await
        .expect("public");
    assert_eq!(some.len(), 2);
    assert!(s.eaf.public(2, Vec::new()).await.expect("other").is_empty());
}

#[test]
fn slugs_match_django() {
    assert_eq!(slugify("  Hello, World!  "), "hello-world");
    assert_eq!(slugify("a -- b"), "a-b");
    assert_eq!(slugify("new_checkout v2"), "new_checkout-v2");
}
