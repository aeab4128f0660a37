//! How a write is committed: through [`Node::write`](crate::coordinator::node::Node::write),
//! which forwards it to the leader from a follower, and how its outcome
//! becomes an answer.

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::json;

use super::errors::{ApiError, ApiResult};
use super::{Api, is_relayed};
use crate::coordinator::node::{Write, WriteReply};
use crate::coordinator::state::{Command, Outcome};

/// Commits a state-machine `command` and answers with its outcome.
pub(super) async fn commit(api: &Api, headers: &HeaderMap, command: Command) -> ApiResult {
    submit(api, headers, Write::Command(command)).await
}

/// Executes `write` (a command or a membership change) and answers with its
/// outcome.
pub(super) async fn submit(api: &Api, headers: &HeaderMap, write: Write) -> ApiResult {
    let reply = api.node.write(write, is_relayed(headers)).await?;
    outcome_response(reply)
}

/// An applied command answers 200 with its version; one the state machine
/// refused answers 409 or 404. A refusal is committed too (the state machine
/// decides on the leader's latest state), so its log index is included.
fn outcome_response(reply: WriteReply) -> ApiResult {
    match reply.outcome {
        Outcome::Applied { version } => Ok(Json(json!({
            "version": version,
            "log_index": reply.log_index,
        }))
        .into_response()),
        Outcome::Rejected { reason } => {
            Err(ApiError::new(StatusCode::CONFLICT, reason)
                .with("log_index", json!(reply.log_index)))
        }
        Outcome::NotFound { reason } => {
            Err(ApiError::new(StatusCode::NOT_FOUND, reason)
                .with("log_index", json!(reply.log_index)))
        }
        Outcome::Nothing => Ok(Json(json!({ "log_index": reply.log_index })).into_response()),
    }
}
