//! `/api/v1/cluster…`: Raft membership and status, and the internal endpoint
//! followers forward writes to.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Api;
use super::auth::{Admin, AdminBody, MAX_BULK_BODY_BYTES, parse_json};
use super::errors::{ApiError, ApiResult};
use super::read::Read;
use super::write::submit;
use crate::coordinator::node::Write;
use crate::coordinator::raft::{Member, NodeId};

/// `GET /api/v1/cluster`: the cluster's id (`null` until its first leader
/// set it), this node's Raft view and every member's role, replication
/// progress and last contact. Answers from Raft's metrics, not
/// the applied state; [`Read`] still settles the consistency (and relays).
pub(super) async fn cluster(State(api): State<Api>, read: Read) -> Response {
    let m = api.node.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let nodes: Vec<Value> = membership
        .nodes()
        .map(|(id, member)| {
            let role = if Some(*id) == m.current_leader {
                "leader"
            } else if voters.contains(id) {
                "follower"
            } else {
                "learner"
            };
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id).cloned().flatten())
                .map(|l| l.index);
            let contact = if *id == api.node.id {
                Some(0)
            } else {
                api.node
                    .contacts
                    .since(*id)
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            };
            json!({
                "id": id,
                "raft_addr": member.raft_addr,
                "http_addr": member.http_addr,
                "role": role,
                "match_index": matched,
                "last_contact_ms": contact,
            })
        })
        .collect();
    let cluster_id = api.node.applied.borrow().registry.cluster_id;
    Json(json!({
        "consistency": read.consistency,
        "node_id": api.node.id,
        "cluster_id": cluster_id,
        "state": format!("{:?}", m.state),
        "leader": m.current_leader,
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "commit_index": api.node.committed.load(Ordering::Relaxed),
        "applied_index": m.last_applied.map(|l| l.index),
        "snapshot_index": m.snapshot.map(|l| l.index),
        "purged_index": m.purged.map(|l| l.index),
        "millis_since_quorum_ack": m.millis_since_quorum_ack,
        "nodes": nodes,
    }))
    .into_response()
}

/// The body of `POST /api/v1/cluster/nodes`: the new member's Raft id (never
/// reused after a removal) and where peers and clients reach it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNodeBody {
    id: NodeId,
    raft_addr: String,
    http_addr: String,
}

/// `POST /api/v1/cluster/nodes`: adds a learner and promotes it to voter once
/// it caught up (see `Node::write`).
pub(super) async fn add_node(
    State(api): State<Api>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
    let b: AddNodeBody = parse_json(&bytes)?;
    // `--insecure` was checked against loopback at start; a member added
    // later would be replicated to in plaintext over the network.
    if api.node.transport.tls().is_none() {
        for (field, addr) in [("raft_addr", &b.raft_addr), ("http_addr", &b.http_addr)] {
            if !crate::tls::is_loopback(addr) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "{field} {addr:?} is not loopback: this cluster runs with --insecure \
                         (plaintext, loopback only); run it with --tls-cert, --tls-key and \
                         --tls-ca to add members on other hosts"
                    ),
                ));
            }
        }
    }
    let write = Write::AddNode {
        id: b.id,
        member: Member {
            raft_addr: b.raft_addr,
            http_addr: b.http_addr,
        },
    };
    submit(&api, &headers, write).await
}

/// `DELETE /api/v1/cluster/nodes/{id}`.
pub(super) async fn remove_node(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
    _admin: Admin,
) -> ApiResult {
    let id: NodeId = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("{id:?} is not a node id")))?;
    submit(&api, &headers, Write::RemoveNode { id }).await
}

/// `PUT|POST /api/v1/internal/write`: a write relayed by another node,
/// executed here if this node leads, else 503. The reply is the raw
/// [`WriteReply`](crate::coordinator::node::WriteReply): the forwarding node
/// renders it for its client.
pub(super) async fn internal_write(
    State(api): State<Api>,
    AdminBody(bytes): AdminBody<MAX_BULK_BODY_BYTES>,
) -> ApiResult {
    let write: Write = parse_json(&bytes)?;
    let reply = api.node.write(write, true).await?;
    Ok(Json(reply).into_response())
}
