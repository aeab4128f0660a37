//! The redb database under both stores: its tables, the errors of disk work,
//! and the helpers that run that work off the runtime's workers.

use std::io;
use std::sync::Arc;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};
use redb::{Database, Durability, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};

use super::marker;
use crate::coordinator::raft::{NodeId, StorageError};

pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Holds `format_version`: its name and key/value types must stay as they
/// are in every format, or a build could not even read which format a dir is in.
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
pub(super) const VERSIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("sm_versions");
pub(super) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
pub(super) const SM_DRILLS: TableDefinition<u64, &[u8]> = TableDefinition::new("sm_drills");
/// One row per override, keyed by the bincode of its (rule, key).
pub(super) const SM_OVERRIDES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("sm_overrides");

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
pub(super) async fn blocking<T, F>(
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

pub(super) fn get_meta<T: for<'de> Deserialize<'de>>(
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

pub(super) fn put_meta<T: Serialize>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    value: &T,
) -> Result<(), DiskError> {
    put_meta_with(db, table, key, value, Durability::Immediate)
}

pub(super) fn put_meta_with<T: Serialize>(
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
