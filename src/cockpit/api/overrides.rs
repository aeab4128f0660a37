//! `/api/v1/overrides…`: per-key overrides — set one, remove one, list or
//! export them, import many in one commit. Setting, removing and importing
//! are admin writes, validated against the enforced rule set before they
//! are proposed (the field at fault is named) and recorded with who made
//! them (the token's fingerprint and the operator name given).

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Api;
use super::auth::{AdminBody, MAX_BULK_BODY_BYTES, actor, parse_json};
use super::errors::{ApiError, ApiResult};
use super::read::Read;
use crate::clock::now_unix_ms;
use crate::coordinator::node::Write;
use crate::coordinator::state::{Command, Outcome};
use crate::overrides::{
    BulkError, CHUNK_ROWS, Override, OverrideChange, Proposed, Row, parse_csv,
    parse_json as rows_json, resolve, split_entries, to_csv,
};
use crate::rules::RuleSet;

fn unprocessable(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message).with("field", json!(field))
}

/// An override as the API shows it.
fn shown(o: &Override, now: i64) -> Value {
    json!({
        "domain": o.domain,
        "descriptor": o.entries.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "rule": o.rule,
        "rule_name": o.rule_name,
        "key": o.key,
        "limit": o.limit,
        "burst": o.burst,
        "expires_at_unix_ms": o.expires_at_unix_ms,
        "expired": !o.live_at(now),
        "reason": o.reason,
        "set_by": o.set_by,
        "set_at_unix_ms": o.set_at_unix_ms,
    })
}

/// Who is asking, as an override records it.
fn set_by(api: &Api, headers: &HeaderMap, peer: &SocketAddr) -> String {
    let a = actor(api, headers, peer);
    match a.operator {
        Some(op) => format!("{} ({op})", a.credential),
        None => a.credential,
    }
}

/// The enforced rule set overrides are validated against.
fn enforced_rules(api: &Api) -> Result<RuleSet, ApiError> {
    let applied = api.node.applied.borrow().clone();
    match applied.registry.enforced_rule_set() {
        Some(Ok(set)) => Ok(set),
        Some(Err(e)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the enforced rule set does not parse in this build: {e}"),
        )),
        None => Err(unprocessable(
            "domain",
            "no rule set is enforced yet: put rules first",
        )),
    }
}

/// Commits `change` and answers with the set's new version.
async fn commit(api: &Api, headers: &HeaderMap, change: OverrideChange, extra: Value) -> ApiResult {
    let reply = api
        .node
        .write(
            Write::Command(Command::SetOverrides(change)),
            super::is_relayed(headers),
        )
        .await?;
    let log_index = json!(reply.log_index);
    match reply.outcome {
        Outcome::Applied { version } => {
            let mut body = json!({ "version": version, "log_index": log_index });
            if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
                body.extend(extra);
            }
            Ok(Json(body).into_response())
        }
        Outcome::Rejected { reason } => {
            Err(ApiError::new(StatusCode::CONFLICT, reason).with("log_index", log_index))
        }
        Outcome::NotFound { reason } => {
            Err(ApiError::new(StatusCode::NOT_FOUND, reason).with("log_index", log_index))
        }
        Outcome::Nothing => Ok(Json(json!({ "log_index": log_index })).into_response()),
    }
}

/// `PUT /api/v1/overrides`: sets one override (a row: `domain`,
/// `descriptor`, `limit`, and optionally `rule`, `burst`, `ttl` or
/// `expires_at_unix_ms`, `reason`).
pub(super) async fn put_override(
    State(api): State<Api>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
    let row: Row = parse_json(&bytes)?;
    let now = now_unix_ms();
    let proposed = row
        .proposed(now)
        .map_err(|(field, reason)| unprocessable(&field, reason))?;
    let rules = enforced_rules(&api)?;
    let by = set_by(&api, &headers, &peer);
    let o = resolve(&rules, &proposed, api.shared_rule_floor, &by, now)
        .map_err(|e| unprocessable(e.field, e.to_string()))?;
    let period = rules
        .rules()
        .find(|r| r.id == o.rule)
        .and_then(|r| r.params.as_ref())
        .map(|p| crate::rules::format_duration(p.period()));
    let extra = json!({ "override": shown(&o, now), "period": period });
    let change = OverrideChange {
        set: vec![o],
        remove: Vec::new(),
        replace_all: false,
        import: None,
        at_unix_ms: now,
    };
    commit(&api, &headers, change, extra).await
}

/// Which overrides a query names: a domain and a descriptor
/// (`customer=42;plan=gold`), optionally a rule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Which {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    descriptor: Option<String>,
    #[serde(default)]
    rule: Option<String>,
    /// The key of an override set by rule name (no descriptor).
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    format: Option<String>,
    /// Include expired overrides not yet dropped.
    #[serde(default)]
    expired: Option<bool>,
    /// Read by the [`Read`] extractor; named here so that it is not refused
    /// as an unknown parameter.
    #[serde(default, rename = "consistent")]
    _consistent: Option<bool>,
}

impl Which {
    fn entries(&self) -> Result<Option<Vec<(String, String)>>, ApiError> {
        let Some(text) = &self.descriptor else {
            return Ok(None);
        };
        let entries: Vec<String> = text
            .split(';')
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        split_entries(&entries)
            .map(Some)
            .map_err(|e| unprocessable("descriptor", e))
    }

    fn matches(&self, o: &Override, entries: Option<&[(String, String)]>) -> bool {
        self.domain.as_ref().is_none_or(|d| *d == o.domain)
            && self
                .rule
                .as_ref()
                .is_none_or(|r| *r == o.rule || o.rule_name.as_ref() == Some(r))
            && entries.is_none_or(|e| e == o.entries.as_slice())
            && self
                .key
                .as_ref()
                .is_none_or(|k| o.entries.is_empty() && *k == o.key)
    }
}

/// `GET /api/v1/overrides[?domain=&descriptor=&rule=&format=json|csv&expired=true]`.
pub(super) async fn list_overrides(Query(q): Query<Which>, read: Read) -> ApiResult {
    let entries = q.entries()?;
    let now = now_unix_ms();
    let overrides = &read.state.registry.overrides;
    let chosen: Vec<&Override> = overrides
        .by_id
        .values()
        .filter(|o| q.matches(o, entries.as_deref()))
        .filter(|o| q.expired.unwrap_or(false) || o.live_at(now))
        .collect();
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(json!({
            "consistency": read.consistency,
            "version": overrides.version,
            "count": chosen.len(),
            "bound": crate::overrides::MAX_OVERRIDES,
            "overrides": chosen.iter().map(|o| shown(o, now)).collect::<Vec<_>>(),
        }))
        .into_response()),
        "csv" => Ok((
            [(header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            to_csv(chosen),
        )
            .into_response()),
        other => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("format {other:?} is not json or csv"),
        )
        .with("field", json!("format"))),
    }
}

/// `DELETE /api/v1/overrides?domain=&descriptor=[&rule=]`: removes the
/// overrides of that descriptor (one per rule it was set on).
pub(super) async fn delete_override(
    State(api): State<Api>,
    Query(q): Query<Which>,
    headers: HeaderMap,
    AdminBody(_): AdminBody,
) -> ApiResult {
    let Some(domain) = q.domain.as_ref() else {
        return Err(unprocessable("domain", "give the override's domain"));
    };
    let entries = q.entries()?;
    if entries.is_none() && (q.key.is_none() || q.rule.is_none()) {
        return Err(unprocessable(
            "descriptor",
            "give the override's descriptor (KEY=VALUE;KEY=VALUE), or its rule and key",
        ));
    }
    let applied = api.node.applied.borrow().clone();
    let remove: Vec<(String, String)> = applied
        .registry
        .overrides
        .by_id
        .values()
        .filter(|o| q.matches(o, entries.as_deref()))
        .map(Override::id)
        .collect();
    if remove.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no override for {} in domain {domain}",
                q.descriptor.as_deref().unwrap_or("")
            ),
        ));
    }
    let extra = json!({ "removed": remove.len() });
    let change = OverrideChange {
        set: Vec::new(),
        remove,
        replace_all: false,
        import: None,
        at_unix_ms: now_unix_ms(),
    };
    commit(&api, &headers, change, extra).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ImportQuery {
    #[serde(default)]
    format: Option<String>,
    /// Replace the whole set instead of adding to it.
    #[serde(default)]
    replace: Option<bool>,
}

fn bulk_refused(e: BulkError) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        .with("row", json!(e.row))
        .with("field", json!(e.field))
}

/// `POST /api/v1/overrides/import?format=csv|json[&replace=true]`: sets every
/// row in one commit, or none (the first bad row is named).
pub(super) async fn import_overrides(
    State(api): State<Api>,
    Query(q): Query<ImportQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody<MAX_BULK_BODY_BYTES>,
) -> ApiResult {
    let rows = match q.format.as_deref().unwrap_or("json") {
        "json" => rows_json(&bytes),
        "csv" => parse_csv(&bytes),
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("format {other:?} is not json or csv"),
            )
            .with("field", json!("format")));
        }
    }
    .map_err(bulk_refused)?;
    let now = now_unix_ms();
    let rules = enforced_rules(&api)?;
    let by = set_by(&api, &headers, &peer);
    let mut set = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let refused = |field: String, reason: String| BulkError {
            row: i + 1,
            field,
            reason,
        };
        let proposed: Proposed = row
            .proposed(now)
            .map_err(|(f, r)| bulk_refused(refused(f, r)))?;
        let o = resolve(&rules, &proposed, api.shared_rule_floor, &by, now)
            .map_err(|e| bulk_refused(refused(e.field.into(), e.to_string())))?;
        set.push(o);
    }
    let extra = json!({ "imported": set.len(), "replaced": q.replace.unwrap_or(false) });
    // A large import never travels as one Raft entry (see
    // `overrides::imports`): its rows are staged chunk by chunk, and the
    // change that applies them is small.
    let import = if set.len() > CHUNK_ROWS {
        let id: u64 = rand::random();
        for (seq, chunk) in set.chunks(CHUNK_ROWS).enumerate() {
            let stage = Command::StageOverrides {
                import: id,
                seq: seq as u32,
                rows: chunk.to_vec(),
                at_unix_ms: now,
            };
            let reply = api
                .node
                .write(Write::Command(stage), super::is_relayed(&headers))
                .await?;
            if let Outcome::Rejected { reason } | Outcome::NotFound { reason } = reply.outcome {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!("staging the import failed, nothing was set: {reason}"),
                ));
            }
        }
        set.clear();
        Some(id)
    } else {
        None
    };
    let change = OverrideChange {
        set,
        remove: Vec::new(),
        replace_all: q.replace.unwrap_or(false),
        import,
        at_unix_ms: now,
    };
    commit(&api, &headers, change, extra).await
}
