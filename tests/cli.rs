//! The `corvid` binary: help, bootstrap, and first-run `serve` with SIGTERM shutdown.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn corvid() -> Command {
    Command::new(env!("CARGO_BIN_EXE_corvid"))
}

#[test]
fn help_describes_every_subcommand() {
    let out = corvid().arg("--help").output().expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "bootstrap", "--log-format"] {
        assert!(text.contains(word), "--help lacks {word}: {text}");
    }
    let serve = corvid().args(["serve", "--help"]).output().expect("runs");
    let text = String::from_utf8_lossy(&serve.stdout);
    for word in [
        "--config",
        "--data-dir",
        "--bind",
        "CORVID_DATA_DIR",
        "CORVID_BIND",
        "CORVID_CONFIG",
    ] {
        assert!(text.contains(word), "serve --help lacks {word}: {text}");
    }
    let boot = corvid()
        .args(["bootstrap", "--help"])
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&boot.stdout).contains("--json"));
}

fn bootstrap_json(dir: &std::path::Path) -> Value {
    let out = corvid()
        .args(["bootstrap", "--json", "--data-dir"])
        .arg(dir)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is exactly one JSON object")
}

#[test]
fn bootstrap_is_idempotent_and_mints_a_fresh_key_each_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = bootstrap_json(dir.path());
    assert_eq!(first["project_id"], 1);
    assert_eq!(first["email"], "admin@localhost");
    assert!(first["password"].as_str().is_some_and(|p| !p.is_empty()));
    assert!(first["project_token"]
        .as_str()
        .expect("token")
        .starts_with("phc_"));

    let second = bootstrap_json(dir.path());
    assert_eq!(second["project_id"], 1);
    assert_eq!(
        second["project_token"], first["project_token"],
        "same project"
    );
    assert!(
        second.get("password").is_none(),
        "password only when the user was created"
    );
    assert_ne!(second["personal_api_key"], first["personal_api_key"]);

    // Both minted keys work against a server on that data dir.
    let config = corvid::config::Config::for_test(dir.path());
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let running = corvid::app::start(config).await.expect("starts");
            tx.send((running.local_addr(), running.first_run.is_some()))
                .expect("send");
            running
                .run_until(async {
                    let _ = stop_rx.await;
                })
                .await
        })
    });
    let (addr, bootstrapped_again) = rx.recv_timeout(Duration::from_secs(60)).expect("addr");
    assert!(
        !bootstrapped_again,
        "serve does not bootstrap a bootstrapped dir"
    );
    let client = reqwest::blocking::Client::new();
    for creds in [&first, &second] {
        let res = client
            .get(format!("http://{addr}/api/projects/"))
            .bearer_auth(creds["personal_api_key"].as_str().expect("key"))
            .send()
            .expect("sent");
        assert_eq!(res.status(), 200);
    }
    let _ = stop_tx.send(());
    thread.join().expect("joined").expect("clean stop");
}

#[test]
fn serve_prints_credentials_once_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = corvid()
        .args(["serve", "--bind", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    let stdout = child.stdout.take().expect("stdout");
    let mut printed = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("line");
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("Saved to") {
            break;
        }
    }
    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("credentials.json")).expect("credentials"),
    )
    .expect("json");
    for field in ["project_token", "personal_api_key", "password"] {
        let value = saved[field].as_str().expect(field);
        assert!(printed.contains(value), "banner shows {field}: {printed}");
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = child.wait().expect("waits");
    assert!(exit.success(), "SIGTERM shuts down cleanly: {exit:?}");
}
