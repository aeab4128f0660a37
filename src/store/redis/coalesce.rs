//! Coalescing: checks that arrive together share one script call.
//!
//! Every exact check used to be its own EVALSHA: one round trip, one Lua entry
//! and one TIME per check, and for the limiter a channel hop and a wake-up per
//! check. Callers now queue their check here; one task takes whatever is
//! queued, groups it by limit (and, on a Cluster, by hash slot, since a
//! script's keys must share one), and sends each group as one call of the
//! algorithm's script, which decides its checks in order exactly as separate
//! calls would (see `scripts/prelude.lua`). A native batch of 100 becomes one
//! or two calls; concurrent Envoy requests share calls as they overlap. No
//! check waits for company: the task sends what is queued as soon as it runs.
//!
//! A check that finds Redis idle (no call on the wire, nothing queued) has no
//! one to share a call with, so it skips the queue and sends its own call from
//! its own task: the hand-off to the task and the wake-up back cost it CPU
//! and latency and buy nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::{RedisStore, decision_from_reply, slot};
use crate::algorithm::{Algorithm, Decision, Micros};
use crate::store::StoreError;

/// Most checks one script call carries: Redis runs a script to the end before
/// anything else, and 64 fixed-window checks take it about half a millisecond;
/// larger groups save little more (per-check cost is within 5 % of its floor).
pub(super) const MAX_CHECKS_PER_CALL: usize = 64;

/// Most queued checks the task takes in one turn before sending.
const MAX_PER_TURN: usize = 1024;

/// What the checks of one script call share: the script, the limit's
/// arguments and the clock (ARGV 1–8, see `scripts/prelude.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CallKey {
    pub algorithm: Algorithm,
    pub now: Option<Micros>,
    /// limit, period µs, tick µs, unit, refill, capacity, ttl floor µs.
    pub limit: [u64; 7],
}

/// One check waiting for its script call.
pub(super) struct Queued {
    pub call: CallKey,
    /// `mr:{<rule>:<key>}`.
    pub prefix: String,
    pub cost: u64,
    pub reply: oneshot::Sender<Result<Decision, StoreError>>,
}

/// The callers' side: where checks queue, and whether Redis is idle.
pub(super) struct Coalescer {
    queue: mpsc::UnboundedSender<Queued>,
    load: Arc<Load>,
}

/// Shared by the callers and the task; relaxed counts are enough, since a
/// stale read only sends one check down the other (equally correct) path.
#[derive(Default)]
struct Load {
    /// Checks queued and not yet taken by the task.
    waiting: AtomicUsize,
    /// Script calls sent and not yet answered, direct or the task's.
    calls: AtomicUsize,
}

/// Counts one script call on the wire until dropped (answered, failed, or
/// given up at the deadline).
pub(super) struct OnTheWire<'a>(&'a AtomicUsize);

impl Drop for OnTheWire<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Coalescer {
    /// Starts the task that sends queued checks through `store` (which must
    /// not itself coalesce). It ends when the `Coalescer` is dropped.
    pub(super) fn start(store: RedisStore) -> Coalescer {
        let (queue, receiver) = mpsc::unbounded_channel();
        let load = Arc::new(Load::default());
        tokio::spawn(run(store, receiver, load.clone()));
        Coalescer { queue, load }
    }

    /// A pass to send a check's own call now, when Redis is idle.
    pub(super) fn direct(&self) -> Option<OnTheWire<'_>> {
        if self.load.waiting.load(Ordering::Relaxed) > 0 {
            return None;
        }
        self.load
            .calls
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| OnTheWire(&self.load.calls))
    }

    /// Queues a check for the task; `false` once the task is gone.
    pub(super) fn queue(&self, check: Queued) -> bool {
        self.load.waiting.fetch_add(1, Ordering::Relaxed);
        if self.queue.send(check).is_err() {
            self.load.waiting.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }
}

async fn run(store: RedisStore, mut queue: mpsc::UnboundedReceiver<Queued>, load: Arc<Load>) {
    let mut taken = Vec::with_capacity(MAX_PER_TURN);
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            // New checks first: they go out now, replies can be handed on after.
            biased;
            n = queue.recv_many(&mut taken, MAX_PER_TURN), if open => {
                if n == 0 {
                    open = false;
                }
                load.waiting.fetch_sub(n, Ordering::Relaxed);
                for group in groups(&store, taken.drain(..)) {
                    load.calls.fetch_add(1, Ordering::Relaxed);
                    let on_the_wire = OnTheWire(&load.calls);
                    in_flight.push(call(&store, group, on_the_wire));
                }
            }
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
}

/// Splits checks into script calls: one limit and (Cluster) one slot per
/// call, at most [`MAX_CHECKS_PER_CALL`] each, arrival order kept within a
/// call. Checks whose caller gave up (deadline passed) are dropped unsent.
fn groups(store: &RedisStore, checks: impl Iterator<Item = Queued>) -> Vec<Vec<Queued>> {
    let cluster = store.is_cluster();
    let mut open: Vec<((CallKey, u16), Vec<Queued>)> = Vec::new();
    let mut full = Vec::new();
    for check in checks.filter(|c| !c.reply.is_closed()) {
        let key = (check.call, if cluster { slot(&check.prefix) } else { 0 });
        let at = match open.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                open.push((key, Vec::new()));
                open.len() - 1
            }
        };
        let group = &mut open[at].1;
        group.push(check);
        if group.len() == MAX_CHECKS_PER_CALL {
            full.push(std::mem::take(group));
        }
    }
    full.extend(open.into_iter().map(|(_, g)| g).filter(|g| !g.is_empty()));
    full
}

/// One script call for a group; each caller gets its own decision, or a copy
/// of the call's error.
async fn call(store: &RedisStore, group: Vec<Queued>, on_the_wire: OnTheWire<'_>) {
    let Some(first) = group.first() else { return };
    let checks: Vec<(&str, u64)> = group.iter().map(|c| (c.prefix.as_str(), c.cost)).collect();
    let result = store.call_script(first.call, &checks).await;
    drop(on_the_wire);
    let reply = match &result {
        Ok(reply) if reply.len() == 6 * group.len() => Ok(reply),
        Ok(reply) => Err(StoreError::Reply(format!(
            "expected 6 integers for each of {} checks, got {}",
            group.len(),
            reply.len()
        ))),
        Err(e) => Err(copy(e)),
    };
    for (i, check) in group.into_iter().enumerate() {
        let decision = match &reply {
            Ok(reply) => decision_from_reply(&reply[6 * i..6 * (i + 1)]),
            Err(e) => Err(copy(e)),
        };
        // The caller may have stopped waiting (its deadline); nothing to do then.
        let _ = check.reply.send(decision);
    }
}

/// The same error for another caller of the same call.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::InvalidInput(e) => StoreError::InvalidInput(e.clone()),
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::Connection(e) => StoreError::Connection(e.clone()),
        StoreError::Server(e) => StoreError::Server(e.clone()),
        StoreError::Reply(e) => StoreError::Reply(e.clone()),
    }
}
