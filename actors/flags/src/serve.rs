//! Serving `/flags`: the request's project, GeoIP, runtime and filters, the organization's
//! quota, the stored person and groups (read once, under a deadline: a late read does not fail
//! the request, it fails only the flags that needed it), evaluation and usage counting.
//!
//! When the quota is known to be unlimited and the stored data is in memory, the whole request
//! is answered without leaving the calling thread.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::coverage::{covered, PersonKeys};
use super::evaluate::{
    cached_groups, evaluate, load_stored, request_only, selected_flags, FlagsOutcome, StoredData,
    StoredGroups,
};
use super::properties::MatchContext;
use super::request::{detect_runtime, FlagRequest};
use super::Flags;
use corvid_kernel::{blocking, StoreError};
use corvid_persons::PersonStore;
use corvid_tenancy::{Project, Tenancy};

/// Where a `/flags` request came from.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub user_agent: Option<String>,
    /// Whether `Origin`, `Referer`, `Sec-Fetch-Mode` or `Sec-Fetch-Site` were sent (a browser).
    pub browser_headers: bool,
    /// The client IP (`X-Forwarded-For`, else the peer), for GeoIP.
    pub ip: Option<IpAddr>,
}

/// What a `/flags` request gets.
pub enum Served {
    Evaluated(FlagsOutcome),
    /// The organization used up its monthly flag-request quota: no flags, not an error.
    QuotaLimited,
}

impl Flags {
    /// Evaluates a decoded request for `project` at `now`.
    pub async fn serve(
        &self,
        project: &Project,
        mut request: FlagRequest,
        caller: Caller,
        now: DateTime<Utc>,
    ) -> Result<Served, StoreError> {
        if let (Some(geoip), false, Some(ip)) = (&self.geoip, request.geoip_disable, caller.ip) {
            geoip.enrich(ip, &mut request.person_properties);
        }
        let runtime = detect_runtime(caller.user_agent.as_deref(), caller.browser_headers);
        let ctx = MatchContext {
            now,
            timezone: match project.timezone.as_str() {
                "UTC" => chrono_tz::UTC,
                other => other.parse().unwrap_or(chrono_tz::UTC),
            },
        };
        let project_id = project.id;
        let snapshot = match self.store.cached_snapshot(project_id) {
            Some(snapshot) => snapshot,
            None => {
                let store = Arc::clone(&self.store);
                blocking(move || store.snapshot(project_id)).await?
            }
        };
        let selected = selected_flags(&snapshot, &request, runtime);
        let group_types = if request.groups.is_empty() {
            None
        } else {
            self.persons.cached_group_types(project_id)
        };
        // The stored person and groups are read only when the request does not decide every
        // flag itself.
        let needs_data = !selected.is_empty()
            && !request.disable_flags
            && !covered(
                snapshot.read_keys.as_ref(),
                &request,
                group_types.as_deref().map(Vec::as_slice),
            );
        let unread = || request_only(&request, group_types.as_deref().map(Vec::as_slice));
        let org = project.organization_id;

        // Fast path: an organization known to be unlimited and the groups needed in memory;
        // a person memory does not hold is read in a batch with the thread's other requests.
        let fast = match self.tenancy.cached_flag_quota(org) {
            Some(None) if needs_data => {
                cached_groups(&self.persons, project_id, &request).map(Fast::Groups)
            }
            Some(None) => Some(Fast::Stored(unread())),
            _ => None,
        };
        let stored = match fast {
            Some(Fast::Stored(stored)) => Some(stored),
            Some(Fast::Groups(groups)) => {
                self.person_with(project_id, &snapshot.person_keys, &request, groups)
                    .await
            }
            None => {
                let unread = (!needs_data).then(unread);
                let request = Arc::new(request.clone());
                match self
                    .load_under_deadline(project_id, org, unread, request, now)
                    .await
                {
                    Loaded::QuotaLimited => return Ok(Served::QuotaLimited),
                    Loaded::Data(stored) => stored,
                }
            }
        };
        let evaluated = evaluate(snapshot, &selected, stored.as_ref(), &request, ctx);
        if evaluated.billable() {
            self.persons.count_flag_request(project_id, now);
        }
        Ok(Served::Evaluated(evaluated))
    }

    /// The stored data with the person from memory, else read through the batched reader
    /// under the deadline (late or failed: `None`, and the flags that needed it fail, as for
    /// any stored read).
    ///
    /// A person in memory is decoded with only the properties the flags read (`keys`).
    async fn person_with(
        &self,
        project_id: u64,
        keys: &PersonKeys,
        request: &FlagRequest,
        groups: StoredGroups,
    ) -> Option<StoredData> {
        let distinct_id = request.distinct_id.as_deref().unwrap_or_default();
        let wanted = |key: &str| keys.contains(key);
        if let Some(person) = self
            .persons
            .cached_person_reading(project_id, distinct_id, &wanted)
        {
            return Some(StoredData { person, groups });
        }
        let deadline = self.settings.stored_read_deadline;
        let started = Instant::now();
        let read = self.persons.read_person(project_id, distinct_id);
        match tokio::time::timeout(deadline, read).await {
            Ok(Ok(person)) => late(started, deadline, project_id, StoredData { person, groups }),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, project_id, "stored person unavailable");
                None
            }
            Err(_) => {
                tracing::warn!(project_id, "stored person not read within the deadline");
                None
            }
        }
    }

    /// One trip to the blocking pool, under the deadline: the quota check and the stored
    /// person and groups (unless `unread` holds what the request alone supplies). Past the
    /// deadline (or on a storage error) the request is still answered, with the flags that
    /// needed stored data marked failed.
    async fn load_under_deadline(
        &self,
        project_id: u64,
        org: Uuid,
        unread: Option<StoredData>,
        request: Arc<FlagRequest>,
        now: DateTime<Utc>,
    ) -> Loaded {
        let (persons, tenancy) = (Arc::clone(&self.persons), self.tenancy.clone());
        let load = blocking(move || {
            if quota_exceeded(&tenancy, &persons, org, now)? {
                return Ok(None);
            }
            let stored = match unread {
                Some(unread) => unread,
                None => load_stored(&persons, project_id, &request)?,
            };
            Ok::<_, StoreError>(Some(stored))
        });
        let deadline = self.settings.stored_read_deadline;
        let started = Instant::now();
        match tokio::time::timeout(deadline, load).await {
            Ok(Ok(Some(stored))) => Loaded::Data(late(started, deadline, project_id, stored)),
            Ok(Ok(None)) => Loaded::QuotaLimited,
            Ok(Err(err)) => {
                tracing::warn!(error = %err, project_id, "stored flag data unavailable");
                Loaded::Data(None)
            }
            Err(_) => {
                tracing::warn!(project_id, "stored flag data not read within the deadline");
                Loaded::Data(None)
            }
        }
    }
}

/// What the fast path has before evaluation.
enum Fast {
    /// Everything evaluation needs.
    Stored(StoredData),
    /// The request's stored groups; the person is still to be read.
    Groups(StoredGroups),
}

enum Loaded {
    Data(Option<StoredData>),
    QuotaLimited,
}

/// An answer that took longer than the deadline is as late as no answer.
fn late(
    started: Instant,
    deadline: Duration,
    project_id: u64,
    stored: StoredData,
) -> Option<StoredData> {
    if started.elapsed() > deadline {
        tracing::warn!(project_id, "stored flag data read after the deadline");
        None
    } else {
        Some(stored)
    }
}

/// Whether the organization used up its monthly flag-request quota: the flag requests of all
/// its projects this month against `feature_flag_request_quota` (none = unlimited). Blocking.
pub(crate) fn quota_exceeded(
    tenancy: &Tenancy,
    persons: &PersonStore,
    org: Uuid,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let Some(quota) = tenancy.flag_quota_blocking(org)? else {
        return Ok(false);
    };
    let month = now.format("%Y-%m").to_string();
    let mut used = 0;
    for project in tenancy.projects_of_organization_blocking(org)? {
        used += persons
            .usage(project.id)?
            .iter()
            .filter(|row| row.month == month)
            .map(|row| row.flag_requests)
            .sum::<u64>();
    }
    Ok(used >= quota)
}
