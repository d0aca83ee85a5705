//! Cluster mode from the outside: `corvid migrate` against a real PostgreSQL server started by
//! the test, and the `[cluster]` configuration a node is started with.

use std::process::{Command, Output};

use corvid_actors::kernel::pg::testing::TestPostgres;

fn corvid(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(args)
        .env_remove("CORVID_POSTGRES_URL")
        .output()
        .expect("runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn migrate_applies_the_schema_once_and_reports_it_current_afterwards() {
    let server = TestPostgres::start();
    let db = server.database();
    let first = corvid(&["migrate", "--postgres-url", &db.url]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("metastore schema migrated to version"),
        "{}",
        text(&first)
    );
    // The URL may also come from the environment, as a deployment sets it.
    let again = Command::new(env!("CARGO_BIN_EXE_corvid"))
        .arg("migrate")
        .env("CORVID_POSTGRES_URL", &db.url)
        .output()
        .expect("runs");
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("metastore schema is current"),
        "{}",
        text(&again)
    );
}

#[test]
fn migrate_without_a_metastore_or_an_unreachable_one_fails_with_a_clear_message() {
    let none = corvid(&["migrate"]);
    assert!(!none.status.success());
    assert!(
        text(&none).contains("CORVID_POSTGRES_URL"),
        "{}",
        text(&none)
    );

    // A loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("postgres://corvid@127.0.0.1:{port}/corvid");
    let down = corvid(&["migrate", "--postgres-url", &url]);
    assert!(!down.status.success());
    assert!(text(&down).contains("metastore"), "{}", text(&down));
}

/// `corvid serve` with `config` as its config file, in `dir`.
fn serve_with(dir: &std::path::Path, config: &str) -> Output {
    let file = dir.join("node.toml");
    std::fs::write(&file, config).expect("config");
    corvid(&[
        "serve",
        "--config",
        &file.to_string_lossy(),
        "--data-dir",
        &dir.join("data").to_string_lossy(),
        "--bind",
        "127.0.0.1:0",
    ])
}

#[test]
fn a_distributed_node_names_what_its_config_lacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = serve_with(dir.path(), "[cluster]\nmode = \"distributed\"\n");
    assert!(!out.status.success());
    assert!(text(&out).contains("cluster.node_id"), "{}", text(&out));

    // Complete, it still does not start: the stores it would need are not all distributed.
    let out = serve_with(
        dir.path(),
        "[cluster]\nmode = \"distributed\"\nnode_id = \"node-1\"\n\
         [cluster.postgres]\nurl = \"postgres://corvid@127.0.0.1:1/corvid\"\n\
         [cluster.object_store]\nbucket = \"corvid\"\n",
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("no PostgreSQL"), "{}", text(&out));
    assert!(
        !dir.path().join("data").join("meta").exists(),
        "nothing was opened"
    );
}
