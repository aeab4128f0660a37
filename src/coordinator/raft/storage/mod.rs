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
//! The storage format (which versions this build writes and reads, and
//! how a data dir of an older one is migrated) is in [`format`].
//!
//! Its files: [`db`] (the tables, errors and blocking helpers), [`format`],
//! [`log_store`] (the log, vote and committed id), [`state_machine`] (the
//! applied state and its snapshots), `marker` (the data dir's record, below)
//! and, here, [`open`], which checks the data dir and hands openraft the two
//! stores.
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

mod db;
mod format;
mod log_store;
mod marker;
mod state_machine;

#[cfg(test)]
mod fixtures;

use std::io;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableTable, ReadableTableMetadata};

pub use self::db::{DB_FILE, DiskError};
use self::db::{LOG, META, SM_DRILLS, SM_META, SM_OVERRIDES, VERSIONS};
pub use self::format::{Applied, FORMAT_VERSION, KNOWN_FORMATS};
use self::format::{FORMAT_KEY, UNVERSIONED_FORMAT, read_format};
pub use self::log_store::LogStore;
use self::log_store::write_record;
pub use self::state_machine::StateMachineStore;

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
    let sm_overrides = txn.open_table(SM_OVERRIDES)?;
    let mut meta = txn.open_table(META)?;
    let found = match recorded {
        Some(found) => Some(found),
        None if log.is_empty()?
            && meta.is_empty()?
            && versions.is_empty()?
            && sm_meta.is_empty()?
            && sm_drills.is_empty()?
            && sm_overrides.is_empty()? =>
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
    drop((log, versions, sm_meta, sm_drills, sm_overrides, meta));
    txn.commit()?;
    // After the commit above (durable): the record never describes a store
    // that is not on disk yet.
    let record = match record {
        Some(r) if r.voted || !has_vote => r,
        Some(r) => write_record(dir, r.created_unix_ms, true)?,
        None => write_record(dir, crate::clock::now_unix_ms(), has_vote)?,
    };
    let state_machine = StateMachineStore::load(Arc::clone(&db))?;
    Ok((LogStore::new(db, dir, record), state_machine))
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{EntryPayload, StorageIOError, Vote};
    use redb::ReadableDatabase;
    use tempfile::TempDir;

    use super::db::put_meta;
    use super::fixtures::{SNAPSHOT_V1, SNAPSHOT_V4, fixture_applied, fixture_applied_v1};
    use super::format::decode_snapshot;
    use super::*;
    use crate::cluster_id::ClusterId;
    use crate::coordinator::raft::{Entry, LogId, SnapshotMeta, StorageError, TypeConfig};
    use crate::coordinator::state::Outcome;

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
        sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V4.to_vec())))
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
             version(s) [1, 2, 3, 4]; run a Meridian build that knows version 9"
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
}
