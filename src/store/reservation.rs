//! Reservations as the stores keep them (issue 31): `reserve` admits an
//! estimate against every limit of a key and records it; `commit` /
//! `release` settle it once (refund or charge the excess, see
//! `algorithm::settle`); a reservation left open past its ttl stays charged
//! at its estimate. The record lives beside the counters — in Redis under
//! the key's hash tag, decided by the same Lua call
//! (`redis/scripts/reserve.lua`, `settle.lua`); in process in a
//! [`MemoryBook`] beside the [`MemoryStore`].
//!
//! A record is kept `ttl + GRACE`: within it, a retried commit answers what
//! the first did and a late one says "expired"; after it, the id is unknown.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{Limit, MemoryStore, StoreError, key};
use crate::algorithm::{Decision, InvalidInput, KeyState, Micros, settle};

/// Longest ttl a reservation may ask for: a call whose cost is not known
/// within an hour is not a call a gateway holds open.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// How long a record outlives its ttl, so that a retried or late commit gets
/// a clear answer rather than "unknown".
pub const GRACE: Duration = Duration::from_secs(600);
/// Open reservations one (rule, key) may hold at once; one more is refused
/// (HTTP 429, gRPC RESOURCE_EXHAUSTED). Bounds a key's records in Redis to
/// this many × ~200 bytes (2 MB), and the Lua sum of a key's outstanding
/// reservations to this many entries.
pub const MAX_OPEN_PER_KEY: usize = 10_000;
/// Records a [`MemoryBook`] holds at most (open, or settled and remembered
/// for retries), over all keys, unless told otherwise.
pub const DEFAULT_MEMORY_RECORDS: usize = 100_000;

/// A reservation's random part: 128 bits, so an id cannot be guessed, and
/// the store finds the record by it (an altered id finds nothing).
pub type Nonce = [u8; 16];

/// How a reservation is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// At its actual cost.
    Commit(u64),
    /// Not used at all: the whole estimate back.
    Release,
}

impl Settle {
    /// The cost the reservation settles at.
    pub fn actual(self) -> u64 {
        match self {
            Settle::Commit(actual) => actual,
            Settle::Release => 0,
        }
    }

    /// `commit` or `release`, for messages and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Settle::Commit(_) => "commit",
            Settle::Release => "release",
        }
    }
}

/// What a reservation asks of a store.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'a> {
    /// Every limit the key is held against, in the rule's order.
    pub limits: &'a [Limit],
    /// The counter key within the rule.
    pub key: &'a str,
    /// The record's name (see [`Nonce`]).
    pub nonce: &'a Nonce,
}

/// A reserve's answer.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// Whether every limit admitted the estimate (then it is charged and recorded).
    pub admitted: bool,
    /// One decision per limit (or a single denial, as `check_all`).
    pub decisions: Vec<Decision>,
    /// Reservations of this key found past their ttl and forgotten (settled
    /// at their estimate), for the `expired` metric.
    pub expired: u64,
}

/// What settling did to one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitSettled {
    /// Hits given back (less than `estimate − actual` when the window the
    /// estimate was charged in no longer counts).
    pub refunded: u64,
    /// Excess hits charged (less than `actual − estimate` when
    /// `max_overdraft` capped it).
    pub charged: u64,
    /// Hits that still fit now, as a check-only peek says.
    pub remaining: u64,
    /// The limit in force.
    pub limit: u64,
}

/// A commit's or release's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The estimate reserved.
    pub estimate: u64,
    /// How it was settled (the first time, for a replay).
    pub settled: Settle,
    /// This call repeated the settlement already made: nothing changed.
    pub replayed: bool,
    /// Per limit, in order; on a replay, what the first settlement did
    /// (with `remaining` as of now).
    pub limits: Vec<LimitSettled>,
    /// How long before this settlement (on the store's clock) the estimate
    /// was charged: places the refund in the period the estimate was
    /// counted in, for the demand report of global rules.
    pub charged_age_us: Micros,
    /// How long until the reservation's ttl ends (0: it has): until then
    /// it counted as open in the demand reports.
    pub expires_in_us: Micros,
}

/// Why a reservation could not be made or settled.
#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    /// Bad input, naming the field.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// No record: never made (a forged or altered id), or forgotten
    /// `GRACE` after its ttl. Nothing was charged.
    #[error(
        "unknown reservation id: never made here, or expired more than {} s ago (an expired reservation stays charged at its estimate)",
        GRACE.as_secs()
    )]
    Unknown,
    /// Made in another region, whose store holds it.
    #[error(
        "reservation id of region {made_in:?}; commit or release it there (this is region {here:?})"
    )]
    OtherRegion {
        /// The region whose limiter made it.
        made_in: String,
        /// This limiter's region.
        here: String,
    },
    /// Its ttl passed before it was settled: it stayed charged at its estimate.
    #[error(
        "reservation expired at its ttl and settled at its estimate ({estimate}); nothing changed"
    )]
    Expired {
        /// The estimate it stays charged at.
        estimate: u64,
    },
    /// Already settled otherwise (a commit at another actual, or a release
    /// after a commit): nothing changed.
    #[error("reservation already settled by {}{}; nothing changed", .was.name(), match .was { Settle::Commit(a) => format!(" at actual {a}"), Settle::Release => String::new() })]
    AlreadySettled {
        /// The first settlement.
        was: Settle,
    },
    /// The key holds `MAX_OPEN_PER_KEY` open reservations, or the memory
    /// book its record bound.
    #[error("too many open reservations ({what}); settle some or wait for their ttl")]
    TooManyOpen {
        /// Which bound, with its number.
        what: String,
    },
    /// The store failed (transient or not).
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for ReservationError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidInput(e) => ReservationError::Invalid(e),
            e => ReservationError::Store(e),
        }
    }
}

/// The memory store's reservation records: one `std::sync::Mutex` around
/// the whole book (held for one reserve or settle, never across an await;
/// reservations are far rarer than checks). Bounded: at most `max_records`
/// records (open, or settled and kept `GRACE` for retries) over all keys, at
/// most [`MAX_OPEN_PER_KEY`] open on one key; a record holds its key (at
/// most `key::MAX_KEY_LEN` bytes of rule and key, escaped ≤ 3,080 bytes)
/// and ~100 bytes plus 32 per limit, so ≤ ~3.5 KB a record, 350 MB at the
/// default 100,000 for the longest keys (a few MB for typical ones).
pub struct MemoryBook {
    inner: Mutex<Book>,
    max_records: usize,
}

#[derive(Default)]
struct Book {
    records: HashMap<Nonce, Record>,
    /// Open reservations per key prefix: (expires at, nonce, estimate).
    open: HashMap<String, Vec<(Micros, Nonce, u64)>>,
}

struct Record {
    prefix: String,
    estimate: u64,
    reserved_at: Micros,
    expires_at: Micros,
    forget_at: Micros,
    settled: Option<(Settle, Vec<LimitSettled>)>,
}

impl Default for MemoryBook {
    fn default() -> Self {
        MemoryBook::with_capacity(DEFAULT_MEMORY_RECORDS)
    }
}

impl MemoryBook {
    /// A book of at most `max_records` records.
    pub fn with_capacity(max_records: usize) -> MemoryBook {
        MemoryBook {
            inner: Mutex::default(),
            max_records: max_records.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `estimate` on `hold` in `store` at `now`, for `ttl_us`.
    pub fn reserve(
        &self,
        store: &MemoryStore,
        hold: Hold<'_>,
        estimate: u64,
        ttl_us: Micros,
        now: Micros,
    ) -> Result<Reserved, ReservationError> {
        let prefix = prefix_of(&hold)?;
        let mut book = self.lock();
        let expired = book.prune_key(&prefix, now);
        let open = book.open.get(&prefix).map_or(0, Vec::len);
        if open >= MAX_OPEN_PER_KEY {
            return Err(ReservationError::TooManyOpen {
                what: format!("{open} on this key, at most {MAX_OPEN_PER_KEY}"),
            });
        }
        if book.records.len() >= self.max_records {
            book.sweep(now);
            if book.records.len() >= self.max_records {
                return Err(ReservationError::TooManyOpen {
                    what: format!(
                        "{} held in memory, at most {}",
                        book.records.len(),
                        self.max_records
                    ),
                });
            }
        }
        if book.records.contains_key(hold.nonce) {
            return Err(ReservationError::Invalid(InvalidInput::new(
                "nonce",
                "(random)",
                "collides with a held reservation; reserve again",
            )));
        }
        let decisions = store.check_all_at(hold.limits, hold.key, estimate, now)?;
        let admitted = decisions.len() == hold.limits.len() && decisions.iter().all(|d| d.allowed);
        if admitted {
            let expires_at = now + ttl_us;
            book.records.insert(
                *hold.nonce,
                Record {
                    prefix: prefix.clone(),
                    estimate,
                    reserved_at: now,
                    expires_at,
                    forget_at: expires_at + GRACE.as_micros() as u64,
                    settled: None,
                },
            );
            book.open
                .entry(prefix)
                .or_default()
                .push((expires_at, *hold.nonce, estimate));
        }
        Ok(Reserved {
            admitted,
            decisions,
            expired,
        })
    }

    /// Settles the reservation `hold.nonce` of `hold`'s key at `now`; each
    /// limit may go past itself by `overdrafts[j]` hits.
    pub fn settle(
        &self,
        store: &MemoryStore,
        hold: Hold<'_>,
        how: Settle,
        overdrafts: &[u64],
        now: Micros,
    ) -> Result<Settled, ReservationError> {
        let prefix = prefix_of(&hold)?;
        let mut book = self.lock();
        let Some(record) = book
            .records
            .get(hold.nonce)
            .filter(|r| r.prefix == prefix && r.forget_at > now)
        else {
            return Err(ReservationError::Unknown);
        };
        let (estimate, reserved_at, expires_at) =
            (record.estimate, record.reserved_at, record.expires_at);
        if let Some((was, limits)) = &record.settled {
            if *was != how {
                return Err(ReservationError::AlreadySettled { was: *was });
            }
            let mut limits = limits.clone();
            let peeks = store.settle_all_at(hold.limits, hold.key, now, |_, _| ())?;
            for (l, (_, d)) in limits.iter_mut().zip(peeks) {
                l.remaining = d.remaining;
            }
            return Ok(Settled {
                estimate,
                settled: was.to_owned(),
                replayed: true,
                limits,
                charged_age_us: now.saturating_sub(reserved_at),
                expires_in_us: expires_at.saturating_sub(now),
            });
        }
        if record.expires_at <= now {
            return Err(ReservationError::Expired { estimate });
        }
        let actual = how.actual();
        let settled = store.settle_all_at(hold.limits, hold.key, now, |j, state| {
            let params = &hold.limits[j].params;
            if actual <= estimate {
                let back = settle::refund(state, reserved_at, now, estimate - actual, params);
                (back, 0)
            } else {
                let overdraft = overdrafts.get(j).copied().unwrap_or(0);
                (
                    0,
                    settle::charge(state, now, actual - estimate, overdraft, params),
                )
            }
        })?;
        let limits: Vec<LimitSettled> = settled
            .into_iter()
            .map(|((refunded, charged), d)| LimitSettled {
                refunded,
                charged,
                remaining: d.remaining,
                limit: d.limit,
            })
            .collect();
        if let Some(r) = book.records.get_mut(hold.nonce) {
            r.settled = Some((how, limits.clone()));
        }
        if let Some(open) = book.open.get_mut(&prefix) {
            open.retain(|(_, n, _)| n != hold.nonce);
            if open.is_empty() {
                book.open.remove(&prefix);
            }
        }
        Ok(Settled {
            estimate,
            settled: how,
            replayed: false,
            limits,
            charged_age_us: now.saturating_sub(reserved_at),
            expires_in_us: expires_at.saturating_sub(now),
        })
    }

    /// The estimates of `limits[0]`'s rule and `key`'s open reservations at
    /// `now`: what the region holds but has not settled.
    pub fn outstanding(
        &self,
        rule: &str,
        counter_key: &str,
        now: Micros,
    ) -> Result<u64, InvalidInput> {
        let prefix = key::key_prefix(rule, counter_key)?;
        let book = self.lock();
        Ok(book.open.get(&prefix).map_or(0, |open| {
            open.iter()
                .filter(|(expires, _, _)| *expires > now)
                .map(|(_, _, estimate)| estimate)
                .sum()
        }))
    }

    /// Records held (open or remembered), for tests and gauges.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Book {
    /// Forgets `prefix`'s open reservations past their ttl (they stay
    /// charged at their estimate); how many.
    fn prune_key(&mut self, prefix: &str, now: Micros) -> u64 {
        let Some(open) = self.open.get_mut(prefix) else {
            return 0;
        };
        let before = open.len();
        open.retain(|(expires, _, _)| *expires > now);
        let expired = (before - open.len()) as u64;
        if open.is_empty() {
            self.open.remove(prefix);
        }
        expired
    }

    /// Drops every record past its grace and every open entry past its ttl.
    fn sweep(&mut self, now: Micros) {
        self.records.retain(|_, r| r.forget_at > now);
        self.open.retain(|_, open| {
            open.retain(|(expires, _, _)| *expires > now);
            !open.is_empty()
        });
    }
}

fn prefix_of(hold: &Hold<'_>) -> Result<String, InvalidInput> {
    let rule = hold.limits.first().map_or("", |l| l.rule.as_str());
    key::key_prefix(rule, hold.key)
}

impl MemoryStore {
    /// Runs `settle(j, state)` on `key`'s state under each of `limits` at
    /// `now`, atomically with every check of them (see
    /// [`MemoryStore::settle_states_at`]), then answers each limit's
    /// check-only peek. A key the store has no room for is left as it is
    /// (`settle` is not called; a default `R`).
    pub fn settle_all_at<R: Default>(
        &self,
        limits: &[Limit],
        key: &str,
        now: Micros,
        mut settle: impl FnMut(usize, &mut KeyState) -> R,
    ) -> Result<Vec<(R, Decision)>, InvalidInput> {
        self.settle_states_at(limits, key, now, |j, state| {
            let r = settle(j, state);
            let outcome = settle::settled(state, now, &limits[j].params);
            (r, outcome)
        })
    }
}

impl MemoryStore {
    /// Charges `amount` hits on `key` under each of `limits` at `now`, limit
    /// `j` at most `overdrafts[j]` past itself (`settle::charge`, as a
    /// commit's excess; no record): Envoy's stream-done settlement.
    pub fn charge_at(
        &self,
        limits: &[Limit],
        key: &str,
        amount: u64,
        overdrafts: &[u64],
        now: Micros,
    ) -> Result<Vec<LimitSettled>, InvalidInput> {
        let charged = self.settle_all_at(limits, key, now, |j, state| {
            let overdraft = overdrafts.get(j).copied().unwrap_or(0);
            settle::charge(state, now, amount, overdraft, &limits[j].params)
        })?;
        Ok(charged
            .into_iter()
            .map(|(charged, d)| LimitSettled {
                refunded: 0,
                charged,
                remaining: d.remaining,
                limit: d.limit,
            })
            .collect())
    }
}

#[cfg(test)]
#[path = "reservation_tests.rs"]
mod tests;
