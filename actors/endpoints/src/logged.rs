//! The activity entries of endpoint and insight-variable writes: one `Endpoint` entry for the
//! endpoint's own fields, one `EndpointVersion` entry per version made or changed (a version is
//! shown as `<name> v<N>`), one `InsightVariable` entry per variable write. Entries name the
//! user the facade runs under (`corvid_activity::acting_as`).

use corvid_activity::{current_actor, ActivityEntry, Recorded};
use serde_json::Value;

use super::model::{Endpoint, EndpointVersion, InsightVariable};

pub(crate) const ENDPOINT: &str = "Endpoint";
pub(crate) const VERSION: &str = "EndpointVersion";
pub(crate) const VARIABLE: &str = "InsightVariable";

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// An endpoint's own fields (its versions have entries of their own).
fn endpoint_json(e: &Endpoint) -> Value {
    let mut v = json(e);
    if let Some(map) = v.as_object_mut() {
        map.remove("versions");
    }
    v
}

/// A version as its entries show it: whether it is materialized, not the materializer's
/// status of the moment (Corvid's bookkeeping, not the user's change).
fn version_json(v: &EndpointVersion) -> Value {
    let mut out = json(v);
    if let Some(map) = out.as_object_mut() {
        map.remove("materialization");
        map.insert("materialized".into(), v.materialization.is_some().into());
    }
    out
}

/// The entries of a write that takes `before` (`None`: a creation) to `after`.
pub(crate) fn endpoint_entries(before: Option<&Endpoint>, after: &Endpoint) -> Vec<ActivityEntry> {
    let actor = current_actor();
    let mut out: Vec<ActivityEntry> = Recorded {
        project_id: after.project_id,
        actor: &actor,
        scope: ENDPOINT,
        item_id: after.id.to_string(),
        name: Some(after.name.clone()),
        before: before.map(endpoint_json).as_ref(),
        after: &endpoint_json(after),
    }
    .entry()
    .into_iter()
    .collect();
    let old = |v: &EndpointVersion| {
        before.and_then(|b| b.versions.iter().find(|o| o.version == v.version))
    };
    // An unchanged version makes no entry (`Recorded::entry` finds no change).
    for version in &after.versions {
        let previous = old(version);
        out.extend(
            Recorded {
                project_id: after.project_id,
                actor: &actor,
                scope: VERSION,
                item_id: version.id.to_string(),
                name: Some(format!("{} v{}", after.name, version.version)),
                before: previous.map(version_json).as_ref(),
                after: &version_json(version),
            }
            .entry(),
        );
    }
    out
}

/// The entry of a variable write (`before`: `None` for a creation).
pub(crate) fn variable_entry(
    before: Option<&InsightVariable>,
    after: &InsightVariable,
) -> Vec<ActivityEntry> {
    Recorded {
        project_id: after.project_id,
        actor: &current_actor(),
        scope: VARIABLE,
        item_id: after.id.to_string(),
        name: Some(after.name.clone()),
        before: before.map(json).as_ref(),
        after: &json(after),
    }
    .entry()
    .into_iter()
    .collect()
}
