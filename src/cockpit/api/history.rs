//! `GET /api/v1/history?rule=R[&key=K][&since=MS]`: a global rule's (or one
//! of its keys') grants, demand and use per region over the epochs this node
//! sampled (`cockpit::history`), and on the leader the rule's finished
//! clock-aligned periods from the world ledger (`world_periods`, the
//! busiest key's world-wide admitted against `L` and the stated bound, for
//! every algorithm; `world_periods_how` says how it is measured).
//!
//! Grants and demand are the same on every node; hits are counted only by
//! the leader. So a follower relays the request to the leader and answers
//! with the leader's history; when the leader cannot be reached it answers
//! with its own, without use (`use_counted: false`, `use_note` says why).

use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::errors::ApiError;
use super::read::{Read, relay_get};
use super::{Api, is_relayed};
use crate::cockpit::history::Series;
use crate::cockpit::ledger_json::{HOW, figure_json};

/// How long a follower waits for the leader's history before it answers
/// with its own: a dashboard should not hang on a leader that froze.
const RELAY_DEADLINE: Duration = Duration::from_secs(2);

/// The query, checked before anything is relayed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HistoryQuery {
    rule: String,
    key: Option<String>,
    /// Only samples computed after this Unix time in ms (a dashboard
    /// asks for what it has not drawn yet).
    since: Option<i64>,
    /// Accepted for symmetry with the other reads; history is always
    /// served as described above.
    #[expect(dead_code, reason = "read by the Read extractor, not from here")]
    consistent: Option<bool>,
}

impl FromRequestParts<Api> for HistoryQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        match Query::<HistoryQuery>::from_request_parts(parts, api).await {
            Ok(Query(query)) => Ok(query),
            Err(e) => Err(
                ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}"))
                    .with("allowed", json!(["rule", "key", "since"])),
            ),
        }
    }
}

pub(super) async fn get_history(
    State(api): State<Api>,
    query: HistoryQuery,
    read: Read,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut use_note = None;
    if !api.allocator.is_leader() && !is_relayed(&headers) {
        match api.node.leader() {
            Some((_, leader)) => match relay_get(&api, &leader, &uri, Some(RELAY_DEADLINE)).await {
                Ok(answer) => return answer,
                Err(e) => use_note = Some(format!("leader unreachable: {e}")),
            },
            None => use_note = Some("no leader known".to_string()),
        }
    }
    let leading = api.allocator.is_leader();
    if !leading && use_note.is_none() {
        use_note = Some("relayed to a node that no longer leads".to_string());
    }
    let allocations = &read.state.registry.allocations;
    let Some(rule) = allocations.rules.get(&query.rule) else {
        let known: Vec<&String> = allocations.rules.keys().collect();
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "rule {:?} has no allocation (not a global rule, or no epoch yet)",
                query.rule
            ),
        )
        .with("global_rules", json!(known))
        .into_response();
    };
    let meta = api.live.meta(&query.rule);
    let period_ms = meta.as_ref().map(|m| m.period_ms);
    let history = api.live.history();
    let capacity = history.capacity();
    let Some(rule_history) = history.rule(&query.rule) else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no sample of this rule yet; retry after the next epoch",
        )
        .into_response();
    };
    let (source, series) = match query.key.as_deref() {
        Some(key) => match rule_history.keys.get(key) {
            Some(series) => ("key_entry", series),
            None if rule.keys.contains_key(key) => {
                drop(history);
                return ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("key {key:?} has an entry but no series: only the keys with the most demand have one"),
                )
                .with("max_key_series", json!(crate::cockpit::history::MAX_KEY_SERIES))
                .into_response();
            }
            None => ("rule_split", &rule_history.split),
        },
        None => ("rule_split", &rule_history.split),
    };
    let samples = render(series, query.since.unwrap_or(i64::MIN), period_ms);
    let regions = series.regions.clone();
    // Busiest first: the dashboard opens on the first.
    let mut keys: Vec<(&String, f64)> = rule_history
        .keys
        .keys()
        .map(|k| {
            let demand = rule.keys.get(k).map_or(0.0, |e| e.demand.values().sum());
            (k, demand)
        })
        .collect();
    keys.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let keys = json!(keys.iter().map(|(k, _)| k).collect::<Vec<_>>());
    drop(history);
    // Per-window world figures for every algorithm, from the leader's
    // ledger: the busiest key's, whichever key was asked for.
    let world_periods = api.allocator.with_ledger(|ledger, _| {
        ledger.rule(&query.rule).map(|r| {
            r.finished()
                .iter()
                .filter(|f| f.start_ms > query.since.unwrap_or(i64::MIN))
                .map(figure_json)
                .collect::<Vec<_>>()
        })
    });
    Json(json!({
        "rule": query.rule,
        "key": query.key,
        "source": source,
        "node_id": api.node.id,
        "use_counted": leading,
        "use_note": use_note,
        "limit": rule.limit,
        "period_ms": period_ms,
        "algorithm": meta.as_ref().map(|m| m.algorithm.name()),
        "accuracy": meta.as_ref().map(|m| m.accuracy),
        "partition": meta.as_ref().map(|m| m.partition),
        "capacity": capacity,
        "keys_with_series": keys,
        "regions": regions,
        "samples": samples,
        "world_periods": world_periods.flatten(),
        "world_periods_how": HOW,
    }))
    .into_response()
}

/// Samples as parallel arrays aligned with the series' regions (`null`
/// where a region had no slot), which keeps a day of them compact.
fn render(series: &Series, since: i64, period_ms: Option<u64>) -> Vec<Value> {
    let per_period = period_ms.map(|p| series.use_per_period(p));
    series
        .samples
        .iter()
        .enumerate()
        .filter(|(_, s)| s.at_unix_ms > since)
        .map(|(i, s)| {
            let pick = |f: &dyn Fn(&crate::cockpit::history::Point) -> Value| -> Vec<Value> {
                s.points
                    .iter()
                    .map(|p| p.as_ref().map_or(Value::Null, f))
                    .collect()
            };
            let used = per_period.as_ref().and_then(|u| u[i].as_ref());
            json!({
                "epoch": s.epoch,
                "at_unix_ms": s.at_unix_ms,
                "limit": s.limit,
                "granted": pick(&|p| json!(p.granted)),
                "demand": pick(&|p| json!((p.demand * 10.0).round() / 10.0)),
                "admitted_in_period": used.map(|u| &u.allowed),
                "rejected_in_period": used.map(|u| &u.rejected),
            })
        })
        .collect()
}
