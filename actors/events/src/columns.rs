//! Property columns: which event properties a project's segments also store as their own
//! columns (like ClickHouse's materialized columns).
//!
//! The set per project is the configured list plus the project's most frequent property keys,
//! which the compactor ([`super::compaction`]) finds by sampling recent segments and then keeps
//! (a key once promoted stays, so segments are not rewritten back and forth). New segments are
//! written with the whole set.

use dashmap::DashMap;

/// The property keys materialized per project.
pub struct PropertyColumns {
    configured: Vec<String>,
    auto: DashMap<u64, Vec<String>>,
    tree: sled::Tree,
}

impl std::fmt::Debug for PropertyColumns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PropertyColumns")
            .field("configured", &self.configured)
            .field("projects", &self.auto.len())
            .finish()
    }
}

impl PropertyColumns {
    pub fn open(db: &sled::Db, configured: Vec<String>) -> sled::Result<PropertyColumns> {
        let tree = db.open_tree("property_columns")?;
        let auto = DashMap::new();
        for item in tree.iter() {
            let (k, v) = item?;
            let (Ok(id), Ok(keys)) = (
                <[u8; 8]>::try_from(k.as_ref()).map(u64::from_be_bytes),
                serde_json::from_slice::<Vec<String>>(&v),
            ) else {
                continue;
            };
            auto.insert(id, keys);
        }
        Ok(PropertyColumns {
            configured,
            auto,
            tree,
        })
    }

    /// Only the configured keys (no store): for tools and tests.
    pub fn fixed(db: &sled::Db, configured: Vec<String>) -> sled::Result<PropertyColumns> {
        Ok(PropertyColumns {
            configured,
            auto: DashMap::new(),
            tree: db.open_tree("property_columns")?,
        })
    }

    /// The keys `project`'s segments materialize: configured first, then promoted ones.
    pub fn keys_for(&self, project: u64) -> Vec<String> {
        let mut keys = self.configured.clone();
        if let Some(auto) = self.auto.get(&project) {
            keys.extend(
                auto.iter()
                    .filter(|k| !self.configured.contains(k))
                    .cloned(),
            );
        }
        keys
    }

    /// Adds `keys` to `project`'s promoted keys (durably), up to `cap` in all.
    pub(super) fn promote(
        &self,
        project: u64,
        keys: &[String],
        cap: usize,
    ) -> Result<bool, corvid_kernel::StoreError> {
        let mut current = self
            .auto
            .get(&project)
            .map(|k| k.clone())
            .unwrap_or_default();
        let before = current.len();
        for k in keys {
            if current.len() >= cap {
                break;
            }
            if !current.contains(k) && !self.configured.contains(k) {
                current.push(k.clone());
            }
        }
        if current.len() == before {
            return Ok(false);
        }
        let value = corvid_kernel::codec::encode(&current)?;
        self.tree.insert(project.to_be_bytes(), value)?;
        self.tree.flush()?;
        self.auto.insert(project, current);
        Ok(true)
    }
}
