//! Survey statistics and response counts, computed by the query engine from the events the SDKs
//! send (`survey shown`, `survey dismissed`, `survey sent`).
//!
//! PostHog's counting rules: a response is one `$survey_submission_id` (partial responses send
//! `survey sent` several times per submission); dismissals after a partial response
//! (`$survey_partially_completed`) are not dismissals; dismissing people exclude people who
//! also responded; "only seen" is shown minus dismissed minus sent, floored at zero.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::model::{EventStats, SurveyStats};
use corvid_query::{utc_text, Generated};
use corvid_query::{QueryEngine, QueryError};

pub const SHOWN: &str = "survey shown";
pub const DISMISSED: &str = "survey dismissed";
pub const SENT: &str = "survey sent";

/// The period a report covers (both ends optional).
#[derive(Debug, Clone, Copy, Default)]
pub struct Period {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// `WHERE` conditions shared by every statistic: the survey, the period, real dismissals.
fn survey_events(sql: &mut Generated, survey: Uuid, period: Period, events: &[&str]) -> String {
    let names: Vec<String> = events.iter().map(|e| sql.bind(*e)).collect();
    let id_key = sql.bind("$survey_id");
    let id = sql.bind(survey.to_string());
    let partial_key = sql.bind("$survey_partially_completed");
    let dismissed = sql.bind(DISMISSED);
    let mut parts = vec![
        format!("event IN ({})", names.join(", ")),
        format!("corvid_prop(properties, {id_key}) = {id}"),
        format!(
            "(event <> {dismissed} OR coalesce(corvid_prop(properties, {partial_key}), 'false') <> 'true')"
        ),
    ];
    if let Some(from) = period.from {
        parts.push(format!("timestamp >= {}", sql.bind(utc_text(from))));
    }
    if let Some(to) = period.to {
        parts.push(format!("timestamp < {}", sql.bind(utc_text(to))));
    }
    parts.join(" AND ")
}

/// One response per submission id (events without one count each).
fn response_key(sql: &mut Generated) -> String {
    let key = sql.bind("$survey_submission_id");
    format!("coalesce(corvid_prop(properties, {key}), uuid)")
}

fn number(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_f64().map(|f| f as u64))
        .unwrap_or(0)
}

fn time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str().and_then(corvid_kernel::parse_timestamp)
}

/// Shown / dismissed / sent statistics of one survey over `period`.
pub async fn survey_stats(
    engine: &QueryEngine,
    project: u64,
    survey: Uuid,
    period: Period,
) -> Result<SurveyStats, QueryError> {
    let mut sql = Generated::default();
    let filter = survey_events(&mut sql, survey, period, &[SHOWN, DISMISSED, SENT]);
    let responses = response_key(&mut sql);
    sql.sql = format!(
        "SELECT event, count() AS total, count(DISTINCT {responses}) AS responses, \
         count(DISTINCT person_id) AS persons, min(timestamp) AS first_seen, \
         max(timestamp) AS last_seen FROM events WHERE {filter} GROUP BY event"
    );
    let out = engine.generated(project, &sql).await?;

    // People who dismissed and never responded.
    let mut only = Generated::default();
    let dismissed = survey_events(&mut only, survey, period, &[DISMISSED]);
    let sent = survey_events(&mut only, survey, period, &[SENT]);
    only.sql = format!(
        "SELECT count(DISTINCT person_id) FROM events WHERE {dismissed} AND person_id NOT IN \
         (SELECT person_id FROM events WHERE {sent})"
    );
    let dismissing_persons = engine
        .generated(project, &only)
        .await?
        .rows
        .first()
        .and_then(|r| r.first())
        .map(number);
    let mut stats = SurveyStats {
        shown: EventStats::default(),
        dismissed: EventStats::default(),
        sent: EventStats::default(),
    };
    for row in &out.rows {
        let [event, total, responses, persons, first, last] = row.as_slice() else {
            continue;
        };
        let target = match event.as_str() {
            Some(SHOWN) => &mut stats.shown,
            Some(DISMISSED) => &mut stats.dismissed,
            Some(SENT) => &mut stats.sent,
            _ => continue,
        };
        target.total_count = if event.as_str() == Some(SENT) {
            number(responses)
        } else {
            number(total)
        };
        target.unique_persons = number(persons);
        target.first_seen = time(first);
        target.last_seen = time(last);
    }
    if let Some(persons) = dismissing_persons {
        stats.dismissed.unique_persons = persons;
    }
    let shown = &mut stats.shown;
    shown.unique_persons_only_seen = shown
        .unique_persons
        .saturating_sub(stats.dismissed.unique_persons + stats.sent.unique_persons);
    shown.total_count_only_seen = shown
        .total_count
        .saturating_sub(stats.dismissed.total_count + stats.sent.total_count);
    Ok(stats)
}

/// Responses (submissions) per survey of the project since each survey's `since` time.
pub async fn response_counts(
    engine: &QueryEngine,
    project: u64,
    surveys: &[(Uuid, DateTime<Utc>)],
) -> Result<Vec<(Uuid, u64)>, QueryError> {
    let mut counts = Vec::with_capacity(surveys.len());
    for (survey, since) in surveys {
        let mut sql = Generated::default();
        let filter = survey_events(
            &mut sql,
            *survey,
            Period {
                from: Some(*since),
                to: None,
            },
            &[SENT],
        );
        let responses = response_key(&mut sql);
        sql.sql = format!("SELECT count(DISTINCT {responses}) FROM events WHERE {filter}");
        let out = engine.generated(project, &sql).await?;
        let n = out
            .rows
            .first()
            .and_then(|r| r.first())
            .map(number)
            .unwrap_or(0);
        counts.push((*survey, n));
    }
    Ok(counts)
}
