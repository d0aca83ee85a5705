//! The surfaces' PostgreSQL schema, against a real server.

use std::sync::Arc;

use corvid_kernel::pg::migrations::migrate;
use corvid_kernel::pg::testing::TestPostgres;
use corvid_kernel::{DefinitionRecords, PgRecords, StoreError};

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

/// A database whose record table refuses records of `kind` until [`allow`] is called, and a
/// sled database holding the flags.
struct Refusing {
    pg: Arc<corvid_kernel::pg::Pg>,
    flags: Arc<corvid_flags::FlagStore>,
    owned: Arc<corvid_flags::OwnedFlags>,
    fixture: corvid_query::testing::Fixture,
    runtime: tokio::runtime::Runtime,
    _server: TestPostgres,
    _dir: tempfile::TempDir,
}

fn refusing(kind: &str) -> Refusing {
    let server = TestPostgres::start();
    let pg = Arc::new(server.database().connect());
    migrate(&pg, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
    let statement = format!(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
         CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON definition_records \
         FOR EACH ROW WHEN (NEW.kind = '{kind}') EXECUTE FUNCTION refuse();"
    );
    pg.run(move |client| async move {
        client.batch_execute(&statement).await?;
        Ok(())
    })
    .expect("trigger");
    let dir = tempfile::tempdir().expect("tempdir");
    let sled = sled::open(dir.path()).expect("sled");
    let (flags, owned) = crate::surface::testing::flags(&sled);
    Refusing {
        pg,
        flags,
        owned,
        fixture: corvid_query::testing::Fixture::new(Vec::new(), Vec::new()),
        runtime: tokio::runtime::Runtime::new().expect("runtime"),
        _server: server,
        _dir: dir,
    }
}

impl Refusing {
    /// Lets records of every kind in again.
    fn allow(&self) {
        self.pg
            .run(|client| async move {
                client
                    .batch_execute("DROP TRIGGER refuse ON definition_records")
                    .await?;
                Ok(())
            })
            .expect("drop trigger");
    }

    /// Runs `create` while the records are refused: it fails with a store error and leaves no
    /// live flag; then lets records in and runs it again, which succeeds.
    fn refused_then_saved<T: std::fmt::Debug, F>(&self, create: impl Fn() -> F) -> T
    where
        F: std::future::Future<Output = Result<T, crate::RecordError>>,
    {
        let failed = self.runtime.block_on(create());
        assert!(
            matches!(failed, Err(crate::RecordError::Store(_))),
            "{failed:?}"
        );
        assert_eq!(
            self.live_flags(),
            Vec::<String>::new(),
            "a flag outlived its record"
        );
        self.allow();
        self.runtime.block_on(create()).expect("saved once allowed")
    }

    /// The keys of project 1's live flags.
    fn live_flags(&self) -> Vec<String> {
        self.flags
            .flags(1)
            .expect("flags")
            .into_iter()
            .filter(|f| !f.definition.deleted)
            .map(|f| f.definition.key)
            .collect()
    }
}

/// An experiment whose record cannot be saved leaves at most its new flag, inactive, and the
/// next create with the key reuses it: one flag, one experiment. (The flag is not withdrawn:
/// another node's experiment may have taken it meanwhile.)
#[test]
fn a_failed_experiment_save_leaves_a_flag_the_retry_reuses() {
    use crate::experiments::{ExperimentChanges, Experiments};

    let db = refusing("experiments");
    let experiments = Experiments::new(
        Arc::new(PgRecords::new(Arc::clone(&db.pg), "experiments")),
        Arc::new(PgRecords::new(Arc::clone(&db.pg), "experiment_holdouts")),
        Arc::clone(&db.owned),
        Arc::clone(&db.fixture.engine),
    );
    let changes = || -> ExperimentChanges {
        serde_json::from_value(
            serde_json::json!({"name": "Checkout", "feature_flag_key": "checkout"}),
        )
        .expect("changes")
    };

    let failed = db.runtime.block_on(experiments.create(
        1,
        &corvid_activity::Actor::system(),
        changes(),
        None,
    ));
    assert!(
        matches!(failed, Err(crate::RecordError::Store(_))),
        "{failed:?}"
    );
    let left = db.flags.flags(1).expect("flags");
    assert!(left.iter().all(|f| !f.definition.active), "{left:?}");

    db.allow();
    let view = db
        .runtime
        .block_on(experiments.create(1, &corvid_activity::Actor::system(), changes(), None))
        .expect("the retry reuses the flag");
    assert_eq!(view.experiment.feature_flag_key, "checkout");
    assert_eq!(db.live_flags(), vec!["checkout".to_string()]);
    assert_eq!(
        view.experiment.feature_flag_id,
        left.first().expect("the flag left").definition.id
    );
}

/// A survey that cannot be saved leaves neither its internal flag nor its targeting flag.
#[test]
fn a_failed_survey_save_withdraws_both_flags_it_created() {
    use crate::surveys::{SurveyChanges, Surveys};

    let db = refusing("surveys");
    let surveys = Surveys::new(
        Arc::new(PgRecords::new(Arc::clone(&db.pg), "surveys")),
        Arc::clone(&db.owned),
        Arc::clone(&db.fixture.engine),
    );
    let changes = || -> SurveyChanges {
        serde_json::from_value(serde_json::json!({
            "name": "NPS",
            "type": "popover",
            "questions": [{"type": "open", "question": "Why?"}],
            "targeting_flag_filters": {"groups": [{"properties": [], "rollout_percentage": 50}]},
        }))
        .expect("changes")
    };

    let system = corvid_activity::Actor::system();
    db.refused_then_saved(|| surveys.create(1, &system, changes(), None));
    assert_eq!(db.live_flags().len(), 2, "internal and targeting flags");
}

/// An early-access feature that cannot be saved gives its flag key back.
#[test]
fn a_failed_feature_save_withdraws_the_flag_it_created() {
    use crate::early_access::{EarlyAccess, FeatureChanges};

    let db = refusing("early_access_features");
    let features = EarlyAccess::new(
        Arc::new(PgRecords::new(Arc::clone(&db.pg), "early_access_features")),
        Arc::clone(&db.owned),
    );
    let changes = || -> FeatureChanges {
        serde_json::from_value(serde_json::json!({"name": "Dark mode", "stage": "beta"}))
            .expect("changes")
    };

    let system = corvid_activity::Actor::system();
    db.refused_then_saved(|| features.create(1, &system, changes()));
    assert_eq!(db.live_flags(), vec!["dark-mode".to_string()]);
}
