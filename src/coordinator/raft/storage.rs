//! Raft log and state machine on disk, in one redb database.
//!
//! Tables:
//! - `raft_log`: log index → bincode `Entry`;
//! - `raft_meta`: `format_version`, `vote`, `committed`, `last_purged`;
//! - `sm_versions`: rule-set version number → bincode `RuleSetVersion`, so an
//!   apply writes only the versions it created or moved, not every version;
//! - `sm_meta`: `applied` (`AppliedHeader`), `regions`, `allocations`,
//!   `cluster_id` (from format 2; absent: no id yet), `drills_last_id`
//!   (from format 3) and `snapshot` (the current snapshot's meta and bytes);
//! - `sm_drills` (from format 3): drill id → bincode `Drill`, so an
//!   observation writes only the drill it touched.
//!
//! ## Format versions
//! Everything above is bincode of Rust types, so changing a stored type (a
//! field added, reordered or retyped anywhere under [`Registry`] or
//! [`Command`](crate::coordinator::state::Command)) changes the format. The
//! version is recorded twice:
//! - per data dir: `raft_meta.format_version` (4 bytes, little-endian, not
//!   bincode, so any build can read it), written when the dir is created (or
//!   migrated, below) and checked by [`open`] before any other table is opened. It covers the log
//!   too: a node never appends to a dir whose format it does not know, so
//!   one dir never mixes formats and entries need no tag of their own;
//! - per snapshot: [`SNAPSHOT_MAGIC`] and the version come before the
//!   bincode [`Applied`], because snapshots travel to other nodes, which may
//!   run another build.
//!
//! A dir or snapshot in a version not in [`KNOWN_FORMATS`] is refused with
//! [`DiskError::UnknownFormat`]. Data written before versions were recorded
//! (no `format_version`, a snapshot without the magic) is version 1: version
//! 1 is defined as exactly that encoding, and the committed fixture
//! `tests/fixtures/raft/snapshot-v1.bin` holds its payload byte for byte.
//! Each later version has its own fixture, `snapshot-v<N>.bin`.
//!
//! The versions:
//! 1. rule-set versions, regions and allocations;
//! 2. adds the cluster id: [`Registry::cluster_id`] (last field of the
//!    registry, so last in a snapshot's payload), `sm_meta.cluster_id` and
//!    [`Command::SetClusterId`](crate::coordinator::state::Command) (the
//!    last variant, so every other command keeps its tag);
//! 3. adds failover drills: [`Registry::drills`] (last field), the
//!    `sm_drills` table, `sm_meta.drills_last_id` and the three drill
//!    commands (appended after `SetClusterId`).
//!
//! Migration: [`open`] takes a dir of an older known version and records
//! [`FORMAT_VERSION`] in it before it is used, so the rule above (one dir,
//! one format) holds from then on; an older build then refuses the dir. This
//! rewrites nothing else, so a version may be migrated this way only when
//! the older one's tables and log entries decode unchanged as the newer one:
//! true of 1 → 2 (a missing `sm_meta.cluster_id` reads as "no id yet", which
//! the leader then sets) and of 2 → 3 (no drills yet). A snapshot keeps the version it was written in and
//! is decoded as such ([`decode_snapshot`]); new snapshots are written in
//! [`FORMAT_VERSION`].
//!
//! Durability: log appends, votes, purges and snapshots commit with
//! `Durability::Immediate` (fsync) before openraft hears they are done. The
//! state machine's writes and the committed id commit with `Durability::None`:
//! redb keeps the database consistent at the last durable commit, and every
//! later durable commit (the next append, a snapshot) persists them too. A
//! crash can therefore only roll the state machine back to an index whose
//! entries the durable log still holds (the log is purged only up to a
//! snapshot, which is itself durable), and openraft re-applies them. This
//! halves the fsyncs per write, which dominate write latency.
//!
//! All disk work runs in `spawn_blocking`, so the runtime's workers never wait
//! on the disk.
//!
//! ## A store that should be here
//! Beside the database, [`marker::FILE`] records that a store was created in
//! this data dir and, once one was stored, that the node voted. [`open`]
//! refuses a dir whose record says so but whose store is missing, empty,
//! unversioned or without a vote ([`DiskError::StoreLost`]), rather than
//! start a node that forgot its log and vote (see `marker`).

mod marker;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::{self, Cursor};
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, StorageIOError, Vote,
};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::allocation::Allocations;
use crate::cluster_id::ClusterId;
use crate::coordinator::drill::Drills;
use crate::coordinator::state::{Outcome, Region, Registry, RuleSetVersion};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Holds `format_version`: its name and key/value types must stay as they
/// are in every format, or a build could not even read which format a dir is in.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const VERSIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("sm_versions");
const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
const SM_DRILLS: TableDefinition<u64, &[u8]> = TableDefinition::new("sm_drills");

/// The file inside `--data-dir`.
pub const DB_FILE: &str = "coordinator.redb";

/// The storage format this build writes (see the module docs). Bump it, add
/// it to [`KNOWN_FORMATS`] and commit a fixture for it whenever a stored
/// type's encoding changes.
pub const FORMAT_VERSION: u32 = 3;
/// The storage formats this build reads.
pub const KNOWN_FORMATS: &[u32] = &[1, 2, 3];
/// The format of data written before versions were recorded.
const UNVERSIONED_FORMAT: u32 = 1;
/// `raft_meta` key of the data dir's format version.
const FORMAT_KEY: &str = "format_version";
/// Starts every snapshot, followed by the format version (`u32`,
/// little-endian) and the bincode [`Applied`]. An unversioned snapshot
/// starts with the tag of `Option<LogId>` (byte 0 or 1), never with `M`.
pub const SNAPSHOT_MAGIC: &[u8; 4] = b"MRSN";

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("decoding stored data: {0}")]
    Codec(#[from] bincode::Error),
    #[error("storage task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// Written by a build with another storage format: reading it as ours
    /// would misread it, so the node stops instead.
    #[error(
        "{what} is in storage format version {found}, but this build knows only version(s) \
         {known:?}; run a Meridian build that knows version {found}"
    )]
    UnknownFormat {
        /// The data dir's file or the snapshot, by name.
        what: String,
        found: u32,
        known: &'static [u32],
    },
    /// A format header that cannot be read at all.
    #[error("{what}: {reason}")]
    BadHeader { what: String, reason: String },
    /// A file of the data dir other than the database.
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    /// The data dir's record says a store was created here (and maybe that
    /// the node voted), but the store is not that store. Starting on it would
    /// make a member that forgot its log and vote.
    #[error(
        "{record} (written {created}) says a store was created in this data dir{voted}, but \
         {found}. Starting on it would make this node a new, empty member: it would forget \
         its log and its vote (so it could vote twice in one term, which breaks Raft's \
         safety), and with --init bootstrap a second cluster under a new id; it is refused \
         with or without --init. Restore {DB_FILE} from a backup of this node; or, to start \
         this node over deliberately, remove it from the cluster (meridian ctl cluster remove \
         ID), move this data dir away, and start it on a new, empty --data-dir with --join",
        record = marker::FILE,
        created = crate::clock::utc_text(*created_unix_ms),
        voted = if *voted { " and that this node voted" } else { "" }
    )]
    StoreLost {
        /// What was found instead, as the message says it.
        found: String,
        created_unix_ms: i64,
        voted: bool,
    },
}

macro_rules! redb_from {
    ($($t:ty),*) => {$(
        impl From<$t> for DiskError {
            fn from(e: $t) -> Self {
                DiskError::Redb(e.into())
            }
        }
    )*};
}
redb_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// Runs `f` against the database on the blocking pool; maps failures onto
/// openraft's error for `subject`.
async fn blocking<T, F>(
    db: &Arc<Database>,
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    f: F,
) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce(&Database) -> Result<T, DiskError> + Send + 'static,
{
    let db = Arc::clone(db);
    let result = match tokio::task::spawn_blocking(move || f(&db)).await {
        Ok(r) => r,
        Err(e) => Err(DiskError::from(e)),
    };
    result.map_err(|e| StorageIOError::new(subject, verb, AnyError::new(&e)).into())
}

fn get_meta<T: for<'de> Deserialize<'de>>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
) -> Result<Option<T>, DiskError> {
    let txn = db.begin_read()?;
    let t = txn.open_table(table)?;
    let value = t.get(key)?;
    Ok(match value {
        Some(v) => Some(bincode::deserialize(v.value())?),
        None => None,
    })
}

fn put_meta<T: Serialize>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    value: &T,
) -> Result<(), DiskError> {
    put_meta_with(db, table, key, value, Durability::Immediate)
}

fn put_meta_with<T: Serialize>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    value: &T,
    durability: Durability,
) -> Result<(), DiskError> {
    let bytes = bincode::serialize(value)?;
    let mut txn = db.begin_write()?;
    txn.set_durability(durability)?;
    {
        let mut t = txn.open_table(table)?;
        t.insert(key, bytes.as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

/// Opens (or creates) the database under `dir` and returns the two halves
/// openraft drives, plus a receiver of every applied state. Refuses a data
/// dir in a storage format this build does not know
/// ([`DiskError::UnknownFormat`]).
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), DiskError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| DiskError::Io { path, source }
    };
    let record = marker::read(dir).map_err(io(&dir.join(marker::FILE)))?;
    let lost = |found: &str| {
        let r = record.unwrap_or(marker::Record {
            created_unix_ms: 0,
            voted: false,
        });
        DiskError::StoreLost {
            found: found.to_owned(),
            created_unix_ms: r.created_unix_ms,
            voted: r.voted,
        }
    };
    let path = dir.join(DB_FILE);
    // Before redb opens it: it would create a missing file and initialise an
    // empty one, and the dir is to be left as it was found.
    if record.is_some() {
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(lost(&format!("no {DB_FILE} is here")));
            }
            Err(e) => return Err(io(&path)(e)),
            Ok(m) if m.len() == 0 => {
                return Err(lost(&format!("{DB_FILE} is empty (0 bytes)")));
            }
            Ok(_) => {}
        }
    }
    let db = Arc::new(Database::create(&path)?);
    let txn = db.begin_write()?;
    // The version first: another format may have other tables, or the same
    // names with other key types, which opening would trip over.
    let recorded = read_format(&txn.open_table(META)?)?;
    if let Some(found) = recorded
        && !KNOWN_FORMATS.contains(&found)
    {
        txn.abort()?;
        return Err(DiskError::UnknownFormat {
            what: DB_FILE.to_string(),
            found,
            known: KNOWN_FORMATS,
        });
    }
    // Every store this build creates records its format before the record
    // is written, and a format is never removed: without one, this is not
    // the store created here.
    let has_vote = txn.open_table(META)?.get("vote")?.is_some();
    let refused = match record {
        Some(_) if recorded.is_none() => Some(lost(&format!(
            "{DB_FILE} holds no storage format (an empty store, or one written before \
             formats were versioned): it is not the store created here"
        ))),
        Some(r) if r.voted && !has_vote => Some(lost(&format!("{DB_FILE} holds no vote"))),
        _ => None,
    };
    if let Some(refused) = refused {
        txn.abort()?;
        return Err(refused);
    }
    // Create every table up front so that read transactions never meet a
    // missing one.
    let log = txn.open_table(LOG)?;
    let versions = txn.open_table(VERSIONS)?;
    let sm_meta = txn.open_table(SM_META)?;
    let sm_drills = txn.open_table(SM_DRILLS)?;
    let mut meta = txn.open_table(META)?;
    let found = match recorded {
        Some(found) => Some(found),
        None if log.is_empty()?
            && meta.is_empty()?
            && versions.is_empty()?
            && sm_meta.is_empty()?
            && sm_drills.is_empty()? =>
        {
            None
        }
        None => {
            tracing::info!(
                "data dir records no storage format (written before formats were versioned): \
                 version {UNVERSIONED_FORMAT}"
            );
            Some(UNVERSIONED_FORMAT)
        }
    };
    if found != Some(FORMAT_VERSION) {
        // A new dir, or an older format whose data reads unchanged as this
        // one (see the module docs): from now on it is in this format.
        if let Some(older) = found {
            tracing::info!(
                from = older,
                to = FORMAT_VERSION,
                "migrating the data dir from storage format {older} to {FORMAT_VERSION}"
            );
        }
        meta.insert(FORMAT_KEY, FORMAT_VERSION.to_le_bytes().as_slice())?;
    }
    drop((log, versions, sm_meta, sm_drills, meta));
    txn.commit()?;
    // After the commit above (durable): the record never describes a store
    // that is not on disk yet.
    let record = match record {
        Some(r) if r.voted || !has_vote => r,
        Some(r) => write_record(dir, r.created_unix_ms, true)?,
        None => write_record(dir, crate::clock::now_unix_ms(), has_vote)?,
    };
    let applied = load_applied(&db)?;
    let (published, _) = watch::channel(Arc::new(applied.clone()));
    Ok((
        LogStore {
            db: Arc::clone(&db),
            committed: Arc::new(AtomicU64::new(0)),
            record: Arc::new(VoteRecord {
                dir: dir.to_path_buf(),
                created_unix_ms: record.created_unix_ms,
                voted: AtomicBool::new(record.voted),
            }),
        },
        StateMachineStore {
            db,
            applied,
            published,
        },
    ))
}

/// Writes the data dir's record of its store (see `marker`).
fn write_record(
    dir: &Path,
    created_unix_ms: i64,
    voted: bool,
) -> Result<marker::Record, DiskError> {
    let record = marker::Record {
        created_unix_ms,
        voted,
    };
    marker::write(dir, record).map_err(|source| DiskError::Io {
        path: dir.join(marker::FILE).display().to_string(),
        source,
    })?;
    Ok(record)
}

/// The data dir's recorded format version; `None` when it records none (a
/// new dir, or one written before versions were recorded).
fn read_format(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Option<u32>, DiskError> {
    let Some(value) = meta.get(FORMAT_KEY)? else {
        return Ok(None);
    };
    let bytes: [u8; 4] = value.value().try_into().map_err(|_| DiskError::BadHeader {
        what: DB_FILE.to_string(),
        reason: format!(
            "raft_meta.{FORMAT_KEY} is {} bytes, expected 4",
            value.value().len()
        ),
    })?;
    Ok(Some(u32::from_le_bytes(bytes)))
}

// ---------------------------------------------------------------- the log

/// The Raft log, vote and committed id. Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// Last committed index openraft saved (0 before any), for status and
    /// metrics; openraft keeps its own copy, this one is read-only elsewhere.
    committed: Arc<AtomicU64>,
    /// The data dir's record, rewritten once, after the first vote is stored.
    record: Arc<VoteRecord>,
}

/// What [`LogStore::save_vote`] needs to note the first vote in the data
/// dir's record (see `marker`).
struct VoteRecord {
    dir: std::path::PathBuf,
    created_unix_ms: i64,
    /// Set once the record says so; only `save_vote` (one at a time: openraft
    /// calls the log store from one task) writes it.
    voted: AtomicBool,
}

impl LogStore {
    /// A shared view of the committed log index.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.committed)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let bounds: (Bound<u64>, Bound<u64>) =
            (range.start_bound().cloned(), range.end_bound().cloned());
        blocking(&self.db, ErrorSubject::Logs, ErrorVerb::Read, move |db| {
            let txn = db.begin_read()?;
            let t = txn.open_table(LOG)?;
            let mut entries = Vec::new();
            for item in t.range::<u64>(bounds)? {
                let (_, v) = item?;
                entries.push(bincode::deserialize(v.value())?);
            }
            Ok(entries)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        blocking(&self.db, ErrorSubject::Logs, ErrorVerb::Read, |db| {
            let last_purged: Option<LogId> = get_meta(db, META, "last_purged")?;
            let txn = db.begin_read()?;
            let t = txn.open_table(LOG)?;
            let last = match t.last()? {
                Some((_, v)) => Some(bincode::deserialize::<Entry>(v.value())?.log_id),
                None => last_purged,
            };
            Ok(LogState {
                last_purged_log_id: last_purged,
                last_log_id: last,
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let vote = *vote;
        let record = Arc::clone(&self.record);
        blocking(&self.db, ErrorSubject::Vote, ErrorVerb::Write, move |db| {
            put_meta(db, META, "vote", &vote)?;
            // After the vote is durable: from now on a store without one is
            // refused. Once per data dir, so votes cost no extra fsync.
            if !record.voted.load(Ordering::Relaxed) {
                write_record(&record.dir, record.created_unix_ms, true)?;
                record.voted.store(true, Ordering::Relaxed);
            }
            Ok(())
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        blocking(&self.db, ErrorSubject::Vote, ErrorVerb::Read, |db| {
            get_meta(db, META, "vote")
        })
        .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.committed
            .store(committed.map_or(0, |id| id.index), Ordering::Relaxed);
        blocking(&self.db, ErrorSubject::Store, ErrorVerb::Write, move |db| {
            // Not fsynced: a lost committed id only means re-applying from
            // the last applied entry, which the durable log still holds.
            put_meta_with(db, META, "committed", &committed, Durability::None)
        })
        .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        blocking(&self.db, ErrorSubject::Store, ErrorVerb::Read, |db| {
            Ok(get_meta::<Option<LogId>>(db, META, "committed")?.flatten())
        })
        .await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let result = blocking(&self.db, ErrorSubject::Logs, ErrorVerb::Write, move |db| {
            let txn = db.begin_write()?;
            {
                let mut t = txn.open_table(LOG)?;
                for entry in &entries {
                    let bytes = bincode::serialize(entry)?;
                    t.insert(entry.log_id.index, bytes.as_slice())?;
                }
            }
            // Default durability is Immediate: commit returns after fsync.
            txn.commit()?;
            Ok(())
        })
        .await;
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(io::Error::other(e.to_string()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        blocking(&self.db, ErrorSubject::Logs, ErrorVerb::Delete, move |db| {
            remove_log_range(db, log_id.index..)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        blocking(&self.db, ErrorSubject::Logs, ErrorVerb::Delete, move |db| {
            // Record the purge point first: a crash between the two commits
            // leaves extra entries, never a hole.
            put_meta(db, META, "last_purged", &log_id)?;
            remove_log_range(db, ..=log_id.index)
        })
        .await
    }
}

fn remove_log_range(db: &Database, range: impl RangeBounds<u64>) -> Result<(), DiskError> {
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(LOG)?;
        let mut keys = Vec::new();
        for item in t.range::<u64>(range)? {
            keys.push(item?.0.value());
        }
        for key in keys {
            t.remove(key)?;
        }
    }
    txn.commit()?;
    Ok(())
}

// ------------------------------------------------------- the state machine

/// Everything the state machine holds: what readers (admin API, WatchRules)
/// see, and what a snapshot contains (after its format header, see
/// `encode_snapshot`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    /// The last log entry applied to `registry` (`None` before any).
    pub last_applied: Option<LogId>,
    /// The newest membership applied, with the entry that carried it.
    pub membership: StoredMembership,
    /// The replicated state itself.
    pub registry: Registry,
}

/// `sm_meta.applied`: how far the state machine on disk got, written with
/// every apply batch. Encodes as the `(last_applied, membership)` tuple it
/// replaced (bincode writes a struct's fields in order).
#[derive(Serialize, Deserialize)]
struct AppliedHeader {
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

/// `sm_meta.snapshot`: the current snapshot, kept so openraft can send it to
/// a follower that lags behind the purged log.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    /// The snapshot's bytes as sent: see [`encode_snapshot`]. Snapshots
    /// stored before format versions have no header; they decode as
    /// version 1.
    data: Vec<u8>,
}

/// Version 1's [`Applied`]: the same fields in the same order, with a
/// registry that had no cluster id. bincode writes a struct as its fields in
/// order, so these decode version-1 snapshots exactly; they must never change.
#[derive(Serialize, Deserialize)]
struct AppliedV1 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    registry: RegistryV1,
}

/// Version 1's [`Registry`].
#[derive(Serialize, Deserialize)]
struct RegistryV1 {
    versions: BTreeMap<u64, RuleSetVersion>,
    regions: BTreeMap<String, Region>,
    allocations: Allocations,
}

impl From<AppliedV1> for Applied {
    /// The version-1 state in this build: no cluster id yet, which the
    /// leader then sets.
    fn from(v1: AppliedV1) -> Applied {
        Applied {
            last_applied: v1.last_applied,
            membership: v1.membership,
            registry: Registry {
                versions: v1.registry.versions,
                regions: v1.registry.regions,
                allocations: v1.registry.allocations,
                cluster_id: None,
                drills: Drills::default(),
            },
        }
    }
}

/// Version 2's [`Applied`]: version 3 without the drills, which come last
/// in the registry. Must never change.
#[derive(Serialize, Deserialize)]
struct AppliedV2 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    registry: RegistryV2,
}

/// Version 2's [`Registry`].
#[derive(Serialize, Deserialize)]
struct RegistryV2 {
    versions: BTreeMap<u64, RuleSetVersion>,
    regions: BTreeMap<String, Region>,
    allocations: Allocations,
    cluster_id: Option<ClusterId>,
}

impl From<AppliedV2> for Applied {
    /// The version-2 state in this build: no drills yet.
    fn from(v2: AppliedV2) -> Applied {
        Applied {
            last_applied: v2.last_applied,
            membership: v2.membership,
            registry: Registry {
                versions: v2.registry.versions,
                regions: v2.registry.regions,
                allocations: v2.registry.allocations,
                cluster_id: v2.registry.cluster_id,
                drills: Drills::default(),
            },
        }
    }
}

/// A snapshot's bytes: [`SNAPSHOT_MAGIC`], [`FORMAT_VERSION`] (`u32`,
/// little-endian), then the bincode [`Applied`].
fn encode_snapshot(applied: &Applied) -> Result<Vec<u8>, bincode::Error> {
    let mut data = Vec::with_capacity(8 + bincode::serialized_size(applied)? as usize);
    data.extend_from_slice(SNAPSHOT_MAGIC);
    data.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bincode::serialize_into(&mut data, applied)?;
    Ok(data)
}

/// Decodes a snapshot written by [`encode_snapshot`] in any of
/// [`KNOWN_FORMATS`], or one without a header (a build from before format
/// versions: version 1). `what` names it in errors.
fn decode_snapshot(data: &[u8], what: &str) -> Result<Applied, DiskError> {
    let Some(rest) = data.strip_prefix(SNAPSHOT_MAGIC) else {
        return Ok(bincode::deserialize::<AppliedV1>(data)?.into());
    };
    let Some((version, payload)) = rest.split_first_chunk::<4>() else {
        return Err(DiskError::BadHeader {
            what: what.to_string(),
            reason: format!("format header cut short ({} bytes)", data.len()),
        });
    };
    match u32::from_le_bytes(*version) {
        1 => Ok(bincode::deserialize::<AppliedV1>(payload)?.into()),
        2 => Ok(bincode::deserialize::<AppliedV2>(payload)?.into()),
        3 => Ok(bincode::deserialize(payload)?),
        found => Err(DiskError::UnknownFormat {
            what: what.to_string(),
            found,
            known: KNOWN_FORMATS,
        }),
    }
}

fn load_applied(db: &Database) -> Result<Applied, DiskError> {
    let header: Option<AppliedHeader> = get_meta(db, SM_META, "applied")?;
    let regions: Option<BTreeMap<String, Region>> = get_meta(db, SM_META, "regions")?;
    let allocations: Option<Allocations> = get_meta(db, SM_META, "allocations")?;
    // Absent in a new dir and in one from format 1.
    let cluster_id: Option<Option<ClusterId>> = get_meta(db, SM_META, "cluster_id")?;
    // Absent before format 3.
    let last_drill: Option<u64> = get_meta(db, SM_META, "drills_last_id")?;
    let txn = db.begin_read()?;
    let t = txn.open_table(VERSIONS)?;
    let mut registry = Registry {
        regions: regions.unwrap_or_default(),
        allocations: allocations.unwrap_or_default(),
        cluster_id: cluster_id.flatten(),
        ..Registry::default()
    };
    for item in t.range::<u64>(..)? {
        let (k, v) = item?;
        registry
            .versions
            .insert(k.value(), bincode::deserialize(v.value())?);
    }
    let drills = txn.open_table(SM_DRILLS)?;
    for item in drills.range::<u64>(..)? {
        let (k, v) = item?;
        registry
            .drills
            .by_id
            .insert(k.value(), Arc::new(bincode::deserialize(v.value())?));
    }
    registry.drills.last_id = last_drill.unwrap_or_default();
    let (last_applied, membership) =
        header.map_or_else(Default::default, |h| (h.last_applied, h.membership));
    Ok(Applied {
        last_applied,
        membership,
        registry,
    })
}

/// Which rows of the per-row tables a write touches.
struct Rows<'a> {
    /// Rule-set versions to write.
    versions: &'a [RuleSetVersion],
    /// Drills to write; rows of drills no longer held are deleted whenever
    /// this is not empty.
    drills: &'a [u64],
    /// Drop every other version and drill first (snapshot install).
    replace: bool,
}

/// Writes the applied header, the regions, the allocations, the cluster id
/// and the rows of `rows` in one transaction.
fn persist_applied(
    db: &Database,
    applied: &Applied,
    rows: Rows<'_>,
    durability: Durability,
) -> Result<(), DiskError> {
    let Rows {
        versions,
        drills,
        replace: replace_versions,
    } = rows;
    let header = bincode::serialize(&AppliedHeader {
        last_applied: applied.last_applied,
        membership: applied.membership.clone(),
    })?;
    let regions = bincode::serialize(&applied.registry.regions)?;
    let allocations = bincode::serialize(&applied.registry.allocations)?;
    let cluster_id = bincode::serialize(&applied.registry.cluster_id)?;
    let mut txn = db.begin_write()?;
    txn.set_durability(durability)?;
    {
        let mut t = txn.open_table(VERSIONS)?;
        if replace_versions {
            t.retain(|_, _| false)?;
        }
        for v in versions {
            t.insert(v.number, bincode::serialize(v)?.as_slice())?;
        }
        let mut m = txn.open_table(SM_META)?;
        m.insert("applied", header.as_slice())?;
        m.insert("regions", regions.as_slice())?;
        m.insert("allocations", allocations.as_slice())?;
        m.insert("cluster_id", cluster_id.as_slice())?;
        let held = &applied.registry.drills;
        if replace_versions || !drills.is_empty() {
            m.insert(
                "drills_last_id",
                bincode::serialize(&held.last_id)?.as_slice(),
            )?;
            let mut t = txn.open_table(SM_DRILLS)?;
            t.retain(|k, _| !replace_versions && held.by_id.contains_key(&k))?;
            let ids: Vec<u64> = if replace_versions {
                held.by_id.keys().copied().collect()
            } else {
                drills.to_vec()
            };
            for id in ids {
                if let Some(d) = held.by_id.get(&id) {
                    t.insert(id, bincode::serialize(d.as_ref())?.as_slice())?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

/// The state machine: applies committed commands to the [`Registry`] and
/// persists the result before reporting it applied.
pub struct StateMachineStore {
    db: Arc<Database>,
    /// The authoritative applied state; only `apply` and `install_snapshot` change it.
    applied: Applied,
    /// Readers' copy, replaced after each apply batch. A `watch` channel so the
    /// admin API and every WatchRules stream read without locking the state
    /// machine, and streams wake on change.
    published: watch::Sender<Arc<Applied>>,
}

impl StateMachineStore {
    /// A receiver of every applied state, starting with the current one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Applied>> {
        self.published.subscribe()
    }

    fn publish(&self) {
        self.published.send_replace(Arc::new(self.applied.clone()));
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.applied.last_applied, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // A batch creates versions above the current one and may move the
        // current one's stage: those are the versions to write.
        let first_dirty = self.applied.registry.current().map_or(0, |v| v.number);
        let mut outcomes = Vec::new();
        let mut drills = Vec::new();
        for entry in entries {
            self.applied.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Outcome::Nothing,
                EntryPayload::Normal(command) => {
                    let drill = command.drill();
                    let outcome = self.applied.registry.apply(command);
                    if let (Some(d), Outcome::Applied { version }) = (drill, &outcome) {
                        // A start names its new id in the outcome.
                        drills.extend(d.or(*version));
                    }
                    outcome
                }
                EntryPayload::Membership(m) => {
                    self.applied.membership = StoredMembership::new(Some(entry.log_id), m);
                    Outcome::Nothing
                }
            };
            outcomes.push(outcome);
        }
        if outcomes.is_empty() {
            return Ok(outcomes);
        }
        let applied = self.applied.clone();
        blocking(
            &self.db,
            ErrorSubject::StateMachine,
            ErrorVerb::Write,
            move |db| {
                let dirty: Vec<RuleSetVersion> = applied
                    .registry
                    .versions
                    .range(first_dirty..)
                    .map(|(_, v)| v.clone())
                    .collect();
                let rows = Rows {
                    versions: &dirty,
                    drills: &drills,
                    replace: false,
                };
                persist_applied(db, &applied, rows, Durability::None)
            },
        )
        .await?;
        self.publish();
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: Arc::clone(&self.db),
            applied: self.applied.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let signature = Some(meta.signature());
        let applied =
            decode_snapshot(&data, &format!("snapshot {}", meta.snapshot_id)).map_err(|e| {
                StorageError::from(StorageIOError::read_snapshot(signature.clone(), &e))
            })?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        let to_write = applied.clone();
        blocking(
            &self.db,
            ErrorSubject::Snapshot(signature),
            ErrorVerb::Write,
            move |db| {
                let versions: Vec<RuleSetVersion> =
                    to_write.registry.versions.values().cloned().collect();
                let rows = Rows {
                    versions: &versions,
                    drills: &[],
                    replace: true,
                };
                persist_applied(db, &to_write, rows, Durability::Immediate)?;
                put_meta(db, SM_META, "snapshot", &stored)
            },
        )
        .await?;
        metrics::counter!("meridian_coordinator_snapshots_installed_total").increment(1);
        self.applied = applied;
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let stored: Option<StoredSnapshot> = blocking(
            &self.db,
            ErrorSubject::Snapshot(None),
            ErrorVerb::Read,
            |db| get_meta(db, SM_META, "snapshot"),
        )
        .await?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

/// Builds a snapshot from a copy of the applied state taken when openraft
/// asked for the builder, so applies continue meanwhile.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    /// The applied state as of the builder's creation; the snapshot is built from it.
    applied: Applied,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let data = encode_snapshot(&self.applied)
            .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, &e)))?;
        let stamp = crate::clock::now_unix_ns();
        let meta = SnapshotMeta {
            last_log_id: self.applied.last_applied,
            last_membership: self.applied.membership.clone(),
            snapshot_id: match self.applied.last_applied {
                Some(id) => format!("{}-{}-{stamp}", id.leader_id, id.index),
                None => format!("empty-{stamp}"),
            },
        };
        metrics::gauge!("meridian_coordinator_snapshot_bytes").set(data.len() as f64);
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        blocking(
            &self.db,
            ErrorSubject::Snapshot(Some(meta.signature())),
            ErrorVerb::Write,
            move |db| put_meta(db, SM_META, "snapshot", &stored),
        )
        .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};
    use tempfile::TempDir;

    use super::*;
    use crate::allocation::GrantChange;

    /// The cluster id in the version-2 fixture.
    const FIXTURE_CLUSTER_ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";

    /// The state the committed fixtures hold: two regions, a rule set put in
    /// canary then rolled back, two allocation epochs (a split change and a
    /// key entry) and, from version 2, a cluster id, so every replicated
    /// type appears in them.
    fn fixture_applied() -> Applied {
        use std::collections::BTreeMap;

        use crate::allocation::{Allocations, KeyAllocation, RegionLease, RuleAllocation, Slot};
        use crate::coordinator::raft::Member;
        use crate::coordinator::state::{Command, RegionState, Stage};

        let mut registry = Registry::default();
        let mut commands = vec![
            Command::PutRegion {
                name: "eu".into(),
                weight: 1.0,
                state: RegionState::Active,
                at_unix_ms: 1_000,
            },
            Command::PutRegion {
                name: "us".into(),
                weight: 2.0,
                state: RegionState::Draining,
                at_unix_ms: 1_001,
            },
            Command::PutRules {
                files: BTreeMap::from([("a.yaml".into(), "domain: a\n".into())]),
                stage: Stage::All,
                at_unix_ms: 2_000,
            },
            Command::PutRules {
                files: BTreeMap::from([("a.yaml".into(), "domain: b\n".into())]),
                stage: Stage::Canary {
                    regions: vec!["eu".into()],
                },
                at_unix_ms: 3_000,
            },
            Command::Rollback {
                to: None,
                at_unix_ms: 4_000,
            },
            Command::SetClusterId(FIXTURE_CLUSTER_ID.parse().expect("cluster id")),
        ];
        let slot = |granted| Slot {
            granted,
            bound: granted,
            target: granted,
            since: 1,
            ..Slot::default()
        };
        let mut state = Allocations::default();
        let mut next = Allocations {
            epoch: 1,
            at_ms: 5_000,
            regions: BTreeMap::from([(
                "eu".into(),
                RegionLease {
                    valid_until_ms: 185_000,
                    acked: 0,
                    last_heard_ms: 4_900,
                },
            )]),
            rules: BTreeMap::from([(
                "a/global".into(),
                RuleAllocation {
                    limit: 1_000,
                    fallback: BTreeMap::from([("eu".into(), 30), ("us".into(), 60)]),
                    split: BTreeMap::from([("eu".into(), slot(400)), ("us".into(), slot(600))]),
                    high_water: 1_000,
                    demand: BTreeMap::from([("eu".into(), 350.0), ("us".into(), 500.0)]),
                    keys: BTreeMap::new(),
                },
            )]),
            ..Allocations::default()
        };
        commands.push(Command::Epoch(state.diff(&next)));
        state.apply(&state.diff(&next));
        next.epoch = 2;
        next.at_ms = 65_000;
        if let Some(rule) = next.rules.get_mut("a/global") {
            rule.keys.insert(
                "user-7".into(),
                KeyAllocation {
                    shares: BTreeMap::from([("eu".into(), slot(900)), ("us".into(), slot(100))]),
                    demand: BTreeMap::from([("eu".into(), 800.0)]),
                },
            );
        }
        commands.push(Command::Epoch(state.diff(&next)));
        // From version 3: a drill, stopped, with observations.
        use crate::coordinator::drill::{Actor, Event, Mode, StartDrill, Stop, StopReason, What};
        let actor = Actor {
            credential: "admin token sha256:0a1b2c3d".into(),
            from: "10.0.0.9:5123".into(),
            operator: Some("ops".into()),
        };
        commands.push(Command::StartDrill(StartDrill {
            region: "eu".into(),
            mode: Mode::Drain,
            duration_ms: Some(30_000),
            note: "quarterly drill".into(),
            force: false,
            by: actor.clone(),
            at_unix_ms: 70_000,
        }));
        commands.push(Command::DrillObserved {
            id: 1,
            events: vec![
                Event {
                    at_unix_ms: 70_300,
                    what: What::Acknowledged { epoch: 3 },
                },
                Event {
                    at_unix_ms: 70_400,
                    what: What::Window {
                        rule: "a/global".into(),
                        start_ms: 60_000,
                        admitted: BTreeMap::from([("eu".into(), 300), ("us".into(), 500)]),
                        estimated: vec!["us".into()],
                    },
                },
            ],
        });
        commands.push(Command::StopDrill {
            id: 1,
            stop: Stop {
                at_unix_ms: 80_000,
                by: actor,
                reason: StopReason::Stopped,
            },
        });
        for command in commands {
            registry.apply(command);
        }
        assert_eq!(
            registry.drills.by_id.len(),
            1,
            "the fixture's drill was applied"
        );
        let leader = openraft::CommittedLeaderId::new(3, 1);
        let members = BTreeMap::from([(
            1,
            Member {
                raft_addr: "10.0.0.1:7000".into(),
                http_addr: "10.0.0.1:8080".into(),
            },
        )]);
        Applied {
            last_applied: Some(LogId::new(leader, 42)),
            membership: StoredMembership::new(
                Some(LogId::new(leader, 2)),
                openraft::Membership::new(vec![std::collections::BTreeSet::from([1])], members),
            ),
            registry,
        }
    }

    /// [`fixture_applied`] as version 2 holds it: without drills.
    fn fixture_applied_v2() -> Applied {
        let mut applied = fixture_applied();
        applied.registry.drills = Drills::default();
        applied
    }

    /// [`fixture_applied`] as version 1 holds it: without a cluster id (nor drills).
    fn fixture_applied_v1() -> Applied {
        let mut applied = fixture_applied_v2();
        applied.registry.cluster_id = None;
        applied
    }

    /// A version-1 snapshot of [`fixture_applied_v1`], committed so that a
    /// change to any stored type's encoding fails here instead of on an
    /// operator's data dir. Never rewritten: a new [`FORMAT_VERSION`] adds
    /// its own file beside it, the bytes of `encode_snapshot(&fixture_applied())`
    /// in that build. The v1 file was first written from the build before
    /// format versions (`4e0c7bf`); the test below re-encodes its payload
    /// byte for byte through [`AppliedV1`].
    const SNAPSHOT_V1: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/raft/snapshot-v1.bin"
    ));

    /// The version-2 snapshot of [`fixture_applied`], first written by the
    /// build that introduced version 2; re-encoded byte for byte below.
    const SNAPSHOT_V2: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/raft/snapshot-v2.bin"
    ));

    /// The version-3 snapshot of [`fixture_applied`], first written by the
    /// build that introduced version 3; re-encoded byte for byte below.
    const SNAPSHOT_V3: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/raft/snapshot-v3.bin"
    ));

    #[test]
    fn committed_v3_snapshot_decodes_to_the_fixture_state_and_this_build_writes_it() {
        let applied = decode_snapshot(SNAPSHOT_V3, "fixture").expect("decode");
        assert_eq!(applied, fixture_applied());
        assert_eq!(applied.registry.drills.last_id, 1);
        assert_eq!(
            encode_snapshot(&applied).expect("encode"),
            SNAPSHOT_V3,
            "this build must write version 3 exactly as the fixture"
        );
    }

    /// The payload after a snapshot's format header.
    fn payload(snapshot: &[u8]) -> &[u8] {
        &snapshot[SNAPSHOT_MAGIC.len() + 4..]
    }

    #[test]
    fn committed_v2_snapshot_decodes_to_the_fixture_state_without_drills() {
        assert_eq!(&SNAPSHOT_V2[..SNAPSHOT_MAGIC.len()], SNAPSHOT_MAGIC);
        let applied = decode_snapshot(SNAPSHOT_V2, "fixture").expect("decode");
        assert_eq!(applied, fixture_applied_v2());
        assert_eq!(
            applied
                .registry
                .cluster_id
                .map(|id| id.to_string())
                .as_deref(),
            Some(FIXTURE_CLUSTER_ID)
        );
        let v2 = AppliedV2 {
            last_applied: applied.last_applied,
            membership: applied.membership.clone(),
            registry: RegistryV2 {
                versions: applied.registry.versions.clone(),
                regions: applied.registry.regions.clone(),
                allocations: applied.registry.allocations.clone(),
                cluster_id: applied.registry.cluster_id,
            },
        };
        assert_eq!(
            bincode::serialize(&v2).expect("encode"),
            payload(SNAPSHOT_V2),
            "AppliedV2 must read and write version 2 exactly as the fixture"
        );
    }

    #[test]
    fn committed_v1_snapshot_decodes_to_the_fixture_state_without_a_cluster_id() {
        let applied = decode_snapshot(SNAPSHOT_V1, "fixture").expect("decode");
        assert_eq!(applied, fixture_applied_v1());
        let allocations = &applied.registry.allocations;
        assert_eq!(allocations.epoch, 2);
        assert_eq!(
            allocations.history.back().map(|r| r.changes.clone()),
            Some(vec![
                GrantChange {
                    rule: "a/global".into(),
                    key: Some("user-7".into()),
                    region: "eu".into(),
                    granted: 900,
                },
                GrantChange {
                    rule: "a/global".into(),
                    key: Some("user-7".into()),
                    region: "us".into(),
                    granted: 100,
                },
            ])
        );
        assert_eq!(applied.registry.current().map(|v| v.number), Some(3));
        let v1 = AppliedV1 {
            last_applied: applied.last_applied,
            membership: applied.membership.clone(),
            registry: RegistryV1 {
                versions: applied.registry.versions.clone(),
                regions: applied.registry.regions.clone(),
                allocations: applied.registry.allocations.clone(),
            },
        };
        assert_eq!(
            bincode::serialize(&v1).expect("encode"),
            payload(SNAPSHOT_V1),
            "AppliedV1 must read and write version 1 exactly as the fixture"
        );
    }

    #[test]
    fn snapshot_without_a_header_decodes_as_version_1() {
        // What builds from before format versions send and store.
        let applied = decode_snapshot(payload(SNAPSHOT_V1), "old snapshot").expect("decode");
        assert_eq!(applied, fixture_applied_v1());
    }

    #[test]
    fn snapshot_in_an_unknown_format_is_refused_naming_both_versions() {
        let mut data = SNAPSHOT_V1.to_vec();
        data[SNAPSHOT_MAGIC.len()..SNAPSHOT_MAGIC.len() + 4].copy_from_slice(&7u32.to_le_bytes());
        let err = decode_snapshot(&data, "snapshot 3-1-42").expect_err("version 7 is unknown");
        assert_eq!(
            err.to_string(),
            "snapshot 3-1-42 is in storage format version 7, but this build knows only \
             version(s) [1, 2, 3]; run a Meridian build that knows version 7"
        );
        let cut = decode_snapshot(&SNAPSHOT_V1[..6], "snapshot x").expect_err("cut short");
        assert!(cut.to_string().contains("cut short"), "{cut}");
    }

    #[tokio::test]
    async fn installing_a_snapshot_in_an_unknown_format_fails_and_keeps_the_state() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_log, mut sm) = open(dir.path()).expect("open");
        let mut data = SNAPSHOT_V3.to_vec();
        data[SNAPSHOT_MAGIC.len()..SNAPSHOT_MAGIC.len() + 4].copy_from_slice(&4u32.to_le_bytes());
        let applied = fixture_applied();
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id: "3-1-42".into(),
        };
        let err = sm
            .install_snapshot(&meta, Box::new(Cursor::new(data)))
            .await
            .expect_err("version 4 is unknown");
        assert!(
            err.to_string().contains("format version 4"),
            "the error names the version: {err}"
        );
        assert_eq!(*sm.subscribe().borrow().as_ref(), Applied::default());
        sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V1.to_vec())))
            .await
            .expect("version 1 installs");
        assert_eq!(*sm.subscribe().borrow().as_ref(), fixture_applied_v1());
        sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V2.to_vec())))
            .await
            .expect("version 2 installs");
        assert_eq!(*sm.subscribe().borrow().as_ref(), fixture_applied_v2());
        sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V3.to_vec())))
            .await
            .expect("version 3 installs");
        assert_eq!(*sm.subscribe().borrow().as_ref(), applied);
        // Installed drills are in the tables: they survive a reopen.
        drop((_log, sm));
        let (_log, sm) = open(dir.path()).expect("reopen");
        assert_eq!(*sm.subscribe().borrow().as_ref(), applied);
    }

    /// Rewrites `raft_meta.format_version` of the dir (`None` removes it).
    fn set_format(dir: &Path, value: Option<&[u8]>) {
        let db = Database::create(dir.join(DB_FILE)).expect("db");
        let txn = db.begin_write().expect("txn");
        {
            let mut meta = txn.open_table(META).expect("meta");
            match value {
                Some(v) => meta.insert(FORMAT_KEY, v).map(drop),
                None => meta.remove(FORMAT_KEY).map(drop),
            }
            .expect("write format");
        }
        txn.commit().expect("commit");
    }

    fn recorded_format(dir: &Path) -> Option<u32> {
        let db = Database::create(dir.join(DB_FILE)).expect("db");
        let txn = db.begin_read().expect("txn");
        read_format(&txn.open_table(META).expect("meta")).expect("format")
    }

    /// A data dir holding the fixture state, as `open` and the state machine
    /// write it.
    async fn dir_with_fixture_state() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_log, mut sm) = open(dir.path()).expect("open");
        let applied = fixture_applied();
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id: "fixture".into(),
        };
        sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V3.to_vec())))
            .await
            .expect("install");
        dir
    }

    /// A data dir as a version-1 build leaves it: the v1 fixture's state and
    /// snapshot, no `sm_meta.cluster_id`, no record of its store, and
    /// `format_version` 1 (`None`: not recorded, as before formats were
    /// versioned).
    async fn version_1_dir(format: Option<u32>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (_log, mut sm) = open(dir.path()).expect("open");
            let applied = fixture_applied_v1();
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
                snapshot_id: "fixture".into(),
            };
            sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V1.to_vec())))
                .await
                .expect("install");
        }
        let db = Database::create(dir.path().join(DB_FILE)).expect("db");
        let txn = db.begin_write().expect("txn");
        txn.open_table(SM_META)
            .expect("sm_meta")
            .remove("cluster_id")
            .expect("remove the cluster id");
        txn.commit().expect("commit");
        drop(db);
        set_format(
            dir.path(),
            format.map(u32::to_le_bytes).as_ref().map(|b| &b[..]),
        );
        // A version-1 build kept no record of its store.
        std::fs::remove_file(dir.path().join(marker::FILE)).expect("remove the record");
        dir
    }

    #[tokio::test]
    async fn a_version_1_data_dir_opens_without_a_cluster_id_and_is_recorded_as_version_2() {
        let dir = version_1_dir(Some(1)).await;
        assert_eq!(recorded_format(dir.path()), Some(1));
        let (log, mut sm) = open(dir.path()).expect("a version 1 dir opens");
        assert_eq!(*sm.subscribe().borrow().as_ref(), fixture_applied_v1());
        // Its stored snapshot is still version 1, and still reads.
        let snapshot = sm.get_current_snapshot().await.expect("read").expect("one");
        assert_eq!(
            decode_snapshot(snapshot.snapshot.get_ref(), "stored").expect("decode"),
            fixture_applied_v1()
        );
        // The leader's id, applied on top, is kept across a reopen.
        let id = ClusterId::random();
        let next = LogId::new(openraft::CommittedLeaderId::new(3, 1), 43);
        let entry = Entry {
            log_id: next,
            payload: EntryPayload::Normal(crate::coordinator::state::Command::SetClusterId(id)),
        };
        let out = sm.apply([entry]).await.expect("apply");
        assert_eq!(out, vec![Outcome::Applied { version: None }]);
        drop((log, sm));
        assert_eq!(recorded_format(dir.path()), Some(FORMAT_VERSION));
        let (_log, sm) = open(dir.path()).expect("reopen");
        assert_eq!(sm.subscribe().borrow().registry.cluster_id, Some(id));
    }

    #[test]
    fn a_new_data_dir_records_the_current_format() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(open(dir.path()).expect("open"));
        assert_eq!(recorded_format(dir.path()), Some(FORMAT_VERSION));
    }

    #[tokio::test]
    async fn a_data_dir_without_a_version_opens_as_version_1_and_is_migrated() {
        let dir = version_1_dir(None).await;
        let (_log, sm) = open(dir.path()).expect("an unversioned dir opens");
        assert_eq!(*sm.subscribe().borrow().as_ref(), fixture_applied_v1());
        drop((_log, sm));
        assert_eq!(recorded_format(dir.path()), Some(FORMAT_VERSION));
    }

    #[tokio::test]
    async fn a_data_dir_in_an_unknown_format_is_refused_naming_both_versions() {
        let dir = dir_with_fixture_state().await;
        set_format(dir.path(), Some(&9u32.to_le_bytes()));
        let Err(err) = open(dir.path()) else {
            panic!("a version 9 dir must be refused");
        };
        assert_eq!(
            err.to_string(),
            "coordinator.redb is in storage format version 9, but this build knows only \
             version(s) [1, 2, 3]; run a Meridian build that knows version 9"
        );
        assert_eq!(
            recorded_format(dir.path()),
            Some(9),
            "the dir is left as it was"
        );
        set_format(dir.path(), Some(b"v1"));
        let Err(err) = open(dir.path()) else {
            panic!("an unreadable version must be refused");
        };
        assert!(err.to_string().contains("expected 4"), "{err}");
    }

    /// Whether `open` refused `dir` as a data dir whose store was lost,
    /// with a message that says what was found and how to start over.
    fn refused_as_lost(dir: &Path, found: &str) {
        let Err(err) = open(dir) else {
            panic!("{found}: a lost store must be refused");
        };
        let text = err.to_string();
        for words in [
            "coordinator.redb.created",
            found,
            "vote",
            "--init",
            "move this data dir away",
        ] {
            assert!(text.contains(words), "{words:?} missing: {text}");
        }
    }

    /// Issue 28: a data dir whose `coordinator.redb` was emptied, removed or
    /// replaced started as a brand-new node (no log, no vote, no
    /// membership, no warning). Once a store was created here, each of
    /// those is refused and the dir left as it was found.
    #[test]
    fn a_data_dir_that_held_a_store_refuses_it_missing_empty_or_unversioned() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(open(dir.path()).expect("a new dir opens"));
        let db = dir.path().join(DB_FILE);

        std::fs::remove_file(&db).expect("remove the store");
        refused_as_lost(dir.path(), "no coordinator.redb");
        assert!(!db.exists(), "no new store is created in its place");

        std::fs::File::create(&db).expect("an empty file");
        refused_as_lost(dir.path(), "empty (0 bytes)");

        std::fs::remove_file(&db).expect("remove");
        drop(Database::create(&db).expect("an empty redb store"));
        refused_as_lost(dir.path(), "holds no storage format");

        // An unversioned store with data (a pre-format build's, restored
        // from an old backup) is not the store created here either.
        std::fs::remove_file(&db).expect("remove");
        let other = tempfile::tempdir().expect("temp dir");
        drop(open(other.path()).expect("open"));
        set_format(other.path(), None);
        put_meta(
            &Database::create(other.path().join(DB_FILE)).expect("db"),
            META,
            "committed",
            &None::<LogId>,
        )
        .expect("some data");
        std::fs::copy(other.path().join(DB_FILE), &db).expect("copy");
        refused_as_lost(dir.path(), "holds no storage format");
    }

    /// A store replaced by a fresh one of this build (format recorded, no
    /// vote) loses the vote all the same: refused once a vote was stored.
    #[tokio::test]
    async fn a_data_dir_whose_node_voted_refuses_a_store_without_a_vote() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (mut log, _sm) = open(dir.path()).expect("open");
            let vote = Vote::new(3, 1);
            log.save_vote(&vote).await.expect("vote");
        }
        let fresh = tempfile::tempdir().expect("temp dir");
        drop(open(fresh.path()).expect("open"));
        std::fs::copy(fresh.path().join(DB_FILE), dir.path().join(DB_FILE)).expect("copy");
        refused_as_lost(dir.path(), "holds no vote");
        // A node that never voted (started, never joined) restarts as it was.
        drop(open(fresh.path()).expect("a store without a vote, never voted"));
    }

    /// A genuinely new dir opens and records its store; a dir written before
    /// the record existed (a store with data, no record) opens and gains it.
    #[tokio::test]
    async fn new_and_older_data_dirs_open_and_record_their_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(open(dir.path()).expect("a new dir opens"));
        assert!(dir.path().join("coordinator.redb.created").exists());
        let old = version_1_dir(Some(1)).await;
        assert!(!old.path().join("coordinator.redb.created").exists());
        drop(open(old.path()).expect("an older dir opens"));
        assert!(old.path().join("coordinator.redb.created").exists());
    }

    struct RedbBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for RedbBuilder {
        async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
            let dir =
                tempfile::tempdir().map_err(|e| StorageError::from(StorageIOError::write(&e)))?;
            let (log, sm) =
                open(dir.path()).map_err(|e| StorageError::from(StorageIOError::write(&e)))?;
            Ok((dir, log, sm))
        }
    }

    /// openraft's conformance suite for log and state-machine stores.
    #[test]
    fn redb_store_passes_openraft_suite() {
        if let Err(e) = Suite::test_all(RedbBuilder) {
            panic!("openraft storage suite: {e}");
        }
    }

    #[tokio::test]
    async fn state_survives_reopen() {
        use crate::coordinator::state::{Command, Stage};
        let dir = tempfile::tempdir().expect("temp dir");
        let log_id = LogId::new(openraft::CommittedLeaderId::new(1, 0), 1);
        {
            let (_log, mut sm) = open(dir.path()).expect("open");
            let entry = Entry {
                log_id,
                payload: EntryPayload::Normal(Command::PutRules {
                    files: [("a.yaml".to_string(), "domain: a\n".to_string())].into(),
                    stage: Stage::All,
                    at_unix_ms: 1,
                }),
            };
            let out = sm.apply([entry]).await.expect("apply");
            assert_eq!(out, vec![Outcome::Applied { version: Some(1) }]);
        }
        let (_log, sm) = open(dir.path()).expect("reopen");
        let applied = sm.subscribe().borrow().clone();
        assert_eq!(applied.last_applied, Some(log_id));
        assert_eq!(applied.registry.current().map(|v| v.number), Some(1));
    }

    #[tokio::test]
    async fn drills_applied_one_by_one_survive_reopen() {
        use crate::coordinator::drill::{Actor, Event, Mode, StartDrill, What};
        use crate::coordinator::state::{Command, RegionState};
        let dir = tempfile::tempdir().expect("temp dir");
        let entry = |index: u64, command: Command| Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(command),
        };
        let expected = {
            let (_log, mut sm) = open(dir.path()).expect("open");
            let out = sm
                .apply([
                    entry(
                        1,
                        Command::PutRegion {
                            name: "eu".into(),
                            weight: 1.0,
                            state: RegionState::Active,
                            at_unix_ms: 1,
                        },
                    ),
                    entry(
                        2,
                        Command::StartDrill(StartDrill {
                            region: "eu".into(),
                            mode: Mode::Fail,
                            duration_ms: None,
                            note: String::new(),
                            force: false,
                            by: Actor::default(),
                            at_unix_ms: 2,
                        }),
                    ),
                ])
                .await
                .expect("apply");
            assert_eq!(out[1], Outcome::Applied { version: Some(1) });
            // An observation alone rewrites only its drill's row.
            let events = vec![Event {
                at_unix_ms: 3,
                what: What::Acknowledged { epoch: 1 },
            }];
            sm.apply([entry(3, Command::DrillObserved { id: 1, events })])
                .await
                .expect("apply");
            sm.subscribe().borrow().clone()
        };
        let (_log, sm) = open(dir.path()).expect("reopen");
        let applied = sm.subscribe().borrow().clone();
        assert_eq!(applied.registry.drills, expected.registry.drills);
        assert_eq!(applied.registry.drills.by_id[&1].events.len(), 2);
    }
}
