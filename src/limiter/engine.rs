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
            Source::Store | Source::Unlimited => match self.decision.reason {
                Some(DenyReason::OverLimit) => "over_limit",
                Some(DenyReason::CostExceedsCapacity { .. }) => "cost_exceeds_capacity",
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            pods_in_region: 1,
            cache_capacity: 100_000,
            breaker_threshold: 5,
            breaker_cool_down: Duration::from_secs(1),
            max_in_flight: 128,
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
    /// Backs `fail_mode: local`; also counts nothing else.
    local: MemoryStore,
    /// Denials remembered until their retry-after, answered without a store call.
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

/// The metrics every check of one rule records.
struct RuleMetrics {
    allowed: Counter,
    denied: Counter,
    shadow_denied: Counter,
    duration: Histogram,
}

impl RuleMetrics {
    fn new(rule: &str) -> RuleMetrics {
        let checks = |outcome: &'static str| counter!("meridian_checks_total", "rule" => rule.to_owned(), "outcome" => outcome);
        RuleMetrics {
            allowed: checks("allowed"),
            denied: checks("denied"),
            shadow_denied: checks("shadow_denied"),
            duration: histogram!("meridian_check_duration_seconds", "rule" => rule.to_owned()),
        }
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
}

impl Engine {
    pub fn new(store: AnyStore, config: &EngineConfig) -> Engine {
        Engine {
            store,
            #[cfg(feature = "redis")]
            batcher: OnceLock::new(),
            local: MemoryStore::new(),
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
        let Some(params) = check.limit.or(rule.params.as_ref()) else {
            return Ok(Verdict {
                decision: unlimited(),
                source: Source::Unlimited,
                shadow_denied: false,
            });
        };
        let limit = Limit {
            rule: rule.id.clone(),
            params: params.clone(),
        };
        let cache_key = [rule.id.as_str(), "\u{0}", check.counter_key].concat();

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
                    counter!("meridian_store_errors_total", "rule" => rule.id.clone(), "kind" => error_kind(&e))
                        .increment(1);
                    tracing::debug!(rule = %rule.id, error = %e, "store failed; using the fail mode");
                    self.fail_mode(rule, &limit, check.counter_key, check.cost)?
                }
            }
        };

        let verdict = shadow(rule, decision, source);
        self.record(rule, &verdict, started.elapsed());
        Ok(verdict)
    }

    /// Counts a verdict and its latency under its rule.
    fn record(&self, rule: &Rule, verdict: &Verdict, took: Duration) {
        let metrics = self.rule_metrics(&rule.id);
        match (verdict.decision.allowed, verdict.shadow_denied) {
            (_, true) => &metrics.shadow_denied,
            (true, false) => &metrics.allowed,
            (false, false) => &metrics.denied,
        }
        .increment(1);
        if matches!(
            verdict.source,
            Source::FailOpen | Source::FailClosed | Source::FailLocal
        ) {
            counter!("meridian_fail_mode_decisions_total", "rule" => rule.id.clone(), "mode" => verdict.reason())
                .increment(1);
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

    /// One counter: in process on the approximate path, else the store.
    async fn decide_counter(
        &self,
        #[cfg_attr(not(feature = "redis"), expect(unused_variables))] rule: &Rule,
        limit: &Limit,
        key: &str,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        #[cfg(feature = "redis")]
        if let (Some(batching), AnyStore::Redis(redis)) =
            (approximate(rule, &limit.params), &self.store)
        {
            return self.batcher(redis).check(limit, key, cost, batching).await;
        }
        self.call_store(limit, key, cost).await
    }

    #[cfg(feature = "redis")]
    fn batcher(&self, redis: &RedisStore) -> &Batcher {
        self.batcher.get_or_init(|| Batcher::start(redis.clone()))
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
        let period = rule.params.as_ref().map_or(0, |p| p.period_us());
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
        let verdict = shadow(rule, decision, Source::NoAllocation);
        self.record(rule, &verdict, Duration::ZERO);
        verdict
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
    batcher::supports(params.algorithm()).then(|| Batching {
        sync_interval,
        max_batch: max_batch.unwrap_or_else(|| batcher::default_max_batch(params)),
    })
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
