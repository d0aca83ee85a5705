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

/// An experiment whose record cannot be saved leaves no live flag behind: the flag created
/// for it is withdrawn, so the key is free for the next attempt.
#[test]
fn a_failed_experiment_save_withdraws_the_flag_it_created() {
    use crate::experiments::{ExperimentChanges, Experiments};
    use crate::RecordError;

    let server = TestPostgres::start();
    let db = server.database();
    let pg = Arc::new(db.connect());
    migrate(&pg, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
    // The fault: the record table refuses experiments until the trigger is dropped.
    pg.run(|client| async move {
        client
            .batch_execute(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
                 CREATE TRIGGER refuse_experiments BEFORE INSERT ON definition_records \
                 FOR EACH ROW WHEN (NEW.kind = 'experiments') EXECUTE FUNCTION refuse();",
            )
            .await?;
        Ok(())
    })
    .expect("trigger");
    let fixture = corvid_query::testing::Fixture::new(Vec::new(), Vec::new());
    let dir = tempfile::tempdir().expect("tempdir");
    let sled = sled::open(dir.path()).expect("sled");
    let (flags, owned) = crate::surface::testing::flags(&sled);
    let experiments = Experiments::new(
        Arc::new(PgRecords::new(Arc::clone(&pg), "experiments")),
        Arc::new(PgRecords::new(Arc::clone(&pg), "experiment_holdouts")),
        owned,
        Arc::clone(&fixture.engine),
    );
    let changes = || -> ExperimentChanges {
        serde_json::from_value(
            serde_json::json!({"name": "Checkout", "feature_flag_key": "checkout"}),
        )
        .expect("changes")
    };

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let failed = runtime.block_on(experiments.create(1, changes(), None));
    assert!(matches!(failed, Err(RecordError::Store(_))), "{failed:?}");
    let live: Vec<_> = flags
        .flags(1)
        .expect("flags")
        .into_iter()
        .filter(|f| !f.definition.deleted)
        .collect();
    assert!(live.is_empty(), "a flag outlived its experiment: {live:?}");

    pg.run(|client| async move {
        client
            .batch_execute("DROP TRIGGER refuse_experiments ON definition_records")
            .await?;
        Ok(())
    })
    .expect("drop trigger");
    let view = runtime
        .block_on(experiments.create(1, changes(), None))
        .expect("the key is free again");
    assert_eq!(view.experiment.feature_flag_key, "checkout");
}
