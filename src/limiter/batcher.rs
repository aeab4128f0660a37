//! The approximate path (`accuracy: approximate`): decisions in process from
//! the last known global count plus this pod's unflushed hits, and a flusher
//! on its own thread that sends the pending deltas in bounded script calls.
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
//!
//! ## Flushes: bounded, on their own thread, counted once
//!
//! - A key has at most one delta in flight (the bound above needs it): a key
//!   whose delta is in flight is not put in another call until that one is
//!   answered or given up; hits admitted meanwhile wait for a later delta.
//! - Calls carry at most `flush_plan::MAX_KEYS_PER_CALL` (128) keys, one shard
//!   (one hash slot on a Cluster) each, so no call holds Redis for long (the
//!   constant has the figures); a round sends at most `MAX_KEYS_PER_ROUND` keys,
//!   one call at a time on a standalone Redis (16 at a time on a Cluster,
//!   where calls go to many slots), and stops at the first failure.
//! - The flusher runs on its own thread with its own event loop: a busy
//!   serving thread cannot delay it, and its bounded rounds take one thread's
//!   time at most, never a serving thread's.
//! - **Counted once.** Each call has a flush id that the script remembers in
//!   Redis for `flush_plan::FLUSH_ID_TTL` (10 s). A call that failed — which
//!   for a timeout means it may well have run — is sent again with the same
//!   id and the same deltas, so if it ran, the retry applies nothing and
//!   only reads the globals. Retries back off (25 ms doubling to 1 s) and
//!   stop after `MAX_ATTEMPTS` (16) sends or `RETRY_WINDOW` (5 s) after the
//!   first, so every send of an id reaches Redis within its lifetime. A call
//!   still failing then is **given up: its hits are dropped** (counted in
//!   `meridian_approx_flush_dropped_hits_total`). Sending them again under a
//!   new id could count them twice if the old call ran (the audit's key hit
//!   once that read 283); dropping can only under-count, by what the given-up
//!   calls carried: the bound above then holds plus
//!   `meridian_approx_flush_dropped_hits_total` (at most max_batch per key
//!   per give-up, and a give-up needs Redis failing for 5 s, during which
//!   checks at max_batch already go to the fail mode).
//!
//! ## Memory: at most `max_keys` tracked counters
//!
//! The counter map holds one entry per (key, window) this pod decided
//! recently, at most `EngineConfig::approximate_max_keys` (default 100,000).
//! A check for a key not tracked while the map is full **takes the exact path**
//! (one script call, bounded by the engine's in-flight cap) and is counted in
//! `meridian_approx_untracked_checks_total`. Chosen over evicting a tracked key
//! (flush it, then drop it): the exact path loses nothing and keeps the
//! bound, while an evicted key that comes back starts from a zero view and
//! may admit another `max_batch`, so a key-cycling client could overshoot
//! without limit; under a random-key flood it costs what exact checks cost.
//! Entries go when settled and idle for their rule's period.
//! Bytes: an entry is its key prefix plus at most 400 bytes (the `Counter`,
//! the window, the prefix's `String`, the map's control byte, all doubled
//! for the map's spare room; a unit test checks the sizes). The prefix is at
//! most 3,078 bytes: rule and key are ≤ 512 bytes each, checked by
//! `store::key::key_prefix` before anything is inserted, and escaping at
//! most triples them. So the map holds at most `max_keys × 3,478` bytes.
//! Two lists copy a key's prefix once more each, at most once per key: the
//! keys with pending hits (`Tracked::dirty`) and the deltas in flight or
//! waiting for a retry. In all at most `max_keys × (3 × 3,078 + 464)` bytes:
//! 970 MB at the default if every rule and key were 512 bytes of `%{}:`,
//! about 60 MB for keys of 40 bytes (the flood of `tests/integration/approximate_flood.rs`
//! measures the process).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::future::join_all;
use metrics::{counter, gauge, histogram};
use tokio::sync::{Notify, oneshot, watch};

use super::flush_plan::{self, AfterFailure, Attempts};
use crate::algorithm::{
    Algorithm, Decision, Micros, Params, fixed_window, precheck, sliding_counter, token_bucket,
};
use crate::clock::now_unix_us;
use crate::store::redis::{Delta, Flushed, Global, RedisStore};
use crate::store::{Limit, StoreError, key};

/// How many calls a round has on the wire at once: one on a standalone
/// Redis (a pipeline of calls would run back to back there, holding other
/// clients as one big call would); on a Cluster calls go to many slots and
/// nodes, so one at a time would take a round trip per slot.
const CLUSTER_CALLS_AT_ONCE: usize = 16;

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

/// Owns the flusher thread: dropping the batcher stops it.
pub struct Batcher {
    /// The counters the checks and the flusher share.
    shared: Arc<Shared>,
    /// Dropped with the batcher, which ends the flusher's loop (and its
    /// thread) at its next await.
    _stop: oneshot::Sender<()>,
}

/// What the checks and the flusher share.
struct Shared {
    store: RedisStore,
    /// `std::sync::Mutex`: no `.await` while held; a check holds it for a
    /// map lookup and a little arithmetic, the flusher for a pass over the
    /// keys with pending hits per round (and over the whole map once per
    /// [`SWEEP_EVERY`]).
    counters: Mutex<Tracked>,
    /// Entries `counters` may hold; checks of other keys take the exact path.
    max_keys: usize,
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
    /// One flush round at a time (the flusher's, or `flush_now`'s), and what
    /// rounds hand on to the next: a key has at most one delta in flight,
    /// which the bound relies on.
    flushing: tokio::sync::Mutex<Rounds>,
    /// `meridian_approx_untracked_checks_total`, registered on first use (the
    /// recorder may be installed after the engine is built).
    untracked: OnceLock<metrics::Counter>,
}

/// The counters, and which of them have hits to send.
struct Tracked {
    /// Per (key prefix, window), at most `max_keys` entries (module doc).
    map: HashMap<(String, u64), Counter>,
    /// The keys whose `pending_since` is set, each once: a round looks only
    /// at these, not at the whole map (a map full of settled keys cost the
    /// idle flusher 14 % of a core when every round walked it). At most one
    /// entry per counter.
    dirty: Vec<(String, u64)>,
    /// When idle counters were last dropped.
    swept: Instant,
}

/// How often idle, settled counters are dropped: a sweep walks the whole
/// map (every round while the map was full kept the idle flusher at 9 % of
/// a core after a flood).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Held between flush rounds, under `Shared::flushing`.
struct Rounds {
    /// Calls that failed and will be sent again, unchanged.
    retries: Vec<Call>,
    /// The next flush id: random per batcher, so pods (and restarts of one)
    /// do not reuse each other's ids within their lifetime in Redis.
    next_id: u64,
}

/// One script call: a flush id and the deltas it carries, one per key.
#[derive(Debug)]
struct Call {
    id: u64,
    /// Each delta's counter, by (prefix, window), in `deltas` order.
    counters: Vec<(String, u64)>,
    deltas: Vec<Delta>,
    /// `None` until first sent.
    attempts: Option<Attempts>,
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
    /// Sent in a call not answered yet (or waiting to be sent again).
    in_flight: u64,
    /// When `pending` became non-zero: the flush is due `sync_interval` later.
    pending_since: Option<Instant>,
    /// Last check or flush; idle counters are dropped.
    touched: Instant,
}

/// What the local view says about one check.
enum Step {
    /// One decision per limit.
    Decided(Vec<Decision>),
    /// The key holds `max_batch` unflushed hits: wait for a flush.
    Wait,
    /// The map is full and does not hold this key.
    Untracked,
}

impl Batcher {
    /// Starts the flusher on a thread of its own, tracking at most
    /// `max_keys` counters (at least 1).
    pub fn start(store: RedisStore, max_keys: usize) -> Batcher {
        let shared = Arc::new(Shared {
            store,
            counters: Mutex::new(Tracked {
                map: HashMap::new(),
                dirty: Vec::new(),
                swept: Instant::now(),
            }),
            max_keys: max_keys.max(1),
            wake: Notify::new(),
            flushed: watch::Sender::new(0),
            clock_offset_us: AtomicI64::new(0),
            failing: AtomicBool::new(false),
            tick_us: AtomicI64::new(i64::MAX),
            flushing: tokio::sync::Mutex::new(Rounds {
                retries: Vec::new(),
                next_id: rand::random(),
            }),
            untracked: OnceLock::new(),
        });
        let (stop, stopped) = oneshot::channel();
        let flusher = shared.clone();
        let thread = std::thread::Builder::new()
            .name("meridian-flusher".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => runtime.block_on(async {
                        tokio::select! {
                            _ = stopped => {}
                            () = run_flusher(flusher) => {}
                        }
                    }),
                    Err(e) => tracing::error!(error = %e,
                        "approximate path: cannot start the flusher's event loop; keys at max_batch go to their fail mode"),
                }
            });
        if let Err(e) = thread {
            tracing::error!(error = %e,
                "approximate path: cannot start the flusher thread; keys at max_batch go to their fail mode");
        }
        Batcher {
            shared,
            _stop: stop,
        }
    }

    /// Decides one check from the local view: `Ok(None)` when this pod
    /// already tracks `max_keys` counters and not this one (the caller takes
    /// the exact path). `Err` only when the key needs a flush (it reached
    /// `max_batch`) that failed or missed the store's deadline: the caller
    /// applies the rule's fail mode.
    pub async fn check(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        batching: Batching,
    ) -> Result<Option<Decision>, StoreError> {
        if cost > 0
            && let Some(denied) = precheck(&limit.params, cost)?
        {
            return Ok(Some(denied));
        }
        // Before anything is stored: this refuses rules and keys over 512 bytes.
        let prefix = key::key_prefix(&limit.rule, key)?;
        let decided = self
            .decide_counters(&[(limit, prefix.as_str(), batching)], cost)
            .await?;
        Ok(decided.and_then(|mut d| d.pop()))
    }

    /// [`Batcher::check`] for the limits of a `limits:` rule, decided
    /// together from the local views of their counters: admitted only when
    /// every limit admits, and then counted in each (a denial charges none).
    /// The counters are the exact path's (`store::redis::check_all`): limit
    /// `j > 0` under `<prefix>:<j>`, all in one hash tag. One decision per
    /// limit, or one alone when a limit refuses the cost outright.
    pub async fn check_all(
        &self,
        limits: &[Limit],
        key: &str,
        cost: u64,
        batchings: &[Batching],
    ) -> Result<Option<Vec<Decision>>, StoreError> {
        let Some(first) = limits.first() else {
            return Ok(Some(Vec::new()));
        };
        if cost > 0 {
            for limit in limits {
                if let Some(denied) = precheck(&limit.params, cost)? {
                    return Ok(Some(vec![denied]));
                }
            }
        }
        // Before anything is stored: this refuses rules and keys over 512 bytes.
        let prefix = key::key_prefix(&first.rule, key)?;
        let prefixes: Vec<String> = (1..limits.len()).map(|j| format!("{prefix}:{j}")).collect();
        let counters: Vec<(&Limit, &str, Batching)> = limits
            .iter()
            .zip(std::iter::once(prefix.as_str()).chain(prefixes.iter().map(String::as_str)))
            .zip(batchings.iter().copied())
            .map(|((limit, prefix), batching)| (limit, prefix, batching))
            .collect();
        self.decide_counters(&counters, cost).await
    }

    /// Decides a check over its counters (one per limit, each with its
    /// prefix), waiting for a flush while one of them holds `max_batch`.
    async fn decide_counters(
        &self,
        counters: &[(&Limit, &str, Batching)],
        cost: u64,
    ) -> Result<Option<Vec<Decision>>, StoreError> {
        // Local decisions never wait on I/O: give other tasks their turn
        // when this task has used its budget.
        tokio::task::consume_budget().await;
        for (_, _, batching) in counters {
            self.shared
                .tick_us
                .fetch_min(batching.sync_interval.as_micros() as i64, Ordering::Relaxed);
        }
        let deadline = self.shared.store.deadline();
        let mut flushes = self.shared.flushed.subscribe();
        let waited_since = Instant::now();
        loop {
            match self.try_decide(counters, cost) {
                Step::Decided(decisions) => return Ok(Some(decisions)),
                Step::Untracked => {
                    self.shared
                        .untracked
                        .get_or_init(|| counter!("meridian_approx_untracked_checks_total"))
                        .increment(1);
                    return Ok(None);
                }
                Step::Wait => {}
            }
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

    /// The local decisions of one check over its counters (one per limit),
    /// or why there are none. Under one lock, so the limits of a check are
    /// decided and charged together.
    fn try_decide(&self, counters: &[(&Limit, &str, Batching)], cost: u64) -> Step {
        let now = self.shared.now();
        let window_of = |params: &Params| match params.algorithm() {
            Algorithm::TokenBucket => 0,
            _ => now / params.period_us(),
        };
        let instant = Instant::now();
        let mut guard = self
            .shared
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Tracked { map, dirty, .. } = &mut *guard;
        // Room for every counter this check needs, or it takes the exact
        // path (looked up only near the cap: a lookup costs a key's copy).
        if map.len() + counters.len() > self.shared.max_keys {
            let missing = counters
                .iter()
                .filter(|(limit, prefix, _)| {
                    !map.contains_key(&((*prefix).to_owned(), window_of(&limit.params)))
                })
                .count();
            if missing > 0 && map.len() + missing > self.shared.max_keys {
                return Step::Untracked;
            }
        }
        let mut decisions = Vec::with_capacity(counters.len());
        let mut wait = false;
        let mut full = false;
        let one = counters.len() == 1;
        for &(limit, prefix, batching) in counters {
            let params = &limit.params;
            let window = window_of(params);
            // A sliding counter's previous window: what was last read of it
            // plus what this pod still holds for it.
            let previous = (params.algorithm() == Algorithm::SlidingWindowCounter)
                .then(|| map.get(&(prefix.to_owned(), window.wrapping_sub(1))))
                .flatten()
                .map(|c| c.global + c.in_flight + c.pending);
            let counter = map
                .entry((prefix.to_owned(), window))
                .or_insert_with(|| Counter::new(params, batching, instant));
            counter.touched = instant;
            counter.params = params.clone();
            counter.batching = batching;
            // In flight counts too: a pod never holds max_batch hits the others cannot see.
            if cost > 0 && counter.pending + counter.in_flight >= batching.max_batch {
                wait = true;
                continue;
            }
            let decision = counter.local_decision(previous, window, now, cost);
            // One limit: charged here, without a second lookup.
            if one && decision.allowed && cost > 0 {
                full |= counter.charge(cost, instant, || dirty.push((prefix.to_owned(), window)));
            }
            decisions.push(decision);
        }
        if wait {
            return Step::Wait;
        }
        if !one && cost > 0 && decisions.iter().all(|d| d.allowed) {
            for &(limit, prefix, _) in counters {
                let id = (prefix.to_owned(), window_of(&limit.params));
                if let Some(counter) = map.get_mut(&id) {
                    full |= counter.charge(cost, instant, || dirty.push(id));
                }
            }
        }
        if full {
            drop(guard);
            self.shared.wake.notify_one();
        }
        Step::Decided(decisions)
    }

    /// Sends every pending delta (and every call waiting for a retry) now,
    /// round after round until one finds nothing to send, and waits for the
    /// answers (tests, shutdown: with checks still arriving it may take a
    /// round per flush interval's worth of them).
    pub async fn flush_now(&self) -> Result<(), StoreError> {
        // A key whose delta was in flight when a round began is sent in the next.
        while flush(&self.shared, true).await? > 0 {}
        Ok(())
    }
}

impl Counter {
    /// Counts `cost` admitted hits; `newly_dirty` runs when the counter had
    /// nothing pending. True when it now holds `max_batch` (wake the flusher).
    fn charge(&mut self, cost: u64, now: Instant, newly_dirty: impl FnOnce()) -> bool {
        self.pending += cost;
        if self.pending_since.is_none() {
            self.pending_since = Some(now);
            newly_dirty();
        }
        self.pending >= self.batching.max_batch
    }

    /// The check's decision from this pod's view: the last global value
    /// read plus the hits it has not seen yet. Changes nothing.
    fn local_decision(
        &self,
        previous: Option<u64>,
        window: u64,
        now: Micros,
        cost: u64,
    ) -> Decision {
        let params = &self.params;
        let unflushed = self.pending + self.in_flight;
        let outcome = match params.algorithm() {
            Algorithm::FixedWindow => {
                let mut state = fixed_window::State {
                    window,
                    count: self.global + unflushed,
                };
                fixed_window::decide(&mut state, now, cost, params)
            }
            Algorithm::SlidingWindowCounter => {
                let mut state = sliding_counter::State {
                    window,
                    current: self.global + unflushed,
                    previous: previous.unwrap_or(self.previous).max(self.previous),
                };
                sliding_counter::decide(&mut state, now, cost, params)
            }
            _ => {
                let unit = params.scale().unit;
                // Rebuilt from counts in the current scale: nothing to convert.
                let level = (self.previous > 0).then(|| token_bucket::Level {
                    tokens: self.global.saturating_sub(unflushed * unit),
                    tick: self.previous,
                    scale: None,
                });
                let level = level.or_else(|| {
                    (unflushed > 0).then(|| token_bucket::Level {
                        tokens: params.scale().capacity.saturating_sub(unflushed * unit),
                        tick: now / params.tick_us(),
                        scale: None,
                    })
                });
                let mut state = token_bucket::State { level };
                token_bucket::decide(&mut state, now, cost, params)
            }
        };
        outcome.decision
    }

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
        self.in_flight == 0
            && self.pending > 0
            && (everything
                || self.pending >= self.batching.max_batch
                || self
                    .pending_since
                    .is_some_and(|t| now >= t + self.batching.sync_interval))
    }

    /// Flush order when more keys are due than a round sends: keys at
    /// max_batch (their checks are waiting) first, then the oldest deltas.
    fn urgency(&self) -> (bool, Option<Instant>) {
        (self.pending < self.batching.max_batch, self.pending_since)
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
        // Failed calls are kept and sent again in a later round.
        let _ = flush(&shared, false).await;
    }
}

/// One flush round: the retries whose backoff is over (all of them when
/// `everything`) and the due deltas, at most `MAX_KEYS_PER_ROUND` keys, in
/// calls of at most `MAX_KEYS_PER_CALL`; the answers are folded back. Returns
/// how many keys it sent (so `flush_now` knows when it is done).
async fn flush(shared: &Shared, everything: bool) -> Result<usize, StoreError> {
    let mut rounds = shared.flushing.lock().await;
    let now = Instant::now();
    let mut budget = flush_plan::MAX_KEYS_PER_ROUND;
    let mut calls = Vec::new();
    let mut waiting = Vec::new();
    let mut given_up = Vec::new();
    for call in rounds.retries.drain(..) {
        let attempts = call.attempts.unwrap_or_else(|| Attempts::first(now));
        if !attempts.may_send(now) {
            given_up.push(call);
        } else if (everything || now >= attempts.next) && call.deltas.len() <= budget {
            budget -= call.deltas.len();
            calls.push(call);
        } else {
            waiting.push(call);
        }
    }
    rounds.retries = waiting;
    let fresh = take_due(shared, now, everything, budget);
    let fresh_from = calls.len();
    let groups = shared.store.shard_groups(&fresh);
    let mut fresh: Vec<Option<((String, u64), Delta)>> = fresh
        .into_iter()
        .map(|d| Some(((d.prefix.clone(), d.window), d)))
        .collect();
    for chunk in flush_plan::chunks(groups, flush_plan::MAX_KEYS_PER_CALL) {
        let (counters, deltas) = chunk.iter().filter_map(|&i| fresh[i].take()).unzip();
        let id = rounds.next_id;
        rounds.next_id = id.wrapping_add(1);
        calls.push(Call {
            id,
            counters,
            deltas,
            attempts: None,
        });
    }
    let sent_keys = calls.iter().map(|c| c.deltas.len()).sum();
    drop_given_up(shared, given_up);
    if calls.is_empty() {
        // Retries still waiting out their backoff: Redis is as failing as it was.
        if rounds.retries.is_empty() {
            shared.failing.store(false, Ordering::Relaxed);
        }
        shared.flushed.send_modify(|g| *g += 1);
        return Ok(0);
    }

    let at_once = if shared.store.is_cluster() {
        CLUSTER_CALLS_AT_ONCE
    } else {
        1
    };
    let mut outcome = Ok(sent_keys);
    let mut unsent = Vec::new();
    let mut calls = calls.into_iter().enumerate().peekable();
    while calls.peek().is_some() {
        let wave: Vec<(usize, Call)> = calls.by_ref().take(at_once).collect();
        let results = join_all(wave.into_iter().map(|(n, mut call)| async move {
            let started = Instant::now();
            call.attempts = Some(match call.attempts {
                None => Attempts::first(started),
                Some(a) => a.resent(),
            });
            let deltas: Vec<&Delta> = call.deltas.iter().collect();
            let result = shared
                .store
                .apply_deltas(call.id, flush_plan::FLUSH_ID_TTL, &deltas)
                .await;
            histogram!("meridian_approx_flush_duration_seconds")
                .record(started.elapsed().as_secs_f64());
            histogram!("meridian_approx_flush_keys").record(deltas.len() as f64);
            (n, call, result)
        }))
        .await;
        let failed = fold_answers(shared, &mut rounds, results);
        if let Some(e) = failed {
            // Redis is failing: the rest waits for the next round.
            unsent.extend(calls.by_ref());
            outcome = Err(e);
        }
    }
    // Calls never sent: fresh deltas go back to pending (no id was used, so
    // they may join other calls), retries keep waiting.
    let mut guard = shared.counters.lock().unwrap_or_else(|e| e.into_inner());
    let Tracked { map, dirty, .. } = &mut *guard;
    for (n, call) in unsent {
        if n < fresh_from {
            rounds.retries.push(call);
            continue;
        }
        for key in call.counters {
            if let Some(c) = map.get_mut(&key) {
                c.pending += c.in_flight;
                c.in_flight = 0;
                if c.pending_since.is_none() {
                    c.pending_since = Some(now - c.batching.sync_interval);
                    dirty.push(key);
                }
            }
        }
    }
    drop(guard);
    shared.failing.store(outcome.is_err(), Ordering::Relaxed);
    shared.flushed.send_modify(|g| *g += 1);
    outcome
}

/// Drops idle settled counters (every [`SWEEP_EVERY`]), then moves the due ones' pending hits in flight — at most `budget`
/// keys, most urgent first — and returns their deltas.
fn take_due(shared: &Shared, now: Instant, everything: bool, budget: usize) -> Vec<Delta> {
    let mut guard = shared.counters.lock().unwrap_or_else(|e| e.into_inner());
    let Tracked { map, dirty, swept } = &mut *guard;
    if now >= *swept + SWEEP_EVERY {
        // Idle, settled counters of past windows (or idle buckets) go.
        map.retain(|_, c| {
            c.pending + c.in_flight > 0 || now.duration_since(c.touched) < c.params.period()
        });
        *swept = now;
    }
    gauge!("meridian_approx_tracked_keys").set(map.len() as f64);
    dirty.retain(|key| map.get(key).is_some_and(|c| c.pending_since.is_some()));
    let counter = |i: usize| map.get(&dirty[i]);
    let mut due: Vec<usize> = (0..dirty.len())
        .filter(|&i| counter(i).is_some_and(|c| c.due(now, everything)))
        .collect();
    if due.len() > budget {
        due.select_nth_unstable_by_key(budget, |&i| counter(i).map(Counter::urgency));
        due.truncate(budget);
    }
    // Highest index first: swap_remove then only moves entries already looked at.
    due.sort_unstable_by(|a, b| b.cmp(a));
    let mut deltas = Vec::with_capacity(due.len());
    for i in due {
        let key = dirty.swap_remove(i);
        if let Some(c) = map.get_mut(&key) {
            c.in_flight = c.pending;
            c.pending = 0;
            c.pending_since = None;
            deltas.push(Delta {
                window: key.1,
                prefix: key.0,
                hits: c.in_flight,
                params: c.params.clone(),
            });
        }
    }
    deltas
}

/// Folds one wave's answers into the counters; failed calls go to the
/// retries (or are given up). Returns the wave's last error, if any.
fn fold_answers(
    shared: &Shared,
    rounds: &mut Rounds,
    results: Vec<(usize, Call, Result<Flushed, StoreError>)>,
) -> Option<StoreError> {
    let local_now = now_unix_us();
    let mut failure = None;
    let mut given_up = Vec::new();
    let mut guard = shared.counters.lock().unwrap_or_else(|e| e.into_inner());
    let counters = &mut guard.map;
    for (_, call, result) in results {
        match result {
            Ok(flushed) => {
                counter!("meridian_approx_flushes_total").increment(1);
                counter!("meridian_approx_flushed_hits_total")
                    .increment(call.deltas.iter().map(|d| d.hits).sum());
                let offset = flushed.server_now as i64 - local_now as i64;
                shared.clock_offset_us.store(offset, Ordering::Relaxed);
                for (key, global) in call.counters.iter().zip(flushed.globals) {
                    if let Some(c) = counters.get_mut(key) {
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
                tracing::debug!(error = %e, keys = call.deltas.len(), id = call.id,
                    "approximate flush failed; the same call is sent again");
                let attempts = call
                    .attempts
                    .unwrap_or_else(|| Attempts::first(Instant::now()));
                match attempts.failed(Instant::now()) {
                    AfterFailure::Retry(next) => rounds.retries.push(Call {
                        attempts: Some(next),
                        ..call
                    }),
                    AfterFailure::GiveUp => given_up.push(call),
                }
                failure = Some(e);
            }
        }
    }
    drop(guard);
    drop_given_up(shared, given_up);
    failure
}

/// Calls out of sends: their hits are dropped (module doc, "Counted once").
fn drop_given_up(shared: &Shared, calls: Vec<Call>) {
    if calls.is_empty() {
        return;
    }
    let mut dropped = 0;
    let mut guard = shared.counters.lock().unwrap_or_else(|e| e.into_inner());
    let counters = &mut guard.map;
    for call in &calls {
        for key in &call.counters {
            if let Some(c) = counters.get_mut(key) {
                dropped += c.in_flight;
                c.in_flight = 0;
            }
        }
    }
    drop(guard);
    counter!("meridian_approx_flush_dropped_hits_total").increment(dropped);
    tracing::warn!(
        calls = calls.len(),
        hits = dropped,
        "approximate flush: Redis failed every send of these calls for {:?}; their hits are dropped (sending them under a new id could count them twice)",
        flush_plan::RETRY_WINDOW
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_costs_at_most_400_bytes_besides_its_prefix() {
        let slot = std::mem::size_of::<((String, u64), Counter)>() + 1;
        // Up to 2× for the map's spare room (7/8 load, doubling on growth);
        // the module doc's byte bound counts 400 a key.
        assert!(2 * slot <= 400, "entry slot is {slot} bytes");
    }
}
