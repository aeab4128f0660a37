//! The coordinator's Raft layer: the type configuration (here), the redb
//! store (`storage`) and the tonic transport: its client (`client`), its
//! service (`service`) and what both record of the leader and the peers
//! (`contact`).

pub mod client;
pub mod contact;
pub mod service;
pub mod storage;

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::coordinator::state::{Command, Outcome};

pub type NodeId = u64;

/// Where a cluster member listens. Kept in the Raft membership, so every node
/// knows every other node's addresses (for Raft RPCs and for forwarding admin
/// writes to the leader).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `host:port` of the Raft gRPC listener.
    pub raft_addr: String,
    /// `host:port` of the admin HTTP listener.
    pub http_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft={} http={}", self.raft_addr, self.http_addr)
    }
}

openraft::declare_raft_types!(
    /// Meridian's Raft types: commands in, outcomes out, snapshots as bytes.
    pub TypeConfig:
        D = Command,
        R = Outcome,
        Node = Member,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;

/// Raft messages can carry several 1 MiB rule sets (append entries) or a
/// snapshot chunk; tonic's default 4 MiB limit would reject them.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
