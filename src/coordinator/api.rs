//! The admin HTTP API (JSON), `/healthz` and `/metrics`.
//!
//! Every answer is JSON; errors are `{"error": "...", ...}`. Writes need
//! `Authorization: Bearer <admin token>` and are forwarded to the leader (see
//! `node.rs`). Reads answer from this node's applied state (`"consistency":
//! "local"`) unless `?consistent=true`, which confirms leadership through a
//! quorum first, relaying the read to the leader when this node is not it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use super::node::{FORWARDED_HEADER, Node, ReadError, Write, WriteError, WriteReply};
use super::raft::{Member, NodeId};
use super::state::{Command, Origin, Outcome, RegionState, RuleSetVersion, Stage};
use super::validation::validate;
use crate::clock::now_unix_ms;
use crate::rules::RuleFile;

/// Largest request body accepted (a whole rule set); larger gets 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How much of an oversized body is read and dropped so the client gets its
/// 413; beyond this the connection is simply closed.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024 * 1024;

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct Api {
    pub node: Arc<Node>,
    pub allocator: Arc<super::allocator::Allocator>,
    pub prometheus: PrometheusHandle,
    /// `--shared-rule-floor`: see `validation::validate`.
    pub shared_rule_floor: f64,
}

/// An error answer: status plus `{"error": message, ...details}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: json!({ "error": message.into() }),
        }
    }

    fn with(mut self, key: &str, value: Value) -> ApiError {
        if let Some(map) = self.body.as_object_mut() {
            map.insert(key.to_string(), value);
        }
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> ApiError {
        let status = match &e {
            WriteError::NoLeader(_) | WriteError::NotLeader => StatusCode::SERVICE_UNAVAILABLE,
            WriteError::Leader { status, body } => {
                return ApiError {
                    status: StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
                    body: body.clone(),
                };
            }
            WriteError::InFlight(_) => StatusCode::BAD_GATEWAY,
            WriteError::Membership(_) => StatusCode::CONFLICT,
            WriteError::UnknownNode(_) => StatusCode::NOT_FOUND,
            WriteError::Fatal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

type ApiResult = Result<Response, ApiError>;

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(prometheus))
        .route("/api/v1/rules", get(get_rules).put(put_rules))
        .route("/api/v1/rules/versions", get(list_versions))
        .route("/api/v1/rules/versions/{n}", get(get_version))
        .route("/api/v1/rules/rollback", post(rollback))
        .route("/api/v1/rules/rollout", post(rollout))
        .route("/api/v1/regions", get(list_regions))
        .route(
            "/api/v1/regions/{name}",
            get(get_region).put(put_region).delete(delete_region),
        )
        .route("/api/v1/allocations", get(get_allocations))
        .route("/api/v1/leases", get(get_leases))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/cluster/nodes", post(add_node))
        .route(
            "/api/v1/cluster/nodes/{id}",
            axum::routing::delete(remove_node),
        )
        .route(
            "/api/v1/internal/write",
            put(internal_write).post(internal_write),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn(record_latency))
        .layer(DefaultBodyLimit::disable())
        .with_state(api)
}

async fn record_latency(path: Option<MatchedPath>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = request.method().to_string();
    let route = path.map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    metrics::histogram!(
        "meridian_coordinator_api_request_seconds",
        "method" => method,
        "route" => route,
        "status" => response.status().as_u16().to_string(),
    )
    .record(start.elapsed().as_secs_f64());
    response
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {}", uri.path()),
    )
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed on {}", uri.path()),
    )
}

// ------------------------------------------------------------ guards

fn authorize(api: &Api, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "writes need an `Authorization: Bearer <admin token>` header",
        ));
    };
    // Compare every byte so the time taken does not reveal a matching prefix.
    let expected = api.node.admin_token.as_bytes();
    let same = given.len() == expected.len()
        && given
            .bytes()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong admin token"))
    }
}

/// Reads a request body of at most [`MAX_BODY_BYTES`]. A larger body is
/// still read (and dropped) up to [`DRAIN_LIMIT_BYTES`] before the 413: a
/// server that answers without reading the body closes the connection under
/// the client, which then sees a reset instead of the JSON error.
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}"),
            )
        })?;
        total = total.saturating_add(chunk.len());
        if total <= MAX_BODY_BYTES {
            kept.extend_from_slice(&chunk);
        } else if total > DRAIN_LIMIT_BYTES {
            break;
        }
    }
    if total > MAX_BODY_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {MAX_BODY_BYTES} bytes"),
        ));
    }
    Ok(Bytes::from(kept))
}

fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

fn is_relayed(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_HEADER)
}

fn wants_consistent(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "consistent=true" || kv == "consistent=1")
    })
}

/// For a read: `Ok(consistency)` to answer locally, or the leader's answer.
async fn read_mode(api: &Api, uri: &Uri, headers: &HeaderMap) -> Result<&'static str, Response> {
    if !wants_consistent(uri) {
        return Ok("local");
    }
    match api.node.linearizable().await {
        Ok(()) => Ok("linearizable"),
        Err(ReadError::NotLeader(Some(leader))) if !is_relayed(headers) => {
            Err(relay_read(api, &leader, uri).await)
        }
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot serve a consistent read here: {e}; retry"),
        )
        .into_response()),
    }
}

async fn relay_read(api: &Api, leader: &Member, uri: &Uri) -> Response {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("http://{}{path}", leader.http_addr);
    let answer = api
        .node
        .http
        .get(url)
        .header(FORWARDED_HEADER, "1")
        .send()
        .await;
    let response = match answer {
        Ok(r) => r,
        Err(e) => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("leader unreachable for a consistent read: {e}; retry"),
            )
            .into_response();
        }
    };
    let status =
        StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    match response.bytes().await {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("reading leader answer: {e}"),
        )
        .into_response(),
    }
}

/// Commits `command` and turns its outcome into an answer.
async fn commit(api: &Api, headers: &HeaderMap, command: Command) -> ApiResult {
    let reply = api
        .node
        .write(Write::Command(command), is_relayed(headers))
        .await?;
    outcome_response(reply)
}

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

// ------------------------------------------------------------ views

fn stage_json(stage: &Stage) -> (&'static str, Vec<String>) {
    match stage {
        Stage::Shadow => ("shadow", Vec::new()),
        Stage::Canary { regions } => ("canary", regions.clone()),
        Stage::All => ("all", Vec::new()),
    }
}

fn version_json(v: &RuleSetVersion, with_files: bool) -> Value {
    let (stage, canary_regions) = stage_json(&v.stage);
    let origin = match v.origin {
        Origin::Put => json!({ "kind": "put" }),
        Origin::Rollback { of } => json!({ "kind": "rollback", "of": of }),
    };
    let mut out = json!({
        "number": v.number,
        "stage": stage,
        "canary_regions": canary_regions,
        "origin": origin,
        "created_at_unix_ms": v.created_at_unix_ms,
        "file_names": v.files.keys().collect::<Vec<_>>(),
    });
    if with_files && let Some(map) = out.as_object_mut() {
        map.insert("files".into(), json!(v.files));
    }
    out
}

/// Accepts `{"stage": "shadow" | "canary" | "all", "canary_regions": [...]}`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StageInput {
    stage: Option<String>,
    #[serde(default)]
    canary_regions: Vec<String>,
}

impl StageInput {
    fn to_stage(&self) -> Result<Stage, ApiError> {
        let bad = |m: String| {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m).with("field", json!("stage"))
        };
        match self.stage.as_deref().unwrap_or("all") {
            "shadow" | "all" if !self.canary_regions.is_empty() => Err(bad(
                "canary_regions is only meaningful with stage \"canary\"".into(),
            )),
            "shadow" => Ok(Stage::Shadow),
            "all" => Ok(Stage::All),
            "canary" if self.canary_regions.is_empty() => {
                Err(bad("stage \"canary\" needs canary_regions".into()))
            }
            "canary" => Ok(Stage::Canary {
                regions: self.canary_regions.clone(),
            }),
            other => Err(bad(format!(
                "unknown stage {other:?}; expected shadow, canary or all"
            ))),
        }
    }
}

// ------------------------------------------------------------ handlers

async fn healthz(State(api): State<Api>) -> Response {
    let metrics = api.node.raft.metrics().borrow().clone();
    let status = if metrics.running_state.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if status == StatusCode::OK { "ok" } else { "raft stopped" },
        "node_id": api.node.id,
        "leader": metrics.current_leader,
        "term": metrics.current_term,
    });
    (status, Json(body)).into_response()
}

async fn prometheus(State(api): State<Api>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        api.prometheus.render(),
    )
        .into_response()
}

async fn get_rules(State(api): State<Api>, uri: Uri, headers: HeaderMap) -> Response {
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    let Some(current) = applied.registry.current() else {
        return ApiError::new(StatusCode::NOT_FOUND, "no rule set has been put yet")
            .with("consistency", json!(consistency))
            .into_response();
    };
    Json(json!({
        "consistency": consistency,
        "applied_index": applied.last_applied.map_or(0, |l| l.index),
        "current": version_json(current, true),
        "stable": applied.registry.stable().map(|v| version_json(v, true)),
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutRulesBody {
    files: BTreeMap<String, String>,
    stage: Option<String>,
    #[serde(default)]
    canary_regions: Vec<String>,
}

async fn put_rules(State(api): State<Api>, headers: HeaderMap, request_body: Body) -> ApiResult {
    let bytes = read_body(request_body).await?;
    authorize(&api, &headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    // JSON when declared, or undeclared but shaped like our JSON body (a
    // JSON object is also valid YAML and would fail validation confusingly).
    let is_json = match content_type {
        Some(v) => v.starts_with("application/json"),
        None => serde_json::from_slice::<PutRulesBody>(&bytes).is_ok(),
    };
    let (files, stage) = if is_json {
        let b: PutRulesBody = parse_json(&bytes)?;
        let stage = StageInput {
            stage: b.stage,
            canary_regions: b.canary_regions,
        }
        .to_stage()?;
        (b.files, stage)
    } else {
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "the YAML body is not UTF-8"))?;
        (
            BTreeMap::from([("rules.yaml".to_string(), text)]),
            Stage::All,
        )
    };
    let rule_files: Vec<RuleFile> = files
        .iter()
        .map(|(name, text)| RuleFile {
            name: name.clone(),
            text: text.clone(),
        })
        .collect();
    if let Err(issues) = validate(&rule_files, api.shared_rule_floor) {
        return Err(
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid rules")
                .with("issues", json!(issues)),
        );
    }
    commit(
        &api,
        &headers,
        Command::PutRules {
            files,
            stage,
            at_unix_ms: now_unix_ms(),
        },
    )
    .await
}

async fn list_versions(State(api): State<Api>, uri: Uri, headers: HeaderMap) -> Response {
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    let versions: Vec<Value> = applied
        .registry
        .versions
        .values()
        .map(|v| version_json(v, false))
        .collect();
    Json(json!({ "consistency": consistency, "versions": versions })).into_response()
}

async fn get_version(
    State(api): State<Api>,
    Path(n): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let Ok(n) = n.parse::<u64>() else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{n:?} is not a version number"),
        )
        .into_response();
    };
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    match applied.registry.versions.get(&n) {
        Some(v) => {
            let mut out = version_json(v, true);
            if let Some(map) = out.as_object_mut() {
                map.insert("consistency".into(), json!(consistency));
            }
            Json(out).into_response()
        }
        None => ApiError::new(StatusCode::NOT_FOUND, format!("version {n} does not exist"))
            .into_response(),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    to: Option<u64>,
}

async fn rollback(State(api): State<Api>, headers: HeaderMap, request_body: Body) -> ApiResult {
    let bytes = read_body(request_body).await?;
    authorize(&api, &headers)?;
    let b: RollbackBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        RollbackBody::default()
    } else {
        parse_json(&bytes)?
    };
    commit(
        &api,
        &headers,
        Command::Rollback {
            to: b.to,
            at_unix_ms: now_unix_ms(),
        },
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutBody {
    /// Defaults to the newest version.
    version: Option<u64>,
    stage: String,
    #[serde(default)]
    canary_regions: Vec<String>,
}

async fn rollout(State(api): State<Api>, headers: HeaderMap, request_body: Body) -> ApiResult {
    let bytes = read_body(request_body).await?;
    authorize(&api, &headers)?;
    let b: RolloutBody = parse_json(&bytes)?;
    let stage = StageInput {
        stage: Some(b.stage),
        canary_regions: b.canary_regions,
    }
    .to_stage()?;
    // Without a version, the state machine resolves "newest" when it
    // applies the command: this node's view may lag the leader's.
    commit(
        &api,
        &headers,
        Command::Rollout {
            version: b.version,
            stage,
        },
    )
    .await
}

async fn list_regions(State(api): State<Api>, uri: Uri, headers: HeaderMap) -> Response {
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    let regions: Vec<&_> = applied.registry.regions.values().collect();
    Json(json!({ "consistency": consistency, "regions": regions })).into_response()
}

async fn get_region(
    State(api): State<Api>,
    Path(name): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    match applied.registry.regions.get(&name) {
        Some(r) => Json(json!({ "consistency": consistency, "region": r })).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            format!("region {name:?} does not exist"),
        )
        .into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionBody {
    #[serde(default = "default_weight")]
    weight: f64,
    #[serde(default = "default_region_state")]
    state: RegionState,
}

fn default_weight() -> f64 {
    1.0
}

fn default_region_state() -> RegionState {
    RegionState::Active
}

fn check_region_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("region name {name:?} must be 1–64 characters of a-z, 0-9, '-' or '_'"),
        )
        .with("field", json!("name")))
    }
}

async fn put_region(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    request_body: Body,
) -> ApiResult {
    let bytes = read_body(request_body).await?;
    authorize(&api, &headers)?;
    check_region_name(&name)?;
    let b: RegionBody = parse_json(&bytes)?;
    if !(b.weight.is_finite() && b.weight > 0.0) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("weight must be a positive number, got {}", b.weight),
        )
        .with("field", json!("weight")));
    }
    commit(
        &api,
        &headers,
        Command::PutRegion {
            name,
            weight: b.weight,
            state: b.state,
            at_unix_ms: now_unix_ms(),
        },
    )
    .await
}

async fn delete_region(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&api, &headers)?;
    commit(&api, &headers, Command::DeleteRegion { name }).await
}

async fn cluster(State(api): State<Api>, uri: Uri, headers: HeaderMap) -> Response {
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
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
    Json(json!({
        "consistency": consistency,
        "node_id": api.node.id,
        "state": format!("{:?}", m.state),
        "leader": m.current_leader,
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "commit_index": api.node.committed.load(std::sync::atomic::Ordering::Relaxed),
        "applied_index": m.last_applied.map(|l| l.index),
        "snapshot_index": m.snapshot.map(|l| l.index),
        "purged_index": m.purged.map(|l| l.index),
        "millis_since_quorum_ack": m.millis_since_quorum_ack,
        "nodes": nodes,
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNodeBody {
    id: NodeId,
    raft_addr: String,
    http_addr: String,
}

async fn add_node(State(api): State<Api>, headers: HeaderMap, request_body: Body) -> ApiResult {
    let bytes = read_body(request_body).await?;
    authorize(&api, &headers)?;
    let b: AddNodeBody = parse_json(&bytes)?;
    let write = Write::AddNode {
        id: b.id,
        member: Member {
            raft_addr: b.raft_addr,
            http_addr: b.http_addr,
        },
    };
    let reply = api.node.write(write, is_relayed(&headers)).await?;
    outcome_response(reply)
}

async fn remove_node(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    authorize(&api, &headers)?;
    let id: NodeId = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("{id:?} is not a node id")))?;
    let reply = api
        .node
        .write(Write::RemoveNode { id }, is_relayed(&headers))
        .await?;
    outcome_response(reply)
}

/// A write relayed by another node: executed here if this node leads, else 503.
async fn internal_write(
    State(api): State<Api>,
    headers: HeaderMap,
    request_body: Body,
) -> ApiResult {
    let bytes = read_body(request_body).await?;
    authorize(&api, &headers)?;
    let write: Write = parse_json(&bytes)?;
    let reply = api.node.write(write, true).await?;
    Ok(Json(reply).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocationQuery {
    rule: Option<String>,
    key: Option<String>,
    /// Epochs of history to include (default 20, at most what is kept).
    history: Option<usize>,
    consistent: Option<bool>,
}

fn shares_json(shares: &crate::allocation::Shares) -> Value {
    let regions: BTreeMap<&String, Value> = shares
        .iter()
        .map(|(region, s)| {
            (
                region,
                json!({ "granted": s.granted, "bound": s.bound, "target": s.target, "since_epoch": s.since }),
            )
        })
        .collect();
    json!(regions)
}

/// `GET /api/v1/allocations[?rule=R[&key=K]][&history=N]`: every global
/// rule's split; one rule with its key entries; or one key's allocation per
/// region with demand, leases and the epochs that changed it.
async fn get_allocations(
    State(api): State<Api>,
    uri: Uri,
    headers: HeaderMap,
    query: Result<axum::extract::Query<AllocationQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let query = match query {
        Ok(q) => q.0,
        Err(e) => {
            return ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}"))
                .with("allowed", json!(["rule", "key", "history", "consistent"]))
                .into_response();
        }
    };
    let _ = query.consistent;
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    let state = &applied.registry.allocations;
    let now = now_unix_ms();
    let leases: BTreeMap<&String, Value> = state
        .regions
        .iter()
        .map(|(name, l)| {
            (
                name,
                json!({
                    "valid_until_unix_ms": l.valid_until_ms,
                    "expires_in_ms": l.valid_until_ms - now,
                    "acked_epoch": l.acked,
                    "last_heard_unix_ms": l.last_heard_ms,
                }),
            )
        })
        .collect();
    let history_len = query.history.unwrap_or(20);
    let head = json!({
        "consistency": consistency,
        "epoch": state.epoch,
        "at_unix_ms": state.at_ms,
        "leases": leases,
    });
    let Some(rule_id) = query.rule else {
        if query.key.is_some() {
            return ApiError::new(StatusCode::BAD_REQUEST, "key needs rule").into_response();
        }
        let rules: BTreeMap<&String, Value> = state
            .rules
            .iter()
            .map(|(id, r)| {
                (
                    id,
                    json!({
                        "limit": r.limit,
                        "split": shares_json(&r.split),
                        "demand": r.demand,
                        "fallback": r.fallback,
                        "key_entries": r.keys.len(),
                    }),
                )
            })
            .collect();
        let mut body = head;
        body["rules"] = json!(rules);
        return Json(body).into_response();
    };
    let Some(rule) = state.rules.get(&rule_id) else {
        let known: Vec<&String> = state.rules.keys().collect();
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("rule {rule_id:?} has no allocation (not a global rule, or no epoch yet)"),
        )
        .with("global_rules", json!(known))
        .into_response();
    };
    // A key without an entry of its own is served by the rule's split: its
    // history is the split's.
    let served_by = query.key.clone().filter(|k| rule.keys.contains_key(k));
    let history: Vec<Value> = state
        .history
        .iter()
        .rev()
        .filter_map(|record| {
            let changes: Vec<Value> = record
                .changes
                .iter()
                .filter(|(r, k, _, _)| *r == rule_id && *k == served_by)
                .map(|(_, _, region, granted)| json!({ "region": region, "granted": granted }))
                .collect();
            (!changes.is_empty()).then(
                || json!({ "epoch": record.epoch, "at_unix_ms": record.at_ms, "changes": changes }),
            )
        })
        .take(history_len)
        .collect();
    let mut body = head;
    body["rule"] = json!(rule_id);
    body["limit"] = json!(rule.limit);
    body["fallback"] = json!(rule.fallback);
    body["history"] = json!(history);
    match &query.key {
        None => {
            let mut keys: Vec<(&String, u64)> = rule
                .keys
                .iter()
                .map(|(k, e)| (k, e.demand.values().sum::<f64>() as u64))
                .collect();
            keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            body["split"] = shares_json(&rule.split);
            body["demand"] = json!(rule.demand);
            body["key_entries"] = json!(keys
                .iter()
                .take(100)
                .map(|(k, _)| json!({ "key": k, "shares": shares_json(&rule.keys[*k].shares), "demand": rule.keys[*k].demand }))
                .collect::<Vec<_>>());
            body["tracked_keys"] = json!(api.allocator.tracked_keys(&rule_id));
        }
        Some(key) => {
            body["key"] = json!(key);
            match rule.keys.get(key) {
                Some(entry) => {
                    body["source"] = json!("key_entry");
                    body["shares"] = shares_json(&entry.shares);
                    body["demand"] = json!(entry.demand);
                }
                None => {
                    body["source"] = json!("rule_split");
                    body["shares"] = shares_json(&rule.split);
                    body["demand"] = json!(rule.demand);
                }
            }
        }
    }
    Json(body).into_response()
}

/// `GET /api/v1/leases`: every region's lease, acknowledgement and status,
/// and (on the leader) the pods heard and the epoch each holds.
async fn get_leases(State(api): State<Api>, uri: Uri, headers: HeaderMap) -> Response {
    let consistency = match read_mode(&api, &uri, &headers).await {
        Ok(c) => c,
        Err(relayed) => return relayed,
    };
    let applied = api.node.applied.borrow().clone();
    let state = &applied.registry.allocations;
    let now = now_unix_ms();
    let pods = api.allocator.pods();
    let regions: Vec<Value> = applied
        .registry
        .regions
        .values()
        .map(|r| {
            let lease = state.regions.get(&r.name).copied().unwrap_or_default();
            let region_pods: Vec<Value> = pods
                .iter()
                .filter(|(region, ..)| *region == r.name)
                .map(|(_, pod, epoch, at)| json!({ "pod": pod, "epoch": epoch, "last_heard_unix_ms": at }))
                .collect();
            json!({
                "region": r.name,
                "state": r.state,
                "weight": r.weight,
                "valid_until_unix_ms": lease.valid_until_ms,
                "lease": if lease.valid_until_ms >= now { "valid" } else { "lapsed" },
                "expires_in_ms": lease.valid_until_ms - now,
                "acked_epoch": lease.acked,
                "last_heard_unix_ms": lease.last_heard_ms,
                "pods": region_pods,
            })
        })
        .collect();
    Json(json!({
        "consistency": consistency,
        "epoch": state.epoch,
        "regions": regions,
        "pods_known_here": !pods.is_empty(),
    }))
    .into_response()
}
