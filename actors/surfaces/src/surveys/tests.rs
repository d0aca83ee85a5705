//! The surveys facade over real storage (sled), real flags and the real query engine.

use std::sync::Arc;

use chrono::{Duration, Utc};
use serde_json::{json, Value};

use super::*;
use crate::RecordError;
use corvid_events::testing::event;
use corvid_events::StoredEvent;
use corvid_flags::FlagStore;
use corvid_kernel::SledRecords;
use corvid_query::testing::Fixture;

struct Setup {
    surveys: Surveys,
    flags: Arc<FlagStore>,
    _fixture: Fixture,
    _dir: tempfile::TempDir,
}

fn setup(events: Vec<StoredEvent>) -> Setup {
    let fixture = Fixture::new(Vec::new(), events);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled");
    let (flags, owned) = crate::surface::testing::flags(&db);
    let store = Arc::new(SledRecords::<Survey>::open(&db, "surveys").expect("store"));
    Setup {
        surveys: Surveys::new(store, owned, Arc::clone(&fixture.engine)),
        flags,
        _fixture: fixture,
        _dir: dir,
    }
}

fn changes(body: Value) -> SurveyChanges {
    serde_json::from_value(body).expect("survey body")
}

fn nps(extra: Value) -> SurveyChanges {
    let mut body = json!({
        "name": "NPS",
        "type": "popover",
        "questions": [{"type": "rating", "question": "How likely?", "scale": 10}],
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    changes(body)
}

fn invalid_detail(err: RecordError) -> String {
    match err {
        RecordError::Invalid { detail, .. } => detail,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_survey_owns_an_internal_flag_that_follows_its_state() {
    let s = setup(Vec::new());
    let view = s
        .surveys
        .create(1, &corvid_activity::Actor::system(), nps(json!({})), None)
        .await
        .expect("create");
    let internal = view.internal_targeting_flag.clone().expect("internal flag");
    assert!(internal.definition.key.starts_with(FLAG_PREFIX));
    assert!(!internal.definition.active, "a draft survey's flag is off");
    assert!(!s.surveys.any_running(1).await.expect("running"));
    assert!(view.survey.questions[0]["id"].is_string());

    let id = view.survey.id;
    let launched = s
        .surveys
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"start_date": Utc::now().to_rfc3339()})),
        )
        .await
        .expect("launch");
    let flag = launched.internal_targeting_flag.expect("flag");
    assert!(flag.definition.active);
    assert_eq!(
        flag.definition.id, internal.definition.id,
        "the same flag is kept"
    );
    assert!(s.surveys.any_running(1).await.expect("running"));
    assert!(!s.surveys.any_running(2).await.expect("other project"));

    let public = s.surveys.public(1).await.expect("public");
    assert_eq!(public.len(), 1);
    assert_eq!(
        public[0]["internal_targeting_flag_key"],
        json!(flag.definition.key)
    );
    assert!(public[0].get("description").is_none());
    assert!(public[0].get("responses_limit").is_none());

    s.surveys
        .archive(1, &corvid_activity::Actor::system(), id)
        .await
        .expect("archive");
    assert!(s.surveys.public(1).await.expect("public").is_empty());
    let archived = s.surveys.get(1, id).await.expect("still readable");
    assert!(archived.survey.archived);
    assert!(
        !archived
            .internal_targeting_flag
            .expect("flag")
            .definition
            .active
    );
    assert_eq!(s.surveys.list(1, Some(false)).await.expect("list").len(), 0);
    assert_eq!(s.surveys.list(1, None).await.expect("list").len(), 1);
}

#[tokio::test]
async fn targeting_and_linked_flags() {
    let s = setup(Vec::new());
    let err = s
        .surveys
        .create(
            1,
            &corvid_activity::Actor::system(),
            nps(json!({"linked_flag_id": 99})),
            None,
        )
        .await
        .expect_err("unknown flag");
    assert_eq!(
        invalid_detail(err),
        "Feature Flag with this ID does not exist"
    );

    let targeting = json!({"groups": [{"properties": [{"key": "plan", "value": ["pro"],
                                                        "operator": "exact", "type": "person"}],
                                        "rollout_percentage": 100}]});
    let view = s
        .surveys
        .create(
            1,
            &corvid_activity::Actor::system(),
            nps(json!({"targeting_flag_filters": targeting})),
            None,
        )
        .await
        .expect("create");
    let flag = view.targeting_flag.expect("targeting flag");
    assert!(flag.definition.key.starts_with(FLAG_PREFIX));
    assert_eq!(flag.definition.filters.groups[0].properties[0].key, "plan");

    let err = s
        .surveys
        .update(
            1,
            &corvid_activity::Actor::system(),
            view.survey.id,
            changes(json!({"targeting_flag_filters": {"groups": [{"properties": []}]}})),
        )
        .await
        .expect_err("everyone");
    assert!(invalid_detail(err).contains("rolls out to everyone"));

    let removed = s
        .surveys
        .update(
            1,
            &corvid_activity::Actor::system(),
            view.survey.id,
            changes(json!({"remove_targeting_flag": true})),
        )
        .await
        .expect("remove");
    assert!(removed.targeting_flag.is_none());
    let gone = s
        .flags
        .flag(1, flag.definition.id)
        .expect("read")
        .expect("kept");
    assert!(gone.definition.deleted);

    let err = s
        .surveys
        .create(1, &corvid_activity::Actor::system(), nps(json!({})), None)
        .await
        .expect_err("same name");
    assert_eq!(
        invalid_detail(err),
        "There is already a survey with this name."
    );
    let err = s
        .surveys
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "X", "type": "modal", "questions": []})),
            None,
        )
        .await
        .expect_err("type");
    assert_eq!(invalid_detail(err), "\"modal\" is not a valid choice.");
}

/// Stores `survey` under `id` instead of its own, so it matches events made beforehand.
fn adopt_id(s: &Setup, survey: &mut Survey, id: Uuid) {
    let store = &s.surveys.inner.store;
    store.delete(1, &survey.id.to_string()).expect("delete");
    survey.id = id;
    store.put(1, &id.to_string(), survey).expect("put");
    s.surveys.inner.reload(1).expect("reload");
}

fn survey_event(name: &str, who: &str, survey: &Uuid, extra: Value) -> StoredEvent {
    let mut props = json!({"$survey_id": survey.to_string()});
    if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    let ts = (Utc::now() - Duration::minutes(1)).to_rfc3339();
    event(1, name, who, &ts, props)
}

#[tokio::test]
async fn stats_count_views_dismissals_and_responses_as_posthog_does() {
    let id = Uuid::now_v7();
    let other = Uuid::now_v7();
    let events = vec![
        survey_event("survey shown", "ann", &id, json!({})),
        survey_event("survey shown", "ann", &id, json!({})),
        survey_event("survey shown", "bob", &id, json!({})),
        survey_event("survey shown", "cat", &id, json!({})),
        survey_event("survey shown", "dan", &id, json!({})),
        // Ann answers in two partial steps of one submission.
        survey_event(
            "survey sent",
            "ann",
            &id,
            json!({"$survey_submission_id": "s1", "$survey_completed": false}),
        ),
        survey_event(
            "survey sent",
            "ann",
            &id,
            json!({"$survey_submission_id": "s1", "$survey_completed": true}),
        ),
        // Bob dismisses after a partial answer: not a dismissal.
        survey_event(
            "survey dismissed",
            "bob",
            &id,
            json!({"$survey_partially_completed": true}),
        ),
        survey_event("survey dismissed", "cat", &id, json!({})),
        // Ann also dismissed once: she responded, so she is not a dismissing person.
        survey_event("survey dismissed", "ann", &id, json!({})),
        survey_event(
            "survey sent",
            "eve",
            &other,
            json!({"$survey_submission_id": "s9"}),
        ),
    ];
    let s = setup(events);
    let mut survey = s
        .surveys
        .create(1, &corvid_activity::Actor::system(), nps(json!({})), None)
        .await
        .expect("create")
        .survey;
    // The survey's id must match the events': store it under the id the events name.
    adopt_id(&s, &mut survey, id);

    let (_, stats) = s
        .surveys
        .stats(1, id, Period::default())
        .await
        .expect("stats");
    assert_eq!(stats.shown.total_count, 5);
    assert_eq!(stats.shown.unique_persons, 4);
    assert_eq!(stats.sent.total_count, 1, "one submission");
    assert_eq!(stats.sent.unique_persons, 1);
    assert_eq!(
        stats.dismissed.total_count, 2,
        "partial dismissals do not count"
    );
    assert_eq!(
        stats.dismissed.unique_persons, 1,
        "people who answered are not dismissers"
    );
    assert_eq!(stats.shown.unique_persons_only_seen, 2);
    assert_eq!(stats.shown.total_count_only_seen, 2);
    assert!(stats.shown.first_seen.is_some() && stats.shown.last_seen.is_some());
    let rates = stats.rates();
    assert_eq!(rates["response_rate"], json!(20.0));
    assert_eq!(rates["unique_users_response_rate"], json!(25.0));

    let later = Period {
        from: Some(Utc::now() + Duration::hours(1)),
        to: None,
    };
    let (_, empty) = s.surveys.stats(1, id, later).await.expect("stats");
    assert_eq!(empty.shown.total_count, 0);
}

#[tokio::test]
async fn a_survey_stops_at_its_response_limit() {
    let id = Uuid::now_v7();
    let events = vec![
        survey_event(
            "survey sent",
            "ann",
            &id,
            json!({"$survey_submission_id": "a"}),
        ),
        survey_event(
            "survey sent",
            "bob",
            &id,
            json!({"$survey_submission_id": "b"}),
        ),
    ];
    let s = setup(events);
    let start = (Utc::now() - Duration::hours(1)).to_rfc3339();
    let mut survey = s
        .surveys
        .create(
            1,
            &corvid_activity::Actor::system(),
            nps(json!({"responses_limit": 3, "start_date": start})),
            None,
        )
        .await
        .expect("create")
        .survey;
    adopt_id(&s, &mut survey, id);

    assert!(s
        .surveys
        .maintain(Utc::now())
        .await
        .expect("maintain")
        .is_empty());
    assert!(s.surveys.get(1, id).await.expect("get").survey.is_running());

    s.surveys
        .update(
            1,
            &corvid_activity::Actor::system(),
            id,
            changes(json!({"responses_limit": 2})),
        )
        .await
        .expect("lower limit");
    assert_eq!(
        s.surveys.maintain(Utc::now()).await.expect("maintain"),
        vec![id]
    );
    let stopped = s.surveys.get(1, id).await.expect("get");
    assert!(stopped.survey.end_date.is_some());
    assert!(
        !stopped
            .internal_targeting_flag
            .expect("flag")
            .definition
            .active
    );
}

#[tokio::test]
async fn iterations_move_the_flag_to_the_current_iteration() {
    let s = setup(Vec::new());
    let start = Utc::now() - Duration::days(8);
    let view = s
        .surveys
        .create(
            1,
            &corvid_activity::Actor::system(),
            nps(json!({"iteration_count": 3, "iteration_frequency_days": 7,
                       "start_date": start.to_rfc3339()})),
            None,
        )
        .await
        .expect("create");
    let survey = &view.survey;
    assert_eq!(survey.iteration_start_dates.len(), 3);
    assert_eq!(survey.current_iteration, Some(2));
    let flag = view.internal_targeting_flag.expect("flag");
    assert!(flag.definition.filters.groups[0].properties[0]
        .key
        .ends_with(&format!("{}/2", survey.id)));

    s.surveys
        .maintain(Utc::now() + Duration::days(7))
        .await
        .expect("maintain");
    let moved = s.surveys.get(1, survey.id).await.expect("get");
    assert_eq!(moved.survey.current_iteration, Some(3));
    assert!(moved
        .internal_targeting_flag
        .expect("flag")
        .definition
        .filters
        .groups[0]
        .properties[0]
        .key
        .ends_with("/3"));

    let err = s
        .surveys
        .update(
            1,
            &corvid_activity::Actor::system(),
            survey.id,
            changes(json!({"iteration_count": 1})),
        )
        .await
        .expect_err("below current");
    assert!(invalid_detail(err).starts_with("Cannot change survey recurrence to 1"));
    let err = s
        .surveys
        .create(
            1,
            &corvid_activity::Actor::system(),
            changes(json!({"name": "R", "type": "api", "questions": [],
                                  "iteration_count": 2})),
            None,
        )
        .await
        .expect_err("no frequency");
    assert!(invalid_detail(err).contains("frequency"));
}
