//! Trends and retention against fixtures whose answers are worked out by hand in comments.

use serde_json::{json, Value};

use crate::testing::Fixture;
use crate::tests::standard;
use corvid_events::testing::event;

fn trends(f: &Fixture, tz: &str, q: Value) -> (Vec<Value>, bool) {
    let mut q = q;
    q["kind"] = json!("TrendsQuery");
    let out = f.query(tz, q).expect("trends run");
    (out.results, out.has_more)
}

fn data(series: &Value) -> Vec<i64> {
    series["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|v| v.as_f64().expect("number") as i64)
        .collect()
}

fn range(from: &str, to: &str) -> Value {
    json!({"date_from": from, "date_to": to})
}

#[test]
fn daily_total_zero_fills_and_labels() {
    // $pageview: Jan 1 alice+bob, Jan 2 carol+alice, Jan 3 dave (tail), Jan 4 none.
    let f = standard();
    let (r, more) = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "$pageview"}], "dateRange": range("2024-01-01", "2024-01-04")}),
    );
    assert!(!more);
    assert_eq!(r.len(), 1);
    assert_eq!(data(&r[0]), vec![2, 2, 1, 0]);
    assert_eq!(r[0]["count"], json!(5));
    assert_eq!(r[0]["label"], json!("$pageview"));
    assert_eq!(r[0]["days"][0], json!("2024-01-01"));
    assert_eq!(r[0]["labels"][0], json!("1-Jan-2024"));
}

#[test]
fn math_dau_sum_and_percentiles() {
    let f = standard();
    let q = |math: &str, event: Value, prop: Value| {
        trends(
            &f,
            "UTC",
            json!({"series": [{"event": event, "math": math, "math_property": prop}],
                   "dateRange": range("2024-01-01", "2024-01-03")}),
        )
        .0
    };
    // All events, distinct persons per day: {alice, bob}, {carol, alice}, {dave}.
    assert_eq!(data(&q("dau", Value::Null, Value::Null)[0]), vec![2, 2, 1]);
    // Purchases: alice 100 on Jan 2, dave 7 on Jan 3.
    assert_eq!(
        data(&q("sum", json!("purchase"), json!("price"))[0]),
        vec![0, 100, 7]
    );
    assert_eq!(
        data(&q("max", json!("purchase"), json!("price"))[0]),
        vec![0, 100, 7]
    );
    // $pageview prices Jan 1: 10 and "20" → median 15; p90 = 10 + 0.9 × 10 = 19.
    let median = q("median", json!("$pageview"), json!("price"));
    assert_eq!(median[0]["data"][0], json!(15));
    let p90 = q("p90", json!("$pageview"), json!("price"));
    assert_eq!(p90[0]["data"][0], json!(19));
}

/// `$pageview` trends over Jan 1–3 broken down by `$browser` with `breakdown`'s extra fields:
/// whether "Other" exists, and each series as (breakdown value, daily counts) in order.
fn pageviews_by_browser(f: &Fixture, breakdown: Value) -> (bool, Vec<(Value, Vec<i64>)>) {
    let mut filter = json!({"breakdown": "$browser", "breakdown_type": "event"});
    if let (Some(filter), Some(extra)) = (filter.as_object_mut(), breakdown.as_object()) {
        filter.extend(extra.clone());
    }
    let (r, more) = trends(
        f,
        "UTC",
        json!({"series": [{"event": "$pageview"}], "dateRange": range("2024-01-01", "2024-01-03"),
               "breakdownFilter": filter}),
    );
    let by = r
        .iter()
        .map(|s| (s["breakdown_value"].clone(), data(s)))
        .collect();
    (more, by)
}

#[test]
fn breakdown_with_other_and_null_buckets() {
    let f = standard();
    assert_eq!(
        pageviews_by_browser(&f, json!({})),
        (
            false,
            vec![
                (json!("Chrome"), vec![1, 1, 1]),
                (json!("Firefox"), vec![1, 0, 0]),
                (json!("Safari"), vec![0, 1, 0]),
            ]
        )
    );
    // Limit 1: Chrome stays, Firefox and Safari fold into Other.
    assert_eq!(
        pageviews_by_browser(&f, json!({"breakdown_limit": 1})),
        (
            true,
            vec![
                (json!("Chrome"), vec![1, 1, 1]),
                (json!("$$_posthog_breakdown_other_$$"), vec![1, 1, 0]),
            ]
        )
    );
    // Limit 2: Firefox and Safari tie on one pageview each; the tie goes by value, so
    // Firefox stays and Safari alone is Other (listed last).
    assert_eq!(
        pageviews_by_browser(&f, json!({"breakdown_limit": 2})),
        (
            true,
            vec![
                (json!("Chrome"), vec![1, 1, 1]),
                (json!("Firefox"), vec![1, 0, 0]),
                (json!("$$_posthog_breakdown_other_$$"), vec![0, 1, 0]),
            ]
        )
    );
    // Dave's purchase has no $browser: the null bucket.
    let (r, _) = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "purchase"}], "dateRange": range("2024-01-01", "2024-01-03"),
               "breakdownFilter": {"breakdowns": [{"property": "$browser", "type": "event"}]}}),
    );
    let values: Vec<&Value> = r.iter().map(|s| &s["breakdown_value"]).collect();
    assert_eq!(
        values,
        vec![&json!("$$_posthog_breakdown_null_$$"), &json!("Chrome")]
    );
}

#[test]
fn person_breakdown_and_several_breakdowns() {
    let f = standard();
    let (r, _) = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "signup"}], "dateRange": range("2024-01-01", "2024-01-01"),
               "breakdownFilter": {"breakdowns": [
                   {"property": "email", "type": "person"},
                   {"property": "$browser", "type": "event"}]}}),
    );
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0]["breakdown_value"],
        json!(["bob@example.com", "Firefox"])
    );
    assert_eq!(r[0]["label"], json!("bob@example.com::Firefox"));
}

#[test]
fn property_filters_apply() {
    let f = standard();
    let (r, _) = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "$pageview", "properties": [{"key": "$browser", "value": ["Chrome"], "operator": "exact", "type": "event"}]}],
               "properties": [{"key": "price", "value": 5, "operator": "gt"}],
               "dateRange": range("2024-01-01", "2024-01-03")}),
    );
    // Chrome pageviews with price > 5: alice Jan 1 (10) only.
    assert_eq!(data(&r[0]), vec![1, 0, 0]);
}

#[test]
fn hour_week_and_month_intervals() {
    let f = standard();
    let hourly = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "$pageview"}], "interval": "hour",
               "dateRange": range("2024-01-01T10:00:00", "2024-01-01T12:00:00")}),
    )
    .0;
    // 10:00 alice, 11:30 bob, 12:xx none.
    assert_eq!(data(&hourly[0]), vec![1, 1, 0]);
    assert_eq!(hourly[0]["days"][0], json!("2024-01-01 10:00:00"));
    let weekly = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "$pageview"}], "interval": "week",
               "dateRange": range("2024-01-01", "2024-01-10")}),
    )
    .0;
    // Weeks start Sunday: Dec 31 (Jan 1–3 events: 5) and Jan 7.
    assert_eq!(weekly[0]["days"], json!(["2023-12-31", "2024-01-07"]));
    assert_eq!(data(&weekly[0]), vec![5, 0]);
    let monthly = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "$pageview"}], "interval": "month",
               "dateRange": range("2024-01-01", "2024-02-10")}),
    )
    .0;
    assert_eq!(data(&monthly[0]), vec![5, 0]);
    assert_eq!(monthly[0]["labels"], json!(["Jan 2024", "Feb 2024"]));
}

#[test]
fn project_timezone_moves_events_across_days() {
    // 03:00Z on Jan 2 is 22:00 on Jan 1 in New York; 06:00Z is 01:00 on Jan 2.
    let f = Fixture::new(
        vec![
            event(1, "e", "a", "2024-01-02T03:00:00Z", json!({})),
            event(1, "e", "b", "2024-01-02T06:00:00Z", json!({})),
        ],
        vec![],
    );
    let q = json!({"series": [{"event": "e"}], "dateRange": range("2024-01-01", "2024-01-02")});
    assert_eq!(data(&trends(&f, "UTC", q.clone()).0[0]), vec![0, 2]);
    assert_eq!(data(&trends(&f, "America/New_York", q).0[0]), vec![1, 1]);
}

#[test]
fn weekly_active_users_use_a_seven_day_window() {
    // One user active on Jan 1 only: counted for Jan 1–7, not from Jan 8.
    let f = Fixture::new(
        vec![event(1, "e", "a", "2024-01-01T12:00:00Z", json!({}))],
        vec![],
    );
    let (r, _) = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "e", "math": "weekly_active"}], "dateRange": range("2024-01-01", "2024-01-09")}),
    );
    assert_eq!(data(&r[0]), vec![1, 1, 1, 1, 1, 1, 1, 0, 0]);
}

#[test]
fn total_value_display_aggregates_the_whole_range() {
    let f = standard();
    let (r, _) = trends(
        &f,
        "UTC",
        json!({"series": [{"event": "$pageview", "math": "dau"}], "dateRange": range("2024-01-01", "2024-01-03"),
               "trendsFilter": {"display": "BoldNumber"}}),
    );
    // alice, bob, carol, dave: alice on two days counts once.
    assert_eq!(r[0]["aggregated_value"], json!(4));
    assert_eq!(r[0]["data"], json!([]));
}

/// u1: Jan 1, 2, 4 · u2: Jan 1, 3 · u3: Jan 2, 3 · u4: Jan 3.
fn retention_fixture() -> Fixture {
    let visits = [
        ("u1", "2024-01-01"),
        ("u1", "2024-01-02"),
        ("u1", "2024-01-04"),
        ("u2", "2024-01-01"),
        ("u2", "2024-01-03"),
        ("u3", "2024-01-02"),
        ("u3", "2024-01-03"),
        ("u4", "2024-01-03"),
    ];
    Fixture::new(
        visits
            .iter()
            .map(|(u, d)| {
                let plan = if *u == "u4" { "free" } else { "pro" };
                event(
                    1,
                    "$pageview",
                    u,
                    &format!("{d}T12:00:00Z"),
                    json!({"plan": plan}),
                )
            })
            .collect(),
        vec![],
    )
}

fn retention(f: &Fixture, filter: Value, extra: Value) -> Vec<Value> {
    let mut q = json!({"kind": "RetentionQuery", "retentionFilter": filter, "dateRange": {"date_to": "2024-01-04"}});
    if let (Some(q), Some(extra)) = (q.as_object_mut(), extra.as_object()) {
        q.extend(extra.clone());
    }
    f.query("UTC", q).expect("retention run").results
}

fn counts(cohort: &Value) -> Vec<u64> {
    cohort["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| v["count"].as_u64().expect("count"))
        .collect()
}

#[test]
fn recurring_retention() {
    let f = retention_fixture();
    let r = retention(&f, json!({"period": "Day", "totalIntervals": 4}), json!({}));
    let got: Vec<Vec<u64>> = r.iter().map(counts).collect();
    assert_eq!(
        got,
        vec![vec![2, 1, 1, 1], vec![2, 1, 1], vec![3, 0], vec![1]]
    );
    assert_eq!(r[0]["label"], json!("Day 0"));
    assert_eq!(r[0]["date"], json!("2024-01-01T00:00:00Z"));
    assert_eq!(r[0]["values"][3]["label"], json!("Day 3"));
}

#[test]
fn first_time_retention() {
    let f = retention_fixture();
    let r = retention(
        &f,
        json!({"period": "Day", "totalIntervals": 4, "retentionType": "retention_first_time"}),
        json!({}),
    );
    let got: Vec<Vec<u64>> = r.iter().map(counts).collect();
    assert_eq!(
        got,
        vec![vec![2, 1, 1, 1], vec![1, 1, 0], vec![1, 0], vec![0]]
    );
}

#[test]
fn cumulative_retention() {
    let f = retention_fixture();
    let r = retention(
        &f,
        json!({"period": "Day", "totalIntervals": 4, "cumulative": true}),
        json!({}),
    );
    // Jan 1 cohort: u1 last returns at k=3, u2 at k=2.
    assert_eq!(counts(&r[0]), vec![2, 2, 2, 1]);
}

#[test]
fn retention_breakdown() {
    let f = retention_fixture();
    let r = retention(
        &f,
        json!({"period": "Day", "totalIntervals": 4}),
        json!({"breakdownFilter": {"breakdown": "plan", "breakdown_type": "event"}}),
    );
    // pro (u1–u3) first, then free (u4: only the Jan 3 cohort).
    assert_eq!(r.len(), 8);
    assert_eq!(r[0]["breakdown_value"], json!("pro"));
    assert_eq!(counts(&r[2]), vec![2, 0]);
    assert_eq!(r[4]["breakdown_value"], json!("free"));
    assert_eq!(counts(&r[6]), vec![1, 0]);
}

#[test]
fn week_retention_groups_days() {
    let f = retention_fixture();
    let r = retention(
        &f,
        json!({"period": "Week", "totalIntervals": 2}),
        json!({}),
    );
    // Weeks from Sunday Dec 24 and Dec 31: all four users are in the second week.
    assert_eq!(
        r.iter().map(counts).collect::<Vec<_>>(),
        vec![vec![0, 0], vec![4]]
    );
}

#[test]
fn bad_insights_are_rejected() {
    let f = standard();
    for q in [
        json!({"kind": "TrendsQuery", "series": []}),
        json!({"kind": "TrendsQuery", "series": [{"event": "x", "math": "sum"}]}),
        json!({"kind": "TrendsQuery", "series": [{"event": "x", "math": "nope"}]}),
        json!({"kind": "TrendsQuery", "series": [{"event": "x"}], "dateRange": {"date_from": "whenever"}}),
        json!({"kind": "RetentionQuery", "retentionFilter": {"period": "Fortnight"}}),
        json!({"kind": "RetentionQuery", "retentionFilter": {"totalIntervals": 0}}),
    ] {
        assert!(f.query("UTC", q.clone()).is_err(), "{q}");
    }
}
