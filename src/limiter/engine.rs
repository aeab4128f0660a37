//! The regional hot path, top to bottom in [`Engine::check`]:
//! unlimited? → local over-limit cache → hot-key split (`split: K`, pick a
//! sub-counter) → approximate path (in process, `batcher`) or circuit breaker
//! → store (with its deadline) → fail mode on store failure → shadow mode →
//! verdict.
//!
//! Matching a request to rules happens before (in the API layers, through
//! `RuleSet::resolve`); the engine decides one (rule, counter key, cost).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram, counter, gauge, histogram};

#[cfg(feature = "redis")]
use super::batcher::{self, Batcher, Batching};
use super::breaker::Breaker;
use super::cache::OverLimitCache;
use super::split::SubCounters;
use super::value_metrics::{Outcome, ValueMetrics};
use crate::algorithm::{Decision, DenyReason, InvalidInput, Params};
#[cfg(feature = "redis")]
use crate::rules::Accuracy;
use crate::rules::{FailMode, Rule};
#[cfg(feature = "redis")]
use crate::store::RedisStore;
use crate::store::{AnyStore, Limit, MemoryStore, Store, StoreError};

/// How a verdict was reached; reported to clients and counted in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Decided by the store (Redis, or the embedded store): the normal path.
    Store,
    /// Denied from the local over-limit cache, without a store call.
    Cache,
    /// The rule is `unlimited`.
    Unlimited,
    /// Store failed (or breaker open): allowed by `fail_mode: open`.
    FailOpen,
    /// Store failed: denied by `fail_mode: closed`.
    FailClosed,
    /// Store failed: decided in memory at limit ÷ pods by `fail_mode: local`.
    FailLocal,
    /// A global rule whose allocation in this region is 0 (or not received
    /// yet): denied without a store call.
    NoAllocation,
    /// `requests_per_unit: 0`: every request denied, without a store call.
    ZeroLimit,
}

/// The engine's answer for one check.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// What the caller is told (a shadow rule's denial is already turned into an allow).
    pub decision: Decision,
    /// Which path decided, so a client or a metric can tell a store's answer from
    /// a cached or fail-mode one.
    pub source: Source,
    /// The rule is in shadow mode and would have denied.
    pub shadow_denied: bool,
    /// Which of a `limits:` rule's limits the decision is (0 = the first,
    /// and for every single-limit rule): its unit is `Rule::unit_of`.
    pub limit_index: usize,
}

impl Verdict {
    /// A short machine-readable reason: `over_limit`, `cost_exceeds_capacity`,
    /// `cached_over_limit`, `fail_open`, `fail_closed`, `fail_local`, or empty.
    pub fn reason(&self) -> &'static str {
        match self.source {
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
            Source::FailLocal => "fail_local",
            Source::Cache => "cached_over_limit",
            Source::NoAllocation => "no_allocation",
            Source::ZeroLimit => "over_limit",
            Source::Store | Source::Unlimited => match self.decision.reason {
                Some(DenyReason::OverLimit) => "over_limit",
                Some(DenyReason::CostExceedsCapacity { .. }) => "cost_exceeds_capacity",
                Some(DenyReason::StoreFull) => "store_full",
                None if self.shadow_denied => "over_limit",
                None => "",
            },
        }
    }
}

/// Engine settings; defaults in [`EngineConfig::default`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Limiter pods in this region: `fail_mode: local` enforces limit ÷ pods.
    pub pods_in_region: u64,
    /// Entries the over-limit cache holds at most.
    pub cache_capacity: usize,
    /// Keys the `fail_mode: local` store holds at most (see `MemoryStore`).
    pub local_capacity: usize,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_threshold: u32,
    /// How long an open breaker waits before letting a probe through.
    pub breaker_cool_down: Duration,
    /// Checks at the store at most; more wait here, before their deadline
    /// starts. Without a cap a burst (say, batches of 100 from several clients)
    /// queues hundreds of scripts on one connection, they all miss the deadline
    /// together, and the breaker sends every rule to its fail mode. Checks
    /// arriving together share script calls (up to 64 a call). 512 gave no
    /// consistent CPU gain for batches of 100 from 4 clients, and on a loaded
    /// 2-core box 1 % of those checks then waited past the 20 ms deadline.
    pub max_in_flight: usize,
    /// Counters the approximate path tracks in memory at most, one per (key,
    /// window) decided recently; checks of further keys take the exact path
    /// (see `limiter::batcher`: at most this many × (3 × 3,078 + 464) bytes,
    /// about 60 MB for 100,000 keys of 40 bytes).
    pub approximate_max_keys: usize,
    /// (rule, descriptor value) series of per-value metrics at most; see
    /// `limiter::value_metrics`.
    pub max_value_metrics: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            pods_in_region: 1,
            cache_capacity: 100_000,
            local_capacity: 100_000,
            breaker_threshold: 5,
            breaker_cool_down: Duration::from_secs(1),
            max_in_flight: 128,
            approximate_max_keys: 100_000,
            max_value_metrics: 1_000,
        }
    }
}

/// The hot path of one limiter process (see the module doc): the store and
/// everything in front of it — the over-limit cache, the breaker, the in-flight
/// cap, the fail-mode store — shared by every worker thread behind an `Arc`.
/// The rules live apart, in `RuleSource`; the engine holds none.
pub struct Engine {
    /// Where counters live: Redis for a region, or the embedded store.
    store: AnyStore,
    /// The approximate path's batcher, started by the first approximate check
    /// (its flusher needs a runtime; `Engine::new` may run outside one). Only
    /// with Redis: on the embedded store every check is already in process.
    #[cfg(feature = "redis")]
    batcher: OnceLock<Batcher>,
    /// `EngineConfig::approximate_max_keys`, for the batcher when it starts.
    #[cfg(feature = "redis")]
    approximate_max_keys: usize,
    /// Per-value series of rules with `detailed_metric` / `value_to_metric`,
    /// capped (`EngineConfig::max_value_metrics`).
    values: ValueMetrics,
    /// Backs `fail_mode: local`; also counts nothing else.
    local: MemoryStore,
    /// Denials remembered until their retry-after, answered without a store
    /// call. Bounded: `cache_capacity` entries of rule + key (≤ 1,024 bytes,
    /// checked before a check gets here) + the limit it was denied under.
    cache: OverLimitCache,
    /// Sends checks to the fail mode while the store is failing.
    breaker: Breaker,
    /// `EngineConfig::max_in_flight` permits: tokio's semaphore, as a check
    /// waits for a permit across `.await` before its deadline starts.
    in_flight: tokio::sync::Semaphore,
    /// Divides a rule's limit for `fail_mode: local` (at least 1).
    pods_in_region: u64,
    /// Each rule's per-check metric handles, by rule id: looking a labelled
    /// metric up through the macros costs label allocations and a registry
    /// search on every check; a handle is one atomic add.
    /// Handles are registered on first use, not here: the metrics recorder
    /// may be installed after the engine is built.
    rule_metrics: RwLock<HashMap<String, Arc<RuleMetrics>, foldhash::fast::RandomState>>,
    /// The store-call latency histogram, registered on first use for the same
    /// reason as `rule_metrics`.
    store_duration: OnceLock<Histogram>,
}

/// The series of `meridian_checks_total` per rule: (outcome, reason), the
/// reason as [`Verdict::reason`] gives it (`ok` for a plain allow). Every
/// series is registered, at 0, with the rule's first check, so an alert on a
/// fail mode or a panel of denials by reason finds its series before the
/// first such decision (15 series per rule and pod; rules are the operator's,
/// never a client's).
const CHECK_SERIES: [(&str, &str); 15] = [
    ("allowed", "ok"),
    ("allowed", "fail_open"),
    ("allowed", "fail_local"),
    ("denied", "over_limit"),
    ("denied", "cost_exceeds_capacity"),
    ("denied", "cached_over_limit"),
    ("denied", "fail_closed"),
    ("denied", "fail_local"),
    ("denied", "no_allocation"),
    ("denied", "store_full"),
    ("shadow_denied", "over_limit"),
    ("shadow_denied", "cached_over_limit"),
    ("shadow_denied", "fail_closed"),
    ("shadow_denied", "fail_local"),
    ("shadow_denied", "no_allocation"),
];

/// The kinds of store failure [`error_kind`] names (bad input is the
/// caller's error, not the store's, and sends nothing to the fail mode).
const STORE_ERROR_KINDS: [&str; 4] = ["timeout", "connection", "server", "reply"];

/// An allowed check is near its limit when it leaves less than this share
/// of the limit (Envoy's ratelimit service counts the same at 80 % used).
const NEAR_LIMIT_REMAINING: f64 = 0.2;

/// The metrics every check of one rule records.
struct RuleMetrics {
    /// `meridian_checks_total{outcome, reason}`, in [`CHECK_SERIES`] order.
    checks: [Counter; CHECK_SERIES.len()],
    /// Allowed checks that left less than [`NEAR_LIMIT_REMAINING`] of the limit.
    near_limit: Counter,
    /// `meridian_store_errors_total{kind}`, in [`STORE_ERROR_KINDS`] order:
    /// registered at 0 like `checks`, so a panel of store errors has series
    /// before the first error.
    store_errors: [Counter; STORE_ERROR_KINDS.len()],
    duration: Histogram,
}

impl RuleMetrics {
    fn new(rule: &str) -> RuleMetrics {
        RuleMetrics {
            checks: CHECK_SERIES.map(|(outcome, reason)| {
                counter!("meridian_checks_total", "rule" => rule.to_owned(), "outcome" => outcome, "reason" => reason)
            }),
            near_limit: counter!("meridian_checks_near_limit_total", "rule" => rule.to_owned()),
            store_errors: STORE_ERROR_KINDS.map(|kind| {
                counter!("meridian_store_errors_total", "rule" => rule.to_owned(), "kind" => kind)
            }),
            duration: histogram!("meridian_check_duration_seconds", "rule" => rule.to_owned()),
        }
    }

    /// The counter a verdict is counted under.
    fn checks(&self, verdict: &Verdict) -> &Counter {
        let outcome = match (verdict.decision.allowed, verdict.shadow_denied) {
            (_, true) => "shadow_denied",
            (true, false) => "allowed",
            (false, false) => "denied",
        };
        let reason = match verdict.reason() {
            "" => "ok",
            reason => reason,
        };
        let at = CHECK_SERIES
            .iter()
            .position(|&(o, r)| o == outcome && r == reason)
            .unwrap_or(0);
        &self.checks[at]
    }
}

/// One check for the engine: a matched rule, the counter within it, and the
/// hits to consume (0 = check only). `limit` overrides the rule's requests per
/// unit (Envoy's per-descriptor `limit`).
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub rule: &'a Rule,
    pub counter_key: &'a str,
    pub cost: u64,
    pub limit: Option<&'a Params>,
    /// The per-value metric name (`Resolved::metric_key`), for rules that
    /// count values.
    pub metric_key: Option<&'a str>,
}

impl Engine {
    pub fn new(store: AnyStore, config: &EngineConfig) -> Engine {
        Engine {
            store,
            #[cfg(feature = "redis")]
            batcher: OnceLock::new(),
            #[cfg(feature = "redis")]
            approximate_max_keys: config.approximate_max_keys,
            values: ValueMetrics::new(config.max_value_metrics),
            local: MemoryStore::with_capacity(config.local_capacity),
            cache: OverLimitCache::new(config.cache_capacity),
            breaker: Breaker::new(config.breaker_threshold, config.breaker_cool_down),
            in_flight: tokio::sync::Semaphore::new(config.max_in_flight.max(1)),
            pods_in_region: config.pods_in_region.max(1),
            rule_metrics: RwLock::default(),
            store_duration: OnceLock::new(),
        }
    }

    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// Gives the calling thread its own Redis connection, on the calling
    /// runtime (see `store::redis::lanes`); nothing to do for the memory store.
    #[cfg(feature = "redis")]
    pub async fn open_lane(&self, index: usize) -> Result<(), StoreError> {
        match &self.store {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(redis) => redis.open_lane(index).await,
        }
    }

    /// Publishes the engine's state gauges (called when /metrics is scraped).
    pub fn report_gauges(&self) {
        gauge!("meridian_store_breaker_open").set(if self.breaker.is_open() { 1.0 } else { 0.0 });
        gauge!("meridian_over_limit_cache_entries").set(self.cache.len() as f64);
    }

    /// Rules changed: cached denials may no longer hold.
    pub fn rules_changed(&self) {
        self.cache.clear();
    }

    pub async fn check(&self, check: Check<'_>) -> Result<Verdict, InvalidInput> {
        let started = Instant::now();
        let rule = check.rule;
        if rule.denies_all() && check.limit.is_none() {
            let verdict = self.denial_to_window_end(rule, Source::ZeroLimit);
            self.record(rule, &verdict, check.metric_key, Duration::ZERO);
            return Ok(verdict);
        }
        let Some(params) = check.limit.or(rule.params.as_ref()) else {
            return Ok(Verdict {
                decision: unlimited(),
                source: Source::Unlimited,
                shadow_denied: false,
                limit_index: 0,
            });
        };
        if !rule.also.is_empty() && check.limit.is_none() {
            let limits = rule.limits().collect::<Vec<_>>();
            return Ok(self.check_limits(check, &limits).await?.0);
        }
        let limit = Limit {
            rule: rule.id.clone(),
            params: params.clone(),
        };
        let cache_key = cache_key(rule, check.counter_key, check.limit);

        let (decision, source) = if let Some(until) = self.cache.denied_until(&cache_key, started) {
            (cached_denial(params, until - started), Source::Cache)
        } else {
            match self
                .decide(rule, &limit, check.counter_key, check.cost)
                .await
            {
                Ok(decision) => {
                    // A split key's denial only says two sub-counters are full.
                    if !decision.allowed
                        && check.cost == 1
                        && decision.retry_after_us > 0
                        && rule.split <= 1
                    {
                        let until = started + decision.retry_after();
                        self.cache.deny_until(&cache_key, until, started);
                    }
                    (decision, Source::Store)
                }
                Err(StoreError::InvalidInput(e)) => return Err(e),
                Err(e) => {
                    let kind = error_kind(&e);
                    let metrics = self.rule_metrics(&rule.id);
                    match STORE_ERROR_KINDS.iter().position(|k| *k == kind) {
                        Some(at) => metrics.store_errors[at].increment(1),
                        None => counter!("meridian_store_errors_total", "rule" => rule.id.clone(), "kind" => kind)
                            .increment(1),
                    }
                    tracing::debug!(rule = %rule.id, error = %e, "store failed; using the fail mode");
                    self.fail_mode(rule, &limit, check.counter_key, check.cost)?
                }
            }
        };

        let verdict = shadow(rule, decision, source);
        self.record(rule, &verdict, check.metric_key, started.elapsed());
        Ok(verdict)
    }

    /// A rule with `limits:`, checked against `limits` (the rule's own, or
    /// this region's allocation of each): every limit in one store call,
    /// admitted only when all admit (a denial charges none); the verdict is
    /// the tightest limit's (the longest retry among denials, else the least
    /// remaining), with `limit_index` saying which. Also answers each
    /// limit's decision, in order, when the store gave one per limit (a
    /// denial before any counter was read gives one only). No over-limit
    /// cache and no split: the parser allows neither beside `limits:`. On a
    /// store failure the fail mode decides: `local` over all limits, each ÷
    /// pods.
    pub async fn check_limits(
        &self,
        check: Check<'_>,
        limits: &[&Params],
    ) -> Result<(Verdict, Vec<Decision>), InvalidInput> {
        let started = Instant::now();
        let rule = check.rule;
        let Some(first) = limits.first().copied() else {
            return Ok((
                Verdict {
                    decision: unlimited(),
                    source: Source::Unlimited,
                    shadow_denied: false,
                    limit_index: 0,
                },
                Vec::new(),
            ));
        };
        let (key, cost) = (check.counter_key, check.cost);
        let limits: Vec<Limit> = limits
            .iter()
            .map(|p| Limit {
                rule: rule.id.clone(),
                params: Params::clone(p),
            })
            .collect();
        let stored = async {
            // The approximate path when every limit's algorithm has one; a
            // key it cannot track (the map is full) takes the exact path.
            #[cfg(feature = "redis")]
            if let AnyStore::Redis(redis) = &self.store
                && let Some(batchings) = limits
                    .iter()
                    .map(|l| approximate(rule, &l.params))
                    .collect::<Option<Vec<_>>>()
                && let Some(decisions) = self
                    .batcher(redis)
                    .check_all(&limits, key, cost, &batchings)
                    .await?
            {
                return Ok(decisions);
            }
            let _permit = self.in_flight.acquire().await.ok();
            let now = Instant::now();
            if !self.breaker.allow(now) {
                return Err(StoreError::Timeout(Duration::ZERO));
            }
            let result = self.store.check_all(&limits, key, cost, None).await;
            self.store_duration
                .get_or_init(|| histogram!("meridian_store_duration_seconds"))
                .record(now.elapsed().as_secs_f64());
            match &result {
                Ok(_) => self.breaker.succeeded(),
                Err(StoreError::InvalidInput(_)) => {}
                Err(_) => self.breaker.failed(Instant::now()),
            }
            result
        };
        let (decisions, source) = match stored.await {
            Ok(decisions) => (decisions, Source::Store),
            Err(StoreError::InvalidInput(e)) => return Err(e),
            Err(e) => {
                counter!("meridian_store_errors_total", "rule" => rule.id.clone(), "kind" => error_kind(&e))
                    .increment(1);
                match rule.fail_mode {
                    FailMode::Open => (vec![fail_decision(first, true)], Source::FailOpen),
                    FailMode::Closed => (vec![fail_decision(first, false)], Source::FailClosed),
                    FailMode::Local => {
                        let local = limits
                            .iter()
                            .map(|l| {
                                Ok(Limit {
                                    rule: l.rule.clone(),
                                    params: per_pod(&l.params, self.pods_in_region)?,
                                })
                            })
                            .collect::<Result<Vec<_>, InvalidInput>>()?;
                        let now = crate::clock::now_unix_us();
                        (
                            self.local.check_all_at(&local, key, cost, now)?,
                            Source::FailLocal,
                        )
                    }
                }
            }
        };
        let (index, decision) = tightest(&decisions);
        let mut verdict = shadow(rule, decision, source);
        verdict.limit_index = index;
        self.record(rule, &verdict, check.metric_key, started.elapsed());
        Ok((verdict, decisions))
    }

    /// Counts a verdict and its latency under its rule (and its value, for
    /// rules that count values).
    fn record(&self, rule: &Rule, verdict: &Verdict, value: Option<&str>, took: Duration) {
        let metrics = self.rule_metrics(&rule.id);
        metrics.checks(verdict).increment(1);
        if let Some(value) = value {
            let outcome = match (verdict.decision.allowed, verdict.shadow_denied) {
                (_, true) => Outcome::ShadowDenied,
                (true, false) => Outcome::Allowed,
                (false, false) => Outcome::Denied,
            };
            self.values.record(&rule.id, value, outcome);
        }
        let decision = &verdict.decision;
        if decision.allowed
            && !verdict.shadow_denied
            && verdict.source == Source::Store
            && (decision.remaining as f64) < decision.limit as f64 * NEAR_LIMIT_REMAINING
        {
            metrics.near_limit.increment(1);
        }
        metrics.duration.record(took.as_secs_f64());
    }

    /// The rule's metric handles, registered on its first check. Rule ids
    /// come from rule files, so the map holds one entry per rule ever loaded.
    fn rule_metrics(&self, rule: &str) -> Arc<RuleMetrics> {
        // A poisoned lock only means another check panicked mid-insert; the
        // map itself is still whole.
        let known = self
            .rule_metrics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(rule)
            .cloned();
        known.unwrap_or_else(|| {
            self.rule_metrics
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .entry(rule.to_owned())
                .or_insert_with(|| Arc::new(RuleMetrics::new(rule)))
                .clone()
        })
    }

    /// A key's decision: from one counter, or (`split: K`) from a random
    /// sub-counter and, when that one denies, one other (see `split`).
    async fn decide(
        &self,
        rule: &Rule,
        limit: &Limit,
        key: &str,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        if rule.split <= 1 {
            return self.decide_counter(rule, limit, key, cost).await;
        }
        let subs = SubCounters::new(limit, key, rule.split);
        let (first, second) = subs.pick_two(&mut rand::rng());
        let (sub_limit, sub_key) = subs.get(first)?;
        let decision = self
            .decide_counter(rule, &sub_limit, &sub_key, cost)
            .await?;
        if decision.allowed || subs.count() == 1 {
            split_selected(
                rule,
                if decision.allowed {
                    "first_ok"
                } else {
                    "denied"
                },
            );
            return Ok(subs.whole(decision));
        }
        let (sub_limit, sub_key) = subs.get(second)?;
        let decision = self
            .decide_counter(rule, &sub_limit, &sub_key, cost)
            .await?;
        split_selected(
            rule,
            if decision.allowed {
                "second_ok"
            } else {
                "denied"
            },
        );
        Ok(subs.whole(decision))
    }

    /// One counter: in process on the approximate path (unless it tracks as
    /// many keys as it may already), else the store.
    async fn decide_counter(
        &self,
        #[cfg_attr(not(feature = "redis"), expect(unused_variables))] rule: &Rule,
        limit: &Limit,
        key: &str,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        // The batcher answers None when it tracks as many keys as it may
        // (`EngineConfig::approximate_max_keys`): this key takes the exact path.
        #[cfg(feature = "redis")]
        if let (Some(batching), AnyStore::Redis(redis)) =
            (approximate(rule, &limit.params), &self.store)
            && let Some(decision) = self
                .batcher(redis)
                .check(limit, key, cost, batching)
                .await?
        {
            return Ok(decision);
        }
        self.call_store(limit, key, cost).await
    }

    #[cfg(feature = "redis")]
    fn batcher(&self, redis: &RedisStore) -> &Batcher {
        self.batcher
            .get_or_init(|| Batcher::start(redis.clone(), self.approximate_max_keys))
    }

    /// Sends the approximate path's pending deltas now (tests, benchmarks, shutdown).
    pub async fn flush_approximate(&self) -> Result<(), StoreError> {
        #[cfg(feature = "redis")]
        if let Some(b) = self.batcher.get() {
            return b.flush_now().await;
        }
        Ok(())
    }

    /// The verdict for a global rule this region holds no allocation for
    /// (shadow mode and metrics apply as to any other verdict).
    pub fn unallocated(&self, rule: &Rule) -> Verdict {
        let verdict = self.denial_to_window_end(rule, Source::NoAllocation);
        self.record(rule, &verdict, None, Duration::ZERO);
        verdict
    }

    /// A denial with no store call, until the end of the rule's current
    /// clock-aligned window (limit 0, nothing remaining).
    fn denial_to_window_end(&self, rule: &Rule, source: Source) -> Verdict {
        let period = rule.params.as_ref().map_or_else(
            || rule.unit.duration().as_micros() as u64,
            |p| p.period_us(),
        );
        let until_window_end = period.saturating_sub(crate::clock::now_unix_us() % period.max(1));
        let decision = Decision {
            allowed: false,
            limit: 0,
            remaining: 0,
            reset_after_us: until_window_end,
            retry_after_us: until_window_end,
            delay_us: 0,
            reason: Some(DenyReason::OverLimit),
        };
        shadow(rule, decision, source)
    }

    /// The store call behind the circuit breaker. Store errors other than bad
    /// input count as failures.
    async fn call_store(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = self.in_flight.acquire().await.ok();
        let now = Instant::now();
        if !self.breaker.allow(now) {
            return Err(StoreError::Timeout(Duration::ZERO));
        }
        let result = if cost == 0 {
            self.store.peek(limit, key, None).await
        } else {
            self.store.check(limit, key, cost, None).await
        };
        self.store_duration
            .get_or_init(|| histogram!("meridian_store_duration_seconds"))
            .record(now.elapsed().as_secs_f64());
        match &result {
            Ok(_) => self.breaker.succeeded(),
            Err(StoreError::InvalidInput(_)) => {}
            Err(_) => self.breaker.failed(Instant::now()),
        }
        result
    }

    fn fail_mode(
        &self,
        rule: &Rule,
        limit: &Limit,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Source), InvalidInput> {
        let params = &limit.params;
        Ok(match rule.fail_mode {
            FailMode::Open => (fail_decision(params, true), Source::FailOpen),
            FailMode::Closed => (fail_decision(params, false), Source::FailClosed),
            FailMode::Local => {
                let local = Limit {
                    rule: limit.rule.clone(),
                    params: per_pod(params, self.pods_in_region)?,
                };
                let now = crate::clock::now_unix_us();
                let decision = if cost == 0 {
                    self.local.peek_at(&local, key, now)?
                } else {
                    self.local.check_at(&local, key, cost, now)?
                };
                (decision, Source::FailLocal)
            }
        })
    }
}

/// The rule's batching when it takes the approximate path (the algorithm must
/// support it; a descriptor's `limit` override keeps the rule's accuracy).
#[cfg(feature = "redis")]
fn approximate(rule: &Rule, params: &Params) -> Option<Batching> {
    let Accuracy::Approximate {
        sync_interval,
        max_batch,
    } = rule.accuracy
    else {
        return None;
    };
    params.algorithm().has_approximate_path().then(|| Batching {
        sync_interval,
        max_batch: max_batch.unwrap_or_else(|| batcher::default_max_batch(params)),
    })
}

/// The over-limit cache's key: the counter and the limit it was denied
/// under. A denial under one limit says nothing about another, so a check
/// under a smaller override (or a smaller allocation) cannot lock out the
/// same counter's checks under the rule's own limit.
fn cache_key(rule: &Rule, counter_key: &str, limit: Option<&Params>) -> String {
    let mut key = String::with_capacity(rule.id.len() + counter_key.len() + 24);
    key.push_str(&rule.id);
    key.push('\u{0}');
    key.push_str(counter_key);
    if let Some(p) = limit {
        use std::fmt::Write;
        let _ = write!(key, "\u{0}{}/{}/{}", p.limit(), p.burst(), p.period_us());
    }
    key
}

fn split_selected(rule: &Rule, outcome: &'static str) {
    counter!("meridian_split_selections_total", "rule" => rule.id.clone(), "outcome" => outcome)
        .increment(1);
}

/// This pod's share when each pod of the region limits on its own.
fn per_pod(params: &Params, pods: u64) -> Result<Params, InvalidInput> {
    let share = |n: u64| ((n / pods).max(1)) as i64;
    Params::new(
        params.algorithm(),
        share(params.limit()),
        params.period(),
        params
            .algorithm()
            .has_burst()
            .then(|| share(params.burst())),
    )
}

/// The tightest of several limits' decisions, and its index: among denials
/// the one to wait longest for, else the one with least remaining.
fn tightest(decisions: &[Decision]) -> (usize, Decision) {
    let denied = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.allowed)
        .max_by_key(|(_, d)| d.retry_after_us);
    let pick = denied.or_else(|| {
        decisions
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| d.remaining)
    });
    pick.map_or_else(|| (0, unlimited()), |(i, d)| (i, d.clone()))
}

fn shadow(rule: &Rule, mut decision: Decision, source: Source) -> Verdict {
    let shadow_denied = rule.shadow_mode && !decision.allowed;
    if shadow_denied {
        tracing::info!(rule = %rule.id, "shadow mode: would have denied");
        decision.allowed = true;
        decision.reason = None;
        decision.retry_after_us = 0;
    }
    Verdict {
        decision,
        source,
        shadow_denied,
        limit_index: 0,
    }
}

fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout(_) => "timeout",
        #[cfg(feature = "redis")]
        StoreError::Connection(_) => "connection",
        #[cfg(feature = "redis")]
        StoreError::Server(_) => "server",
        StoreError::Reply(_) => "reply",
        StoreError::InvalidInput(_) => "invalid_input",
    }
}

fn unlimited() -> Decision {
    Decision {
        allowed: true,
        limit: 0,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
        reason: None,
    }
}

fn cached_denial(params: &Params, left: Duration) -> Decision {
    let left = left.as_micros() as u64;
    Decision {
        allowed: false,
        limit: params.limit(),
        remaining: 0,
        reset_after_us: left,
        retry_after_us: left,
        // Only leaky_bucket reports a delay; for a denial it equals retry-after.
        delay_us: if params.algorithm() == crate::algorithm::Algorithm::LeakyBucket {
            left
        } else {
            0
        },
        reason: Some(DenyReason::OverLimit),
    }
}

/// A decision made without the store: nothing is known about the counter.
fn fail_decision(params: &Params, allowed: bool) -> Decision {
    Decision {
        allowed,
        limit: params.limit(),
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
        reason: (!allowed).then_some(DenyReason::OverLimit),
    }
}

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;
    use crate::rules::{RuleFile, RuleSet};

    /// Checks of one rule with a limit of 5, counted under a recorder of the
    /// test's own: every (outcome, reason) series exists from the first
    /// check, the allows and the denial land under their reasons, and the
    /// one allow that left under 20 % of the limit counts as near it.
    #[test]
    fn checks_are_counted_by_outcome_and_reason_with_near_limit_ones() {
        let rules = RuleSet::parse(&[RuleFile {
            name: "rules.yaml".into(),
            text: "domain: api\ndescriptors:\n  - key: otp\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
                .into(),
        }])
        .expect("valid rules");
        let resolved = rules.resolve("api", &[("otp", "+91")]).expect("a match");
        let rule = resolved.rule.expect("a rule with a limit");
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let engine = Engine::new(
            AnyStore::Memory(MemoryStore::new()),
            &EngineConfig::default(),
        );
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                for _ in 0..7 {
                    let check = Check {
                        rule,
                        counter_key: &resolved.counter_key,
                        metric_key: None,
                        cost: 1,
                        limit: None,
                    };
                    engine.check(check).await.expect("a verdict");
                }
            });
        });
        let text = handle.render();
        let value = |labels: &str| -> Option<f64> {
            text.lines()
                .find(|l| l.starts_with(&format!("meridian_checks_total{{{labels}}} ")))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        };
        let series = |o: &str, r: &str| format!("rule=\"api|otp\",outcome=\"{o}\",reason=\"{r}\"");
        assert_eq!(value(&series("allowed", "ok")), Some(5.0), "{text}");
        assert_eq!(value(&series("denied", "over_limit")), Some(1.0), "{text}");
        assert_eq!(
            value(&series("denied", "cached_over_limit")),
            Some(1.0),
            "{text}"
        );
        for (outcome, reason) in CHECK_SERIES {
            assert!(
                value(&series(outcome, reason)).is_some(),
                "no {outcome}/{reason}: {text}"
            );
        }
        assert!(
            text.contains("meridian_checks_near_limit_total{rule=\"api|otp\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("meridian_store_errors_total{rule=\"api|otp\",kind=\"timeout\"} 0\n"),
            "{text}"
        );
    }
}
