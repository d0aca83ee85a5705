//! The official PostHog SDKs as black-box clients. Each is installed once (pinned versions from
//! `tests/sdk/`) into the cargo target dir; concurrent test processes wait on a lock file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn sdk_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("corvid-sdk")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `install` once per `name` and spec; later calls wait for it to have finished.
fn install_once(name: &str, spec: &Path, install: impl FnOnce(&Path)) -> PathBuf {
    let dir = sdk_root().join(name);
    let spec_text = std::fs::read_to_string(spec).expect("sdk spec");
    let ready = dir.join(".ready");
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(spec_text.as_str()) {
        return dir;
    }
    std::fs::create_dir_all(sdk_root()).expect("sdk root");
    let lock = sdk_root().join(format!("{name}.lock"));
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => {
                if std::fs::read_to_string(&ready).ok().as_deref() == Some(spec_text.as_str()) {
                    return dir;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("waited too long for {}: {e}", lock.display()),
        }
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if std::fs::read_to_string(&ready).ok().as_deref() != Some(spec_text.as_str()) {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("sdk dir");
            install(&dir);
            std::fs::write(&ready, &spec_text).expect("ready marker");
        }
    }));
    let _ = std::fs::remove_file(&lock);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    dir
}

/// Runs `cmd`; panics with its output if it fails, else returns its stdout.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Python interpreter with the pinned `posthog` package.
pub fn python() -> PathBuf {
    let spec = repo().join("tests/sdk/python/requirements.txt");
    let dir = install_once("python", &spec, |dir| {
        run(
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(dir.join("venv")),
            "python3 -m venv",
        );
        run(
            Command::new(dir.join("venv/bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
                .arg(&spec),
            "pip install posthog",
        );
    });
    dir.join("venv/bin/python")
}

/// A directory with the pinned `posthog-node` in `node_modules` and the test scripts.
pub fn node_dir() -> PathBuf {
    let spec = repo().join("tests/sdk/node/package.json");
    install_once("node", &spec, |dir| {
        std::fs::copy(&spec, dir.join("package.json")).expect("package.json");
        run(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(dir),
            "npm install posthog-node",
        );
    })
}

/// The path of a script in `tests/sdk/python/`.
pub fn python_script(name: &str) -> PathBuf {
    repo().join("tests/sdk/python").join(name)
}

/// Runs a script from `tests/sdk/` with `args`; panics with its output if it fails.
pub fn run_python(script: &str, args: &[&str]) -> String {
    run(
        Command::new(python())
            .arg(repo().join("tests/sdk/python").join(script))
            .args(args),
        script,
    )
}

pub fn run_node(script: &str, args: &[&str]) -> String {
    let dir = node_dir();
    // The script must sit beside node_modules for the bare import to resolve.
    let target = dir.join(script);
    std::fs::copy(repo().join("tests/sdk/node").join(script), &target).expect("copy script");
    run(
        Command::new("node")
            .arg(&target)
            .args(args)
            .current_dir(&dir),
        script,
    )
}
