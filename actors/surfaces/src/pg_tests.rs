//! The surfaces' PostgreSQL schema, against a real server.

use std::sync::Arc;

use corvid_kernel::pg::migrations::migrate;
use corvid_kernel::pg::testing::TestPostgres;
use corvid_kernel::{PgRecords, RecordStore, StoreError};

/// Two experiments on one feature flag, from two nodes at once: the store keeps one live.
#[test]
fn one_live_experiment_per_flag() {
    let server = TestPostgres::start();
    let db = server.database();
    let (pg1, pg2) = (Arc::new(db.connect()), Arc::new(db.connect()));
    migrate(&pg1, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
    let node1: PgRecords<serde_json::Value> = PgRecords::new(pg1, "experiments");
    let node2: PgRecords<serde_json::Value> = PgRecords::new(pg2, "experiments");
    let experiment = |id: u64, deleted: bool| serde_json::json!({"id": id, "feature_flag_id": 7, "deleted": deleted});
    let wins = std::thread::scope(|scope| {
        let a = scope.spawn(|| node1.put(1, "1", &experiment(1, false)));
        let b = scope.spawn(|| node2.put(1, "2", &experiment(2, false)));
        [a.join().expect("put"), b.join().expect("put")]
    });
    assert_eq!(wins.iter().filter(|w| w.is_ok()).count(), 1, "{wins:?}");
    assert!(wins
        .iter()
        .any(|w| matches!(w, Err(StoreError::Conflict { .. }))));
    // The live one can be rewritten; a deleted one frees the flag; other projects differ.
    let live = if wins[0].is_ok() { "1" } else { "2" };
    let id: u64 = live.parse().expect("id");
    node1.put(1, live, &experiment(id, false)).expect("rewrite");
    node1.put(1, live, &experiment(id, true)).expect("delete");
    node2
        .put(1, "3", &experiment(3, false))
        .expect("the flag is free");
    node2
        .put(2, "4", &experiment(4, false))
        .expect("another project");
}
