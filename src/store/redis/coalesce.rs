//! Coalescing: checks that arrive together share one script call.
//!
//! Every exact check used to be its own EVALSHA: one round trip, one Lua entry
//! and one TIME per check, and for the limiter a channel hop and a wake-up per
//! check. Callers now queue their check here; one task takes whatever is
//! queued, groups it by algorithm (and, on a Cluster, by hash slot, since a
//! script's keys must share one), and sends each group as one call of the
//! algorithm's script, which decides its checks in order exactly as separate
//! calls would (see `scripts/prelude.lua`). A native batch of 100 becomes one
//! or two calls; concurrent Envoy requests share calls as they overlap. No
//! check waits for company: the task sends what is queued as soon as it runs.

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

/// One check waiting for its script call.
pub(super) struct Queued {
    pub algorithm: Algorithm,
    /// `mr:{<rule>:<key>}`.
    pub prefix: String,
    pub now: Option<Micros>,
    /// cost, limit, period µs, tick µs, unit, refill, capacity, ttl floor µs
    /// (ARGV 2–9 of the check; see `scripts/prelude.lua`).
    pub args: [u64; 8],
    pub reply: oneshot::Sender<Result<Decision, StoreError>>,
}

/// Starts the task that sends queued checks through `store` (which must not
/// itself coalesce). It ends when every sender is dropped.
pub(super) fn start(store: RedisStore) -> mpsc::UnboundedSender<Queued> {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(run(store, receiver));
    sender
}

async fn run(store: RedisStore, mut queue: mpsc::UnboundedReceiver<Queued>) {
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
                for group in groups(&store, taken.drain(..)) {
                    in_flight.push(call(&store, group));
                }
            }
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
}

/// Splits checks into script calls: one algorithm and (Cluster) one slot per
/// call, at most [`MAX_CHECKS_PER_CALL`] each, arrival order kept within a
/// call. Checks whose caller gave up (deadline passed) are dropped unsent.
fn groups(store: &RedisStore, checks: impl Iterator<Item = Queued>) -> Vec<Vec<Queued>> {
    let cluster = store.is_cluster();
    let mut open: Vec<((Algorithm, u16), Vec<Queued>)> = Vec::new();
    let mut full = Vec::new();
    for check in checks.filter(|c| !c.reply.is_closed()) {
        let key = (
            check.algorithm,
            if cluster { slot(&check.prefix) } else { 0 },
        );
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
async fn call(store: &RedisStore, group: Vec<Queued>) {
    let Some(first) = group.first() else { return };
    let mut invocation = store.script(first.algorithm).prepare_invoke();
    for check in &group {
        invocation.key(check.prefix.as_str());
        invocation.arg(check.now.map(|n| n.to_string()).unwrap_or_default());
        for value in check.args {
            invocation.arg(value);
        }
    }
    let result = store.invoke(&invocation).await;
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
