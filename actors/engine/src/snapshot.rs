//! Backups of an embedded node: `corvid snapshot` and `corvid restore`.
//!
//! A snapshot is a directory (or a bucket prefix) holding the metadata store exported tree by
//! tree, with the person keyspaces as two more trees (`meta.export`; a node started on the
//! restored data dir moves them back into their keyspaces), the node's other files as they are (the events directory, the WAL,
//! materialized results, first-run credentials) and, written last, `manifest.json` listing
//! every file with its size and SHA-256: a snapshot without a manifest is incomplete.
//!
//! Taken while the node serves, it is consistent the way a crash is: while the copy runs no
//! file it may copy is deleted (covered WAL files, superseded segment versions and expired
//! days wait for the next pass after it), the shards' checkpoints are copied first, then the
//! metadata is exported, then the segments, and the WAL last. Restoring it and starting the node replays
//! the WAL from the copied checkpoints, skipping events already in the copied segments, so
//! the restored node holds exactly the events acknowledged before the WAL was copied.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use corvid_events::{
    segment_backup_files as segment_files, wal_backup_files as wal_files, BackupPin,
};
use corvid_kernel::bucket::{under, upload_file};
use corvid_kernel::StoreError;
use corvid_persons::PersonFiles;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// What names a snapshot's files: `manifest.json`.
pub const MANIFEST: &str = "manifest.json";
const FORMAT: &str = "corvid-snapshot";
const VERSION: u32 = 1;
/// The metadata store's export inside a snapshot.
const META_EXPORT: &str = "meta.export";

/// Top-level entries of a data dir a snapshot leaves out: the metadata store and the person
/// keyspaces (exported instead), a cluster node's own store, file exports (short-lived downloads), staging, the
/// control socket and snapshots or restores under way.
const SKIPPED: [&str; 7] = [
    "meta",
    crate::PERSONS_DIR,
    "node",
    "exports",
    "staging",
    "control.sock",
    "lock",
];

/// What a snapshot exports: the metadata store, and the person keyspaces when the data dir
/// has them.
pub type Stores = (sled::Db, Option<PersonFiles>);

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Location(String),
    #[error("the snapshot is incomplete or damaged: {0}")]
    Damaged(String),
    #[error("{0} is not empty: restore into a new data dir")]
    NotEmpty(PathBuf),
    #[error("cannot open the metadata store at {0} (is a server using it? snapshot it through the server)")]
    Locked(PathBuf),
    #[error("{0}")]
    Io(String),
}

fn io(e: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Io(e.to_string())
}

impl From<StoreError> for SnapshotError {
    fn from(e: StoreError) -> SnapshotError {
        io(e)
    }
}

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The manifest: what a snapshot holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub created_at: DateTime<Utc>,
    /// The newest WAL record when the snapshot began (0 when taken offline).
    pub wal_last_seq: u64,
    pub files: Vec<SnapshotFile>,
}

/// What a snapshot or a restore did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotReport {
    pub location: String,
    pub files: usize,
    pub bytes: u64,
    pub wal_last_seq: u64,
}

/// Where a snapshot goes or comes from: a directory, or `s3://bucket/prefix` reached with
/// `aws`, the `AWS_*` settings of whoever asked (`AWS_ACCESS_KEY_ID`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, …), never the serving node's own.
pub fn location(
    text: &str,
    aws: &[(String, String)],
) -> Result<Arc<dyn ObjectStore>, SnapshotError> {
    if let Some(rest) = text.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(SnapshotError::Location(format!("{text}: no bucket named")));
        }
        let mut builder = AmazonS3Builder::new();
        for (key, value) in aws {
            if let Ok(config) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(config, value);
            }
        }
        let store: Arc<dyn ObjectStore> = Arc::new(
            builder
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| SnapshotError::Location(format!("{text}: {e}")))?,
        );
        let prefix = prefix.trim_matches('/');
        return Ok(if prefix.is_empty() {
            store
        } else {
            under(store, prefix)
        });
    }
    std::fs::create_dir_all(text).map_err(|e| SnapshotError::Location(format!("{text}: {e}")))?;
    Ok(Arc::new(LocalFileSystem::new_with_prefix(text).map_err(
        |e| SnapshotError::Location(format!("{text}: {e}")),
    )?))
}

/// The `AWS_*` variables of this process's environment, for [`location`].
pub fn aws_environment() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .collect()
}

/// Writes every tree of `db`, then every keyspace of `persons`, to `out`: per tree its name
/// and entries, each length-prefixed.
fn export_meta((db, persons): &Stores, out: &Path) -> Result<(), SnapshotError> {
    db.flush().map_err(io)?;
    let mut file = BufWriter::new(std::fs::File::create(out).map_err(io)?);
    let mut put = |bytes: &[u8]| -> Result<(), SnapshotError> {
        file.write_all(&(bytes.len() as u64).to_le_bytes())
            .map_err(io)?;
        file.write_all(bytes).map_err(io)
    };
    for name in db.tree_names() {
        let tree = db.open_tree(&name).map_err(io)?;
        put(b"tree")?;
        put(&name)?;
        for entry in tree.iter() {
            let (key, value) = entry.map_err(io)?;
            put(b"kv")?;
            put(&key)?;
            put(&value)?;
        }
    }
    if let Some(persons) = persons {
        let mut current: Option<String> = None;
        persons.export(|name, key, value| {
            if current.as_deref() != Some(name) {
                put(b"tree")?;
                put(name.as_bytes())?;
                current = Some(name.to_string());
            }
            put(b"kv")?;
            put(key)?;
            put(value)
        })?;
    }
    put(b"end")?;
    let file = file.into_inner().map_err(io)?;
    file.sync_all().map_err(io)
}

/// Reads an export written by [`export_meta`] into the (new) store at `dir`.
fn import_meta(export: &Path, dir: &Path) -> Result<(), SnapshotError> {
    let mut input = BufReader::new(std::fs::File::open(export).map_err(io)?);
    let mut next = || -> Result<Vec<u8>, SnapshotError> {
        let mut len = [0u8; 8];
        input.read_exact(&mut len).map_err(io)?;
        let len = u64::from_le_bytes(len);
        if len > 1 << 30 {
            return Err(SnapshotError::Damaged(
                "meta.export holds an impossible length".into(),
            ));
        }
        let mut bytes = vec![0u8; len as usize];
        input.read_exact(&mut bytes).map_err(io)?;
        Ok(bytes)
    };
    let db = sled::open(dir).map_err(io)?;
    let mut tree: Option<sled::Tree> = None;
    loop {
        match next()?.as_slice() {
            b"tree" => tree = Some(db.open_tree(next()?).map_err(io)?),
            b"kv" => {
                let (key, value) = (next()?, next()?);
                tree.as_ref()
                    .ok_or_else(|| {
                        SnapshotError::Damaged("meta.export: an entry before its tree".into())
                    })?
                    .insert(key, value)
                    .map_err(io)?;
            }
            b"end" => break,
            _ => {
                return Err(SnapshotError::Damaged(
                    "meta.export: an unknown record".into(),
                ))
            }
        }
    }
    db.flush().map_err(io)?;
    Ok(())
}

/// Every file under `dir` (relative to `base`), skipping staged `.tmp` files.
fn plain_files(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        if kind.is_dir() {
            plain_files(base, &path, out)?;
        } else if kind.is_file() && !path.to_string_lossy().ends_with(".tmp") {
            if let Ok(relative) = path.strip_prefix(base) {
                out.push(relative.to_path_buf());
            }
        }
    }
    Ok(())
}

/// The data dir's files besides the metadata, the events and the WAL.
fn other_files(data_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if SKIPPED.contains(&name.as_str())
            || name == "events"
            || name == "wal"
            || name.starts_with(".snapshot")
        {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            plain_files(data_dir, &entry.path(), &mut files)?;
        } else if kind.is_file() {
            files.push(PathBuf::from(name));
        }
    }
    files.sort();
    Ok(files)
}

/// The files of the events directory a backup copies ([`segment_files`]), listed off the
/// event loop.
async fn events_files(events: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let listed = events.to_path_buf();
    tokio::task::spawn_blocking(move || segment_files(&listed))
        .await
        .map_err(io)?
        .map_err(io)
}

fn key_of(relative: &Path) -> String {
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Uploads the files `relative` to `root` names under `prefix`. A staged flush file published
/// since it was listed is copied under its new name; any other file gone since it was listed
/// is skipped (a serving node deletes none while the backup's pin holds).
async fn copy_files(
    store: &dyn ObjectStore,
    root: &Path,
    prefix: &str,
    relative: Vec<PathBuf>,
    into: &mut Vec<SnapshotFile>,
) -> Result<(), SnapshotError> {
    for listed in relative {
        // A staged flush file published since it was listed is copied under its new name.
        let published = listed
            .to_str()
            .and_then(|name| name.strip_suffix(".tmp"))
            .map(PathBuf::from);
        for file in std::iter::once(listed).chain(published) {
            let key = if prefix.is_empty() {
                key_of(&file)
            } else {
                format!("{prefix}/{}", key_of(&file))
            };
            match upload_file(store, &root.join(&file), &key).await {
                Ok(sent) => {
                    into.push(SnapshotFile {
                        path: key,
                        bytes: sent.bytes,
                        sha256: sent.sha256,
                    });
                    break;
                }
                Err(_) if !root.join(&file).exists() => {}
                Err(e) => return Err(SnapshotError::Io(format!("{key}: {e}"))),
            }
        }
    }
    Ok(())
}

/// Takes a snapshot of the embedded node under `data_dir` whose metadata store is `db` into
/// `store`. `pin` keeps the files it copies in place while it runs (a serving node's; `None`
/// offline).
pub async fn take(
    db: Stores,
    data_dir: &Path,
    pin: Option<BackupPin>,
    wal_last_seq: u64,
    store: Arc<dyn ObjectStore>,
    location: &str,
) -> Result<SnapshotReport, SnapshotError> {
    let work = data_dir.join(format!(".snapshot-{}", uuid_like()));
    std::fs::create_dir_all(&work).map_err(io)?;
    let outcome = take_into(db, data_dir, &work, wal_last_seq, store, location).await;
    let _ = std::fs::remove_dir_all(&work);
    drop(pin);
    outcome
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    )
}

async fn take_into(
    db: Stores,
    data_dir: &Path,
    work: &Path,
    wal_last_seq: u64,
    store: Arc<dyn ObjectStore>,
    location: &str,
) -> Result<SnapshotReport, SnapshotError> {
    let created_at = Utc::now();
    // A manifest from an earlier snapshot here would vouch for files about to change.
    match store.delete(&ObjectPath::from(MANIFEST)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(io(e)),
    }
    // The checkpoints are copied first. Before the metadata export: a flush writes the
    // person changes of its events before its checkpoint covers them, so every event a
    // copied checkpoint covers has its person changes in the export; exported first, a flush
    // between the export and this copy covered events whose person changes the export
    // lacked, and the restored node did not replay them (person writes accepted but not yet
    // in the keyspaces are of events no checkpoint covers yet). Before the segments are listed:
    // every flush a copied checkpoint covers has its files in the directory by then; listed
    // together, a flush between the listing and the copy was covered by the copied
    // checkpoint and missing from the copied segments. Events after the copied checkpoints
    // are replayed from the WAL, as after a crash.
    let mut files = Vec::new();
    let events = data_dir.join("events");
    let is_checkpoint = |file: &PathBuf| file.starts_with("_checkpoints");
    let checkpoints = events_files(&events)
        .await?
        .into_iter()
        .filter(is_checkpoint);
    copy_files(
        store.as_ref(),
        &events,
        "events",
        checkpoints.collect(),
        &mut files,
    )
    .await?;
    let export = work.join(META_EXPORT);
    let exported = export.clone();
    tokio::task::spawn_blocking(move || export_meta(&db, &exported))
        .await
        .map_err(io)??;
    copy_files(
        store.as_ref(),
        work,
        "",
        vec![PathBuf::from(META_EXPORT)],
        &mut files,
    )
    .await?;
    let dir = data_dir.to_path_buf();
    let others = tokio::task::spawn_blocking(move || other_files(&dir))
        .await
        .map_err(io)?
        .map_err(io)?;
    copy_files(store.as_ref(), data_dir, "", others, &mut files).await?;
    let segments = events_files(&events).await?.into_iter();
    let segments = segments.filter(|file| !is_checkpoint(file)).collect();
    copy_files(store.as_ref(), &events, "events", segments, &mut files).await?;
    let wal = data_dir.join("wal");
    let listed = wal.clone();
    let logs = tokio::task::spawn_blocking(move || wal_files(&listed))
        .await
        .map_err(io)?
        .map_err(io)?;
    copy_files(store.as_ref(), &wal, "wal", logs, &mut files).await?;
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        created_at,
        wal_last_seq,
        files,
    };
    let body = serde_json::to_vec_pretty(&manifest).map_err(io)?;
    store
        .put(&ObjectPath::from(MANIFEST), PutPayload::from(body))
        .await
        .map_err(io)?;
    Ok(SnapshotReport {
        location: location.to_string(),
        files: manifest.files.len(),
        bytes: manifest.files.iter().map(|f| f.bytes).sum(),
        wal_last_seq,
    })
}

/// Takes a snapshot of a data dir no server is using.
pub async fn take_offline(data_dir: &Path, to: &str) -> Result<SnapshotReport, SnapshotError> {
    let meta = data_dir.join("meta");
    if !meta.exists() {
        return Err(SnapshotError::Location(format!(
            "{} holds no Corvid data",
            data_dir.display()
        )));
    }
    let opened = meta.clone();
    let db = tokio::task::spawn_blocking(move || sled::open(&opened))
        .await
        .map_err(io)?
        .map_err(|_| SnapshotError::Locked(meta))?;
    let dir = data_dir.join(crate::PERSONS_DIR);
    let persons = if dir.exists() {
        let opened = dir.clone();
        let files = tokio::task::spawn_blocking(move || {
            PersonFiles::open(&opened, crate::DEFAULT_PERSON_CACHE_BYTES)
        })
        .await
        .map_err(io)?
        .map_err(|_| SnapshotError::Locked(dir))?;
        Some(files)
    } else {
        None
    };
    let store = location(to, &aws_environment())?;
    take((db, persons), data_dir, None, 0, store, to).await
}

/// Brings the new data dir `data_dir` to the state of the snapshot at `from`: every file
/// checked against the manifest, the metadata store imported. Written beside the target
/// and renamed into place at the end, so a failed restore leaves no half-made data dir.
pub async fn restore(from: &str, data_dir: &Path) -> Result<SnapshotReport, SnapshotError> {
    if std::fs::read_dir(data_dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(SnapshotError::NotEmpty(data_dir.to_path_buf()));
    }
    let store = location(from, &aws_environment())?;
    let manifest: Manifest = {
        let bytes = store
            .get(&ObjectPath::from(MANIFEST))
            .await
            .map_err(|e| SnapshotError::Damaged(format!("no {MANIFEST}: {e}")))?
            .bytes()
            .await
            .map_err(io)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| SnapshotError::Damaged(format!("{MANIFEST}: {e}")))?
    };
    if manifest.format != FORMAT || manifest.version > VERSION {
        return Err(SnapshotError::Damaged(format!(
            "{MANIFEST} is not a Corvid snapshot this build reads"
        )));
    }
    let name = data_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    let staging = data_dir.with_file_name(format!(".{name}.restoring"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io)?;
    let outcome = restore_into(store.as_ref(), &manifest, &staging).await;
    if let Err(e) = outcome {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let _ = std::fs::remove_dir(data_dir);
    std::fs::rename(&staging, data_dir).map_err(io)?;
    Ok(SnapshotReport {
        location: from.to_string(),
        files: manifest.files.len(),
        bytes: manifest.files.iter().map(|f| f.bytes).sum(),
        wal_last_seq: manifest.wal_last_seq,
    })
}

async fn restore_into(
    store: &dyn ObjectStore,
    manifest: &Manifest,
    staging: &Path,
) -> Result<(), SnapshotError> {
    for file in &manifest.files {
        let relative = Path::new(&file.path);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(SnapshotError::Damaged(format!(
                "{}: not a plain path",
                file.path
            )));
        }
        let target = staging.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut stream = store
            .get(&ObjectPath::from(file.path.as_str()))
            .await
            .map_err(|e| SnapshotError::Damaged(format!("{}: {e}", file.path)))?
            .into_stream();
        let mut out = std::fs::File::create(&target).map_err(io)?;
        let mut hash = Sha256::new();
        let mut bytes = 0u64;
        while let Some(chunk) = stream.try_next().await.map_err(io)? {
            hash.update(&chunk);
            bytes += chunk.len() as u64;
            out.write_all(&chunk).map_err(io)?;
        }
        out.sync_all().map_err(io)?;
        if bytes != file.bytes || hex_of(hash) != file.sha256 {
            return Err(SnapshotError::Damaged(format!(
                "{} does not match the manifest",
                file.path
            )));
        }
    }
    let export = staging.join(META_EXPORT);
    if !export.exists() {
        return Err(SnapshotError::Damaged(format!("no {META_EXPORT}")));
    }
    let meta = staging.join("meta");
    tokio::task::spawn_blocking(move || {
        import_meta(&export, &meta)?;
        std::fs::remove_file(&export).map_err(io)
    })
    .await
    .map_err(io)??;
    Ok(())
}

fn hex_of(hash: Sha256) -> String {
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sled can hold a data dir's lock for a moment after its last handle drops (its I/O
    /// threads finish first); the server's own open waits for it, and so does this test.
    fn open_when_released(path: &Path) -> sled::Db {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match sled::open(path) {
                Ok(db) => return db,
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                Err(e) => panic!("sled: {e:?}"),
            }
        }
    }

    #[test]
    fn metadata_and_persons_round_trip_through_an_export() {
        use corvid_persons::{EmbeddedPersons, Person, PersonRecords};

        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path().join("a")).expect("sled");
        db.insert(b"k0", b"v0").expect("insert");
        let tree = db.open_tree("groups").expect("tree");
        for i in 0..100u32 {
            tree.insert(i.to_be_bytes(), format!("g{i}").as_bytes())
                .expect("insert");
        }
        let files = PersonFiles::open(&dir.path().join("persons-a"), 8 << 20).expect("files");
        let persons = EmbeddedPersons::open(&db, files.clone()).expect("persons");
        let stored: Vec<Person> = (0..50)
            .map(|i| Person {
                id: uuid::Uuid::new_v4(),
                created_at: chrono::Utc::now(),
                properties: serde_json::Map::new(),
                is_identified: false,
                version: 0,
                distinct_ids: vec![format!("d{i}"), format!("e{i}")],
            })
            .collect();
        for p in &stored {
            persons.put_person(4, p).expect("put");
        }
        let export = dir.path().join("meta.export");
        export_meta(&(db, Some(files)), &export).expect("export");
        import_meta(&export, &dir.path().join("b")).expect("import");

        let back = open_when_released(&dir.path().join("b"));
        assert_eq!(back.get(b"k0").expect("get").as_deref(), Some(&b"v0"[..]));
        let tree = back.open_tree("groups").expect("tree");
        assert_eq!(tree.len(), 100);
        assert_eq!(
            tree.get(7u32.to_be_bytes()).expect("get").as_deref(),
            Some(&b"g7"[..])
        );
        // A node started on the restored data dir finds every person by every id.
        let files = PersonFiles::open(&dir.path().join("persons-b"), 8 << 20).expect("files");
        let restored = EmbeddedPersons::open(&back, files).expect("persons");
        for p in &stored {
            assert_eq!(restored.person(4, p.id).expect("read").as_ref(), Some(p));
            for did in &p.distinct_ids {
                assert_eq!(
                    restored.person_id_by_distinct_id(4, did).expect("read"),
                    Some(p.id)
                );
            }
        }
    }
}
