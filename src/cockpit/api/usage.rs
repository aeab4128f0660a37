//! `GET /api/v1/usage` and `GET /api/v1/usage/top`: how much of its limit
//! one key used, per region and world-wide, and the keys of each global
//! rule closest to or over their limit.
//!
//! - `/api/v1/usage?domain=D&descriptor=K=V;K2=V2` resolves the descriptor
//!   against the enforced rules as a check would (`?domain=D&rule=R&key=K`
//!   names the counter as a check by rule name does: `R` a rule id, or a
//!   `rate_limit.name` of `D`, and `K` the key as given). For every limit of
//!   the rule it matches: `L`, the override of the key if any, and for a
//!   `scope: global` limit, per region, what the leader's world ledger has
//!   of the key in the current clock-aligned period, the region's
//!   allocation for the key and how old the region's counts are; world-wide
//!   the sum and its ratio to the key's limit (the override's, else `L`).
//!   A `scope: region` limit is counted in each region's own Redis: the
//!   coordinator has no figure of it, and the answer says so.
//! - `/api/v1/usage/top[?rule=R][&n=N]`: per global rule (or `R`), the
//!   tracked keys with the highest admitted / limit over the open periods
//!   (the current one and the one that ended, until final) and the busiest
//!   key of the newest finished one; at most `N` (default 10, at most 100).
//!
//! Everything comes from what regions already report: the ledger tracks
//! the busiest keys only (each pod reports its 16 busiest keys per period,
//! the ledger keeps 64 per period), so a quiet key is "not tracked" — its
//! count is unknown, never shown as 0. The ledger is the leader's, so a
//! follower relays both routes to the leader (like `/api/v1/ledger`).
//! [`usage_json`] and [`top_json`] shape the answers from what the handlers
//! copy out of the leader (pure, unit tested in `usage_tests.rs`); the query
//! and what it names are `usage_query.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use self::query::unprocessable;
pub(super) use self::query::{Target, UsageQuery, target};
use super::errors::ApiError;
use super::read::{Read, relay_get};
use super::{Api, is_relayed};
use crate::allocation::ledger::{KeyCounts, KeyFigure, Ledger, RuleLedger};
use crate::allocation::reserved::ReservedBook;
use crate::allocation::{Allocations, Millis};
use crate::overrides::{Override, Overrides};
use crate::rules::{RuleSet, Scope};

#[path = "usage_query.rs"]
mod query;

/// How long a follower waits for the leader's answer.
const RELAY_DEADLINE: Duration = Duration::from_secs(2);

/// Keys per rule `/usage/top` lists when the query does not say.
const DEFAULT_TOP: usize = 10;
/// The most keys per rule `/usage/top` lists.
pub const MAX_TOP: usize = 100;

/// How every figure is measured, for the API and the docs.
pub const HOW: &str = "used: the key's hits admitted world-wide in the current clock-aligned \
     rule period (floor(t / period) × period), the sum of the latest count each pod reported to \
     the leader (pods report every report interval, so a figure is at most that old plus \
     delivery; `age_ms` says how old each region's is). For a sliding window or a bucket it is \
     the clock-aligned period, not a rolling window or the tokens left. Each pod reports its 16 \
     busiest keys per period and the leader tracks the 64 busiest: a key that is not among them \
     is `not tracked` (its count is unknown, not 0), and a pod that did not report the key counts \
     0 for it. An overridden key's counts are kept in its rule's units (× L / O) by the leader and \
     shown here in the key's own (× O / L, within rounding). allocation: what the region \
     enforces for the key (its own entry, else the rule's split; of the override O when one is \
     set: granted × O / L). ratio: world-wide used / the key's limit (the override's, else L). \
     scope: region rules are counted in each region's own Redis: the coordinator holds no figure \
     of them. reserved: the estimates of the key's reservations open now (reserved, not yet \
     committed, released or expired), as the region's pods last reported them; used counts them \
     at their estimate, so settled = used − reserved (an estimate charged in the period before \
     is in reserved but not in used: settled then reads low)";

// ---- shaping the answers (pure) ---------------------------------------------

/// One global limit's figures of the key, copied out of the leader's ledger.
#[derive(Debug, Clone, Default)]
pub(super) struct LimitFigures {
    /// The start of the period containing now.
    pub current_start: Millis,
    /// The key in that period; `None`: no pod reported the period yet.
    pub current: Option<KeyFigure>,
    /// The key in the period before, while it is open.
    pub previous: Option<KeyFigure>,
    /// Estimates of the key's reservations open now, per region, as its
    /// pods last reported them (`allocation::reserved`).
    pub reserved: BTreeMap<String, u64>,
}

/// The key's figures of every global limit of its rule in `ledger`.
/// Open reservations count from pods heard within `fresh_ms`.
pub(super) fn figures_of(
    ledger: &Ledger,
    reserved: &ReservedBook,
    t: &Target,
    now: Millis,
    fresh_ms: i64,
) -> BTreeMap<String, LimitFigures> {
    let mut figures = BTreeMap::new();
    for index in 0..=t.rule.also.len() {
        let id = t.rule.limit_id(index);
        if let Some(rule) = ledger.rule(&id) {
            let start = rule.period_start(now);
            let previous = start.saturating_sub(rule.terms().period_ms as Millis);
            figures.insert(
                id.to_string(),
                LimitFigures {
                    current_start: start,
                    current: rule.key_figure(&t.key, start),
                    previous: rule.key_figure(&t.key, previous),
                    reserved: reserved.regions(id.as_ref(), &t.key, now, fresh_ms),
                },
            );
        }
    }
    figures
}

/// What a usage answer is made of besides its target.
pub(super) struct Snapshot<'a> {
    /// The leader's clock.
    pub now: Millis,
    /// Registered regions.
    pub regions: Vec<String>,
    pub overrides: &'a Overrides,
    pub allocations: &'a Allocations,
    /// By limit id; a global limit missing here is not in the ledger (yet).
    pub figures: BTreeMap<String, LimitFigures>,
    /// The report interval limiters are given: how stale figures may be.
    pub report_interval_ms: u64,
    pub node_id: u64,
}

/// The key's override on `limit_id`, if one is held (live or not): the
/// leader reads that key's reports in its rule's units while it is held.
fn held_override<'a>(overrides: &'a Overrides, limit_id: &str, key: &str) -> Option<&'a Override> {
    overrides
        .by_id
        .get(&(limit_id.to_string(), key.to_string()))
}

/// Turns a count in the rule's units (the leader scales an overridden key
/// by L / O) back into the key's hits.
fn unscale(count: u64, limit: u64, o: Option<&Override>) -> u64 {
    match o {
        Some(o) => (count as f64 * o.limit.max(1) as f64 / limit.max(1) as f64).round() as u64,
        None => count,
    }
}

fn ratio(used: u64, limit: u64) -> f64 {
    if limit == 0 {
        0.0
    } else {
        used as f64 / limit as f64
    }
}

fn override_json(o: &Override, now: Millis) -> Value {
    json!({
        "limit": o.limit,
        "burst": o.burst,
        "expires_at_unix_ms": o.expires_at_unix_ms,
        "expired": !o.live_at(now),
        "reason": o.reason,
        "set_by": o.set_by,
        "set_at_unix_ms": o.set_at_unix_ms,
    })
}

/// What region `region` enforces for the key: (granted of `L`, in the
/// key's units, where it comes from).
fn allocation(
    allocations: &Allocations,
    limit_id: &str,
    key: &str,
    region: &str,
    limit: u64,
    live: Option<&Override>,
) -> (Option<u64>, Option<u64>, &'static str) {
    let Some(rule) = allocations.rules.get(limit_id) else {
        return (None, None, "none");
    };
    let (shares, source) = match rule.keys.get(key) {
        Some(entry) => (&entry.shares, "key_entry"),
        None => (&rule.split, "rule_split"),
    };
    let Some(slot) = shares.get(region) else {
        return (None, None, source);
    };
    let granted = slot.granted.min(limit);
    // As the limiter divides an override (`limiter::global::Global::limit`).
    let enforced = match live {
        Some(o) if granted < limit => {
            (u128::from(granted) * u128::from(o.limit) / u128::from(limit.max(1))) as u64
        }
        Some(o) => o.limit,
        None => granted,
    };
    (Some(granted), Some(enforced), source)
}

/// The answer of `GET /api/v1/usage` for `t`.
pub(super) fn usage_json(t: &Target, s: &Snapshot) -> Value {
    let rule = &t.rule;
    let limits: Vec<Value> = rule
        .limits()
        .enumerate()
        .map(|(index, params)| {
            let id = rule.limit_id(index).into_owned();
            let limit = params.limit();
            let held = held_override(s.overrides, &id, &t.key);
            let live = held.filter(|o| o.live_at(s.now));
            let key_limit = live.map_or(limit, |o| o.limit);
            let mut out = json!({
                "limit_id": id,
                "limit": limit,
                "period_ms": params.period().as_millis() as u64,
                "algorithm": params.algorithm().name(),
                "override": held.map(|o| override_json(o, s.now)),
                "key_limit": key_limit,
            });
            if rule.scope != Scope::Global {
                out["scope"] = json!("region");
                out["figures"] = Value::Null;
                out["note"] = json!(
                    "scope: region: each region counts this limit in its own Redis against the \
                     whole limit; the coordinator holds no figure of it"
                );
                return out;
            }
            out["scope"] = json!("global");
            global_limit(&mut out, t, s, &id, limit, held, live, key_limit);
            out
        })
        .collect();
    json!({
        "node_id": s.node_id,
        "at_unix_ms": s.now,
        "domain": t.domain,
        "descriptor": t.descriptor,
        "rule": rule.id,
        "key": t.key,
        "report_interval_ms": s.report_interval_ms,
        "how": HOW,
        "limits": limits,
    })
}

/// The figures of one global limit of the key, added to `out`.
#[expect(clippy::too_many_arguments, reason = "one limit's figures, each named")]
fn global_limit(
    out: &mut Value,
    t: &Target,
    s: &Snapshot,
    id: &str,
    limit: u64,
    held: Option<&Override>,
    live: Option<&Override>,
    key_limit: u64,
) {
    let figures = s.figures.get(id);
    let current = figures.and_then(|f| f.current.as_ref());
    let previous = figures.and_then(|f| f.previous.as_ref());
    let period_ms = current.map_or_else(|| out["period_ms"].as_u64().unwrap_or(0), |c| c.period_ms);
    let start = figures.map_or(0, |f| f.current_start);
    let tracked = current.is_some_and(|c| c.admitted.is_some());
    let status = match (figures, current) {
        (None, _) => "not_in_ledger",
        (Some(_), None) => "no_reports",
        (Some(_), Some(_)) if tracked => "tracked",
        _ => "not_tracked",
    };
    // Every region registered, allocated or counted.
    let mut names: BTreeSet<String> = s.regions.iter().cloned().collect();
    if let Some(a) = s.allocations.rules.get(id) {
        names.extend(a.split.keys().cloned());
    }
    for f in current.iter().chain(previous.iter()) {
        names.extend(f.regions.iter().map(|r| r.region.to_string()));
    }
    let mut world_allocation: Option<u64> = None;
    let open = |region: &str| {
        figures
            .and_then(|f| f.reserved.get(region))
            .copied()
            .unwrap_or(0)
    };
    let world_reserved: u64 = names.iter().map(|n| open(n)).sum();
    let regions: Vec<Value> = names
        .iter()
        .map(|name| {
            let (granted, allocated, source) =
                allocation(s.allocations, id, &t.key, name, limit, live);
            if let Some(a) = allocated {
                world_allocation = Some(world_allocation.unwrap_or(0).saturating_add(a));
            }
            let here = current.and_then(|c| c.regions.iter().find(|r| &*r.region == name));
            let before = previous.and_then(|p| p.regions.iter().find(|r| &*r.region == name));
            // What is known of the key in this region: counted by every
            // pod that reported the period, by some (the others did not
            // report it: no hits, or not among their busiest), by none, or
            // nothing (the key is not tracked; the region did not report).
            let figure = match here {
                None => "no_reports",
                Some(r) if r.admitted.is_none() => "not_tracked",
                Some(r) if r.pods_with_key == 0 => "not_reported",
                Some(r) if r.pods_with_key < r.pods => "partial",
                Some(_) => "counted",
            };
            let used = here
                .filter(|r| r.pods_with_key > 0)
                .and_then(|r| r.admitted)
                .map(|n| unscale(n, limit, held));
            let heard = here.or(before);
            let reserved = open(name);
            json!({
                "region": name,
                "used": used,
                "reserved": reserved,
                "settled": used.map(|u| u.saturating_sub(reserved)),
                "figure": figure,
                "pods": here.map(|r| r.pods),
                "pods_with_key": here.map(|r| r.pods_with_key),
                "allocation": allocated,
                "granted_of_limit": granted,
                "allocation_source": source,
                "last_report_unix_ms": heard.map(|r| r.newest_report_ms),
                "age_ms": heard.map(|r| s.now.saturating_sub(r.newest_report_ms).max(0)),
                "oldest_pod_age_ms": heard.map(|r| s.now.saturating_sub(r.oldest_report_ms).max(0)),
            })
        })
        .collect();
    let world_used = current
        .and_then(|c| c.admitted)
        .map(|n| unscale(n, limit, held));
    let previous_json = previous.map(|p| {
        let used = p.admitted.map(|n| unscale(n, limit, held));
        json!({
            "start_unix_ms": p.start_ms,
            "used": used,
            "ratio": used.map(|u| ratio(u, key_limit)),
        })
    });
    out["status"] = json!(status);
    out["period"] = json!({
        "start_unix_ms": start,
        "end_unix_ms": start.saturating_add(period_ms as Millis),
    });
    out["regions"] = json!(regions);
    out["world"] = json!({
        "used": world_used,
        "reserved": world_reserved,
        "settled": world_used.map(|u| u.saturating_sub(world_reserved)),
        "key_limit": key_limit,
        "ratio": world_used.map(|u| ratio(u, key_limit)),
        "allocation": world_allocation,
        "over": world_used.is_some_and(|u| u > key_limit),
    });
    out["previous_period"] = previous_json.unwrap_or(Value::Null);
}

/// One global rule's ledger as `/usage/top` needs it, copied out.
#[derive(Debug, Clone, Default)]
pub(super) struct TopRule {
    pub id: String,
    pub limit: u64,
    pub period_ms: u64,
    pub current_start: Millis,
    /// Open periods that began (start, tracked keys with counts).
    pub tracked: Vec<(Millis, KeyCounts)>,
    /// The newest finished period's busiest key: (start, key, count).
    pub busiest_finished: Option<(Millis, Arc<str>, u64)>,
}

impl TopRule {
    pub(super) fn of(id: &str, rule: &RuleLedger, now: Millis) -> TopRule {
        let terms = rule.terms();
        TopRule {
            id: id.to_string(),
            limit: terms.limit,
            period_ms: terms.period_ms,
            current_start: rule.period_start(now),
            tracked: rule.tracked_keys(now),
            busiest_finished: rule
                .finished()
                .back()
                .and_then(|f| Some((f.start_ms, Arc::clone(f.key.as_ref()?), f.admitted))),
        }
    }
}

/// The answer of `GET /api/v1/usage/top`: per rule, at most `n` keys by
/// their highest used / limit over the periods listed.
pub(super) fn top_json(rules: &[TopRule], overrides: &Overrides, n: usize, now: Millis) -> Value {
    let mut out = serde_json::Map::new();
    for r in rules {
        // key → its periods (start, count in the rule's units).
        let mut keys: BTreeMap<Arc<str>, Vec<(Millis, u64)>> = BTreeMap::new();
        for (start, tracked) in &r.tracked {
            for (key, count) in tracked {
                keys.entry(Arc::clone(key))
                    .or_default()
                    .push((*start, *count));
            }
        }
        if let Some((start, key, count)) = &r.busiest_finished
            && !r.tracked.iter().any(|(s, _)| s == start)
        {
            keys.entry(Arc::clone(key))
                .or_default()
                .push((*start, *count));
        }
        let mut ranked: Vec<(f64, u64, Value)> = keys
            .iter()
            .map(|(key, periods)| {
                let held = held_override(overrides, &r.id, key);
                let live = held.filter(|o| o.live_at(now));
                let key_limit = live.map_or(r.limit, |o| o.limit);
                let mut periods: Vec<(Millis, u64)> = periods
                    .iter()
                    .map(|(start, count)| (*start, unscale(*count, r.limit, held)))
                    .collect();
                periods.sort_by_key(|(start, _)| std::cmp::Reverse(*start));
                let (worst_start, worst) = periods
                    .iter()
                    .copied()
                    .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
                    .unwrap_or((0, 0));
                let current = periods
                    .iter()
                    .find(|(start, _)| *start == r.current_start)
                    .map(|(_, used)| *used);
                let top = ratio(worst, key_limit);
                let shown = json!({
                    "key": &**key,
                    "used": worst,
                    "ratio": top,
                    "over": worst > key_limit,
                    "worst_period_start_unix_ms": worst_start,
                    "current_used": current,
                    "key_limit": key_limit,
                    "override": held.map(|o| override_json(o, now)),
                    "periods": periods.iter().map(|(start, used)| json!({
                        "start_unix_ms": start,
                        "used": used,
                        "ratio": ratio(*used, key_limit),
                        "current": *start == r.current_start,
                    })).collect::<Vec<_>>(),
                });
                (top, worst, shown)
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(b.1.cmp(&a.1))
                .then_with(|| a.2["key"].as_str().cmp(&b.2["key"].as_str()))
        });
        let candidates = ranked.len();
        let listed: Vec<Value> = ranked.into_iter().take(n).map(|(_, _, v)| v).collect();
        out.insert(
            r.id.clone(),
            json!({
                "limit": r.limit,
                "period_ms": r.period_ms,
                "current_start_unix_ms": r.current_start,
                "periods": r.tracked.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                "candidates": candidates,
                "keys": listed,
            }),
        );
    }
    Value::Object(out)
}

// ---- the handlers ------------------------------------------------------------

/// `None` when this node leads (it answers); else the leader's answer
/// relayed, or a 503 saying why there is none.
async fn unless_leader(api: &Api, uri: &Uri, headers: &HeaderMap) -> Option<Response> {
    if api.allocator.is_leader() {
        return None;
    }
    let why = if is_relayed(headers) {
        "relayed to a node that no longer leads".to_string()
    } else {
        match api.node.leader() {
            Some((_, leader)) => match relay_get(api, &leader, uri, Some(RELAY_DEADLINE)).await {
                Ok(answer) => return Some(answer),
                Err(e) => format!("leader unreachable: {e}"),
            },
            None => "no leader known".to_string(),
        }
    };
    Some(
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("usage comes from the world ledger, kept by the leader: {why}; retry"),
        )
        .into_response(),
    )
}

fn stopped_leading() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "this node stopped leading while answering; retry",
    )
    .into_response()
}

fn enforced(read: &Read) -> Result<RuleSet, ApiError> {
    match read.state.registry.enforced_rule_set() {
        Some(Ok(set)) => Ok(set),
        Some(Err(e)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the enforced rule set does not parse in this build: {e}"),
        )),
        None => Err(unprocessable("domain", "no rule set is enforced yet")),
    }
}

/// `GET /api/v1/usage?domain=&descriptor=` or `?rule=&key=[&domain=]`.
pub(super) async fn get_usage(
    State(api): State<Api>,
    query: UsageQuery,
    read: Read,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    // Resolved here (the rules are replicated): a bad query is refused
    // without a trip to the leader.
    let target = match enforced(&read).and_then(|rules| target(&rules, &query)) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    if let Some(answer) = unless_leader(&api, &uri, &headers).await {
        return answer;
    }
    // Three report intervals: a pod that stopped reporting (killed,
    // scaled down) no longer counts.
    let fresh_ms = 3 * api.allocator.report_cadence().0 as i64;
    let copied = api.allocator.with_usage(|ledger, reserved, now| {
        let figures = figures_of(ledger, reserved, &target, now, fresh_ms);
        (figures, now)
    });
    let Some((figures, now)) = copied else {
        return stopped_leading();
    };
    let registry = &read.state.registry;
    let snapshot = Snapshot {
        now,
        regions: registry.regions.keys().cloned().collect(),
        overrides: &registry.overrides,
        allocations: &registry.allocations,
        figures,
        report_interval_ms: api.allocator.report_cadence().0,
        node_id: api.node.id,
    };
    Json(usage_json(&target, &snapshot)).into_response()
}

/// The query of `GET /api/v1/usage/top`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TopQuery {
    rule: Option<String>,
    n: Option<usize>,
    #[expect(dead_code, reason = "read by the Read extractor, not from here")]
    consistent: Option<bool>,
}

impl FromRequestParts<Api> for TopQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        match Query::<TopQuery>::from_request_parts(parts, api).await {
            Ok(Query(query)) => Ok(query),
            Err(e) => Err(
                ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}"))
                    .with("allowed", json!(["rule", "n", "consistent"])),
            ),
        }
    }
}

/// `GET /api/v1/usage/top[?rule=R][&n=N]`.
pub(super) async fn get_top(
    State(api): State<Api>,
    query: TopQuery,
    read: Read,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let n = query.n.unwrap_or(DEFAULT_TOP);
    if n == 0 || n > MAX_TOP {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("n {n}: list 1 to {MAX_TOP} keys per rule"),
        )
        .with("field", json!("n"))
        .into_response();
    }
    if let Some(answer) = unless_leader(&api, &uri, &headers).await {
        return answer;
    }
    let copied = api.allocator.with_ledger(|ledger, now| {
        let rules: Vec<TopRule> = ledger
            .rules()
            .filter(|(id, _)| query.rule.as_ref().is_none_or(|r| r == *id))
            .map(|(id, rule)| TopRule::of(id, rule, now))
            .collect();
        (rules, now)
    });
    let Some((rules, now)) = copied else {
        return stopped_leading();
    };
    if let Some(rule) = &query.rule
        && rules.is_empty()
    {
        let known: Vec<&String> = read.state.registry.allocations.rules.keys().collect();
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("rule {rule:?} is not a global rule of the enforced rule set"),
        )
        .with("field", json!("rule"))
        .with("global_rules", json!(known))
        .into_response();
    }
    Json(json!({
        "node_id": api.node.id,
        "at_unix_ms": now,
        "n": n,
        "report_interval_ms": api.allocator.report_cadence().0,
        "how": HOW,
        "rules": top_json(&rules, &read.state.registry.overrides, n, now),
    }))
    .into_response()
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
