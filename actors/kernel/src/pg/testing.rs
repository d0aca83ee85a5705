//! A throwaway PostgreSQL server for tests: Debian's server binaries, a cluster made with
//! `initdb` in a temporary directory, listening on a free loopback port, stopped and deleted
//! when dropped. As root (CI containers) the server runs as the `postgres` system user, since
//! PostgreSQL refuses to run as root.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{Pg, PgSettings};

pub struct TestPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
}

/// One database of a [`TestPostgres`].
pub struct TestDatabase {
    pub url: String,
}

impl TestDatabase {
    pub fn settings(&self) -> PgSettings {
        PgSettings {
            url: self.url.clone(),
            pool_size: 4,
            connect_timeout: Duration::from_secs(10),
            ca_file: None,
        }
    }

    pub fn connect(&self) -> Pg {
        Pg::connect(&self.settings()).expect("pool")
    }

    /// Applies the migrations of `sets` (a crate's own and those of the crates it needs).
    pub fn migrate(&self, sets: &[&[super::migrations::Migration]]) {
        super::migrations::migrate(&self.connect(), sets).expect("migrate");
    }
}

/// The newest installed server's binaries (`CORVID_PG_BIN` overrides).
fn find_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("CORVID_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries in /usr/lib/postgresql (apt-get install postgresql)")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("a PostgreSQL server in /usr/lib/postgresql/*/bin")
        .1
}

/// The `postgres` system user's uid and gid, when this process runs as root.
fn server_user() -> Option<(u32, u32)> {
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(1);
    if me != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the postgres system user (installed with the server)")
    };
    Some((id("-u"), id("-g")))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl TestPostgres {
    /// Starts a server; panics with the server's log when it cannot.
    pub fn start() -> TestPostgres {
        let server = TestPostgres::init();
        server.launch("");
        server
    }

    /// Starts a server that takes TLS with `cert` and `key` (PEM), and takes databases other
    /// than `postgres` over TLS only (so a connection that succeeds proves TLS was used).
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> TestPostgres {
        let server = TestPostgres::init();
        let data = server.data();
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let path = data.join(to);
            std::fs::copy(from, &path).expect("copy TLS file");
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod");
            if let Some((uid, gid)) = server.user {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
            }
        }
        std::fs::write(
            data.join("pg_hba.conf"),
            "host postgres all 127.0.0.1/32 trust\n\
             hostssl all all 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 reject\n",
        )
        .expect("pg_hba.conf");
        server.launch("-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        server
    }

    /// A new cluster, not started.
    fn init() -> TestPostgres {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = server_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let server = TestPostgres {
            bin: find_bin(),
            port: free_port(),
            user,
            dir,
        };
        server.run(
            "initdb",
            &[
                "-D",
                &server.data().to_string_lossy(),
                "-U",
                "corvid",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        server
    }

    /// Starts the server with `extra` options.
    fn launch(&self, extra: &str) {
        let server = self;
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off \
             -c max_connections=200 {extra}",
            server.port,
            server.dir.path().display()
        );
        server.run(
            "pg_ctl",
            &[
                "-D",
                &server.data().to_string_lossy(),
                "-l",
                &server.log().to_string_lossy(),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        if !out.status.success() {
            let log = std::fs::read_to_string(self.log()).unwrap_or_default();
            panic!(
                "{program} failed: {}\n{}\n{log}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://corvid@127.0.0.1:{}/{database}", self.port)
    }

    /// A new, empty database.
    pub fn database(&self) -> TestDatabase {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("corvid_test_{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let admin = TestDatabase {
            url: self.url("postgres"),
        }
        .connect();
        let statement = format!("CREATE DATABASE {name}");
        admin
            .run(move |client| async move {
                client.batch_execute(&statement).await?;
                Ok(())
            })
            .expect("create database");
        TestDatabase {
            url: self.url(&name),
        }
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                &self.data().to_string_lossy(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}
