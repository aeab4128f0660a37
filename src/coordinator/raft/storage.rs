//! Raft log and state machine on disk, in one redb database.
//!
//! Tables:
//! - `raft_log`: log index → bincode `Entry`;
//! - `raft_meta`: `vote`, `committed`, `last_purged`;
//! - `sm_versions`: rule-set version number → bincode `RuleSetVersion`, so an
//!   apply writes only the versions it created or moved, not every version;
//! - `sm_meta`: `applied` (last applied log id + membership), `regions`, and
//!   `snapshot` (the current snapshot's meta and bytes).
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

use std::fmt::Debug;
use std::io::{self, Cursor};
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, StorageIOError, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::coordinator::state::{Outcome, Region, Registry, RuleSetVersion};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const VERSIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("sm_versions");
const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");

/// The file inside `--data-dir`.
pub const DB_FILE: &str = "coordinator.redb";

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("decoding stored data: {0}")]
    Codec(#[from] bincode::Error),
    #[error("storage task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
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
/// openraft drives, plus a receiver of every applied state.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), DiskError> {
    let db = Arc::new(Database::create(dir.join(DB_FILE))?);
    // Create every table up front so that read transactions never meet a
    // missing one.
    let txn = db.begin_write()?;
    txn.open_table(LOG)?;
    txn.open_table(META)?;
    txn.open_table(VERSIONS)?;
    txn.open_table(SM_META)?;
    txn.commit()?;
    let applied = load_applied(&db)?;
    let (published, _) = watch::channel(Arc::new(applied.clone()));
    Ok((
        LogStore {
            db: Arc::clone(&db),
            committed: Arc::new(AtomicU64::new(0)),
        },
        StateMachineStore {
            db,
            applied,
            published,
        },
    ))
}

// ---------------------------------------------------------------- the log

/// The Raft log, vote and committed id. Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// Last committed index openraft saved (0 before any), for status and
    /// metrics; openraft keeps its own copy, this one is read-only elsewhere.
    committed: Arc<AtomicU64>,
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
        blocking(&self.db, ErrorSubject::Vote, ErrorVerb::Write, move |db| {
            put_meta(db, META, "vote", &vote)
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
/// see, and what a snapshot contains.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub registry: Registry,
}

/// The snapshot stored in `sm_meta`.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

fn load_applied(db: &Database) -> Result<Applied, DiskError> {
    let header: Option<(Option<LogId>, StoredMembership)> = get_meta(db, SM_META, "applied")?;
    let regions: Option<std::collections::BTreeMap<String, Region>> =
        get_meta(db, SM_META, "regions")?;
    let allocations: Option<crate::allocation::Allocations> = get_meta(db, SM_META, "allocations")?;
    let txn = db.begin_read()?;
    let t = txn.open_table(VERSIONS)?;
    let mut registry = Registry {
        regions: regions.unwrap_or_default(),
        allocations: allocations.unwrap_or_default(),
        ..Registry::default()
    };
    for item in t.range::<u64>(..)? {
        let (k, v) = item?;
        registry
            .versions
            .insert(k.value(), bincode::deserialize(v.value())?);
    }
    let (last_applied, membership) = header.unwrap_or_default();
    Ok(Applied {
        last_applied,
        membership,
        registry,
    })
}

/// Writes the applied header, the regions and `versions` in one transaction;
/// with `replace_versions`, drops every other version first (snapshot install).
fn persist_applied(
    db: &Database,
    applied: &Applied,
    versions: &[RuleSetVersion],
    durability: Durability,
    replace_versions: bool,
) -> Result<(), DiskError> {
    let header = bincode::serialize(&(applied.last_applied, &applied.membership))?;
    let regions = bincode::serialize(&applied.registry.regions)?;
    let allocations = bincode::serialize(&applied.registry.allocations)?;
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
        for entry in entries {
            self.applied.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Outcome::Nothing,
                EntryPayload::Normal(command) => self.applied.registry.apply(command),
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
                persist_applied(db, &applied, &dirty, Durability::None, false)
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
        let applied: Applied = bincode::deserialize(&data).map_err(|e| {
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
                persist_applied(db, &to_write, &versions, Durability::Immediate, true)?;
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
    applied: Applied,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let data = bincode::serialize(&self.applied)
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
}
