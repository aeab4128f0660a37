//! A running coordinator node: the Raft handle, its applied state, and the
//! path every admin write takes.
//!
//! Writes sent to a follower are **forwarded** to the leader (not redirected):
//! clients and limiters may talk to any node, the follower validates the
//! request itself, then relays the resulting [`Write`] to the leader's
//! `/api/v1/internal/write` and returns the leader's answer. While no leader
//! is known (an election), the write waits up to [`WRITE_DEADLINE`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::error::{ChangeMembershipError, CheckIsLeaderError, ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use super::raft::contact::PeerContacts;
use super::raft::storage::Applied;
use super::raft::{Member, NodeId, Raft};
use super::state::{Command, Outcome};
use crate::cluster_id::ClusterId;

/// How long a write waits for a leader (an election with default timings
/// takes 1.5–3 s) before answering 503.
/// Membership changes also wait here for a previous change to commit.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// How long a joining node may take to catch up before it would be promoted
/// from learner to voter.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);

/// Marks a request relayed by another node, so it is never relayed twice.
pub const FORWARDED_HEADER: &str = "x-meridian-forwarded";

/// A write, as the leader executes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Write {
    Command(Command),
    /// Add as learner, wait until it caught up, then make it a voter.
    AddNode {
        id: NodeId,
        member: Member,
    },
    /// Remove a voter or learner from the membership.
    RemoveNode {
        id: NodeId,
    },
}

/// A committed write's answer from the state machine, returned to the node
/// that proposed it (possibly relayed from the leader).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteReply {
    /// The log index the write was committed at.
    pub log_index: u64,
    /// What applying the command did.
    pub outcome: Outcome,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("no leader accepted the write within {0:?}; the cluster may have lost its quorum")]
    NoLeader(Duration),
    #[error("this node is not the leader")]
    NotLeader,
    /// The leader answered with an error; relayed as is.
    #[error("leader answered {status}")]
    Leader {
        status: u16,
        body: serde_json::Value,
    },
    #[error("the leader failed while the write was in flight; it may or may not be committed: {0}")]
    InFlight(String),
    #[error("membership change refused: {0}")]
    Membership(String),
    #[error("node {0} is not a member")]
    UnknownNode(NodeId),
    #[error("raft node stopped: {0}")]
    Fatal(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not the leader")]
    NotLeader(Option<Member>),
    #[error("leadership could not be confirmed: {0}")]
    Unconfirmed(String),
}

enum Local {
    NotLeader(Option<Member>),
    /// Another membership change is still being committed; try again shortly.
    Busy,
    Failed(WriteError),
}

type ClientWriteRaftError = RaftError<NodeId, ClientWriteError<NodeId, Member>>;

fn classify(e: ClientWriteRaftError) -> Local {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            Local::NotLeader(f.leader_node)
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => Local::Busy,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Local::Failed(WriteError::Membership(e.to_string()))
        }
        RaftError::Fatal(f) => Local::Failed(WriteError::Fatal(f.to_string())),
    }
}

/// The coordinator node shared by the admin API and the gRPC services.
pub struct Node {
    pub id: NodeId,
    /// This node's own addresses, as the membership lists them.
    pub member: Member,
    /// The openraft handle: writes, membership changes and leader lookups.
    pub raft: Raft,
    /// The state machine's applied state; every read is served from it.
    pub applied: watch::Receiver<Arc<Applied>>,
    /// When each peer last answered, written by the Raft network, read by the cluster API.
    pub contacts: PeerContacts,
    /// Last committed log index, as the log store last saved it.
    pub committed: Arc<AtomicU64>,
    /// Bearer token every write must carry (also on forwarded writes).
    pub admin_token: String,
    /// For relaying writes and consistent reads to the leader.
    pub http: reqwest::Client,
    /// TLS or plaintext between nodes: the scheme of the URLs built from
    /// members' addresses, and the certificates of the channels dialled.
    pub transport: crate::tls::Transport,
}

impl Node {
    /// Executes `write` on the leader: here if this node leads, otherwise
    /// relayed (once; a relayed write is never relayed again).
    pub async fn write(&self, write: Write, relayed: bool) -> Result<WriteReply, WriteError> {
        let deadline = Instant::now() + WRITE_DEADLINE;
        loop {
            match self.execute(write.clone()).await {
                Ok(reply) => return Ok(reply),
                Err(Local::Failed(e)) => return Err(e),
                Err(Local::NotLeader(_)) if relayed => return Err(WriteError::NotLeader),
                Err(Local::NotLeader(Some(leader))) if leader != self.member => {
                    match self.relay(&leader, &write).await {
                        Ok(reply) => return Ok(reply),
                        // The leader is gone or was deposed: wait for the next one.
                        Err(Relay::Retry) => {}
                        Err(Relay::Failed(e)) => return Err(e),
                    }
                }
                Err(Local::NotLeader(_) | Local::Busy) => {}
            }
            if Instant::now() >= deadline {
                return Err(WriteError::NoLeader(WRITE_DEADLINE));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn execute(&self, write: Write) -> Result<WriteReply, Local> {
        match write {
            Write::Command(command) => {
                let r = self.raft.client_write(command).await.map_err(classify)?;
                Ok(WriteReply {
                    log_index: r.log_id.index,
                    outcome: r.data,
                })
            }
            Write::AddNode { id, member } => self.add_node(id, member).await,
            Write::RemoveNode { id } => {
                let membership = self.raft.metrics().borrow().membership_config.clone();
                let change = if membership.membership().voter_ids().any(|v| v == id) {
                    ChangeMembers::RemoveVoters(BTreeSet::from([id]))
                } else if membership.membership().learner_ids().any(|l| l == id) {
                    ChangeMembers::RemoveNodes(BTreeSet::from([id]))
                } else {
                    return Err(Local::Failed(WriteError::UnknownNode(id)));
                };
                let r = self
                    .raft
                    .change_membership(change, false)
                    .await
                    .map_err(classify)?;
                Ok(WriteReply {
                    log_index: r.log_id.index,
                    outcome: Outcome::Nothing,
                })
            }
        }
    }

    async fn add_node(&self, id: NodeId, member: Member) -> Result<WriteReply, Local> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let is_voter = membership.membership().voter_ids().any(|v| v == id);
        if is_voter {
            // A restarted node re-joining: nothing to change.
            return Ok(WriteReply {
                log_index: membership.log_id().map_or(0, |l| l.index),
                outcome: Outcome::Nothing,
            });
        }
        // `blocking = true`: returns once the learner has replicated the log
        // up to the membership entry, so it is promoted only when caught up.
        match tokio::time::timeout(CATCH_UP_DEADLINE, self.raft.add_learner(id, member, true)).await
        {
            Ok(r) => r.map_err(classify)?,
            Err(_) => {
                return Err(Local::Failed(WriteError::Membership(format!(
                    "node {id} did not catch up within {CATCH_UP_DEADLINE:?}; it stays a learner"
                ))));
            }
        };
        let r = self
            .raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(classify)?;
        Ok(WriteReply {
            log_index: r.log_id.index,
            outcome: Outcome::Nothing,
        })
    }

    async fn relay(&self, leader: &Member, write: &Write) -> Result<WriteReply, Relay> {
        let url = format!(
            "{}/api/v1/internal/write",
            self.transport.url(&leader.http_addr)
        );
        let sent = self
            .http
            .post(url)
            .bearer_auth(&self.admin_token)
            .header(FORWARDED_HEADER, "1")
            .json(write)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Err(Relay::Retry),
            Err(e) => return Err(Relay::Failed(WriteError::InFlight(e.to_string()))),
        };
        let status = response.status();
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Err(Relay::Retry);
        }
        let body: serde_json::Value = match response.json().await {
            Ok(b) => b,
            Err(e) => return Err(Relay::Failed(WriteError::InFlight(e.to_string()))),
        };
        if status.is_success() {
            serde_json::from_value(body)
                .map_err(|e| Relay::Failed(WriteError::InFlight(e.to_string())))
        } else {
            Err(Relay::Failed(WriteError::Leader {
                status: status.as_u16(),
                body,
            }))
        }
    }

    /// Confirms this node leads and has applied everything committed before
    /// the call. A blip (a heartbeat round that misses its quorum) is retried.
    pub async fn linearizable(&self) -> Result<(), ReadError> {
        let mut last = String::new();
        for _ in 0..3 {
            match self.raft.ensure_linearizable().await {
                Ok(_) => return Ok(()),
                Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                    return Err(ReadError::NotLeader(f.leader_node));
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(ReadError::Unconfirmed(last))
    }

    /// Gives the cluster its id and ends once it has one (it never changes):
    /// while this node leads and has applied no id (a new cluster, or a data
    /// dir from storage format 1), it proposes a random one. Runs on every
    /// node, so whichever leads does it. Two leaders in turn may both propose
    /// one; the state machine keeps the first, so the race is harmless.
    pub async fn set_cluster_id(self: Arc<Self>) {
        let mut applied = self.applied.clone();
        let mut metrics = self.raft.metrics();
        loop {
            if let Some(id) = applied.borrow_and_update().registry.cluster_id {
                tracing::info!(cluster_id = %id, "cluster id");
                return;
            }
            if metrics.borrow_and_update().current_leader == Some(self.id) {
                let id = ClusterId::random();
                match self.raft.client_write(Command::SetClusterId(id)).await {
                    Ok(r) if matches!(r.data, Outcome::Applied { .. }) => {
                        tracing::info!(cluster_id = %id, "this leader set the cluster id");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not set the cluster id yet; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                continue;
            }
            tokio::select! {
                changed = applied.changed() => if changed.is_err() { return },
                changed = metrics.changed() => if changed.is_err() { return },
            }
        }
    }

    /// The current leader's member record, if known.
    pub fn leader(&self) -> Option<(NodeId, Member)> {
        let metrics = self.raft.metrics().borrow().clone();
        let id = metrics.current_leader?;
        let member = metrics
            .membership_config
            .membership()
            .get_node(&id)?
            .clone();
        Some((id, member))
    }
}

enum Relay {
    Retry,
    Failed(WriteError),
}
