//! `/api/v1/rules…`: the versioned rule set. A put adds a version at a
//! rollout stage; rollout moves a version through shadow → canary → all;
//! rollback makes an earlier version current again as a new version.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Api;
use super::auth::{AdminBody, parse_json};
use super::errors::{ApiError, ApiResult};
use super::read::Read;
use super::rule_diffs::DiffError;
use super::write::commit;
use crate::clock::now_unix_ms;
use crate::coordinator::state::{Command, Origin, Outcome, RuleSetVersion, Stage};
use crate::coordinator::validation::validate;
use crate::rules::{MAX_DEPTH, RuleFile, check_depth};

fn stage_json(stage: &Stage) -> (&'static str, Vec<String>) {
    match stage {
        Stage::Shadow => ("shadow", Vec::new()),
        Stage::Canary { regions } => ("canary", regions.clone()),
        Stage::All => ("all", Vec::new()),
    }
}

/// A version as the API shows it; `with_files` adds the file texts, which
/// the version list leaves out to stay small.
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
    /// Absent means `"all"`.
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

/// `GET /api/v1/rules`: the current version and the stable one, with files.
pub(super) async fn get_rules(read: Read) -> Response {
    let Read { consistency, state } = read;
    let Some(current) = state.registry.current() else {
        return ApiError::new(StatusCode::NOT_FOUND, "no rule set has been put yet")
            .with("consistency", json!(consistency))
            .into_response();
    };
    Json(json!({
        "consistency": consistency,
        "applied_index": state.last_applied.map_or(0, |l| l.index),
        "current": version_json(current, true),
        "stable": state.registry.stable().map(|v| version_json(v, true)),
    }))
    .into_response()
}

/// The JSON form of `PUT /api/v1/rules`; the other form is one bare YAML file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutRulesBody {
    /// File name → YAML text; validated together, as one rule set.
    files: BTreeMap<String, String>,
    stage: Option<String>,
    #[serde(default)]
    canary_regions: Vec<String>,
}

/// `PUT /api/v1/rules`: validates the files and commits them as a new version.
pub(super) async fn put_rules(
    State(api): State<Api>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
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
    // Refused before any parser runs, as a malformed body (400), not as
    // invalid rules (422): validation would reject it too, but only after
    // reading it.
    for (name, text) in &files {
        if let Err(deep) = check_depth(text, MAX_DEPTH) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{name}:{}: yaml: {deep}", deep.line),
            )
            .with("file", json!(name))
            .with("line", json!(deep.line))
            .with("depth", json!(deep.depth))
            .with("max_depth", json!(deep.limit)));
        }
    }
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

/// `GET /api/v1/rules/versions`: every kept version, without file texts.
pub(super) async fn list_versions(read: Read) -> Response {
    let versions: Vec<Value> = read
        .state
        .registry
        .versions
        .values()
        .map(|v| version_json(v, false))
        .collect();
    Json(json!({ "consistency": read.consistency, "versions": versions })).into_response()
}

/// The `{n}` of `/api/v1/rules/versions/{n}`. An extractor of its own so
/// that it runs before [`Read`]: a malformed number is answered here, never
/// relayed to the leader.
pub(super) struct VersionNumber(u64);

impl FromRequestParts<Api> for VersionNumber {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<VersionNumber, Response> {
        let Path(n) = Path::<String>::from_request_parts(parts, api)
            .await
            .map_err(IntoResponse::into_response)?;
        n.parse().map(VersionNumber).map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{n:?} is not a version number"),
            )
            .into_response()
        })
    }
}

/// `GET /api/v1/rules/versions/{n}`: one version with its files.
pub(super) async fn get_version(VersionNumber(n): VersionNumber, read: Read) -> Response {
    match read.state.registry.versions.get(&n) {
        Some(v) => {
            let mut out = version_json(v, true);
            if let Some(map) = out.as_object_mut() {
                map.insert("consistency".into(), json!(read.consistency));
            }
            Json(out).into_response()
        }
        None => ApiError::new(StatusCode::NOT_FOUND, format!("version {n} does not exist"))
            .into_response(),
    }
}

/// The query of `GET /api/v1/rules/diff`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DiffQuery {
    from: u64,
    to: u64,
    #[expect(dead_code, reason = "read by the Read extractor, not from here")]
    consistent: Option<bool>,
}

/// `GET /api/v1/rules/diff?from=A&to=B`: what changed from version A to B,
/// as `meridian ctl rules diff A B` prints it (`rules::diff`, bounded in
/// changed lines and steps), from the node's cache of diffs or computed on
/// a blocking thread, one at a time (`rule_diffs`): 503 with `Retry-After`
/// when another diff holds the turn too long.
pub(super) async fn diff(
    State(api): State<Api>,
    query: Result<Query<DiffQuery>, QueryRejection>,
    read: Read,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => {
            return ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}"))
                .with("allowed", json!(["from", "to"]))
                .into_response();
        }
    };
    let versions = &read.state.registry.versions;
    for (n, field) in [(q.from, "from"), (q.to, "to")] {
        if !versions.contains_key(&n) {
            return ApiError::new(StatusCode::NOT_FOUND, format!("{field}: no version {n}"))
                .with("field", json!(field))
                .with("versions", json!(versions.keys().collect::<Vec<_>>()))
                .into_response();
        }
    }
    match api.diffs.get(Arc::clone(&read.state), q.from, q.to).await {
        // `diff` is JSON already; the other fields are numbers and a
        // constant word, so the object is written as text.
        Ok(diff) => (
            [(header::CONTENT_TYPE, "application/json")],
            format!(
                r#"{{"consistency":"{}","from":{},"to":{},"diff":{diff}}}"#,
                read.consistency, q.from, q.to
            ),
        )
            .into_response(),
        Err(e @ DiffError::Busy) => {
            let mut response = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                .with("retry_after_s", json!(1))
                .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        Err(e) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("diff: {e}")).into_response()
        }
    }
}

/// The body of `POST /api/v1/rules/rollback`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    /// Absent means the last version before current that was enforced
    /// everywhere, as the leader's state machine finds it.
    to: Option<u64>,
}

/// `POST /api/v1/rules/rollback`: an empty body means `{}`.
///
/// The target is validated as a put is (parser and `--shared-rule-floor`):
/// a version accepted under older rules is not enforced again if today's
/// would refuse it. The target is resolved from this node's state (the
/// leader's when it leads) and proposed by number, so the version validated
/// is the one copied.
pub(super) async fn rollback(
    State(api): State<Api>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
    let b: RollbackBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        RollbackBody::default()
    } else {
        parse_json(&bytes)?
    };
    // On the leader this waits until everything committed is applied; a
    // follower (or a leader without quorum, whose write fails anyway) uses
    // what it has applied.
    let _fresh = api.node.linearizable().await;
    let state = api.node.applied.borrow().clone();
    let target = state
        .registry
        .rollback_target(b.to)
        .map_err(|refused| match refused {
            Outcome::NotFound { reason } => ApiError::new(StatusCode::NOT_FOUND, reason),
            Outcome::Rejected { reason } => ApiError::new(StatusCode::CONFLICT, reason),
            other => ApiError::new(StatusCode::CONFLICT, format!("{other:?}")),
        })?;
    let files = target.rule_files();
    if let Err(issues) = validate(&files, api.shared_rule_floor) {
        let first = issues.first().map_or_else(String::new, |i| {
            format!("; {}:{}: {}: {}", i.file, i.line, i.field, i.reason)
        });
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "rollback to version {} refused: its rules fail today's validation{first}",
                target.number
            ),
        )
        .with("version", json!(target.number))
        .with("issues", json!(issues)));
    }
    commit(
        &api,
        &headers,
        Command::Rollback {
            to: Some(target.number),
            at_unix_ms: now_unix_ms(),
        },
    )
    .await
}

/// The body of `POST /api/v1/rules/rollout`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutBody {
    /// Defaults to the newest version.
    version: Option<u64>,
    stage: String,
    #[serde(default)]
    canary_regions: Vec<String>,
}

/// `POST /api/v1/rules/rollout`: moves a version to another stage.
pub(super) async fn rollout(
    State(api): State<Api>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
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
