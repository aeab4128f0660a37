//! Whether this node serves watches: it is a member of a cluster, knows the
//! leader, and is caught up with the leader's commit by
//! [`LeaderContact`]'s test (see [`raft::contact`](super::raft::contact),
//! where the Raft transport records what it heard from the leader and its
//! peers).

use std::collections::BTreeSet;

use tonic::Status;

use super::raft::contact::{LeaderContact, PeerContacts, Stream};
use super::raft::{NodeId, Raft};

/// Whether this node serves watches: what the Raft core says of its
/// membership and leader, and [`LeaderContact`]'s test. Cheap to clone, for
/// each stream to check again while it is open.
#[derive(Clone)]
pub struct Freshness {
    pub raft: Raft,
    pub contact: LeaderContact,
    /// When each peer last answered this node (the leader's quorum test).
    pub peers: PeerContacts,
}

impl Freshness {
    /// `Ok` when this node may serve a watch: it is a member of a cluster,
    /// knows the leader and is caught up with its commit, so what it applied
    /// is the cluster's current state, not an empty node's "no version" nor
    /// a stopped or cut-off node's old one. Otherwise UNAVAILABLE with the
    /// reason, and the limiter tries another node.
    pub fn serving(&self) -> Result<(), Status> {
        self.serves(Stream::New)
    }

    /// [`Freshness::serving`] for a stream already open.
    pub fn still_serving(&self) -> Result<(), Status> {
        self.serves(Stream::Open)
    }

    fn serves(&self, stream: Stream) -> Result<(), Status> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        if membership.nodes().next().is_none() {
            return Err(Status::unavailable(
                "this node is in no cluster yet (not initialised or joined); watch another",
            ));
        }
        if metrics.current_leader.is_none() {
            return Err(Status::unavailable(
                "this node knows no leader (an election, or it is cut off); watch another",
            ));
        }
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let applied = metrics.last_applied.map_or(0, |l| l.index);
        self.contact
            .check(metrics.id, metrics.state, &voters, applied, &self.peers, stream)
            .map_err(|lag| {
                metrics::counter!("meridian_coordinator_watch_refused_total", "cap" => "not_caught_up")
                    .increment(1);
                Status::unavailable(format!("{lag}; watch another node"))
            })
    }
}
