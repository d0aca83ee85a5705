//! How many queries one credential runs at once (`query.max_concurrent_per_credential`):
//! past it, [`QueryError::CredentialBusy`] (429). The node's own bound and memory pool are the
//! engine's; this keeps one key from taking all of them. Only statements that really run count:
//! an endpoint answered from its cache or its materialized result takes no place.

use std::sync::Arc;

use dashmap::DashMap;

use super::QueryError;

/// Counts running queries per credential; an entry exists only while its queries run.
#[derive(Clone)]
pub struct QueryGate {
    max: usize,
    running: Arc<DashMap<String, usize>>,
}

/// One running query; dropping it frees its place.
pub struct QueryTicket {
    key: String,
    running: Arc<DashMap<String, usize>>,
}

impl QueryGate {
    pub fn new(max_per_credential: usize) -> QueryGate {
        QueryGate {
            max: max_per_credential.max(1),
            running: Arc::default(),
        }
    }

    /// A place for one more query of `credential`, or `CredentialBusy` when it runs its
    /// maximum already.
    pub fn enter(&self, credential: &str) -> Result<QueryTicket, QueryError> {
        let mut count = self.running.entry(credential.to_string()).or_insert(0);
        if *count >= self.max {
            return Err(QueryError::CredentialBusy);
        }
        *count += 1;
        Ok(QueryTicket {
            key: credential.to_string(),
            running: Arc::clone(&self.running),
        })
    }

    /// Credentials with queries running now.
    pub fn credentials_running(&self) -> usize {
        self.running.len()
    }
}

impl Drop for QueryTicket {
    fn drop(&mut self) {
        self.running.remove_if_mut(&self.key, |_, count| {
            *count = count.saturating_sub(1);
            *count == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_runs_at_most_its_share_and_entries_go_when_done() {
        let gate = QueryGate::new(2);
        let a = gate.enter("k1").expect("first");
        let b = gate.enter("k1").expect("second");
        assert!(matches!(gate.enter("k1"), Err(QueryError::CredentialBusy)));
        let other = gate.enter("k2").expect("another key");
        drop(a);
        let c = gate.enter("k1").expect("a place was freed");
        drop((b, c, other));
        assert_eq!(gate.credentials_running(), 0);
    }
}
