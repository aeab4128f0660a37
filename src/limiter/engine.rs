//! The regional hot path, top to bottom in [`Engine::check`]:
//! unlimited? → local over-limit cache → hot-key split (`split: K`, pick a
//! sub-counter) → approximate path (in process, `batcher`) or circuit breaker
//! → store (with its deadline) → fail mode on store failure → shadow mode →
//! verdict.
//!
//! Matching a request to rules happens before (in the API layers, through
//! `RuleSet::resolve`); the engine decides one (rule, counter key, cost).

use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};

#[cfg(feature = "redis")]
use super::batcher::{self, Batcher, Batching};
use super::breaker::Breaker;
use super::cache::OverLimitCache;
use super::check_metrics::{CheckMetrics, RuleMetrics};
use super::counters::{self, Cleared};
use super::split::SubCounters;
use super::verdict::{Source, Verdict, cached_denial, fail_decision, shadow, tightest, unlimited};
use crate::algorithm::{Decision, DenyReason, InvalidInput, Params};
#[cfg(feature = "redis")]
use crate::rules::Accuracy;
use crate::rules::{FailMode, Rule};
#[cfg(feature = "redis")]
use crate::store::RedisStore;
use crate::store::reservation::{Hold, MemoryBook, ReservationError, Reserved, Settle, Settled};
use crate::store::{AnyStore, Counters, Limit, MemoryStore, Store, StoreError, key};

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
    /// What every check counts, by rule (see `check_metrics`).
    metrics: CheckMetrics,
    /// Reservation records when counters are in `store`'s memory (Redis
    /// keeps them itself); bounded, see `MemoryBook`.
    book: MemoryBook,
    /// Reservation calls at the store at most ([`RESERVATIONS_IN_FLIGHT`]);
    /// more wait here, before their deadline starts. Each is a script call
    /// of its own (none is coalesced like checks), and 128 of them queued
    /// on one connection missed a 20 ms deadline together.
    reservations_in_flight: tokio::sync::Semaphore,
}

/// See `Engine::reservations_in_flight`.
const RESERVATIONS_IN_FLIGHT: usize = 16;
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
            local: MemoryStore::with_capacity(config.local_capacity),
            cache: OverLimitCache::new(config.cache_capacity),
            breaker: Breaker::new(config.breaker_threshold, config.breaker_cool_down),
            in_flight: tokio::sync::Semaphore::new(config.max_in_flight.max(1)),
            pods_in_region: config.pods_in_region.max(1),
            metrics: CheckMetrics::new(config.max_value_metrics),
            book: MemoryBook::default(),
            reservations_in_flight: tokio::sync::Semaphore::new(RESERVATIONS_IN_FLIGHT),
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
        let rule = check.rule;
        if rule.denies_all() && check.limit.is_none() {
            let verdict = self.denial_to_window_end(rule, Source::ZeroLimit);
            self.metrics
                .record(rule, &verdict, check.metric_key, Duration::ZERO);
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
        let metrics = self.metrics.rule_metrics(&rule.id);
        if let Some(verdict) = self.check_in_process(
            rule,
            &limit,
            check.counter_key,
            check.cost,
            check.metric_key,
            &metrics,
        ) {
            return verdict;
        }
        let started = Instant::now();
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
                    let limits = std::slice::from_ref(&limit);
                    let (mut decisions, source) =
                        self.fail_over(rule, &e, limits, check.counter_key, check.cost)?;
                    (decisions.pop().unwrap_or_else(unlimited), source)
                }
            }
        };

        let verdict = shadow(rule, decision, source);
        self.metrics.record_for(
            &metrics,
            rule,
            &verdict,
            check.metric_key,
            Some(started.elapsed()),
        );
        Ok(verdict)
    }

    /// One limit of a one-limit rule on the embedded store, decided in
    /// place and synchronously: what [`Engine::check`] does for it, and what
    /// the library's rule handles call directly with a `limit` built once.
    /// No over-limit cache (the store is in process: a cached denial would
    /// save nothing and answer less exactly than the store), no breaker and
    /// no in-flight cap (it can neither fail nor queue), and the clock read
    /// for the duration metric only when a recorder is installed. `None`
    /// for any other store, and for a split rule (its sub-counter is picked
    /// at random: the general path decides it).
    pub(crate) fn check_in_process(
        &self,
        rule: &Rule,
        limit: &Limit,
        key: &str,
        cost: u64,
        metric_key: Option<&str>,
        metrics: &RuleMetrics,
    ) -> Option<Result<Verdict, InvalidInput>> {
        if rule.split > 1 {
            return None;
        }
        let store = self.store.in_process()?;
        let started = metrics.timed().then(Instant::now);
        let now = crate::clock::now_unix_us_fast();
        let decided = match cost {
            0 => store.peek_at(limit, key, now),
            _ => store.check_at(limit, key, cost, now),
        };
        Some(decided.map(|decision| {
            let verdict = shadow(rule, decision, Source::Store);
            self.metrics.record_for(
                metrics,
                rule,
                &verdict,
                metric_key,
                started.map(|s| s.elapsed()),
            );
            verdict
        }))
    }

    /// The rule's metric handles (registered with its first check).
    pub(crate) fn rule_metrics(&self, rule: &Rule) -> Arc<RuleMetrics> {
        self.metrics.rule_metrics(&rule.id)
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
        if limits.is_empty() {
            return Ok((
                Verdict {
                    decision: unlimited(),
                    source: Source::Unlimited,
                    shadow_denied: false,
                    limit_index: 0,
                },
                Vec::new(),
            ));
        }
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
            self.guarded(|| self.store.check_all(&limits, key, cost, None))
                .await
        };
        let (decisions, source) = match stored.await {
            Ok(decisions) => (decisions, Source::Store),
            Err(StoreError::InvalidInput(e)) => return Err(e),
            Err(e) => self.fail_over(rule, &e, &limits, key, cost)?,
        };
        let (index, decision) = tightest(&decisions);
        let mut verdict = shadow(rule, decision, source);
        verdict.limit_index = index;
        self.metrics
            .record(rule, &verdict, check.metric_key, started.elapsed());
        Ok((verdict, decisions))
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

    /// Clears every counter `counter_key` has under `rule` (an operator's
    /// reset): in the store, each limit's and each split sub-counter's state
    /// whatever the algorithm; this pod's approximate-path view of them
    /// with its unflushed hits (under the flusher's lock, so none is added
    /// back after the delete); the `fail_mode: local` store's; then the
    /// cached denials, last, so that a check that read the old count while
    /// the reset ran cannot leave one behind. Not behind the breaker: an
    /// operator's command fails on its own deadline and counts no failure.
    pub async fn reset(&self, rule: &Rule, counter_key: &str) -> Result<Cleared, StoreError> {
        key::check(&rule.id, counter_key)?;
        let keys = counters::counter_keys(rule, counter_key);
        let periods = counters::periods(rule);
        let counters = Counters {
            rule: &rule.id,
            keys: &keys,
            limits: rule.also.len() + 1,
            periods: &periods,
        };
        let clear = self.store.clear(&counters, None);
        #[cfg(feature = "redis")]
        let (pending_hits, store_keys) = match self.batcher.get() {
            Some(batcher) => batcher.reset(&counters.prefixes()?, clear).await,
            None => (0, clear.await),
        };
        #[cfg(not(feature = "redis"))]
        let (pending_hits, store_keys) = (0, clear.await);
        let local_keys = self
            .local
            .clear_at(&counters, crate::clock::now_unix_us())?;
        Ok(Cleared {
            store_keys: store_keys?,
            local_keys,
            pending_hits,
            cached_denials: self.cache.forget(&cache_key(rule, counter_key, None)),
        })
    }

    /// Reserves `estimate` against every limit of `hold` for `ttl_us`
    /// (`store::reservation`): admitted only when all admit, then charged
    /// and recorded atomically. Behind an in-flight cap of its own, not the breaker
    /// or the fail mode: a reservation no store recorded could never be
    /// settled, so a store failure is the caller's error to see.
    pub async fn reserve(
        &self,
        hold: Hold<'_>,
        estimate: u64,
        ttl_us: crate::algorithm::Micros,
    ) -> Result<Reserved, ReservationError> {
        let _permit = self.reservations_in_flight.acquire().await.ok();
        match &self.store {
            AnyStore::Memory(memory) => {
                let now = crate::clock::now_unix_us();
                self.book.reserve(memory, hold, estimate, ttl_us, now)
            }
            #[cfg(feature = "redis")]
            AnyStore::Redis(redis) => redis.reserve(hold, estimate, ttl_us).await,
        }
    }

    /// Settles the reservation `hold.nonce` (commit or release); limit `j`
    /// may go past itself by `overdrafts[j]` hits.
    pub async fn settle(
        &self,
        hold: Hold<'_>,
        how: Settle,
        overdrafts: &[u64],
    ) -> Result<Settled, ReservationError> {
        let _permit = self.reservations_in_flight.acquire().await.ok();
        match &self.store {
            AnyStore::Memory(memory) => {
                let now = crate::clock::now_unix_us();
                self.book.settle(memory, hold, how, overdrafts, now)
            }
            #[cfg(feature = "redis")]
            AnyStore::Redis(redis) => redis.settle(hold, how, overdrafts).await,
        }
    }

    /// The estimates of `rule`'s open reservations on `counter_key`, summed:
    /// what this region holds and has not settled.
    pub async fn outstanding(&self, rule: &str, counter_key: &str) -> Result<u64, StoreError> {
        match &self.store {
            AnyStore::Memory(_) => {
                Ok(self
                    .book
                    .outstanding(rule, counter_key, crate::clock::now_unix_us())?)
            }
            #[cfg(feature = "redis")]
            AnyStore::Redis(redis) => redis.outstanding(rule, counter_key).await,
        }
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
        self.metrics.record(rule, &verdict, None, Duration::ZERO);
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

    /// One counter's store call, guarded (see `guarded`); a cost of 0 peeks.
    async fn call_store(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.guarded(|| async {
            if cost == 0 {
                self.store.peek(limit, key, None).await
            } else {
                self.store.check(limit, key, cost, None).await
            }
        })
        .await
    }

    /// A store call behind the in-flight cap and the circuit breaker, timed.
    /// Store errors other than bad input count as the breaker's failures.
    async fn guarded<T, F>(&self, call: impl FnOnce() -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = self.in_flight.acquire().await.ok();
        let now = Instant::now();
        if !self.breaker.allow(now) {
            return Err(StoreError::Timeout(Duration::ZERO));
        }
        let result = call().await;
        self.metrics.store_call_took(now.elapsed());
        match &result {
            Ok(_) => self.breaker.succeeded(),
            Err(StoreError::InvalidInput(_)) => {}
            Err(_) => self.breaker.failed(Instant::now()),
        }
        result
    }

    /// The store failed `limits` (one, or a `limits:` rule's): counts the
    /// failure and decides by the rule's fail mode. `open` and `closed` know
    /// nothing about any counter and answer for the first limit alone;
    /// `local` decides every limit in memory, each ÷ pods.
    fn fail_over(
        &self,
        rule: &Rule,
        error: &StoreError,
        limits: &[Limit],
        key: &str,
        cost: u64,
    ) -> Result<(Vec<Decision>, Source), InvalidInput> {
        self.metrics.store_failed(rule, error);
        tracing::debug!(rule = %rule.id, %error, "store failed; using the fail mode");
        let first = || limits.iter().take(1);
        Ok(match rule.fail_mode {
            FailMode::Open => (
                first().map(|l| fail_decision(&l.params, true)).collect(),
                Source::FailOpen,
            ),
            FailMode::Closed => (
                first().map(|l| fail_decision(&l.params, false)).collect(),
                Source::FailClosed,
            ),
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
                let decisions = match local.as_slice() {
                    [one] if cost == 0 => vec![self.local.peek_at(one, key, now)?],
                    [one] => vec![self.local.check_at(one, key, cost, now)?],
                    all => self.local.check_all_at(all, key, cost, now)?,
                };
                (decisions, Source::FailLocal)
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

// Envoy's stream-done charge: another call beside the reservations'.
#[path = "engine_charge.rs"]
mod charge;

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;
    use crate::limiter::check_metrics::CHECK_SERIES;
    use crate::rules::{RuleFile, RuleSet};
    use crate::store::{AnyStore, MemoryStore};

    /// Checks of one rule with a limit of 5, counted (`check_metrics`) under a recorder of the
    /// test's own: every (outcome, reason) series exists from the first
    /// check, the allows and the denials land under their reasons (the
    /// embedded store keeps no over-limit cache: both denials are its own),
    /// the one allow that left under 20 % of the limit counts as near it,
    /// and with a recorder installed every check is timed.
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
        assert_eq!(value(&series("denied", "over_limit")), Some(2.0), "{text}");
        assert_eq!(
            value(&series("denied", "cached_over_limit")),
            Some(0.0),
            "{text}"
        );
        assert!(
            text.contains("meridian_check_duration_seconds_count{rule=\"api|otp\"} 7\n"),
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
