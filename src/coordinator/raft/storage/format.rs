//! The storage format: which versions this build writes and reads, the
//! snapshot's encoding, and the older versions' types that decode it.
//!
//! ## Format versions
//! Every table (see [the store's layout](super)) is bincode of Rust types,
//! so changing a stored type (a field added, reordered or retyped anywhere
//! under [`Registry`] or [`Command`](crate::coordinator::state::Command))
//! changes the format. The version is recorded twice:
//! - per data dir: `raft_meta.format_version` (4 bytes, little-endian, not
//!   bincode, so any build can read it), written when the dir is created (or
//!   migrated, below) and checked by [`open`](super::open) before any other
//!   table is opened. It covers the log too: a node never appends to a dir
//!   whose format it does not know, so one dir never mixes formats and
//!   entries need no tag of their own;
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
//!    commands (appended after `SetClusterId`);
//! 4. adds per-key overrides and counter resets: [`Registry::overrides`]
//!    and [`Registry::resets`] (the last fields), the `sm_overrides` table
//!    (one row per override), `sm_meta.overrides_version`, `sm_meta.resets`
//!    and `SetOverrides`, `StartReset`, `ResetAnswered` (appended after the
//!    drill commands).
//!
//! Migration: [`open`](super::open) takes a dir of an older known version and records
//! [`FORMAT_VERSION`] in it before it is used, so the rule above (one dir,
//! one format) holds from then on; an older build then refuses the dir. This
//! rewrites nothing else, so a version may be migrated this way only when
//! the older one's tables and log entries decode unchanged as the newer one:
//! true of 1 → 2 (a missing `sm_meta.cluster_id` reads as "no id yet", which
//! the leader then sets), of 2 → 3 (no drills yet) and of 3 → 4 (no
//! overrides yet). A snapshot keeps the version it was written in and
//! is decoded as such ([`decode_snapshot`]); new snapshots are written in
//! [`FORMAT_VERSION`].

use std::collections::BTreeMap;

use redb::ReadableTable;
use serde::{Deserialize, Serialize};

use super::db::{DB_FILE, DiskError};
use crate::allocation::Allocations;
use crate::cluster_id::ClusterId;
use crate::coordinator::drill::Drills;
use crate::coordinator::raft::{LogId, StoredMembership};
use crate::coordinator::state::{Region, Registry, RuleSetVersion};

/// The storage format this build writes (see the module docs). Bump it, add
/// it to [`KNOWN_FORMATS`] and commit a fixture for it whenever a stored
/// type's encoding changes.
pub const FORMAT_VERSION: u32 = 4;
/// The storage formats this build reads.
pub const KNOWN_FORMATS: &[u32] = &[1, 2, 3, 4];
/// The format of data written before versions were recorded.
pub(super) const UNVERSIONED_FORMAT: u32 = 1;
/// `raft_meta` key of the data dir's format version.
pub(super) const FORMAT_KEY: &str = "format_version";
/// Starts every snapshot, followed by the format version (`u32`,
/// little-endian) and the bincode [`Applied`]. An unversioned snapshot
/// starts with the tag of `Option<LogId>` (byte 0 or 1), never with `M`.
pub const SNAPSHOT_MAGIC: &[u8; 4] = b"MRSN";

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
                overrides: Default::default(),
                resets: Default::default(),
                override_imports: Default::default(),
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
                overrides: Default::default(),
                resets: Default::default(),
                override_imports: Default::default(),
            },
        }
    }
}

/// Version 3's [`Applied`]: version 4 without the overrides and resets,
/// which come last in the registry. Must never change.
#[derive(Serialize, Deserialize)]
struct AppliedV3 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    registry: RegistryV3,
}

/// Version 3's [`Registry`].
#[derive(Serialize, Deserialize)]
struct RegistryV3 {
    versions: BTreeMap<u64, RuleSetVersion>,
    regions: BTreeMap<String, Region>,
    allocations: Allocations,
    cluster_id: Option<ClusterId>,
    drills: Drills,
}

impl From<AppliedV3> for Applied {
    /// The version-3 state in this build: no overrides nor resets yet.
    fn from(v3: AppliedV3) -> Applied {
        Applied {
            last_applied: v3.last_applied,
            membership: v3.membership,
            registry: Registry {
                versions: v3.registry.versions,
                regions: v3.registry.regions,
                allocations: v3.registry.allocations,
                cluster_id: v3.registry.cluster_id,
                drills: v3.registry.drills,
                overrides: Default::default(),
                resets: Default::default(),
                override_imports: Default::default(),
            },
        }
    }
}

/// A snapshot's bytes: [`SNAPSHOT_MAGIC`], [`FORMAT_VERSION`] (`u32`,
/// little-endian), then the bincode [`Applied`].
pub(super) fn encode_snapshot(applied: &Applied) -> Result<Vec<u8>, bincode::Error> {
    let mut data = Vec::with_capacity(8 + bincode::serialized_size(applied)? as usize);
    data.extend_from_slice(SNAPSHOT_MAGIC);
    data.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bincode::serialize_into(&mut data, applied)?;
    Ok(data)
}

/// Decodes a snapshot written by [`encode_snapshot`] in any of
/// [`KNOWN_FORMATS`], or one without a header (a build from before format
/// versions: version 1). `what` names it in errors.
pub(super) fn decode_snapshot(data: &[u8], what: &str) -> Result<Applied, DiskError> {
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
        3 => Ok(bincode::deserialize::<AppliedV3>(payload)?.into()),
        4 => Ok(bincode::deserialize(payload)?),
        found => Err(DiskError::UnknownFormat {
            what: what.to_string(),
            found,
            known: KNOWN_FORMATS,
        }),
    }
}

/// The data dir's recorded format version; `None` when it records none (a
/// new dir, or one written before versions were recorded).
pub(super) fn read_format(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::GrantChange;
    use crate::coordinator::raft::storage::fixtures::{
        FIXTURE_CLUSTER_ID, SNAPSHOT_V1, SNAPSHOT_V2, SNAPSHOT_V3, SNAPSHOT_V4, fixture_applied,
        fixture_applied_v1, fixture_applied_v2, fixture_applied_v3,
    };

    #[test]
    fn committed_v4_snapshot_decodes_to_the_fixture_state_and_this_build_writes_it() {
        let applied = decode_snapshot(SNAPSHOT_V4, "fixture").expect("decode");
        assert_eq!(applied, fixture_applied());
        assert_eq!(applied.registry.drills.last_id, 1);
        assert_eq!(applied.registry.overrides.by_id.len(), 1);
        assert_eq!(
            encode_snapshot(&applied).expect("encode"),
            SNAPSHOT_V4,
            "this build must write version 4 exactly as the fixture"
        );
    }

    #[test]
    fn committed_v3_snapshot_decodes_to_the_fixture_state_without_overrides() {
        let applied = decode_snapshot(SNAPSHOT_V3, "fixture").expect("decode");
        assert_eq!(applied, fixture_applied_v3());
        assert_eq!(applied.registry.drills.last_id, 1);
        let v3 = AppliedV3 {
            last_applied: applied.last_applied,
            membership: applied.membership.clone(),
            registry: RegistryV3 {
                versions: applied.registry.versions.clone(),
                regions: applied.registry.regions.clone(),
                allocations: applied.registry.allocations.clone(),
                cluster_id: applied.registry.cluster_id,
                drills: applied.registry.drills.clone(),
            },
        };
        assert_eq!(
            bincode::serialize(&v3).expect("encode"),
            payload(SNAPSHOT_V3),
            "AppliedV3 must read and write version 3 exactly as the fixture"
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
             version(s) [1, 2, 3, 4]; run a Meridian build that knows version 7"
        );
        let cut = decode_snapshot(&SNAPSHOT_V1[..6], "snapshot x").expect_err("cut short");
        assert!(cut.to_string().contains("cut short"), "{cut}");
    }
}
