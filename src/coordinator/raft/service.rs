//! The server side of the Raft RPCs over tonic: the `meridian.v1.Raft`
//! service, which admits each RPC (term, membership, the caller's
//! certificate), decodes its bincode payload and feeds it to the local Raft
//! node, telling [`LeaderContact`] the leader's commit on the way.

use openraft::Vote;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use super::contact::LeaderContact;
use super::{MAX_MESSAGE_BYTES, NodeId, Raft, TypeConfig};
use crate::proto::meridian::v1::RaftPayload;
use crate::proto::meridian::v1::raft_server;
use crate::tls::Identity;

/// The `meridian.v1.Raft` gRPC service: decodes each RPC and hands it to the
/// local Raft node.
pub struct RaftService {
    raft: Raft,
    /// Told the leader's commit on every AppendEntries this node answers as
    /// the current leader's follower: whether it is caught up (watches).
    contact: LeaderContact,
}

impl RaftService {
    pub fn server(raft: Raft, contact: LeaderContact) -> raft_server::RaftServer<RaftService> {
        raft_server::RaftServer::new(RaftService { raft, contact })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// Decodes one RPC's bincode payload; `rpc` names it in the refusal, with
/// the payload's length (bincode's errors say what was wrong, not where).
/// Safe on any bytes: lengths are checked against the payload before
/// anything is read or allocated past it, and no payload type is recursive.
fn decode<T: DeserializeOwned>(request: Request<RaftPayload>, rpc: &str) -> Result<T, Status> {
    decode_payload(&request.into_inner().data, rpc)
}

fn decode_payload<T: DeserializeOwned>(data: &[u8], rpc: &str) -> Result<T, Status> {
    bincode::deserialize(data).map_err(|e| {
        Status::invalid_argument(format!(
            "undecodable {rpc} payload ({} bytes): {e}",
            data.len()
        ))
    })
}

fn encode<T: Serialize>(reply: &T) -> Result<Response<RaftPayload>, Status> {
    bincode::serialize(reply)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(format!("encoding Raft reply: {e}")))
}

/// No real cluster reaches this term (an election a millisecond for 100
/// million years); a vote beyond it is forged, and near `u64::MAX` it would
/// overflow the next election's increment and stop the Raft core for good.
pub const MAX_TERM: u64 = 1 << 62;

impl RaftService {
    /// Refuses an RPC whose sender claims a term no cluster reaches, is
    /// not a member of this node's cluster, or (over TLS) is not the node
    /// its certificate names. A node not yet in any cluster (a learner being
    /// added) takes RPCs from whoever adds it — over TLS, only from a node.
    fn admit(&self, kind: &str, caller: Caller, vote: &Vote<NodeId>) -> Result<(), Status> {
        let sender = vote.leader_id().node_id;
        let term = vote.leader_id().term;
        let refusal = if let Some(reason) = caller.refusal(sender) {
            Some(reason)
        } else if term >= MAX_TERM {
            Some(format!(
                "term {term} is beyond any real election (at most {MAX_TERM})"
            ))
        } else {
            let metrics = self.raft.metrics().borrow().clone();
            let membership = metrics.membership_config.membership();
            let known = membership.nodes().any(|(id, _)| *id == sender);
            let empty = membership.nodes().next().is_none();
            (!known && !empty).then(|| format!("node {sender} is not a member of this cluster"))
        };
        match refusal {
            None => Ok(()),
            Some(reason) => {
                tracing::warn!(rpc = kind, %reason, "Raft RPC refused");
                metrics::counter!("meridian_coordinator_raft_rpcs_refused_total", "rpc" => kind.to_string())
                    .increment(1);
                Err(Status::permission_denied(reason))
            }
        }
    }
}

/// Who sent a Raft RPC, as the connection proves it.
enum Caller {
    /// Plaintext (`--insecure`): nothing is proven.
    Unproven,
    /// TLS: the identity the verified certificate names.
    Proven(Identity),
}

impl Caller {
    fn of<T>(request: &Request<T>) -> Caller {
        match crate::tls::peer(request).and_then(|p| p.identity.clone()) {
            Some(identity) => Caller::Proven(identity),
            None => Caller::Unproven,
        }
    }

    /// Why a caller may not send an RPC as node `sender`, if it may not.
    fn refusal(&self, sender: NodeId) -> Option<String> {
        match self {
            Caller::Unproven => None,
            Caller::Proven(Identity::Node(id)) if *id == sender => None,
            Caller::Proven(identity) => Some(format!(
                "the RPC claims to come from node {sender}, but the caller's certificate names {identity}"
            )),
        }
    }
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let caller = Caller::of(&request);
        let rpc: VoteRequest<NodeId> = decode(request, "vote")?;
        self.admit("vote", caller, &rpc.vote)?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let caller = Caller::of(&request);
        let rpc: AppendEntriesRequest<TypeConfig> = decode(request, "append_entries")?;
        self.admit("append_entries", caller, &rpc.vote)?;
        let leader_commit = rpc.leader_commit.map_or(0, |l| l.index);
        let reply = self.raft.append_entries(rpc).await;
        // Any answer but "a higher vote" means the sender is the leader this
        // node follows (a conflict too: the commit it names is still its).
        if matches!(&reply, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.contact.told(leader_commit);
        }
        encode(&reply)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let caller = Caller::of(&request);
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(request, "install_snapshot")?;
        self.admit("install_snapshot", caller, &rpc.vote)?;
        encode(&self.raft.install_snapshot(rpc).await)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::{CommittedLeaderId, EntryPayload, LogId, SnapshotMeta, StoredMembership};
    use proptest::prelude::*;

    use super::*;
    use crate::coordinator::raft::Entry;
    use crate::coordinator::state::{Command, RegionState, Stage};

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// Valid payloads of each RPC, with the commands a leader replicates.
    fn payloads(index: u64, text: String) -> Vec<(&'static str, Vec<u8>)> {
        let vote = Vote::new(3, 1);
        let commands = [
            Command::PutRules {
                files: BTreeMap::from([("rules.yaml".to_owned(), text)]),
                stage: Stage::Canary {
                    regions: vec!["eu".into()],
                },
                at_unix_ms: 1,
            },
            Command::PutRegion {
                name: "eu".into(),
                weight: 1.5,
                state: RegionState::Draining,
                at_unix_ms: 2,
            },
            Command::Rollback {
                to: Some(index),
                at_unix_ms: 3,
            },
        ];
        let entries: Vec<Entry> = commands
            .into_iter()
            .enumerate()
            .map(|(i, c)| Entry {
                log_id: log_id(3, index + i as u64),
                payload: EntryPayload::Normal(c),
            })
            .collect();
        let append = AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: Some(log_id(2, index)),
            entries,
            leader_commit: Some(log_id(2, index)),
        };
        let snapshot = InstallSnapshotRequest::<TypeConfig> {
            vote,
            meta: SnapshotMeta {
                last_log_id: Some(log_id(3, index)),
                last_membership: StoredMembership::default(),
                snapshot_id: format!("s-{index}"),
            },
            offset: 0,
            data: vec![1, 2, 3],
            done: true,
        };
        let ask = VoteRequest::new(vote, Some(log_id(2, index)));
        let bytes = |r: Result<Vec<u8>, bincode::Error>| r.expect("encode");
        vec![
            ("vote", bytes(bincode::serialize(&ask))),
            ("append_entries", bytes(bincode::serialize(&append))),
            ("install_snapshot", bytes(bincode::serialize(&snapshot))),
        ]
    }

    /// Decodes as the service would; a refusal must be an invalid-argument
    /// status naming the RPC and the payload's length.
    fn decodes_or_names(rpc: &str, data: &[u8]) -> Result<bool, TestCaseError> {
        let result = match rpc {
            "vote" => decode_payload::<VoteRequest<NodeId>>(data, rpc).map(|_| ()),
            "append_entries" => {
                decode_payload::<AppendEntriesRequest<TypeConfig>>(data, rpc).map(|_| ())
            }
            _ => decode_payload::<InstallSnapshotRequest<TypeConfig>>(data, rpc).map(|_| ()),
        };
        match result {
            Ok(()) => Ok(true),
            Err(status) => {
                prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                let prefix = format!("undecodable {rpc} payload ({} bytes): ", data.len());
                prop_assert!(
                    status.message().starts_with(&prefix),
                    "{}",
                    status.message()
                );
                Ok(false)
            }
        }
    }

    #[test]
    fn valid_payloads_decode() {
        for (rpc, data) in payloads(7, "domain: api\n".into()) {
            assert_eq!(decodes_or_names(rpc, &data).ok(), Some(true), "{rpc}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_bytes_never_panic_and_refusals_name_the_rpc(
            data in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            for rpc in ["vote", "append_entries", "install_snapshot"] {
                decodes_or_names(rpc, &data)?;
            }
        }

        /// Flipped, cut and inserted bytes in real payloads, including length
        /// prefixes turned huge: decoded or refused, never a panic or an
        /// allocation of what the prefix claims.
        #[test]
        fn edited_payloads_never_panic_and_refusals_name_the_rpc(
            index in any::<u64>(),
            text in ".{0,40}",
            edits in prop::collection::vec(
                (any::<prop::sample::Index>(), any::<u8>(), 0u8..3),
                1..6,
            ),
            cut in any::<prop::sample::Index>(),
        ) {
            for (rpc, mut data) in payloads(index, text.clone()) {
                for (at, byte, op) in &edits {
                    let at = at.index(data.len());
                    match op {
                        0 => data[at] = *byte,
                        1 => data.insert(at, *byte),
                        _ => data[at] = 0xff,
                    }
                }
                decodes_or_names(rpc, &data)?;
                let short = cut.index(data.len());
                decodes_or_names(rpc, &data[..short])?;
            }
        }
    }
}
