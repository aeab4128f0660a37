//! The Raft state machine store: applies committed commands to the
//! [`Registry`], persists the result in the `sm_*` tables, publishes it to
//! readers, and builds, keeps and installs snapshots.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder, StorageIOError,
};
use redb::{Database, Durability, ReadableDatabase};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::db::{
    DiskError, SM_DRILLS, SM_META, SM_OVERRIDES, VERSIONS, blocking, get_meta, put_meta,
};
use super::format::{Applied, decode_snapshot, encode_snapshot};
use crate::allocation::Allocations;
use crate::cluster_id::ClusterId;
use crate::coordinator::raft::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::coordinator::resets::Resets;
use crate::coordinator::state::{Outcome, Region, Registry, RuleSetVersion};
use crate::overrides::{Import, Imports, Override, Overrides};

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

/// `sm_meta` key of the staged imports' index: (id, staged at, chunks).
const IMPORTS_KEY: &str = "override_imports";

/// `sm_meta` key of chunk `seq` of staged import `id`: each chunk is written
/// once, when it is staged, and deleted when its import is applied or dropped.
fn chunk_key(id: u64, seq: u32) -> String {
    format!("override_import/{id:020}/{seq:010}")
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
    // Absent before format 4.
    let overrides_version: Option<u64> = get_meta(db, SM_META, "overrides_version")?;
    let mut overrides = Overrides {
        version: overrides_version.unwrap_or_default(),
        ..Overrides::default()
    };
    let rows = txn.open_table(SM_OVERRIDES)?;
    for item in rows.range::<&[u8]>(..)? {
        let (_, v) = item?;
        let o: Override = bincode::deserialize(v.value())?;
        overrides.by_id.insert(o.id(), o);
    }
    registry.overrides = Arc::new(overrides);
    // Absent before format 4.
    let resets: Option<Resets> = get_meta(db, SM_META, "resets")?;
    registry.resets = resets.unwrap_or_default();
    let staged: Option<Vec<(u64, i64, u32)>> = get_meta(db, SM_META, IMPORTS_KEY)?;
    let mut imports = Imports::default();
    for (id, at_unix_ms, chunks) in staged.unwrap_or_default() {
        let mut import = Import {
            at_unix_ms,
            chunks: Vec::new(),
        };
        for seq in 0..chunks {
            let rows: Option<Vec<Override>> = get_meta(db, SM_META, &chunk_key(id, seq))?;
            import.chunks.push(Arc::new(rows.unwrap_or_default()));
        }
        imports.by_id.insert(id, import);
    }
    registry.override_imports = Arc::new(imports);
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
    /// The overrides before the batch, when it changed them: rows that
    /// differ from the registry's are written, rows no longer held deleted.
    overrides_before: Option<&'a Overrides>,
    /// Whether the batch touched the resets (kept as one value, bounded).
    resets: bool,
    /// The staged imports before the batch, when it touched them.
    imports_before: Option<&'a Imports>,
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
        overrides_before,
        resets,
        imports_before,
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
        if replace_versions || imports_before.is_some() {
            let after = &applied.registry.override_imports;
            let empty = Imports::default();
            let before = match imports_before {
                Some(before) if !replace_versions => before,
                _ => {
                    m.retain(|k, _| !k.starts_with("override_import/"))?;
                    &empty
                }
            };
            for (id, import) in &before.by_id {
                let kept = after.by_id.get(id).map_or(0, |i| i.chunks.len());
                for seq in kept..import.chunks.len() {
                    m.remove(chunk_key(*id, seq as u32).as_str())?;
                }
            }
            for (id, import) in &after.by_id {
                let written = before.by_id.get(id).map_or(0, |i| i.chunks.len());
                for (seq, chunk) in import.chunks.iter().enumerate().skip(written) {
                    m.insert(
                        chunk_key(*id, seq as u32).as_str(),
                        bincode::serialize(chunk.as_ref())?.as_slice(),
                    )?;
                }
            }
            let index: Vec<(u64, i64, u32)> = after
                .by_id
                .iter()
                .map(|(id, i)| (*id, i.at_unix_ms, i.chunks.len() as u32))
                .collect();
            m.insert(IMPORTS_KEY, bincode::serialize(&index)?.as_slice())?;
        }
        if replace_versions || resets {
            m.insert(
                "resets",
                bincode::serialize(&applied.registry.resets)?.as_slice(),
            )?;
        }
        let overrides = &applied.registry.overrides;
        if replace_versions || overrides_before.is_some() {
            m.insert(
                "overrides_version",
                bincode::serialize(&overrides.version)?.as_slice(),
            )?;
            let mut t = txn.open_table(SM_OVERRIDES)?;
            let empty = Overrides::default();
            let before = match overrides_before {
                Some(before) if !replace_versions => before,
                _ => {
                    t.retain(|_, _| false)?;
                    &empty
                }
            };
            for id in before.by_id.keys() {
                if !overrides.by_id.contains_key(id) {
                    t.remove(bincode::serialize(id)?.as_slice())?;
                }
            }
            for (id, o) in &overrides.by_id {
                if before.by_id.get(id) != Some(o) {
                    t.insert(
                        bincode::serialize(id)?.as_slice(),
                        bincode::serialize(o)?.as_slice(),
                    )?;
                }
            }
        }
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
    /// The state machine as `db` holds it.
    pub(super) fn load(db: Arc<Database>) -> Result<StateMachineStore, DiskError> {
        let applied = load_applied(&db)?;
        let (published, _) = watch::channel(Arc::new(applied.clone()));
        Ok(StateMachineStore {
            db,
            applied,
            published,
        })
    }

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
        let overrides_before = Arc::clone(&self.applied.registry.overrides);
        let mut outcomes = Vec::new();
        let mut drills = Vec::new();
        let mut resets = false;
        let imports_before = Arc::clone(&self.applied.registry.override_imports);
        let mut imports = false;
        for entry in entries {
            self.applied.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Outcome::Nothing,
                EntryPayload::Normal(command) => {
                    let drill = command.drill();
                    resets |= command.is_reset();
                    imports |= command.touches_imports();
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
                let changed = !Arc::ptr_eq(&overrides_before, &applied.registry.overrides);
                let rows = Rows {
                    versions: &dirty,
                    drills: &drills,
                    overrides_before: changed.then_some(overrides_before.as_ref()),
                    resets,
                    imports_before: imports.then_some(imports_before.as_ref()),
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
                    overrides_before: None,
                    resets: false,
                    imports_before: None,
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
    use super::*;
    use crate::coordinator::raft::storage::fixtures::{
        SNAPSHOT_V1, SNAPSHOT_V2, SNAPSHOT_V3, SNAPSHOT_V4, fixture_applied, fixture_applied_v1,
        fixture_applied_v2, fixture_applied_v3,
    };
    use crate::coordinator::raft::storage::format::SNAPSHOT_MAGIC;
    use crate::coordinator::raft::storage::open;

    #[tokio::test]
    async fn installing_a_snapshot_in_an_unknown_format_fails_and_keeps_the_state() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_log, mut sm) = open(dir.path()).expect("open");
        let mut data = SNAPSHOT_V3.to_vec();
        data[SNAPSHOT_MAGIC.len()..SNAPSHOT_MAGIC.len() + 4].copy_from_slice(&5u32.to_le_bytes());
        let applied = fixture_applied();
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id: "3-1-42".into(),
        };
        let err = sm
            .install_snapshot(&meta, Box::new(Cursor::new(data)))
            .await
            .expect_err("version 5 is unknown");
        assert!(
            err.to_string().contains("format version 5"),
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
        assert_eq!(*sm.subscribe().borrow().as_ref(), fixture_applied_v3());
        sm.install_snapshot(&meta, Box::new(Cursor::new(SNAPSHOT_V4.to_vec())))
            .await
            .expect("version 4 installs");
        assert_eq!(*sm.subscribe().borrow().as_ref(), applied);
        // Installed drills and overrides are in the tables: they survive a reopen.
        drop((_log, sm));
        let (_log, sm) = open(dir.path()).expect("reopen");
        assert_eq!(*sm.subscribe().borrow().as_ref(), applied);
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

    #[tokio::test]
    async fn overrides_set_removed_and_expired_survive_reopen_row_by_row() {
        use crate::coordinator::state::Command;
        use crate::overrides::{Override, OverrideChange};
        let dir = tempfile::tempdir().expect("temp dir");
        let entry = |index: u64, command: Command| Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(command),
        };
        let o = |key: &str, expires: Option<i64>| Override {
            domain: "api".into(),
            entries: vec![("customer".into(), key.into())],
            rule: "api|customer".into(),
            key: format!("customer={key}"),
            limit: 5_000,
            burst: None,
            expires_at_unix_ms: expires,
            reason: String::new(),
            set_by: "t".into(),
            set_at_unix_ms: 1,
            rule_name: None,
        };
        let change = |set, remove, at| {
            Command::SetOverrides(OverrideChange {
                set,
                remove,
                replace_all: false,
                import: None,
                at_unix_ms: at,
            })
        };
        let expected = {
            let (_log, mut sm) = open(dir.path()).expect("open");
            sm.apply([
                entry(
                    1,
                    change(
                        vec![o("1", None), o("2", Some(50)), o("3", None)],
                        vec![],
                        10,
                    ),
                ),
                entry(
                    2,
                    change(
                        vec![],
                        vec![("api|customer".into(), "customer=3".into())],
                        20,
                    ),
                ),
            ])
            .await
            .expect("apply");
            // In a batch of its own, after 2 expired: 2 is dropped, 4 added.
            sm.apply([entry(3, change(vec![o("4", None)], vec![], 60))])
                .await
                .expect("apply");
            sm.subscribe().borrow().clone()
        };
        assert_eq!(expected.registry.overrides.version, 3);
        let (_log, sm) = open(dir.path()).expect("reopen");
        let applied = sm.subscribe().borrow().clone();
        assert_eq!(applied.registry.overrides, expected.registry.overrides);
        let keys: Vec<&str> = applied
            .registry
            .overrides
            .by_id
            .keys()
            .map(|(_, k)| k.as_str())
            .collect();
        assert_eq!(keys, vec!["customer=1", "customer=4"]);
    }

    #[tokio::test]
    async fn a_staged_import_survives_reopen_and_applies_whole() {
        use crate::coordinator::state::Command;
        use crate::overrides::{Override, OverrideChange};
        let dir = tempfile::tempdir().expect("temp dir");
        let entry = |index: u64, command: Command| Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(command),
        };
        let rows = |from: usize| -> Vec<Override> {
            (from..from + 3)
                .map(|i| Override {
                    domain: "api".into(),
                    entries: Vec::new(),
                    rule: "api|customer".into(),
                    rule_name: None,
                    key: format!("customer={i}"),
                    limit: 5_000,
                    burst: None,
                    expires_at_unix_ms: None,
                    reason: String::new(),
                    set_by: "t".into(),
                    set_at_unix_ms: 1,
                })
                .collect()
        };
        let stage = |seq: u32, from| Command::StageOverrides {
            import: 9,
            seq,
            rows: rows(from),
            at_unix_ms: 10,
        };
        {
            let (_log, mut sm) = open(dir.path()).expect("open");
            sm.apply([entry(1, stage(0, 0)), entry(2, stage(1, 3))])
                .await
                .expect("apply");
        }
        let (_log, mut sm) = open(dir.path()).expect("reopen");
        let applied = sm.subscribe().borrow().clone();
        assert_eq!(applied.registry.override_imports.by_id[&9].rows(), 6);
        assert!(
            applied.registry.overrides.by_id.is_empty(),
            "staged, not set"
        );
        let apply = Command::SetOverrides(OverrideChange {
            set: Vec::new(),
            remove: Vec::new(),
            replace_all: false,
            import: Some(9),
            at_unix_ms: 20,
        });
        let out = sm.apply([entry(3, apply)]).await.expect("apply");
        assert_eq!(out[0], Outcome::Applied { version: Some(1) });
        drop((_log, sm));
        let (_log, sm) = open(dir.path()).expect("reopen");
        let applied = sm.subscribe().borrow().clone();
        assert_eq!(applied.registry.overrides.by_id.len(), 6);
        assert!(applied.registry.override_imports.by_id.is_empty());
    }
}
