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
mod counter;
mod flusher;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::counter;
use tokio::sync::{Notify, oneshot, watch};

use self::counter::Counter;
use self::flusher::{Rounds, flush, run_flusher};
use crate::algorithm::{Algorithm, Decision, Micros, Params, precheck};
use crate::clock::now_unix_us;
use crate::store::redis::RedisStore;
use crate::store::{Limit, StoreError, key};

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
    /// `flusher::SWEEP_EVERY`).
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
            flushing: tokio::sync::Mutex::new(Rounds::new()),
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

    /// Forgets this pod's view of the counters under `prefixes` (a reset)
    /// and runs `clear` (the store's delete) while no flush is out: a round
    /// on the wire is waited for, and none starts until `clear` is done. So
    /// no flush adds the old hits back after the delete, and hits admitted
    /// after the forgetting reach Redis after it. Their pending hits are
    /// dropped, and their deltas in calls waiting for a retry are emptied.
    /// Returns the hits dropped and `clear`'s output.
    ///
    /// Walks the whole counter map once under its lock (at most `max_keys`
    /// entries, a few milliseconds): a counter is keyed by its window too,
    /// which the reset does not know. An operator's command, not a check.
    pub async fn reset<T>(&self, prefixes: &[String], clear: impl Future<Output = T>) -> (u64, T) {
        let mut rounds = self.shared.flushing.lock().await;
        let prefixes: HashSet<&str> = prefixes.iter().map(String::as_str).collect();
        let mut dropped = rounds.forget(&prefixes);
        {
            let mut guard = self
                .shared
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let Tracked { map, dirty, .. } = &mut *guard;
            map.retain(|(prefix, _), c| {
                let forget = prefixes.contains(prefix.as_str());
                if forget {
                    // Hits in flight were counted with the retries above
                    // (no round is out).
                    dropped += c.pending;
                }
                !forget
            });
            // A key charged again gets a new counter that lists itself anew;
            // listed twice, a round would send its hits and then a zero
            // delta over them.
            dirty.retain(|(prefix, _)| !prefixes.contains(prefix.as_str()));
        }
        let cleared = clear.await;
        drop(rounds);
        (dropped, cleared)
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
impl Shared {
    /// The Redis clock, as well as this pod knows it.
    fn now(&self) -> Micros {
        now_unix_us().saturating_add_signed(self.clock_offset_us.load(Ordering::Relaxed))
    }
}
