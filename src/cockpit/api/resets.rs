//! `/api/v1/resets…`: clear one key's counters in every region. Starting a
//! reset is an admin write, recorded with who asked (as drills are); each
//! region's limiters apply it and answer, and the reset's page shows every
//! region's answer — or that it is still pending (a region cut off applies
//! it when it comes back, within `RESET_VALID_MS`), or that it expired
//! unanswered.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Api;
use super::auth::{AdminBody, actor, parse_json};
use super::errors::{ApiError, ApiResult};
use super::read::Read;
use crate::clock::now_unix_ms;
use crate::coordinator::node::Write;
use crate::coordinator::resets::{RESET_VALID_MS, ResetOrder, StartReset};
use crate::coordinator::state::{Command, Outcome};
use crate::overrides::split_entries;

fn unprocessable(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message).with("field", json!(field))
}

/// The body of `POST /api/v1/resets`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    domain: String,
    /// KEY=VALUE entries, outermost first.
    #[serde(default)]
    descriptor: Vec<String>,
    #[serde(default)]
    rule: Option<String>,
    /// Instead of a descriptor: the key as checks by rule name (`rule`)
    /// count it.
    #[serde(default)]
    key: Option<String>,
}

/// A reset with each region's state at `now`.
fn shown(o: &ResetOrder, now: i64) -> Value {
    let regions: Vec<Value> = o
        .regions
        .iter()
        .map(|region| match o.answers.get(region) {
            Some(a) => json!({
                "region": region,
                "state": if a.ok { "applied" } else { "failed" },
                "at_unix_ms": a.at_unix_ms,
                "pod": a.pod,
                "detail": a.detail,
            }),
            None if now - o.at_unix_ms < RESET_VALID_MS => json!({
                "region": region,
                "state": "pending",
                "detail": format!(
                    "not answered yet; a region cut off applies it when it reconnects, until {}",
                    crate::clock::utc_text(o.at_unix_ms + RESET_VALID_MS)
                ),
            }),
            None => json!({
                "region": region,
                "state": "not applied",
                "detail": "the region did not answer before the reset expired; its counters were not cleared",
            }),
        })
        .collect();
    let done = regions.iter().all(|r| r["state"] != "pending");
    json!({
        "id": o.id,
        "domain": o.domain,
        "descriptor": o.entries.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "rule": o.rule,
        "key": o.key,
        "at_unix_ms": o.at_unix_ms,
        "by": o.by,
        "done": done,
        "regions": regions,
    })
}

/// `POST /api/v1/resets`: starts a reset of one key in every registered region.
pub(super) async fn start_reset(
    State(api): State<Api>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
    let b: StartBody = parse_json(&bytes)?;
    let entries = split_entries(&b.descriptor).map_err(|e| unprocessable("descriptor", e))?;
    let applied = api.node.applied.borrow().clone();
    let registry = &applied.registry;
    // Checked here for a clear answer: each limiter resolves it again
    // against the rules it enforces.
    let rules = match registry.enforced_rule_set() {
        Some(Ok(set)) => set,
        _ => return Err(unprocessable("domain", "no rule set is enforced yet")),
    };
    let rule = match &b.key {
        Some(key) => {
            let Some(named) = &b.rule else {
                return Err(unprocessable(
                    "rule",
                    "a key without a descriptor needs the rule's name",
                ));
            };
            if !entries.is_empty() {
                return Err(unprocessable(
                    "key",
                    "give a descriptor, or a rule name and a key, not both",
                ));
            }
            crate::store::key::check(named, key)
                .map_err(|e| unprocessable(e.field, e.to_string()))?;
            match rules.by_name(&b.domain, named) {
                Ok(Some(rule)) => rule.clone(),
                Ok(None) => {
                    return Err(unprocessable(
                        "rule",
                        format!("no rule of domain {} is named {named}", b.domain),
                    ));
                }
                Err(e) => return Err(unprocessable("rule", e.to_string())),
            }
        }
        None => {
            let pairs: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let resolved = rules
                .resolve(&b.domain, &pairs)
                .and_then(|r| r.rule.cloned());
            let Some(rule) = resolved else {
                return Err(unprocessable(
                    "descriptor",
                    format!(
                        "{} matches no rule of domain {}: there is nothing to reset",
                        b.descriptor.join(" "),
                        b.domain
                    ),
                ));
            };
            if let Some(named) = &b.rule
                && *named != rule.id
                && rule.name.as_deref() != Some(named.as_str())
            {
                return Err(unprocessable(
                    "rule",
                    format!("the descriptor resolves to rule {}, not {named}", rule.id),
                ));
            }
            rule
        }
    };
    // Limiters check a named rule by its name (an id names it too here).
    let rule_name = match &b.key {
        Some(_) => rule.name.clone(),
        None => b.rule.as_ref().and(rule.name.clone()),
    };
    let start = StartReset {
        domain: b.domain,
        entries,
        rule: rule_name,
        key: b.key,
        by: actor(&api, &headers, &peer),
        at_unix_ms: now_unix_ms(),
        regions: registry.regions.keys().cloned().collect(),
    };
    drop(applied);
    let reply = api
        .node
        .write(
            Write::Command(Command::StartReset(start)),
            super::is_relayed(&headers),
        )
        .await?;
    let log_index = json!(reply.log_index);
    match reply.outcome {
        Outcome::Applied { version } => {
            metrics::counter!("meridian_coordinator_resets_total").increment(1);
            Ok(Json(json!({ "reset": version, "log_index": log_index })).into_response())
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

/// `GET /api/v1/resets`: the resets kept, newest first.
pub(super) async fn list_resets(read: Read) -> ApiResult {
    let now = now_unix_ms();
    let resets: Vec<Value> = read
        .state
        .registry
        .resets
        .by_id
        .values()
        .rev()
        .map(|o| shown(o, now))
        .collect();
    Ok(Json(json!({ "consistency": read.consistency, "resets": resets })).into_response())
}

/// `GET /api/v1/resets/{id}`: one reset and every region's answer.
pub(super) async fn get_reset(Path(id): Path<u64>, read: Read) -> ApiResult {
    let Some(o) = read.state.registry.resets.by_id.get(&id) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("reset {id} is not kept"),
        ));
    };
    Ok(
        Json(json!({ "consistency": read.consistency, "reset": shown(o, now_unix_ms()) }))
            .into_response(),
    )
}
