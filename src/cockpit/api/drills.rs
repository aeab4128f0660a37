//! `/api/v1/drills…`: region failover drills — start, stop, list, and each
//! drill's report. Starting and stopping are admin writes; the record of
//! who did it (the token's fingerprint, the client's address and the
//! operator name it gave) goes into the drill.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::Api;
use super::auth::{AdminBody, actor, parse_json};
use super::errors::{ApiError, ApiResult};
use super::read::Read;
use crate::clock::now_unix_ms;
use crate::coordinator::drill::report::{markdown, report};
use crate::coordinator::drill::{Drill, Mode, StartDrill, Stop, StopReason};
use crate::coordinator::node::Write;
use crate::coordinator::state::{Command, Outcome};

/// The body of `POST /api/v1/drills`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    region: String,
    mode: String,
    /// e.g. `"30s"`, `"5m"`; none: until stopped.
    #[serde(default)]
    duration: Option<String>,
    #[serde(default)]
    note: String,
    #[serde(default)]
    force: bool,
}

fn unprocessable(field: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message).with("field", json!(field))
}

/// A drill's summary for lists.
fn summary(d: &Drill) -> serde_json::Value {
    json!({
        "id": d.id,
        "region": d.region,
        "mode": d.mode,
        "note": d.note,
        "started_at_unix_ms": d.started_at_unix_ms,
        "ends_at_unix_ms": d.ends_at(),
        "started_by": d.started_by,
        "stopped": d.stopped,
        "active": d.active(),
        "finished": d.finished,
        "forced": d.forced,
        "events": d.events.len(),
    })
}

/// `GET /api/v1/drills`: every drill kept, newest first.
pub(super) async fn list_drills(read: Read) -> Response {
    let drills: Vec<serde_json::Value> = read
        .state
        .registry
        .drills
        .by_id
        .values()
        .rev()
        .map(|d| summary(d))
        .collect();
    Json(json!({ "consistency": read.consistency, "drills": drills })).into_response()
}

fn find(read: &Read, id: u64) -> Result<&Drill, ApiError> {
    read.state
        .registry
        .drills
        .by_id
        .get(&id)
        .map(|d| d.as_ref())
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("drill {id} does not exist")))
}

/// `GET /api/v1/drills/{id}`: the summary and the report (as JSON, and as
/// markdown for people).
pub(super) async fn get_drill(Path(id): Path<u64>, read: Read) -> ApiResult {
    let d = find(&read, id)?;
    let r = report(d);
    Ok(Json(json!({
        "consistency": read.consistency,
        "drill": summary(d),
        "markdown": markdown(&r),
        "report": r,
    }))
    .into_response())
}

#[derive(Deserialize)]
pub(super) struct ReportQuery {
    #[serde(default)]
    format: Option<String>,
}

/// `GET /api/v1/drills/{id}/report[?format=json|markdown]`.
pub(super) async fn get_report(
    Path(id): Path<u64>,
    Query(q): Query<ReportQuery>,
    read: Read,
) -> ApiResult {
    let d = find(&read, id)?;
    let r = report(d);
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(r).into_response()),
        "markdown" | "md" => Ok((
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            markdown(&r),
        )
            .into_response()),
        other => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("format {other:?} is not json or markdown"),
        )
        .with("field", json!("format"))),
    }
}

/// `POST /api/v1/drills`: starts a drill.
pub(super) async fn start_drill(
    State(api): State<Api>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
    let b: StartBody = parse_json(&bytes)?;
    super::regions::check_region_name(&b.region, "region")?;
    let mode: Mode = b.mode.parse().map_err(|e| unprocessable("mode", e))?;
    let duration_ms = match &b.duration {
        None => None,
        Some(text) => {
            let d = crate::rules::parse_duration(text)
                .map_err(|e| unprocessable("duration", format!("duration {e}")))?;
            Some(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }
    };
    let start = StartDrill {
        region: b.region,
        mode,
        duration_ms,
        note: b.note,
        force: b.force,
        by: actor(&api, &headers, &peer),
        at_unix_ms: now_unix_ms(),
    };
    // Checked here for a clear answer; the state machine checks again
    // against the state the command meets.
    {
        let applied = api.node.applied.borrow().clone();
        let registry = &applied.registry;
        registry
            .drills
            .check_start(
                &start,
                registry.regions.contains_key(&start.region),
                &registry.serving_regions(),
                registry.global_rules().len(),
            )
            .map_err(|reason| {
                ApiError::new(StatusCode::CONFLICT, reason).with("field", json!("region"))
            })?;
    }
    let reply = api
        .node
        .write(
            Write::Command(Command::StartDrill(start)),
            super::is_relayed(&headers),
        )
        .await?;
    answer(reply.outcome, reply.log_index)
}

/// `POST /api/v1/drills/{id}/stop`.
pub(super) async fn stop_drill(
    State(api): State<Api>,
    Path(id): Path<u64>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    AdminBody(_): AdminBody,
) -> ApiResult {
    let stop = Stop {
        at_unix_ms: now_unix_ms(),
        by: actor(&api, &headers, &peer),
        reason: StopReason::Stopped,
    };
    let reply = api
        .node
        .write(
            Write::Command(Command::StopDrill { id, stop }),
            super::is_relayed(&headers),
        )
        .await?;
    answer(reply.outcome, reply.log_index)
}

fn answer(outcome: Outcome, log_index: u64) -> ApiResult {
    match outcome {
        Outcome::Applied { version } => Ok(Json(json!({
            "drill": version,
            "log_index": log_index,
        }))
        .into_response()),
        Outcome::Rejected { reason } => {
            Err(ApiError::new(StatusCode::CONFLICT, reason).with("log_index", json!(log_index)))
        }
        Outcome::NotFound { reason } => {
            Err(ApiError::new(StatusCode::NOT_FOUND, reason).with("log_index", json!(log_index)))
        }
        Outcome::Nothing => Ok(Json(json!({ "log_index": log_index })).into_response()),
    }
}
