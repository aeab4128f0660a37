//! `GET /api/v1/ledger[?rule=R][&periods=N]`: per global rule, world-wide
//! admitted per clock-aligned period against `L` and the stated bound —
//! the current period, the newest finished ones (world and per region) and
//! the worst of the last hour (`cockpit::ledger_json`).
//!
//! The ledger is counted by the leader from the reports that reach it, so
//! a follower relays the request to the leader and answers with the
//! leader's ledger (`node_id` says which node served it); when the leader
//! cannot be reached it answers 503 saying why. Reads are authorised like
//! every other read ([`Read`]: the read or admin token when
//! `--read-token-file` is set).

use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, json};

use super::errors::ApiError;
use super::read::{Read, relay_get};
use super::{Api, is_relayed};
use crate::allocation::ledger::MAX_FINISHED;
use crate::cockpit::ledger_json::{HOW, rule_json};

/// How long a follower waits for the leader's ledger: a dashboard should
/// not hang on a leader that froze.
const RELAY_DEADLINE: Duration = Duration::from_secs(2);

/// Finished periods per rule when the query does not say.
const DEFAULT_PERIODS: usize = 60;

/// The query, checked before anything is relayed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LedgerQuery {
    rule: Option<String>,
    /// Finished periods per rule, newest last (default 60, at most
    /// [`MAX_FINISHED`]).
    periods: Option<usize>,
    /// Accepted for symmetry with the other reads; the ledger is always
    /// the leader's.
    #[expect(dead_code, reason = "read by the Read extractor, not from here")]
    consistent: Option<bool>,
}

impl FromRequestParts<Api> for LedgerQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        match Query::<LedgerQuery>::from_request_parts(parts, api).await {
            Ok(Query(query)) => Ok(query),
            Err(e) => Err(
                ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}"))
                    .with("allowed", json!(["rule", "periods", "consistent"])),
            ),
        }
    }
}

pub(super) async fn get_ledger(
    State(api): State<Api>,
    query: LedgerQuery,
    read: Read,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(n) = query.periods
        && n > MAX_FINISHED
    {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("periods {n} is above the {MAX_FINISHED} periods the ledger keeps per rule"),
        )
        .with("field", json!("periods"))
        .into_response();
    }
    if !api.allocator.is_leader() {
        let why = if is_relayed(&headers) {
            "relayed to a node that no longer leads".to_string()
        } else {
            match api.node.leader() {
                Some((_, leader)) => {
                    match relay_get(&api, &leader, &uri, Some(RELAY_DEADLINE)).await {
                        Ok(answer) => return answer,
                        Err(e) => format!("leader unreachable: {e}"),
                    }
                }
                None => "no leader known".to_string(),
            }
        };
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the world ledger is kept by the leader: {why}; retry"),
        )
        .into_response();
    }
    let periods = query.periods.unwrap_or(DEFAULT_PERIODS);
    let global = &read.state.registry.allocations.rules;
    let rules = api.allocator.with_ledger(|ledger, now| {
        let mut rules = Map::new();
        for (id, rule) in ledger.rules() {
            if query.rule.as_ref().is_none_or(|r| r == id) {
                rules.insert(id.clone(), rule_json(rule, now, periods));
            }
        }
        (rules, now)
    });
    let Some((rules, now)) = rules else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node stopped leading while answering; retry",
        )
        .into_response();
    };
    if let Some(rule) = &query.rule
        && !rules.contains_key(rule)
    {
        let known: Vec<&String> = global.keys().collect();
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("rule {rule:?} is not a global rule of the enforced rule set"),
        )
        .with("global_rules", json!(known))
        .into_response();
    }
    Json(json!({
        "consistency": read.consistency,
        "node_id": api.node.id,
        "at_unix_ms": now,
        "how": HOW,
        "rules": rules,
    }))
    .into_response()
}
