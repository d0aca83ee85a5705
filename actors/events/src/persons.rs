//! Person and group processing of one event, following PostHog's ingestion pipeline
//! (`PostHog/posthog:nodejs/src/worker/ingestion/`, the person and group steps).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::normalize::CapturedEvent;
use super::property_keys::{PROPERTY_EDITING_EVENTS, PROPERTY_EDITING_KEYS};
use corvid_kernel::StoreError;
use corvid_persons::{CompactPerson, Group, Person, PersonStore, Touched};

/// Namespace of deterministic person ids: UUIDv5 of `"{project_id}:{distinct_id}"`.
pub const PERSONLESS_NAMESPACE: Uuid = Uuid::from_u128(0x932979b4_65c3_4424_8467_0b66ec27bc22);

/// Events that only make sense with person processing; dropped when it is off.
const PERSON_ONLY_EVENTS: [&str; 4] = [
    "$identify",
    "$create_alias",
    "$merge_dangerously",
    "$groupidentify",
];

/// What to store with the event.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Keep {
        person_id: Uuid,
        /// The person after this event; `None` when personless (stored as `{}`).
        person: Option<KnownPerson>,
        /// `$group_0..4` keys.
        groups: [Option<String>; 5],
    },
    /// The event is not stored (a person-only event with person processing off).
    Drop,
}

/// A person an event is stored with.
#[derive(Debug, Clone, PartialEq)]
pub enum KnownPerson {
    /// Read from memory and left compact. Most events change nothing about their person, so
    /// the shard recognises it by its encoded properties and reuses the JSON text it made for
    /// them before, without decoding them.
    Compact(CompactPerson),
    /// Written by this event, or read from storage.
    Decoded(Arc<Person>),
}

impl KnownPerson {
    pub fn id(&self) -> Uuid {
        match self {
            KnownPerson::Compact(person) => person.id(),
            KnownPerson::Decoded(person) => person.id,
        }
    }

    /// The person's properties; `None` when a compact record does not decode (never written
    /// so: read the person from storage then).
    pub fn properties(&self, store: &PersonStore) -> Option<Map<String, Value>> {
        match self {
            KnownPerson::Compact(person) => store.decode(person).map(|p| p.properties),
            KnownPerson::Decoded(person) => Some(person.properties.clone()),
        }
    }

    /// Whether two reads of one person certainly have the same properties (without decoding
    /// a compact one); `false` may still be the same.
    pub fn same_properties(&self, other: &KnownPerson) -> bool {
        match (self, other) {
            (KnownPerson::Compact(a), KnownPerson::Compact(b)) => {
                a.encoded_properties() == b.encoded_properties()
            }
            (KnownPerson::Decoded(a), KnownPerson::Decoded(b)) => {
                Arc::ptr_eq(a, b) || a.properties == b.properties
            }
            _ => false,
        }
    }
}

/// The deterministic person id of a distinct id.
pub fn person_uuid(project_id: u64, distinct_id: &str) -> Uuid {
    Uuid::new_v5(
        &PERSONLESS_NAMESPACE,
        format!("{project_id}:{distinct_id}").as_bytes(),
    )
}

/// Whether a distinct id may take part in a merge (PostHog's blocklist).
pub fn is_illegal_distinct_id(id: &str) -> bool {
    let trimmed = id.trim();
    let unquoted = trimmed.trim_matches(|c| c == '"' || c == '\'');
    if unquoted.is_empty() {
        return true;
    }
    const CASE_INSENSITIVE: [&str; 10] = [
        "anonymous",
        "guest",
        "distinctid",
        "distinct_id",
        "id",
        "not_authenticated",
        "email",
        "undefined",
        "true",
        "false",
    ];
    const CASE_SENSITIVE: [&str; 7] = [
        "[object Object]",
        "NaN",
        "None",
        "none",
        "null",
        "0",
        "undefined",
    ];
    let lower = unquoted.to_ascii_lowercase();
    CASE_INSENSITIVE.contains(&lower.as_str()) || CASE_SENSITIVE.contains(&unquoted)
}

/// Whether [`process_event`] may change `event.properties`: only `$process_person_profile`
/// (removed, or the personless clean-up), `$groups` (adds `$group_N`) and `$groupidentify`
/// (drops `$set`, …) do. Otherwise the text serialized when the event was accepted is stored
/// as it is. Keep in step with every properties mutation below.
pub fn may_change_properties(event: &CapturedEvent) -> bool {
    PROPERTY_EDITING_EVENTS.contains(&event.event.as_str())
        || PROPERTY_EDITING_KEYS
            .iter()
            .any(|key| event.properties.contains_key(*key))
}

/// Applies person and group processing to `event` (mutating its properties as ingestion does)
/// and says what to store.
pub fn process_event(
    store: &PersonStore,
    project_id: u64,
    event: &mut CapturedEvent,
) -> Result<Outcome, StoreError> {
    let personless = matches!(
        event.properties.get("$process_person_profile"),
        Some(Value::Bool(false))
    );
    if personless {
        return personless_outcome(store, project_id, event);
    }
    if matches!(
        event.properties.get("$process_person_profile"),
        Some(Value::Bool(true))
    ) {
        event.properties.remove("$process_person_profile");
    }

    if let Some(outcome) = read_only_outcome(store, project_id, event)? {
        return Ok(outcome);
    }
    let _writer = store.lock();
    // Nodes sharing the records (a cluster) take turns per person, so none overwrites
    // another's read-modify-write.
    store.exclusively(project_id, touched(event), || {
        write_person(store, project_id, event)
    })
}

/// What the write of `event` may change: its distinct id, the one it merges with, the group
/// it identifies (the persons of those distinct ids are added by the store).
fn touched(event: &CapturedEvent) -> Vec<Touched> {
    let mut out = vec![Touched::DistinctId(event.distinct_id.clone())];
    let other = match event.event.as_str() {
        "$identify" => event
            .properties
            .get("$anon_distinct_id")
            .and_then(value_as_id),
        "$create_alias" | "$merge_dangerously" => {
            event.properties.get("alias").and_then(value_as_id)
        }
        _ => None,
    };
    out.extend(other.map(Touched::DistinctId));
    if event.event == "$groupidentify" {
        let text = |key: &str| event.properties.get(key).and_then(value_as_id);
        if let (Some(group_type), Some(key)) = (text("$group_type"), text("$group_key")) {
            out.push(Touched::Group { group_type, key });
        }
    }
    out
}

/// The locked path of [`process_event`]: merges, group identification, and the person write.
fn write_person(
    store: &PersonStore,
    project_id: u64,
    event: &mut CapturedEvent,
) -> Result<Outcome, StoreError> {
    let distinct_id = event.distinct_id.clone();
    match event.event.as_str() {
        "$identify" => {
            if let Some(Value::String(anon)) = event.properties.get("$anon_distinct_id").cloned() {
                merge(
                    store,
                    project_id,
                    &distinct_id,
                    &anon,
                    false,
                    event.timestamp,
                )?;
            }
        }
        "$create_alias" | "$merge_dangerously" => {
            let dangerous = event.event == "$merge_dangerously";
            if let Some(alias) = event.properties.get("alias").and_then(value_as_id) {
                merge(
                    store,
                    project_id,
                    &distinct_id,
                    &alias,
                    dangerous,
                    event.timestamp,
                )?;
            }
        }
        _ => {}
    }

    let groups = if event.event == "$groupidentify" {
        for key in ["$set", "$set_once", "$unset"] {
            event.properties.remove(key);
        }
        group_identify(store, project_id, event)?;
        resolve_groups(store, project_id, event)?
    } else {
        resolve_groups(store, project_id, event)?
    };

    let (mut person, is_new) = match store.person_for_update(project_id, &distinct_id)? {
        Some(person) => (person, false),
        None => (
            Person {
                id: person_uuid(project_id, &distinct_id),
                created_at: event.timestamp,
                properties: Map::new(),
                is_identified: false,
                version: 0,
                distinct_ids: vec![distinct_id.clone()],
            },
            true,
        ),
    };
    let mut changed = apply_property_updates(&mut person.properties, &event.properties);
    if matches!(
        event.event.as_str(),
        "$identify" | "$create_alias" | "$merge_dangerously"
    ) && !person.is_identified
    {
        person.is_identified = true;
        changed = true;
    }
    let person = if changed || is_new {
        person.version += 1;
        // An existing person was found by this id: its ids already point at it.
        let new_ids = if is_new {
            vec![distinct_id]
        } else {
            Vec::new()
        };
        store.put_person_adding(project_id, person, new_ids)?
    } else {
        Arc::new(person)
    };
    Ok(Outcome::Keep {
        person_id: person.id,
        person: Some(KnownPerson::Decoded(person)),
        groups,
    })
}

/// The common case without the writer lock: an existing person, no merge, no property change,
/// only known group types. `None` means a write is needed (take the locked path).
fn read_only_outcome(
    store: &PersonStore,
    project_id: u64,
    event: &mut CapturedEvent,
) -> Result<Option<Outcome>, StoreError> {
    if PERSON_ONLY_EVENTS.contains(&event.event.as_str()) {
        return Ok(None);
    }
    let person = match store.cached_compact_person(project_id, &event.distinct_id) {
        Some(Some(person)) => KnownPerson::Compact(person),
        Some(None) => return Ok(None),
        None => match store.load_person(project_id, &event.distinct_id)? {
            Some(person) => KnownPerson::Decoded(person),
            None => return Ok(None),
        },
    };
    let mut resolved = Vec::new();
    if let Some(Value::Object(groups)) = event.properties.get("$groups") {
        for (group_type, key) in groups {
            let Some(key) = value_as_id(key) else {
                continue;
            };
            match store.group_type_index(project_id, group_type)? {
                Some(index) => resolved.push((index, key)),
                None => return Ok(None),
            }
        }
    }
    let updates = ["$set", "$set_once", "$unset"];
    if updates.iter().any(|k| event.properties.contains_key(*k)) {
        let Some(mut properties) = person.properties(store) else {
            return Ok(None);
        };
        if apply_property_updates(&mut properties, &event.properties) {
            return Ok(None);
        }
    }
    let mut columns: [Option<String>; 5] = Default::default();
    for (index, key) in resolved {
        event
            .properties
            .insert(format!("$group_{index}"), Value::String(key.clone()));
        columns[usize::from(index)] = Some(key);
    }
    Ok(Some(Outcome::Keep {
        person_id: person.id(),
        person: Some(person),
        groups: columns,
    }))
}

fn personless_outcome(
    store: &PersonStore,
    project_id: u64,
    event: &mut CapturedEvent,
) -> Result<Outcome, StoreError> {
    if PERSON_ONLY_EVENTS.contains(&event.event.as_str()) {
        return Ok(Outcome::Drop);
    }
    for key in ["$set", "$set_once", "$unset"] {
        event.properties.remove(key);
    }
    for i in 0..5 {
        event.properties.remove(&format!("$group_{i}"));
    }
    let person_id = store
        .person_id_by_distinct_id(project_id, &event.distinct_id)?
        .unwrap_or_else(|| person_uuid(project_id, &event.distinct_id));
    Ok(Outcome::Keep {
        person_id,
        person: None,
        groups: Default::default(),
    })
}

fn value_as_id(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `$set_once`, then `$set`, then `$unset`. Returns whether anything changed.
pub fn apply_property_updates(
    person: &mut Map<String, Value>,
    properties: &Map<String, Value>,
) -> bool {
    let mut changed = false;
    if let Some(Value::Object(set_once)) = properties.get("$set_once") {
        for (k, v) in set_once {
            if !person.contains_key(k) {
                person.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    if let Some(Value::Object(set)) = properties.get("$set") {
        for (k, v) in set {
            if person.get(k) != Some(v) {
                person.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    let unset: Vec<String> = match properties.get("$unset") {
        Some(Value::Array(keys)) => keys
            .iter()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect(),
        Some(Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    };
    for k in unset {
        changed |= person.remove(&k).is_some();
    }
    changed
}

/// Merges `other`'s person into `target`'s. Caller holds the writer lock.
fn merge(
    store: &PersonStore,
    project_id: u64,
    target: &str,
    other: &str,
    dangerous: bool,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    if target == other {
        return Ok(());
    }
    if is_illegal_distinct_id(target) || is_illegal_distinct_id(other) {
        tracing::debug!(
            project_id,
            target,
            other,
            "cannot_merge_with_illegal_distinct_id"
        );
        return Ok(());
    }
    let t = store.person_for_update(project_id, target)?;
    let o = store.person_for_update(project_id, other)?;
    match (t, o) {
        (None, None) => {
            let person = Person {
                id: person_uuid(project_id, target),
                created_at: at,
                properties: Map::new(),
                is_identified: true,
                version: 1,
                distinct_ids: vec![target.to_string(), other.to_string()],
            };
            let new_ids = person.distinct_ids.clone();
            store.put_person_adding(project_id, person, new_ids)?;
        }
        (Some(mut person), None) | (None, Some(mut person)) => {
            let mut new_ids = Vec::new();
            for did in [target, other] {
                if !person.distinct_ids.iter().any(|d| d == did) {
                    person.distinct_ids.push(did.to_string());
                    new_ids.push(did.to_string());
                }
            }
            person.is_identified = true;
            person.version += 1;
            store.put_person_adding(project_id, person, new_ids)?;
        }
        (Some(t), Some(o)) if t.id == o.id => {}
        (Some(mut t), Some(o)) => {
            if o.is_identified && !dangerous {
                tracing::debug!(project_id, target, other, "cannot_merge_already_identified");
                return Ok(());
            }
            let mut properties = o.properties.clone();
            properties.extend(t.properties);
            t.properties = properties;
            t.created_at = t.created_at.min(o.created_at);
            t.is_identified = true;
            t.version = t.version.max(o.version) + 1;
            let mut new_ids = Vec::new();
            for did in o.distinct_ids {
                if !t.distinct_ids.contains(&did) {
                    t.distinct_ids.push(did.clone());
                    new_ids.push(did);
                }
            }
            store.put_person_adding(project_id, t, new_ids)?;
            store.delete_person(project_id, o.id)?;
        }
    }
    Ok(())
}

/// `$groupidentify`: upsert the group with `$group_set`. Caller holds the writer lock.
fn group_identify(
    store: &PersonStore,
    project_id: u64,
    event: &CapturedEvent,
) -> Result<(), StoreError> {
    let Some(Value::String(group_type)) = event.properties.get("$group_type") else {
        return Ok(());
    };
    let Some(group_key) = event.properties.get("$group_key").and_then(value_as_id) else {
        return Ok(());
    };
    let Some(index) = store.ensure_group_type(project_id, group_type)? else {
        tracing::debug!(project_id, group_type, "group type limit reached");
        return Ok(());
    };
    let set = match event.properties.get("$group_set") {
        Some(Value::Object(set)) => set.clone(),
        _ => Map::new(),
    };
    let mut group = store
        .group(project_id, index, &group_key)?
        .unwrap_or(Group {
            group_type_index: index,
            group_type: group_type.clone(),
            group_key: group_key.clone(),
            properties: Map::new(),
            created_at: event.timestamp,
        });
    group.properties.extend(set);
    group.created_at = group.created_at.min(event.timestamp);
    store.put_group(project_id, &group)
}

/// `$groups: {type: key}` → `$group_<index>` properties and columns. Caller holds the lock.
fn resolve_groups(
    store: &PersonStore,
    project_id: u64,
    event: &mut CapturedEvent,
) -> Result<[Option<String>; 5], StoreError> {
    let mut columns: [Option<String>; 5] = Default::default();
    let Some(Value::Object(groups)) = event.properties.get("$groups").cloned() else {
        return Ok(columns);
    };
    for (group_type, key) in groups {
        let Some(key) = value_as_id(&key) else {
            continue;
        };
        if let Some(index) = store.ensure_group_type(project_id, &group_type)? {
            event
                .properties
                .insert(format!("$group_{index}"), Value::String(key.clone()));
            columns[usize::from(index)] = Some(key);
        }
    }
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::property_keys::PROCESSING_READS;
    use serde_json::json;

    fn store() -> (tempfile::TempDir, PersonStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        (
            dir,
            PersonStore::open(&db, corvid_persons::PersonFiles::temporary()).expect("store"),
        )
    }

    fn event(name: &str, did: &str, props: Value) -> CapturedEvent {
        CapturedEvent {
            uuid: Uuid::now_v7(),
            event: name.into(),
            distinct_id: did.into(),
            properties: props.as_object().cloned().expect("object"),
            uuid_made_here: false,
            properties_json: None,
            timestamp: Utc::now(),
            created_at: Utc::now(),
        }
    }

    fn keep(
        store: &PersonStore,
        outcome: Outcome,
    ) -> (Uuid, Map<String, Value>, [Option<String>; 5]) {
        match outcome {
            Outcome::Keep {
                person_id,
                person,
                groups,
            } => (
                person_id,
                person
                    .map(|p| p.properties(store).expect("decodes"))
                    .unwrap_or_default(),
                groups,
            ),
            Outcome::Drop => panic!("event was dropped"),
        }
    }

    /// The shard stores the text serialized at acceptance whenever `may_change_properties` says
    /// no: processing must then leave the properties exactly as they were.
    #[test]
    fn properties_change_only_where_announced() {
        let (_d, s) = store();
        let cases = [
            (
                "$pageview",
                "u1",
                json!({"$current_url": "/a", "$set": {"plan": "pro"}}),
            ),
            (
                "$identify",
                "u1",
                json!({"$anon_distinct_id": "anon-1", "$set_once": {"a": 1}}),
            ),
            ("$create_alias", "u1", json!({"alias": "u1-alias"})),
            ("$merge_dangerously", "u2", json!({"alias": "u1"})),
            ("$identify", "null", json!({"$anon_distinct_id": "u1"})),
            ("x", "u3", json!({"$unset": ["plan"], "$group_0": "manual"})),
            (
                "$groupidentify",
                "u1",
                json!({"$group_type": "company", "$group_key": "acme", "$group_set": {"n": 1}, "$set": {"x": 1}}),
            ),
            ("x", "u1", json!({"$groups": {"company": "acme"}})),
            ("x", "u1", json!({"$groups": {"unknown_type": "k"}})),
            (
                "x",
                "u4",
                json!({"$process_person_profile": true, "$set": {"y": 2}}),
            ),
            (
                "x",
                "u5",
                json!({"$process_person_profile": false, "$set": {"y": 2}, "$group_1": "g"}),
            ),
        ];
        let mut announced = 0;
        for (name, did, props) in cases {
            let mut e = event(name, did, props);
            let before = e.properties.clone();
            let may_change = may_change_properties(&e);
            process_event(&s, 1, &mut e).expect("processed");
            if may_change {
                announced += 1;
            } else {
                assert_eq!(e.properties, before, "{name} {did}");
            }
        }
        assert_eq!(announced, 5);
    }

    /// The pipeline keeps only [`PROCESSING_READS`] of events whose properties processing does
    /// not change: processing must then reach the same persons as with every key present.
    #[test]
    fn processing_reads_only_the_announced_keys() {
        let (_d1, full) = store();
        let (_d2, slim) = store();
        let cases = [
            ("$pageview", "anon-1", json!({"$set": {"seen": true}})),
            (
                "$identify",
                "u1",
                json!({"$anon_distinct_id": "anon-1", "$set_once": {"a": 1}}),
            ),
            ("$create_alias", "u1", json!({"alias": "u1-alias"})),
            ("$pageview", "u1-alias", json!({"$unset": ["a"]})),
            ("$merge_dangerously", "u2", json!({"alias": "u1"})),
            (
                "x",
                "u2",
                json!({"$set": {"plan": "pro"}, "$set_once": {"plan": "free"}}),
            ),
            ("x", "u3", json!({})),
        ];
        for (name, did, props) in cases {
            let mut props = props.as_object().cloned().expect("object");
            for (k, v) in [
                ("$current_url", json!("/a")),
                ("alias_not", json!("x")),
                ("n", json!(1)),
            ] {
                props.insert(k.into(), v);
            }
            let mut a = event(name, did, Value::Object(props.clone()));
            assert!(!may_change_properties(&a), "{name}");
            let mut b = a.clone();
            b.properties
                .retain(|k, _| PROCESSING_READS.contains(&k.as_str()));
            let got_a = keep(&full, process_event(&full, 1, &mut a).expect("full"));
            let got_b = keep(&slim, process_event(&slim, 1, &mut b).expect("slim"));
            assert_eq!(got_a, got_b, "{name} {did}");
        }
        let persons = |s: &PersonStore| {
            let mut all: Vec<(Vec<String>, Map<String, Value>, bool)> = s
                .persons(1)
                .expect("persons")
                .into_iter()
                .map(|p| (p.distinct_ids, p.properties, p.is_identified))
                .collect();
            all.sort_by(|x, y| x.0.cmp(&y.0));
            all
        };
        assert_eq!(persons(&full), persons(&slim));
        assert_eq!(persons(&full).len(), 2);
    }

    #[test]
    fn set_once_then_set_then_unset() {
        let (_d, s) = store();
        let mut e = event(
            "x",
            "u1",
            json!({"$set_once": {"a": 1, "b": 1}, "$set": {"b": 2, "c": 3}}),
        );
        let (_, props, _) = keep(&s, process_event(&s, 1, &mut e).expect("ok"));
        assert_eq!(Value::Object(props), json!({"a": 1, "b": 2, "c": 3}));
        let mut e = event("x", "u1", json!({"$set_once": {"a": 9}, "$unset": ["c"]}));
        let (_, props, _) = keep(&s, process_event(&s, 1, &mut e).expect("ok"));
        assert_eq!(Value::Object(props), json!({"a": 1, "b": 2}));
    }

    #[test]
    fn identify_merges_anonymous_into_identified_but_not_two_identified() {
        let (_d, s) = store();
        let mut anon = event("$pageview", "anon-1", json!({"$set": {"seen": true}}));
        let (anon_person, _, _) = keep(&s, process_event(&s, 1, &mut anon).expect("ok"));
        let mut ident = event(
            "$identify",
            "user-1",
            json!({"$anon_distinct_id": "anon-1", "$set": {"email": "a@b"}}),
        );
        let (person, props, _) = keep(&s, process_event(&s, 1, &mut ident).expect("ok"));
        assert_eq!(person, anon_person, "user-1 joins the anonymous person");
        assert_eq!(Value::Object(props), json!({"seen": true, "email": "a@b"}));
        let p = s.person(1, person).expect("read").expect("exists");
        assert!(p.is_identified);
        assert_eq!(
            s.person_id_by_distinct_id(1, "user-1").expect("read"),
            Some(person)
        );

        // Another identified person is not merged without $merge_dangerously.
        let mut other = event("$identify", "user-2", json!({}));
        let (p2, _, _) = keep(&s, process_event(&s, 1, &mut other).expect("ok"));
        let mut alias = event("$create_alias", "user-1", json!({"alias": "user-2"}));
        process_event(&s, 1, &mut alias).expect("ok");
        assert_eq!(
            s.person_id_by_distinct_id(1, "user-2").expect("read"),
            Some(p2)
        );
        let mut force = event("$merge_dangerously", "user-1", json!({"alias": "user-2"}));
        process_event(&s, 1, &mut force).expect("ok");
        assert_eq!(
            s.person_id_by_distinct_id(1, "user-2").expect("read"),
            Some(person)
        );
        assert!(
            s.person(1, p2).expect("read").is_none(),
            "source person deleted"
        );
    }

    #[test]
    fn illegal_ids_never_merge() {
        let (_d, s) = store();
        for bad in [
            "undefined",
            "null",
            "0",
            "anonymous",
            "  ",
            "\"guest\"",
            "NaN",
            "[object Object]",
        ] {
            assert!(is_illegal_distinct_id(bad), "{bad}");
            let mut e = event("$identify", "real-user", json!({"$anon_distinct_id": bad}));
            process_event(&s, 1, &mut e).expect("ok");
            assert_eq!(
                s.person_id_by_distinct_id(1, bad).expect("read"),
                None,
                "{bad}"
            );
        }
        assert!(!is_illegal_distinct_id("user-42"));
    }

    #[test]
    fn personless_events_use_deterministic_ids_and_drop_person_only_events() {
        let (_d, s) = store();
        let mut e = event(
            "$pageview",
            "ghost",
            json!({"$process_person_profile": false, "$set": {"x": 1}, "$group_0": "g"}),
        );
        let (id, props, _) = keep(&s, process_event(&s, 7, &mut e).expect("ok"));
        assert_eq!(id, Uuid::new_v5(&PERSONLESS_NAMESPACE, b"7:ghost"));
        assert!(props.is_empty());
        assert!(!e.properties.contains_key("$set") && !e.properties.contains_key("$group_0"));
        assert!(
            s.person_by_distinct_id(7, "ghost").expect("read").is_none(),
            "no person created"
        );
        for name in PERSON_ONLY_EVENTS {
            let mut e = event(name, "ghost", json!({"$process_person_profile": false}));
            assert_eq!(
                process_event(&s, 7, &mut e).expect("ok"),
                Outcome::Drop,
                "{name}"
            );
        }
    }

    #[test]
    fn groups_map_to_indexes_up_to_five_types() {
        let (_d, s) = store();
        let mut gi = event(
            "$groupidentify",
            "u",
            json!({"$group_type": "company", "$group_key": "acme", "$group_set": {"plan": "pro"}}),
        );
        process_event(&s, 1, &mut gi).expect("ok");
        let g = s.group(1, 0, "acme").expect("read").expect("exists");
        assert_eq!(Value::Object(g.properties), json!({"plan": "pro"}));
        let mut e = event("x", "u", json!({"$groups": {"company": "acme", "team": 5}}));
        let (_, _, cols) = keep(&s, process_event(&s, 1, &mut e).expect("ok"));
        assert_eq!(cols[0].as_deref(), Some("acme"));
        assert_eq!(cols[1].as_deref(), Some("5"));
        assert_eq!(e.properties["$group_0"], "acme");
        for t in ["a", "b", "c", "d"] {
            let mut e = event("x", "u", json!({"$groups": {t: "k"}}));
            process_event(&s, 1, &mut e).expect("ok");
        }
        assert_eq!(
            s.group_types(1).expect("read").len(),
            5,
            "a sixth type is not mapped"
        );
    }

    /// Two nodes (separate pools on one PostgreSQL) writing one person at once.
    #[test]
    fn concurrent_writes_of_one_person_on_two_nodes_lose_nothing() {
        use corvid_kernel::pg::testing::TestPostgres;
        use corvid_persons::PgPersons;

        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[corvid_kernel::MIGRATIONS, corvid_persons::MIGRATIONS]);
        let nodes: Vec<PersonStore> = (0..2)
            .map(|_| PersonStore::new(Arc::new(PgPersons::new(Arc::new(db.connect())))))
            .collect();
        // Each node sets its own keys on one person and merges its own anonymous id into it.
        std::thread::scope(|s| {
            for (n, node) in nodes.iter().enumerate() {
                s.spawn(move || {
                    for i in 0..15 {
                        let mut e =
                            event("$set", "user", json!({"$set": {format!("n{n}_k{i}"): i}}));
                        process_event(node, 1, &mut e).expect("set");
                        let mut id = event(
                            "$identify",
                            "user",
                            json!({"$anon_distinct_id": format!("anon-{n}-{i}")}),
                        );
                        process_event(node, 1, &mut id).expect("identify");
                    }
                });
            }
        });
        let persons = nodes[0].persons(1).expect("persons");
        assert_eq!(persons.len(), 1, "one person: {persons:?}");
        let person = &persons[0];
        for n in 0..2 {
            for i in 0..15 {
                assert_eq!(
                    person.properties.get(&format!("n{n}_k{i}")),
                    Some(&json!(i)),
                    "no lost property"
                );
                assert!(person.distinct_ids.contains(&format!("anon-{n}-{i}")));
            }
        }
        let mut ids = person.distinct_ids.clone();
        ids.sort();
        ids.dedup();
        assert_eq!(
            ids.len(),
            person.distinct_ids.len(),
            "no duplicate distinct id"
        );
        assert_eq!(ids.len(), 31);

        // Node 1's cached copy is dropped when node 0 changes the person.
        let cached = nodes[1].load_person(1, "user").expect("load");
        assert!(cached.is_some());
        let mut e = event("$set", "user", json!({"$set": {"late": true}}));
        process_event(&nodes[0], 1, &mut e).expect("set");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let seen = loop {
            let person = match nodes[1].cached_person(1, "user") {
                Some(p) => p,
                None => nodes[1].load_person(1, "user").expect("load"),
            };
            let late = person.is_some_and(|p| p.properties.get("late") == Some(&json!(true)));
            if late || std::time::Instant::now() > deadline {
                break late;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(seen, "node 1 serves node 0's change within a second");
    }
}
