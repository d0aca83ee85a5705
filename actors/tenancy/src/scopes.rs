//! Personal-API-key scopes: `<object>:read|write` or `*`, as PostHog names them.
//! `write` implies `read`. OAuth access tokens reuse the same set.

use std::collections::BTreeSet;
use std::fmt;

/// The objects a scope can name. A subset of PostHog's list: the ones Corvid serves.
pub const OBJECTS: &[&str] = &[
    "activity_log",
    "batch_export",
    "cohort",
    "early_access_feature",
    "endpoint",
    "event_definition",
    "experiment",
    "feature_flag",
    "group",
    "insight",
    "insight_variable",
    "logs",
    "organization",
    "person",
    "personal_api_key",
    "project",
    "query",
    "survey",
    "user",
    "webhook",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    Read,
    Write,
}

/// One scope such as `feature_flag:read`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scope {
    pub object: &'static str,
    pub access: Access,
}

impl Scope {
    /// Parses `object:read|write`; unknown objects or actions give `None`.
    pub fn parse(text: &str) -> Option<Scope> {
        let (object, action) = text.split_once(':')?;
        let object = OBJECTS.iter().find(|o| **o == object)?;
        let access = match action {
            "read" => Access::Read,
            "write" => Access::Write,
            _ => return None,
        };
        Some(Scope { object, access })
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.access {
            Access::Read => "read",
            Access::Write => "write",
        };
        write!(f, "{}:{action}", self.object)
    }
}

/// What a credential may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeSet {
    /// `*`: every scope.
    All,
    Some(BTreeSet<Scope>),
}

impl ScopeSet {
    /// Parses a key's scope list. Returns the first invalid entry as the error.
    pub fn parse<S: AsRef<str>>(scopes: &[S]) -> Result<ScopeSet, String> {
        let mut set = BTreeSet::new();
        for s in scopes {
            let s = s.as_ref();
            if s == "*" {
                return Ok(ScopeSet::All);
            }
            set.insert(Scope::parse(s).ok_or_else(|| s.to_string())?);
        }
        Ok(ScopeSet::Some(set))
    }

    /// Whether this set grants `wanted`; `write` on an object grants `read` too.
    pub fn grants(&self, wanted: &Scope) -> bool {
        match self {
            ScopeSet::All => true,
            ScopeSet::Some(set) => {
                set.contains(wanted)
                    || (wanted.access == Access::Read
                        && set.contains(&Scope {
                            object: wanted.object,
                            access: Access::Write,
                        }))
            }
        }
    }

    /// Whether every scope of `other` is granted by `self` (no privilege escalation).
    pub fn covers(&self, other: &ScopeSet) -> bool {
        match (self, other) {
            (ScopeSet::All, _) => true,
            (ScopeSet::Some(_), ScopeSet::All) => false,
            (ScopeSet::Some(_), ScopeSet::Some(wanted)) => wanted.iter().all(|s| self.grants(s)),
        }
    }

    /// Every concrete scope string Corvid knows, for `scopes_supported` style listings.
    pub fn all_scope_names() -> Vec<String> {
        OBJECTS
            .iter()
            .flat_map(|o| [format!("{o}:read"), format!("{o}:write")])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(s: &str) -> Scope {
        Scope::parse(s).expect("valid scope")
    }

    #[test]
    fn write_implies_read_but_not_the_reverse() {
        let set = ScopeSet::parse(&["feature_flag:write"]).expect("parses");
        assert!(set.grants(&scope("feature_flag:read")));
        assert!(set.grants(&scope("feature_flag:write")));
        let read_only = ScopeSet::parse(&["feature_flag:read"]).expect("parses");
        assert!(!read_only.grants(&scope("feature_flag:write")));
        assert!(!read_only.grants(&scope("query:read")));
    }

    #[test]
    fn star_grants_everything_and_unknown_scopes_are_rejected() {
        assert_eq!(ScopeSet::parse(&["*"]), Ok(ScopeSet::All));
        assert!(ScopeSet::All.grants(&scope("project:write")));
        assert_eq!(
            ScopeSet::parse(&["query:read", "spaceship:fly"]),
            Err("spaceship:fly".to_string())
        );
        assert_eq!(ScopeSet::parse(&["query:admin"]), Err("query:admin".into()));
    }

    #[test]
    fn covers_prevents_escalation() {
        let mine = ScopeSet::parse(&["query:write", "project:read"]).expect("parses");
        assert!(mine.covers(&ScopeSet::parse(&["query:read"]).expect("parses")));
        assert!(!mine.covers(&ScopeSet::parse(&["project:write"]).expect("parses")));
        assert!(!mine.covers(&ScopeSet::All));
    }
}
