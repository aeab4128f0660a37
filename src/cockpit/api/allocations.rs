//! `/api/v1/allocations` and `/api/v1/leases`: how the allocator split each
//! global limit between regions, and the leases that bound how long a region
//! may enforce its share without hearing from the coordinator.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Api;
use super::errors::ApiError;
use super::read::Read;
use crate::allocation::Shares;
use crate::clock::now_unix_ms;

/// The query of `GET /api/v1/allocations`, an extractor of its own so that a
/// malformed query is answered before [`Read`] relays anything.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AllocationQuery {
    rule: Option<String>,
    key: Option<String>,
    /// Epochs of history to include (default 20, at most what is kept).
    history: Option<usize>,
    /// Listed so that `deny_unknown_fields` accepts it; [`Read`] reads it
    /// from the raw query.
    #[expect(dead_code, reason = "read by the Read extractor, not from here")]
    consistent: Option<bool>,
}

impl FromRequestParts<Api> for AllocationQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        match Query::<AllocationQuery>::from_request_parts(parts, api).await {
            Ok(Query(query)) => Ok(query),
            Err(e) => Err(
                ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}"))
                    .with("allowed", json!(["rule", "key", "history", "consistent"])),
            ),
        }
    }
}

fn shares_json(shares: &Shares) -> Value {
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
/// rule's split with the hits its regions reported to this node while it
/// led (`hits`: asked and allowed per region); one rule with its key entries; or one key's allocation per
/// region with demand, leases and the epochs that changed it.
pub(super) async fn get_allocations(
    State(api): State<Api>,
    query: AllocationQuery,
    read: Read,
) -> Response {
    let state = &read.state.registry.allocations;
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
        "consistency": read.consistency,
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
                        "hits": api.allocator.hits(id),
                    }),
                )
            })
            .collect();
        let mut body = head;
        body["rules"] = json!(rules);
        // Hits are counted by the leader as reports arrive: a follower's
        // are empty or stale, `?consistent=true` reads the leader's.
        body["hits_counted_here"] = json!(api.allocator.is_leader());
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
                .filter(|c| c.rule == rule_id && c.key == served_by)
                .map(|c| json!({ "region": c.region, "granted": c.granted }))
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
pub(super) async fn get_leases(State(api): State<Api>, read: Read) -> Response {
    let state = &read.state.registry.allocations;
    let now = now_unix_ms();
    let pods = api.allocator.pods();
    let regions: Vec<Value> = read
        .state
        .registry
        .regions
        .values()
        .map(|r| {
            let lease = state.regions.get(&r.name).copied().unwrap_or_default();
            let region_pods: Vec<Value> = pods
                .iter()
                .filter(|p| p.region == r.name)
                .map(|p| json!({ "pod": p.pod, "epoch": p.epoch, "last_heard_unix_ms": p.last_heard_ms }))
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
    // Pods reporting less often than the coordinators ask (see /readyz).
    let (expected_ms, slow) = api.allocator.report_cadence();
    let mismatched: Vec<Value> = slow
        .iter()
        .map(|p| json!({ "region": p.region, "pod": p.pod, "interval_ms": p.interval_ms }))
        .collect();
    Json(json!({
        "consistency": read.consistency,
        "epoch": state.epoch,
        "regions": regions,
        "pods_known_here": !pods.is_empty(),
        "report_interval": { "expected_ms": expected_ms, "mismatched_pods": mismatched },
    }))
    .into_response()
}
