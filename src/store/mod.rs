//! Where counters live: the [`Store`] trait and its two implementations,
//! [`MemoryStore`] (embedded, one process) and [`RedisStore`] (standalone or
//! Cluster, shared by every pod of a region).
//!
//! Both run the same algorithms (`crate::algorithm`) with the same key layout
//! (`key`), so a check answers the same wherever the state is kept.

mod huge_pages;
pub mod key;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod reservation;

pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{RedisConfig, RedisStore};

use std::future::Future;
use std::time::Duration;

use crate::algorithm::{Decision, InvalidInput, Micros, Params};

/// One limit as a store sees it: the rule it belongs to (part of every key)
/// and its validated parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The rule's name; every state key starts with it, so two rules never share a counter.
    pub rule: String,
    /// The algorithm, limit and period the check is decided with.
    pub params: Params,
}

/// Decides one check atomically against shared state.
///
/// `now` is the caller's clock in µs since the Unix epoch; `None` means the
/// store's own clock (the Redis server's `TIME`, so every pod of a region agrees
/// on window boundaries whatever their own clocks say).
pub trait Store: Send + Sync {
    /// Decides a check of `cost` hits on `key` under `limit`, counting them if
    /// admitted, in one atomic step (one Lua script call on Redis).
    fn check(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides without consuming (Envoy's `hits_addend: 0`): allowed unless
    /// the key is already over its limit — which happens only when the limit
    /// shrank under it — with `remaining` telling how many more hits fit.
    fn peek(
        &self,
        limit: &Limit,
        key: &str,
        now: Option<Micros>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Deletes every counter `counters` names, whatever algorithm wrote it
    /// (an operator's reset): afterwards each key starts from nothing.
    /// Returns how many stored keys (Redis keys, or the embedded store's
    /// entries) held state and were deleted. `now` as for `check`: it picks
    /// the windows a windowed counter is named by.
    fn clear(
        &self,
        counters: &Counters<'_>,
        now: Option<Micros>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// What [`Store::clear`] deletes: every counter of some keys under one rule,
/// for each of the rule's limits, in any algorithm's layout.
#[derive(Debug, Clone, Copy)]
pub struct Counters<'a> {
    /// The rule's id, the first part of every key (`Limit::rule`).
    pub rule: &'a str,
    /// The counter keys: a descriptor's, and for a split rule each of its
    /// sub-counters' (`limiter::split`), which hash to other Cluster slots.
    pub keys: &'a [String],
    /// How many limits the rule has: limit 0 keeps its state under the key's
    /// prefix, limit `j > 0` of a `limits:` rule under `<prefix>:<j>` (the
    /// embedded store: `#<j>`), as `check_all` does.
    pub limits: usize,
    /// Periods (µs) a fixed window or sliding counter of these keys may
    /// have counted in: a window's counter is named by its index in its
    /// period, so the Redis store names the windows of each (the embedded
    /// store keeps one entry a key and ignores them).
    pub periods: &'a [u64],
}

impl Counters<'_> {
    /// The Redis key prefix of each key's limits: `mr:{<rule>:<key>}:<j>`
    /// for limit `j > 0`, then `mr:{<rule>:<key>}` for limit 0 (as
    /// `check_all` names them; the approximate path's counters too). A
    /// key's prefixes share its hash tag.
    pub fn prefixes(&self) -> Result<Vec<String>, InvalidInput> {
        let mut out = Vec::with_capacity(self.keys.len() * self.limits.max(1));
        for k in self.keys {
            let prefix = key::key_prefix(self.rule, k)?;
            for j in 1..self.limits {
                out.push(format!("{prefix}:{j}"));
            }
            out.push(prefix);
        }
        Ok(out)
    }
}

/// Why a store could not decide.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The check itself was malformed (a zero cost, an over-long key); retrying
    /// cannot help, and no fail mode applies.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// Redis did not answer within `RedisConfig::deadline` (transient).
    #[error("redis did not answer within the {0:?} deadline")]
    Timeout(Duration),
    /// The connection to Redis failed or was lost (transient).
    #[cfg(feature = "redis")]
    #[error("redis connection failed: {0}")]
    Connection(#[source] ::redis::RedisError),
    /// Redis answered with an error that is neither a timeout nor a lost
    /// connection (`OOM`, a script error, …): not transient.
    #[cfg(feature = "redis")]
    #[error("redis refused the command: {0}")]
    Server(#[source] ::redis::RedisError),
    /// Redis answered something the script's contract does not allow.
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
}

impl StoreError {
    /// Whether retrying (or falling back per the rule's fail mode) makes sense:
    /// the store was unreachable or slow, not the request wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Timeout(_) => true,
            #[cfg(feature = "redis")]
            StoreError::Connection(_) => true,
            _ => false,
        }
    }
}

/// The store a limiter runs on, chosen at start-up (`--redis` or `--store memory`).
pub enum AnyStore {
    /// An in-process store: one process's counters only.
    Memory(MemoryStore),
    /// A Redis server or Cluster shared by every pod of a region (boxed:
    /// `RedisStore` is many times the size of `MemoryStore`).
    #[cfg(feature = "redis")]
    Redis(Box<RedisStore>),
}

impl AnyStore {
    /// Decides `cost` hits under every one of `limits` (a rule's `limits:`)
    /// atomically: admitted only when all admit, and a denial charges none.
    /// One decision per limit (or a single denial; see the stores).
    pub async fn check_all(
        &self,
        limits: &[Limit],
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(s) => {
                let now = now.unwrap_or_else(crate::clock::now_unix_us);
                Ok(s.check_all_at(limits, key, cost, now)?)
            }
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.check_all(limits, key, cost, now).await,
        }
    }

    /// The embedded store, when this is one: it decides in place.
    pub fn in_process(&self) -> Option<&MemoryStore> {
        match self {
            AnyStore::Memory(s) => Some(s),
            #[cfg(feature = "redis")]
            AnyStore::Redis(_) => None,
        }
    }

    /// Whether the store answers (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.ping().await,
        }
    }
}

impl Store for AnyStore {
    async fn check(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        match self {
            AnyStore::Memory(s) => s.check(limit, key, cost, now).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.check(limit, key, cost, now).await,
        }
    }

    async fn peek(
        &self,
        limit: &Limit,
        key: &str,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        match self {
            AnyStore::Memory(s) => s.peek(limit, key, now).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.peek(limit, key, now).await,
        }
    }

    async fn clear(&self, counters: &Counters<'_>, now: Option<Micros>) -> Result<u64, StoreError> {
        match self {
            AnyStore::Memory(s) => s.clear(counters, now).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => s.clear(counters, now).await,
        }
    }
}
