//! The approximate path (`accuracy: approximate`): decisions in process from
//! the last known global count plus this pod's unflushed hits, and a background
//! flusher that sends every pending delta in one script call per shard.
//!
//! ## The bound
//!
//! A pod admits a hit when `global (as last read) + its own unflushed hits +
//! cost ≤ limit`. Its view misses only what *other* pods admitted since its
//! last flush answered. A key's unflushed hits never reach `max_batch` and
//! stay admittable: at `max_batch` the flusher is woken, and further checks
//! wait for the flush's answer (or, if Redis is failing, go to the rule's
//! fail mode). So once the true count reaches the limit, each pod admits at
//! most `max_batch` more before a flush shows it the full window:
//!
//! > admitted ≤ L + pods × max_batch per window (cost-1 hits; a check of cost
//! > c may add c − 1 more per pod). Token bucket: ≤ B + R·T + pods × max_batch.
//!
//! Under-admission is small: a pod's view is never above the truth, so it
//! denies only when the true count is at least as high.
//!
//! Windows are the exact scripts' windows, on the Redis clock: every flush
//! answer carries the server time, and the pod keeps the offset to its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use metrics::{counter, histogram};
use tokio::sync::{Notify, watch};

use crate::algorithm::{
    Algorithm, Decision, Micros, Params, fixed_window, precheck, sliding_counter, token_bucket,
};
use crate::clock::now_unix_us;
use crate::store::redis::{Delta, Global, RedisStore};
use crate::store::{Limit, StoreError, key};

/// The algorithms with an approximate path. Sliding log keeps one entry per
/// hit (nothing to batch into a count) and GCRA's state is a timestamp that
/// every hit moves by an amount depending on the previous one, so neither
/// can be summed from deltas.
pub fn supports(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::TokenBucket
    )
}

/// `max_batch` when the rule does not set it: limit / 100, at least 1.
pub fn default_max_batch(params: &Params) -> u64 {
    (params.limit() / 100).max(1)
}

/// How one approximate rule batches, from its `accuracy:` block.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    pub sync_interval: Duration,
    pub max_batch: u64,
}

/// Owns the flusher task: dropping the batcher stops it.
pub struct Batcher {
    /// The counters the checks and the flusher share.
    shared: Arc<Shared>,
    /// The flusher; aborted when the batcher is dropped.
    flusher: tokio::task::JoinHandle<()>,
}

/// What the checks and the flusher share.
struct Shared {
    store: RedisStore,
    /// Per (key prefix, window). `std::sync::Mutex`: no `.await` while held,
    /// and every hold is a map lookup plus a little arithmetic.
    counters: Mutex<HashMap<(String, u64), Counter>>,
    /// Wakes the flusher early: a key reached `max_batch`.
    wake: Notify,
    /// Bumped after every flush attempt; checks waiting for room watch it.
    flushed: watch::Sender<u64>,
    /// Redis clock minus the local clock, µs, from the last flush answer.
    clock_offset_us: AtomicI64,
    /// The last flush failed: checks that need a flush go to the fail mode at
    /// once instead of waiting for one that will not come.
    failing: AtomicBool,
    /// The shortest `sync_interval` of any rule seen (the flusher's tick), µs.
    tick_us: AtomicI64,
    /// One flush at a time (the flusher's, or `flush_now`'s): a key has at
    /// most one delta in flight, which the bound relies on.
    flushing: tokio::sync::Mutex<()>,
}

/// One key's view in one window.
#[derive(Debug)]
struct Counter {
    params: Params,
    batching: Batching,
    /// From the last flush answer: the window's count (fixed window, sliding
    /// counter) or the bucket's tokens in scaled units (token bucket).
    global: u64,
    /// Sliding counter: the previous window's count. Token bucket: the tick of `global`.
    previous: u64,
    /// Admitted here, not yet sent.
    pending: u64,
    /// Sent in the flush under way.
    in_flight: u64,
    /// When `pending` became non-zero: the flush is due `sync_interval` later.
    pending_since: Option<Instant>,
    /// Last check or flush; idle counters are dropped.
    touched: Instant,
}

impl Batcher {
    /// Starts the flusher (must run inside a tokio runtime).
    pub fn start(store: RedisStore) -> Batcher {
        let shared = Arc::new(Shared {
            store,
            counters: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            flushed: watch::Sender::new(0),
            clock_offset_us: AtomicI64::new(0),
            failing: AtomicBool::new(false),
            tick_us: AtomicI64::new(i64::MAX),
            flushing: tokio::sync::Mutex::new(()),
        });
        let flusher = tokio::spawn(run_flusher(shared.clone()));
        Batcher { shared, flusher }
    }

    /// Decides one check from the local view. `Err` only when the key needs a
    /// flush (it reached `max_batch`) that failed or missed the store's
    /// deadline: the caller applies the rule's fail mode.
    pub async fn check(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        batching: Batching,
    ) -> Result<Decision, StoreError> {
        if cost > 0
            && let Some(denied) = precheck(&limit.params, cost)?
        {
            return Ok(denied);
        }
        // Local decisions never wait on I/O: give the flusher and other tasks
        // their turn when this task has used its budget.
        tokio::task::consume_budget().await;
        let prefix = key::key_prefix(&limit.rule, key)?;
        self.shared
            .tick_us
            .fetch_min(batching.sync_interval.as_micros() as i64, Ordering::Relaxed);
        let deadline = self.shared.store.deadline();
        let mut flushes = self.shared.flushed.subscribe();
        let waited_since = Instant::now();
        loop {
            if let Some(decision) = self.try_decide(limit, &prefix, cost, batching) {
                return Ok(decision);
            }
            // The key has max_batch unflushed hits: wait for a flush to answer.
            if self.shared.failing.load(Ordering::Relaxed) {
                return Err(StoreError::Timeout(Duration::ZERO));
            }
            self.shared.wake.notify_one();
            let left = deadline.saturating_sub(waited_since.elapsed());
            match tokio::time::timeout(left, flushes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Err(StoreError::Timeout(deadline)),
            }
        }
    }

    /// The local decision, or `None` when the key must flush before admitting more.
    fn try_decide(
        &self,
        limit: &Limit,
        prefix: &str,
        cost: u64,
        batching: Batching,
    ) -> Option<Decision> {
        let params = &limit.params;
        let now = self.shared.now();
        let window = match params.algorithm() {
            Algorithm::TokenBucket => 0,
            _ => now / params.period_us(),
        };
        let instant = Instant::now();
        let mut counters = self
            .shared
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // A sliding counter's previous window: what was last read of it plus
        // what this pod still holds for it.
        let previous = (params.algorithm() == Algorithm::SlidingWindowCounter)
            .then(|| counters.get(&(prefix.to_owned(), window.wrapping_sub(1))))
            .flatten()
            .map(|c| c.global + c.in_flight + c.pending);
        let counter = counters
            .entry((prefix.to_owned(), window))
            .or_insert_with(|| Counter::new(params, batching, instant));
        counter.touched = instant;
        counter.params = params.clone();
        counter.batching = batching;
        // In flight counts too: a pod never holds max_batch hits the others cannot see.
        if cost > 0 && counter.pending + counter.in_flight >= batching.max_batch {
            return None;
        }
        let unflushed = counter.pending + counter.in_flight;
        let outcome = match params.algorithm() {
            Algorithm::FixedWindow => {
                let mut state = fixed_window::State {
                    window,
                    count: counter.global + unflushed,
                };
                fixed_window::decide(&mut state, now, cost, params)
            }
            Algorithm::SlidingWindowCounter => {
                let mut state = sliding_counter::State {
                    window,
                    current: counter.global + unflushed,
                    previous: previous.unwrap_or(counter.previous).max(counter.previous),
                };
                sliding_counter::decide(&mut state, now, cost, params)
            }
            _ => {
                let unit = params.scale().unit;
                let level = (counter.previous > 0).then(|| token_bucket::Level {
                    tokens: counter.global.saturating_sub(unflushed * unit),
                    tick: counter.previous,
                });
                let level = level.or_else(|| {
                    (unflushed > 0).then(|| token_bucket::Level {
                        tokens: params.scale().capacity.saturating_sub(unflushed * unit),
                        tick: now / params.tick_us(),
                    })
                });
                let mut state = token_bucket::State { level };
                token_bucket::decide(&mut state, now, cost, params)
            }
        };
        if outcome.decision.allowed && cost > 0 {
            counter.pending += cost;
            counter.pending_since.get_or_insert(instant);
            if counter.pending >= batching.max_batch {
                drop(counters);
                self.shared.wake.notify_one();
            }
        }
        Some(outcome.decision)
    }

    /// Sends every pending delta now and waits for the answer (tests, shutdown).
    pub async fn flush_now(&self) -> Result<(), StoreError> {
        flush(&self.shared, true).await
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.flusher.abort();
    }
}

impl Counter {
    fn new(params: &Params, batching: Batching, now: Instant) -> Counter {
        Counter {
            params: params.clone(),
            batching,
            global: 0,
            previous: 0,
            pending: 0,
            in_flight: 0,
            pending_since: None,
            touched: now,
        }
    }

    fn due(&self, now: Instant, everything: bool) -> bool {
        self.pending > 0
            && (everything
                || self.pending >= self.batching.max_batch
                || self
                    .pending_since
                    .is_some_and(|t| now >= t + self.batching.sync_interval))
    }
}

impl Shared {
    /// The Redis clock, as well as this pod knows it.
    fn now(&self) -> Micros {
        now_unix_us().saturating_add_signed(self.clock_offset_us.load(Ordering::Relaxed))
    }
}

async fn run_flusher(shared: Arc<Shared>) {
    loop {
        let tick = match shared.tick_us.load(Ordering::Relaxed) {
            i64::MAX => Duration::from_millis(50),
            us => Duration::from_micros(us.max(1_000) as u64),
        };
        // Half the interval: a delta waits at most about sync_interval.
        let _ = tokio::time::timeout(tick / 2, shared.wake.notified()).await;
        // Errors are kept in the counters and retried on the next round.
        let _ = flush(&shared, false).await;
    }
}

/// One flush round: take the due deltas, send them per shard, fold the answers back.
async fn flush(shared: &Shared, everything: bool) -> Result<(), StoreError> {
    let _one_at_a_time = shared.flushing.lock().await;
    let now = Instant::now();
    let mut ids = Vec::new();
    let mut deltas = Vec::new();
    {
        let mut counters = shared.counters.lock().unwrap_or_else(|e| e.into_inner());
        // Idle, settled counters of past windows (or idle buckets) go.
        counters.retain(|_, c| {
            c.pending + c.in_flight > 0 || now.duration_since(c.touched) < c.params.period()
        });
        for ((prefix, window), c) in counters.iter_mut() {
            if c.in_flight == 0 && c.due(now, everything) {
                c.in_flight = c.pending;
                c.pending = 0;
                c.pending_since = None;
                ids.push((prefix.clone(), *window));
                deltas.push(Delta {
                    prefix: prefix.clone(),
                    window: *window,
                    hits: c.in_flight,
                    params: c.params.clone(),
                });
            }
        }
    }
    if deltas.is_empty() {
        shared.flushed.send_modify(|g| *g += 1);
        return Ok(());
    }
    let groups = shared.store.shard_groups(&deltas);
    let deltas = &deltas;
    let calls = groups.iter().map(|group| async move {
        let batch: Vec<&Delta> = group.iter().map(|&i| &deltas[i]).collect();
        let started = Instant::now();
        let result = shared.store.apply_deltas(&batch).await;
        histogram!("meridian_approx_flush_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        histogram!("meridian_approx_flush_keys").record(batch.len() as f64);
        (group, result)
    });
    let results = join_all(calls).await;

    let mut outcome = Ok(());
    let local_now = now_unix_us();
    let mut counters = shared.counters.lock().unwrap_or_else(|e| e.into_inner());
    for (group, result) in results {
        match result {
            Ok(flushed) => {
                let offset = flushed.server_now as i64 - local_now as i64;
                shared.clock_offset_us.store(offset, Ordering::Relaxed);
                for (&i, global) in group.iter().zip(flushed.globals) {
                    if let Some(c) = counters.get_mut(&ids[i]) {
                        c.in_flight = 0;
                        (c.global, c.previous) = match global {
                            Global::Window { count } => (count, 0),
                            Global::Sliding { count, previous } => (count, previous),
                            Global::Bucket { tokens, tick } => (tokens, tick),
                        };
                    }
                }
            }
            Err(e) => {
                counter!("meridian_approx_flush_errors_total").increment(1);
                tracing::debug!(error = %e, keys = group.len(), "approximate flush failed; deltas kept");
                // Kept for the next round: back into pending, due at once.
                for &i in group {
                    if let Some(c) = counters.get_mut(&ids[i]) {
                        c.pending += c.in_flight;
                        c.in_flight = 0;
                        c.pending_since
                            .get_or_insert(now - c.batching.sync_interval);
                    }
                }
                outcome = Err(e);
            }
        }
    }
    drop(counters);
    shared.failing.store(outcome.is_err(), Ordering::Relaxed);
    shared.flushed.send_modify(|g| *g += 1);
    outcome
}
