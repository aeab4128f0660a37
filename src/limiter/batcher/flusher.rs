//! The flusher: rounds that send the pending deltas in bounded script
//! calls, retry a failed call unchanged under its flush id, fold the
//! answers back into the counters, and drop the hits of a call out of
//! sends (see the module doc of `batcher`, "Flushes").

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::join_all;
use metrics::{counter, gauge, histogram};

use super::counter::Counter;
use super::{Shared, Tracked};
use crate::clock::now_unix_us;
use crate::limiter::flush_plan::{self, AfterFailure, Attempts};
use crate::store::StoreError;
use crate::store::redis::{Delta, Flushed, Global};

/// How many calls a round has on the wire at once: one on a standalone
/// Redis (a pipeline of calls would run back to back there, holding other
/// clients as one big call would); on a Cluster calls go to many slots and
/// nodes, so one at a time would take a round trip per slot.
const CLUSTER_CALLS_AT_ONCE: usize = 16;

/// How often idle, settled counters are dropped: a sweep walks the whole
/// map (every round while the map was full kept the idle flusher at 9 % of
/// a core after a flood).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Held between flush rounds, under `Shared::flushing`.
pub(super) struct Rounds {
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

impl Rounds {
    /// No retries yet, and a random first flush id.
    pub(super) fn new() -> Rounds {
        Rounds {
            retries: Vec::new(),
            next_id: rand::random(),
        }
    }
}

impl Rounds {
    /// A reset of the counters under `prefixes`: their deltas in calls
    /// waiting for a retry carry no hits from now on, and their answers
    /// update no counter. The delta stays in its call (with the same flush
    /// id and the same first prefix, which names the id's key), so a call
    /// that ran before is still recognised and applies nothing. Returns the
    /// hits taken out.
    pub(super) fn forget(&mut self, prefixes: &HashSet<&str>) -> u64 {
        let mut dropped = 0;
        for call in &mut self.retries {
            for (counter, delta) in call.counters.iter_mut().zip(&mut call.deltas) {
                if prefixes.contains(delta.prefix.as_str()) {
                    dropped += delta.hits;
                    delta.hits = 0;
                    // No counter is named by an empty prefix (they all
                    // start `mr:{`): the answer updates none, not even the
                    // counter this key starts anew after the reset.
                    counter.0.clear();
                }
            }
        }
        dropped
    }
}

/// The flusher thread's loop: a round every half of the shortest
/// `sync_interval`, or at once when a key reaches `max_batch`.
pub(super) async fn run_flusher(shared: Arc<Shared>) {
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
pub(super) async fn flush(shared: &Shared, everything: bool) -> Result<usize, StoreError> {
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
    use crate::algorithm::{Algorithm, Params};

    fn delta(prefix: &str, hits: u64) -> ((String, u64), Delta) {
        let params =
            Params::new(Algorithm::FixedWindow, 10, Duration::from_secs(60), None).unwrap();
        let delta = Delta {
            prefix: prefix.to_owned(),
            window: 7,
            hits,
            params,
        };
        ((prefix.to_owned(), 7), delta)
    }

    /// A reset empties its keys' deltas in calls waiting for a retry and
    /// unnames their counters, keeping each call's id, its first prefix
    /// (the id's key) and the other keys' deltas as they were.
    #[test]
    fn a_reset_empties_its_keys_deltas_in_retries_and_keeps_the_rest() {
        let mut rounds = Rounds::new();
        let (counters, deltas) = [delta("mr:{r:42}", 3), delta("mr:{r:7}", 2)]
            .into_iter()
            .unzip();
        rounds.retries.push(Call {
            id: 9,
            counters,
            deltas,
            attempts: None,
        });
        let dropped = rounds.forget(&HashSet::from(["mr:{r:42}"]));
        assert_eq!(dropped, 3);
        let call = &rounds.retries[0];
        assert_eq!(call.id, 9);
        assert_eq!(
            call.deltas
                .iter()
                .map(|d| (d.prefix.as_str(), d.hits))
                .collect::<Vec<_>>(),
            [("mr:{r:42}", 0), ("mr:{r:7}", 2)]
        );
        assert_eq!(call.counters[0], (String::new(), 7));
        assert_eq!(call.counters[1], ("mr:{r:7}".to_owned(), 7));
    }
}
