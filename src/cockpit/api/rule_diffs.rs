//! Rule diffs for `GET /api/v1/rules/diff`: computed one at a time on a
//! blocking thread, and kept by version pair.
//!
//! A diff may take `rules::diff::MAX_STEPS` of CPU (about 0.1 s in a release
//! build), and anyone who may read rules may ask for one: sixteen at once
//! used to take every core, `/healthz` to 43 s and the node's memory from
//! 166 to 521 MB (issue 28). So [`DIFFS_AT_ONCE`] run at a time and a request
//! that cannot start one within [`START_WITHIN`] is told to come back later.
//! A version never changes and its number is never reused, so a pair's diff
//! never changes either: the last [`CACHED_DIFFS`] (at most [`CACHED_BYTES`])
//! are answered again without computing, and requests for a pair being
//! computed wait for that computation instead of starting their own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::counter;
use tokio::sync::{OnceCell, Semaphore};

use crate::coordinator::raft::storage::Applied;

/// Diffs computed at once by one node: one core, whatever the node has.
pub const DIFFS_AT_ONCE: usize = 1;

/// How long a request waits for its turn before it is answered 503.
pub const START_WITHIN: Duration = Duration::from_secs(2);

/// Diffs kept, most recently asked for last.
pub const CACHED_DIFFS: usize = 32;

/// Bytes of diff text kept. A diff is at most about both versions' size
/// (each within the admin API's 1 MiB body) plus headers.
pub const CACHED_BYTES: usize = 32 * 1024 * 1024;

/// One pair's diff as a JSON string (quoted and escaped, ready to be put in
/// an answer as is: a cached answer costs a copy, not a re-encoding of up to
/// megabytes), computed or being computed.
type Slot = Arc<OnceCell<Arc<str>>>;

/// The cache and the gate; one per node, shared by every request.
pub struct RuleDiffs {
    /// (from, to) and its slot, least recently asked for first. std's
    /// lock: held to find, insert or trim, never across an await.
    slots: Mutex<VecDeque<((u64, u64), Slot)>>,
    /// A permit per diff being computed ([`DIFFS_AT_ONCE`]).
    computing: Arc<Semaphore>,
}

/// Why no diff was answered.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// Other diffs held every turn for [`START_WITHIN`].
    #[error(
        "other rule diffs kept this node busy for {START_WITHIN:?} ({DIFFS_AT_ONCE} computed at a time); retry in a second"
    )]
    Busy,
    /// The blocking thread panicked or was cancelled.
    #[error("the diff's thread failed: {0}")]
    Failed(String),
}

impl Default for RuleDiffs {
    fn default() -> Self {
        RuleDiffs {
            slots: Mutex::new(VecDeque::new()),
            computing: Arc::new(Semaphore::new(DIFFS_AT_ONCE)),
        }
    }
}

impl RuleDiffs {
    /// The diff from version `from` to `to`, both in `state` (the caller
    /// checked), as a JSON string, from the cache or computed now.
    pub async fn get(
        &self,
        state: Arc<Applied>,
        from: u64,
        to: u64,
    ) -> Result<Arc<str>, DiffError> {
        let slot = self.slot((from, to));
        if let Some(text) = slot.get() {
            counter!("meridian_coordinator_rule_diffs_total", "outcome" => "cached").increment(1);
            return Ok(Arc::clone(text));
        }
        let computing = Arc::clone(&self.computing);
        // Set when this request, not another one for the same pair, computes.
        let mut computes = false;
        let text = slot
            .get_or_try_init(|| {
                computes = true;
                async move {
                    let permit = tokio::time::timeout(START_WITHIN, computing.acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .ok_or(DiffError::Busy)?;
                    // The thread keeps the permit: a request given up on still
                    // holds its turn until the work it started ends.
                    tokio::task::spawn_blocking(move || {
                        let _permit = permit;
                        let versions = &state.registry.versions;
                        let files = |n: u64| versions.get(&n).map(|v| &v.files);
                        let text = match (files(from), files(to)) {
                            (Some(old), Some(new)) => crate::rules::diff::diff(
                                &format!("{from}/"),
                                old,
                                &format!("{to}/"),
                                new,
                            ),
                            _ => String::new(),
                        };
                        Arc::<str>::from(serde_json::Value::String(text).to_string())
                    })
                    .await
                    .map_err(|e| DiffError::Failed(e.to_string()))
                }
            })
            .await;
        let outcome = match &text {
            Ok(_) if computes => "computed",
            Ok(_) => "shared",
            Err(DiffError::Busy) => "busy",
            Err(DiffError::Failed(_)) => "failed",
        };
        counter!("meridian_coordinator_rule_diffs_total", "outcome" => outcome).increment(1);
        let text = Arc::clone(text?);
        self.trim();
        Ok(text)
    }

    /// The pair's slot, made the most recently asked for (created if new).
    fn slot(&self, pair: (u64, u64)) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.iter().position(|(p, _)| *p == pair) {
            Some(i) => slots.remove(i).map(|(_, s)| s),
            None => None,
        }
        .unwrap_or_default();
        slots.push_back((pair, Arc::clone(&slot)));
        while slots.len() > CACHED_DIFFS {
            slots.pop_front();
        }
        slot
    }

    /// Drops the least recently asked for diffs past [`CACHED_BYTES`]. A
    /// dropped slot still being computed finishes for those waiting on it.
    fn trim(&self) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = |slots: &VecDeque<((u64, u64), Slot)>| -> usize {
            slots
                .iter()
                .filter_map(|(_, s)| s.get().map(|t| t.len()))
                .sum()
        };
        while slots.len() > 1 && bytes(&slots) > CACHED_BYTES {
            slots.pop_front();
        }
    }
}
