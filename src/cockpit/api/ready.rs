//! `GET /readyz`: whether this node can serve limiters (Raft runs and a
//! leader is known), and — informational, it never makes a node unready —
//! the report interval limiters are given with the pods that report less
//! often than that. Open like `/healthz`: probes carry no token; it names
//! pods and regions, which `/metrics` names too.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Api;
use crate::allocation::cadence::MISMATCH_FACTOR;

/// `GET /readyz`: 200 when Raft runs and this node knows a leader, else 503
/// with the reason. `report_interval.mismatched_pods` is the leader's count
/// (`null` on a follower: only the leader hears reports).
pub(super) async fn readyz(State(api): State<Api>) -> Response {
    let metrics = api.node.raft.metrics().borrow().clone();
    let reason = match (&metrics.running_state, metrics.current_leader) {
        (Err(fatal), _) => Some(format!("raft stopped: {fatal}")),
        (Ok(()), None) => Some("no leader known (an election, or cut off)".to_string()),
        (Ok(()), Some(_)) => None,
    };
    let leading = api.allocator.is_leader();
    let (expected_ms, slow) = api.allocator.report_cadence();
    let mismatched: Value = if leading {
        json!(
            slow.iter()
                .map(|p| json!({
                    "region": p.region,
                    "pod": p.pod,
                    "interval_ms": p.interval_ms,
                    "expected_ms": expected_ms,
                    "last_heard_unix_ms": p.heard_ms,
                }))
                .collect::<Vec<_>>()
        )
    } else {
        Value::Null
    };
    let status = if reason.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if reason.is_none() { "ready" } else { "not ready" },
        "reason": reason,
        "node_id": api.node.id,
        "leader": metrics.current_leader,
        "report_interval": {
            "expected_ms": expected_ms,
            "mismatch_above_ms": (expected_ms as f64 * MISMATCH_FACTOR) as u64,
            "mismatched_pods": mismatched,
            "counted_here": leading,
        },
    });
    (status, Json(body)).into_response()
}
