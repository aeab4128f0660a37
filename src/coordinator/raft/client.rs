//! The client side of the Raft RPCs over tonic, which openraft drives:
//! [`Network`] makes one [`Connection`] per peer, which sends bincode
//! payloads (see raft.proto) and stamps every answer in [`PeerContacts`].

use std::time::Duration;

use openraft::error::{
    Infallible, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Request;
use tonic::transport::Channel;

use super::contact::PeerContacts;
use super::{MAX_MESSAGE_BYTES, Member, NodeId, TypeConfig};
use crate::proto::meridian::v1::RaftPayload;
use crate::proto::meridian::v1::raft_client::RaftClient;
use crate::tls::{Expect, Transport};

/// Creates one [`Connection`] per peer for openraft.
#[derive(Clone)]
pub struct Network {
    pub contacts: PeerContacts,
    /// TLS (the peer must present its own node's certificate) or plaintext.
    transport: Transport,
}

impl Network {
    pub fn new(transport: Transport) -> Network {
        Network {
            contacts: PeerContacts::default(),
            transport,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Connection {
        let url = self.transport.url(&node.raft_addr);
        let client = self
            .transport
            .channel(&url, Expect::Node(target), |e| {
                e.connect_timeout(Duration::from_secs(1))
            })
            .map(|channel| {
                RaftClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            });
        Connection {
            target,
            client,
            contacts: self.contacts.clone(),
        }
    }
}

/// The client side of the Raft service, to one peer.
pub struct Connection {
    target: NodeId,
    /// `Err` when the peer's address is not a valid URI; every RPC then fails
    /// as unreachable (the membership, not this node, must be fixed).
    client: Result<RaftClient<Channel>, String>,
    /// Stamped on every answer from `target`, for the cluster API.
    contacts: PeerContacts,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

type RpcResult<T, E> = Result<T, RPCError<NodeId, Member, RaftError<NodeId, E>>>;

impl Connection {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: RpcKind,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                    e.clone(),
                ))));
            }
        };
        let data =
            bincode::serialize(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut req = Request::new(RaftPayload { data });
        req.set_timeout(option.hard_ttl());
        let reply = match kind {
            RpcKind::Vote => client.vote(req).await,
            RpcKind::Append => client.append_entries(req).await,
            RpcKind::Snapshot => client.install_snapshot(req).await,
        };
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
            Err(status) => return Err(RPCError::Network(NetworkError::new(&status))),
        };
        self.contacts.touch(self.target);
        let result: Result<Resp, RaftError<NodeId, E>> = bincode::deserialize(&reply.data)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Clone, Copy)]
enum RpcKind {
    Vote,
    Append,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, Infallible> {
        self.call(RpcKind::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(RpcKind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, Infallible> {
        self.call(RpcKind::Vote, &rpc, &option).await
    }
}
