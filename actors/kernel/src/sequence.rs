//! Durable id sequences: one counter per key of a sled tree.

use super::StoreError;

/// The next value (1, 2, …) of the counter under `key` in `tree`, unique across restarts once
/// the tree is flushed (every caller flushes the record it numbers).
pub fn next(tree: &sled::Tree, key: &str) -> Result<u64, StoreError> {
    let mut corrupt = false;
    let next = tree.update_and_fetch(key.as_bytes(), |old| {
        let current = match old.map(<[u8; 8]>::try_from) {
            None => 0,
            Some(Ok(bytes)) => u64::from_be_bytes(bytes),
            Some(Err(_)) => {
                corrupt = true;
                return old.map(<[u8]>::to_vec);
            }
        };
        Some((current + 1).to_be_bytes().to_vec())
    })?;
    let value = next
        .filter(|_| !corrupt)
        .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
        .map(u64::from_be_bytes);
    value.ok_or_else(|| StoreError::Sequence {
        name: key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_independent_increasing_and_refuse_garbage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let tree = db.open_tree("seq").expect("tree");
        assert_eq!(next(&tree, "a").expect("a"), 1);
        assert_eq!(next(&tree, "a").expect("a"), 2);
        assert_eq!(next(&tree, "b").expect("b"), 1);
        tree.insert("bad", b"xyz".to_vec()).expect("insert");
        assert!(matches!(
            next(&tree, "bad"),
            Err(StoreError::Sequence { .. })
        ));
    }
}
