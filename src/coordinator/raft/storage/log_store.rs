//! The Raft log store: log entries, the vote and the committed id, and the
//! data dir's record that this node voted (see `marker`).

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, Vote};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use super::db::{DiskError, LOG, META, blocking, get_meta, put_meta, put_meta_with};
use super::marker;
use crate::coordinator::raft::{Entry, LogId, NodeId, StorageError, TypeConfig};

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
    /// The log store of `db`, whose data dir `dir` holds `record`.
    pub(super) fn new(db: Arc<Database>, dir: &Path, record: marker::Record) -> LogStore {
        LogStore {
            db,
            committed: Arc::new(AtomicU64::new(0)),
            record: Arc::new(VoteRecord {
                dir: dir.to_path_buf(),
                created_unix_ms: record.created_unix_ms,
                voted: AtomicBool::new(record.voted),
            }),
        }
    }

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

/// Writes the data dir's record of its store (see `marker`).
pub(super) fn write_record(
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
