//! The embedded store: state in this process, for library use, the `local`
//! fail mode, the simulator and tests. Sharded so that threads checking
//! different keys rarely meet on a lock.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use metrics::counter;

use super::huge_pages::HugePages;
use super::{Counters, Limit, Store, StoreError, key};
use crate::algorithm::{Algorithm, Decision, DenyReason, InvalidInput, KeyState, Micros, precheck};

/// Shards a store is split into. 70, not 64: the default million keys is
/// 14,286 a shard, under the 14,336 a table of 16,384 slots holds before it
/// doubles (hashbrown fills tables to 7/8), so a full default store's tables
/// take 141 MiB instead of the 256 MiB of 64 shards at 15,625 keys each.
const SHARDS: usize = 70;

/// Keys a [`MemoryStore`] holds unless told otherwise.
pub const DEFAULT_CAPACITY: usize = 1_000_000;

/// An in-process [`Store`]: each key's algorithm state in one of 70 mutex-guarded
/// shards, so checks of different keys rarely contend. Expired state is dropped
/// lazily as shards are touched; nothing is shared with other processes.
///
/// Bounded: at most `capacity` keys (rounded up to a multiple of 70), each a
/// 128-byte entry holding its state and, when they fit in 46 bytes, its
/// rule's name and the client's key; longer ones take an allocation of their
/// own (at most 2 × `key::MAX_KEY_LEN` = 1,024 bytes, unescaped), and a
/// sliding log's timestamps 8 bytes per hit in its period. A full shard first drops expired state; if that
/// frees nothing, a new key is denied with [`DenyReason::StoreFull`] while
/// the keys already held are decided as usual. Forgetting a held key instead
/// would reset its count, which a flood of fresh keys could then do at will.
///
/// A shard's table of 2 MiB or more (from about 7,200 keys a shard, some
/// 500,000 in the store) sits on transparent huge pages where Linux offers
/// them (`store::huge_pages`): the same bytes, fewer page-table walks.
pub struct MemoryStore {
    /// `std::sync::Mutex`, not tokio's: no `.await` happens while one is held,
    /// and a decision takes well under a microsecond.
    shards: Box<[Mutex<Shard>]>,
    /// One hash per check picks the shard (its high half, [`shard_of`]) and
    /// the slot in it (the table reads the low bits).
    hasher: RandomState,
    /// Keys one shard holds at most.
    per_shard: usize,
}

#[derive(Default)]
struct Shard {
    /// Keyed by the hash of a [`StateId`]; the rule and key are in the entry,
    /// so a hit builds, formats and allocates nothing. On huge pages once
    /// large: over 1 M keys a slot on 4 KiB pages cost a TLB miss per check.
    entries: HashTable<Entry, HugePages>,
    /// Checks since expired entries were last swept; a sweep runs once this
    /// reaches the shard's size, so its cost is O(1) per check amortised.
    since_sweep: usize,
    /// No entry expires before this: a lower bound, lowered whenever an
    /// entry's expiry is set, made exact by each sweep. A sweep before it
    /// would drop nothing, so it is skipped. Without it a full shard scanned
    /// all its entries for every new key it refused (a flood of new keys
    /// cost a whole shard's scan each, and 1 M keys in a store of 1 M, a few
    /// shards a little over their share, spent a third of their time there).
    earliest_expiry: Micros,
}

impl Shard {
    /// Drops expired entries, unless none can have expired yet.
    fn sweep(&mut self, now: Micros) {
        if now < self.earliest_expiry {
            return;
        }
        let mut earliest = Micros::MAX;
        self.entries.retain(|e| {
            let live = e.expires_at > now;
            if live {
                earliest = earliest.min(e.expires_at);
            }
            live
        });
        self.earliest_expiry = earliest;
    }
}

/// The bytes of a rule name and a client key held in an [`Entry`] itself.
/// 46 makes an entry two cache lines, which hold UUID keys under rule names
/// of up to ten bytes; longer names take an allocation of their own.
const INLINE_NAME: usize = 46;

// Aligned so that an entry takes exactly two adjacent cache lines, which
// the CPU fetches together: a check over many keys misses once (the slot),
// not on a third line, or on the name elsewhere.
#[repr(align(64))]
struct Entry {
    /// The rule's name followed by the client's key, as given: compared part
    /// by part, never escaped or formatted (the parts are told apart by
    /// `rule_len`, so ("a:b", "c") and ("a", "b:c") stay two entries).
    name: Name,
    /// Bytes of `name` that are the rule's (at most `key::MAX_KEY_LEN`).
    rule_len: u16,
    /// The algorithm the state was decided under (a rule switched to another
    /// algorithm starts afresh, as the Redis keys' tags make it there).
    algorithm: Algorithm,
    /// Which of a rule's `limits:` (0: the first, and every one-limit rule).
    limit_index: u16,
    hash: u64,
    state: KeyState,
    expires_at: Micros,
}

/// An entry's name: in the entry while it fits, so a lookup reads the
/// table's slot and nothing else (a name always in its own allocation cost
/// a second cache miss per check over 1 M keys: 17 % of the time there).
enum Name {
    Inline { len: u8, bytes: [u8; INLINE_NAME] },
    Heap(Box<[u8]>),
}

impl Name {
    fn new(rule: &str, key: &str) -> Name {
        let len = rule.len() + key.len();
        if len <= INLINE_NAME {
            let mut bytes = [0; INLINE_NAME];
            bytes[..rule.len()].copy_from_slice(rule.as_bytes());
            bytes[rule.len()..len].copy_from_slice(key.as_bytes());
            // `len` ≤ INLINE_NAME < 256.
            return Name::Inline {
                len: len as u8,
                bytes,
            };
        }
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(rule.as_bytes());
        bytes.extend_from_slice(key.as_bytes());
        Name::Heap(bytes.into_boxed_slice())
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Name::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Name::Heap(bytes) => bytes,
        }
    }
}

/// Which state a check reads: what the Redis store spells
/// `mr:{<rule>:<key>}:<tag>` (and `…:<j>` for limit j), kept as its parts.
#[derive(Clone, Copy)]
struct StateId<'a> {
    rule: &'a str,
    key: &'a str,
    algorithm: Algorithm,
    limit_index: u16,
}

impl StateId<'_> {
    fn hash(&self, hasher: &RandomState) -> u64 {
        // Hashing a tuple of strs writes each one's length: no two splits
        // of the same bytes hash alike by construction.
        hasher.hash_one((self.rule, self.key, self.algorithm, self.limit_index))
    }

    fn is(&self, e: &Entry) -> bool {
        let (rule, key) = e.name.as_bytes().split_at(usize::from(e.rule_len));
        e.algorithm == self.algorithm
            && e.limit_index == self.limit_index
            && rule == self.rule.as_bytes()
            && key == self.key.as_bytes()
    }

    fn entry(&self, hash: u64, state: KeyState) -> Entry {
        Entry {
            name: Name::new(self.rule, self.key),
            // `key::check` holds a rule to MAX_KEY_LEN (512) bytes.
            rule_len: self.rule.len() as u16,
            algorithm: self.algorithm,
            limit_index: self.limit_index,
            hash,
            state,
            expires_at: 0,
        }
    }
}

impl MemoryStore {
    /// An empty store of [`DEFAULT_CAPACITY`] keys.
    pub fn new() -> MemoryStore {
        MemoryStore::with_capacity(DEFAULT_CAPACITY)
    }

    /// An empty store holding at most `capacity` keys (see the type's doc).
    pub fn with_capacity(capacity: usize) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    /// Decides a check at time `now` (µs since the Unix epoch), synchronously:
    /// the in-process library calls this on its hot path.
    pub fn check_at(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Micros,
    ) -> Result<Decision, InvalidInput> {
        if let Some(denied) = precheck(&limit.params, cost)? {
            return Ok(denied);
        }
        self.decide_at(limit, key, cost, now)
    }

    /// [`Store::peek`], synchronously.
    pub fn peek_at(&self, limit: &Limit, key: &str, now: Micros) -> Result<Decision, InvalidInput> {
        self.decide_at(limit, key, 0, now)
    }

    /// Every algorithm reads a cost of 0 as "decide without consuming".
    fn decide_at(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Micros,
    ) -> Result<Decision, InvalidInput> {
        key::check(&limit.rule, key)?;
        let id = StateId {
            rule: &limit.rule,
            key,
            algorithm: limit.params.algorithm(),
            limit_index: 0,
        };
        Ok(self.decide(id, now, cost, limit))
    }

    fn decide(&self, id: StateId<'_>, now: Micros, cost: u64, limit: &Limit) -> Decision {
        let algorithm = id.algorithm;
        let hash = id.hash(&self.hasher);
        let shard = &self.shards[shard_of(hash)];
        // A poisoned shard only means another thread panicked mid-decision; the
        // map itself is intact, so keep serving.
        let mut guard = shard.lock().unwrap_or_else(|e| e.into_inner());
        let shard = &mut *guard;
        shard.since_sweep += 1;
        if shard.since_sweep >= shard.entries.len().max(1024) {
            shard.sweep(now);
            shard.since_sweep = 0;
        }
        if shard.entries.len() >= self.per_shard && shard.entries.find(hash, |e| id.is(e)).is_none()
        {
            shard.sweep(now);
            shard.since_sweep = 0;
            if shard.entries.len() >= self.per_shard {
                drop(guard);
                return store_full(limit);
            }
        }
        let entry = shard
            .entries
            .entry(hash, |e| id.is(e), |e| e.hash)
            .or_insert_with(|| id.entry(hash, KeyState::fresh(algorithm)))
            .into_mut();
        if entry.expires_at <= now {
            entry.state = KeyState::fresh(algorithm);
        }
        let outcome = entry.state.decide(now, cost, &limit.params);
        entry.expires_at = now + outcome.keep_for_us;
        shard.earliest_expiry = shard.earliest_expiry.min(entry.expires_at);
        outcome.decision
    }

    /// Decides `cost` hits on `key` under every one of `limits` at once, as
    /// the Redis multi script does: each limit is decided on a copy of its
    /// state, and the states are kept only when every limit admits, so a
    /// denial charges none. The shards involved are locked together, in
    /// index order (so two such checks cannot deadlock). One decision per
    /// limit, or one denial when a limit cannot take the cost at all or the
    /// store is full.
    pub fn check_all_at(
        &self,
        limits: &[Limit],
        key: &str,
        cost: u64,
        now: Micros,
    ) -> Result<Vec<Decision>, InvalidInput> {
        // A cost of 0 is a check-only peek, which precheck refuses.
        for limit in limits.iter().filter(|_| cost > 0) {
            if let Some(denied) = precheck(&limit.params, cost)? {
                return Ok(vec![denied]);
            }
        }
        let keys = self.state_ids(limits, key)?;
        let (order, mut guards) = self.lock_shards(&keys);
        for (id, hash) in &keys {
            let shard = &mut guards[slot_in(&order, *hash)];
            if shard.entries.len() >= self.per_shard
                && shard.entries.find(*hash, |e| id.is(e)).is_none()
            {
                shard.sweep(now);
                if shard.entries.len() >= self.per_shard {
                    return Ok(vec![store_full(&limits[0])]);
                }
            }
        }
        let mut decided = Vec::with_capacity(limits.len());
        let mut before = Vec::with_capacity(limits.len());
        for ((id, hash), limit) in keys.iter().zip(limits) {
            let shard = &guards[slot_in(&order, *hash)];
            let state = shard
                .entries
                .find(*hash, |e| id.is(e))
                .filter(|e| e.expires_at > now)
                .map_or_else(
                    || KeyState::fresh(limit.params.algorithm()),
                    |e| e.state.clone(),
                );
            let mut after = state.clone();
            let outcome = after.decide(now, cost, &limit.params);
            before.push(state);
            decided.push((after, outcome));
        }
        if !decided.iter().all(|(_, o)| o.decision.allowed) {
            // Nothing is kept; a limit that would have admitted reports what
            // a check-only peek sees, as the Redis script does.
            return Ok(decided
                .into_iter()
                .zip(before)
                .zip(limits)
                .map(|(((_, o), mut state), limit)| match o.decision.allowed {
                    true => state.decide(now, 0, &limit.params).decision,
                    false => o.decision,
                })
                .collect());
        }
        {
            for ((id, hash), (state, outcome)) in keys.iter().zip(&decided) {
                let shard = &mut guards[slot_in(&order, *hash)];
                let entry = shard
                    .entries
                    .entry(*hash, |e| id.is(e), |e| e.hash)
                    .or_insert_with(|| id.entry(*hash, state.clone()))
                    .into_mut();
                entry.state = state.clone();
                entry.expires_at = now + outcome.keep_for_us;
                let expires_at = entry.expires_at;
                shard.earliest_expiry = shard.earliest_expiry.min(expires_at);
            }
        }
        Ok(decided.into_iter().map(|(_, o)| o.decision).collect())
    }

    /// Each limit's entry id for `key`, with its hash (the key validated).
    fn state_ids<'a>(
        &self,
        limits: &'a [Limit],
        key: &'a str,
    ) -> Result<Vec<(StateId<'a>, u64)>, InvalidInput> {
        let mut keys = Vec::with_capacity(limits.len());
        for (j, limit) in limits.iter().enumerate() {
            key::check(&limit.rule, key)?;
            let id = StateId {
                rule: &limit.rule,
                key,
                algorithm: limit.params.algorithm(),
                limit_index: limit_index(j)?,
            };
            keys.push((id, id.hash(&self.hasher)));
        }
        Ok(keys)
    }

    /// Locks the shards of `keys` in shard order (so two multi-limit calls
    /// never wait on each other crosswise): the shard indexes, sorted, and
    /// their guards in the same order.
    fn lock_shards(&self, keys: &[(StateId<'_>, u64)]) -> (Vec<usize>, Vec<MutexGuard<'_, Shard>>) {
        let mut order: Vec<usize> = keys.iter().map(|(_, h)| shard_of(*h)).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order
            .iter()
            .map(|&i| self.shards[i].lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        (order, guards)
    }

    /// Runs `settle(j, state)` on `key`'s live state under each of `limits`
    /// (fresh state where none is held), with the shards involved locked
    /// together as in [`MemoryStore::check_all_at`], and keeps each state for
    /// the `keep_for_us` of the outcome `settle` returns: a reservation's
    /// refund or excess charge (`store::reservation`). A key new to a full
    /// shard is not added: `settle` is not called for it, and it answers
    /// `R::default()` with a fresh state's peek.
    pub fn settle_states_at<R: Default>(
        &self,
        limits: &[Limit],
        key: &str,
        now: Micros,
        mut settle: impl FnMut(usize, &mut KeyState) -> (R, crate::algorithm::Outcome),
    ) -> Result<Vec<(R, Decision)>, InvalidInput> {
        let keys = self.state_ids(limits, key)?;
        let (order, mut guards) = self.lock_shards(&keys);
        let mut out = Vec::with_capacity(limits.len());
        for (j, ((id, hash), limit)) in keys.iter().zip(limits).enumerate() {
            let shard = &mut guards[slot_in(&order, *hash)];
            let held = shard.entries.find(*hash, |e| id.is(e)).is_some();
            if !held && shard.entries.len() >= self.per_shard {
                let mut fresh = KeyState::fresh(limit.params.algorithm());
                out.push((R::default(), fresh.decide(now, 0, &limit.params).decision));
                continue;
            }
            let entry = shard
                .entries
                .entry(*hash, |e| id.is(e), |e| e.hash)
                .or_insert_with(|| id.entry(*hash, KeyState::fresh(limit.params.algorithm())))
                .into_mut();
            if entry.expires_at <= now {
                entry.state = KeyState::fresh(limit.params.algorithm());
            }
            let (r, outcome) = settle(j, &mut entry.state);
            entry.expires_at = entry.expires_at.max(now + outcome.keep_for_us);
            let expires_at = entry.expires_at;
            shard.earliest_expiry = shard.earliest_expiry.min(expires_at);
            out.push((r, outcome.decision));
        }
        Ok(out)
    }

    /// [`Store::clear`] at time `now`, synchronously: drops the entry of
    /// every algorithm under each key and limit (an entry names the
    /// algorithm, not the window, so no period is needed). Counts the
    /// entries that still held live state.
    pub fn clear_at(&self, counters: &Counters<'_>, now: Micros) -> Result<u64, InvalidInput> {
        let mut cleared = 0;
        for key in counters.keys {
            key::check(counters.rule, key)?;
            for j in 0..counters.limits.max(1) {
                for algorithm in Algorithm::ALL {
                    let id = StateId {
                        rule: counters.rule,
                        key,
                        algorithm,
                        limit_index: limit_index(j)?,
                    };
                    let hash = id.hash(&self.hasher);
                    let shard = &self.shards[shard_of(hash)];
                    let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
                    if let Ok(entry) = shard.entries.find_entry(hash, |e| id.is(e)) {
                        let (removed, _) = entry.remove();
                        cleared += u64::from(removed.expires_at > now);
                    }
                }
            }
        }
        Ok(cleared)
    }

    /// Keys currently held, expired or not (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).entries.len())
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the shards' tables have allocated (entries and control bytes).
    #[cfg(test)]
    fn table_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()))
            .map(|s| s.entries.allocation_size())
            .sum()
    }
}

/// Where the guard of `hash`'s shard is among guards taken in `order` (the
/// sorted shard indexes [`MemoryStore::lock_shards`] answers).
fn slot_in(order: &[usize], hash: u64) -> usize {
    order.binary_search(&shard_of(hash)).unwrap_or(0)
}

/// The shard of a key whose hash is `hash`: from the hash's high half, since
/// a table picks a key's slot from the low bits — a shard chosen by them too
/// holds only keys alike in them, which then all start their probe in the
/// same few slots.
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

/// Limit `j` of a rule's `limits:` as an entry names it (rules hold a
/// handful; a `u16` keeps the entry small).
fn limit_index(j: usize) -> Result<u16, InvalidInput> {
    u16::try_from(j).map_err(|_| InvalidInput::new("limits", j, "at most 65,535 limits a rule"))
}

/// The denial of a key a full store cannot take: retry once held state
/// has expired (a second is a guess; the store cannot know when).
fn store_full(limit: &Limit) -> Decision {
    counter!("meridian_memory_store_full_total", "rule" => limit.rule.clone()).increment(1);
    Decision {
        allowed: false,
        limit: limit.params.limit(),
        remaining: 0,
        reset_after_us: 1_000_000,
        retry_after_us: 1_000_000,
        delay_us: 0,
        reason: Some(DenyReason::StoreFull),
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl Store for MemoryStore {
    async fn check(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        Ok(self.check_at(
            limit,
            key,
            cost,
            now.unwrap_or_else(crate::clock::now_unix_us_fast),
        )?)
    }

    async fn peek(
        &self,
        limit: &Limit,
        key: &str,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        Ok(self.peek_at(
            limit,
            key,
            now.unwrap_or_else(crate::clock::now_unix_us_fast),
        )?)
    }

    async fn clear(&self, counters: &Counters<'_>, now: Option<Micros>) -> Result<u64, StoreError> {
        Ok(self.clear_at(counters, now.unwrap_or_else(crate::clock::now_unix_us))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, DenyReason, Params};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    fn limit(algorithm: Algorithm, n: i64) -> Limit {
        Limit {
            rule: "r".into(),
            params: Params::new(algorithm, n, Duration::from_secs(60), None).unwrap(),
        }
    }

    #[test]
    fn many_threads_admit_exactly_the_limit() {
        let store = MemoryStore::new();
        for algorithm in Algorithm::ALL {
            let l = limit(algorithm, 1000);
            let admitted = AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        for _ in 0..200 {
                            if store.check_at(&l, "k", 1, 1_000_000_000).unwrap().allowed {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(admitted.into_inner(), 1000, "{algorithm}");
        }
    }

    #[test]
    fn expired_entries_are_swept() {
        let store = MemoryStore::new();
        let l = limit(Algorithm::FixedWindow, 10);
        for i in 0..5000 {
            store.check_at(&l, &format!("k{i}"), 1, 0).unwrap();
        }
        assert!(store.len() >= 5000);
        // An hour later every window has expired; traffic on 2000 other keys
        // reaches every shard often enough to sweep the old ones away.
        for i in 0..(SHARDS * 6000) {
            store
                .check_at(&l, &format!("n{}", i % 2000), 1, 3_600_000_000)
                .unwrap();
        }
        assert_eq!(store.len(), 2000);
    }

    #[test]
    fn a_flood_of_new_keys_cannot_grow_a_full_store_or_reset_held_keys() {
        let store = MemoryStore::with_capacity(SHARDS * 10);
        let l = limit(Algorithm::FixedWindow, 2);
        // A key in use before the flood: 2 of 2 used.
        assert!(store.check_at(&l, "held", 1, 0).unwrap().allowed);
        assert!(store.check_at(&l, "held", 1, 0).unwrap().allowed);
        let mut refused = 0;
        for i in 0..100_000 {
            let d = store.check_at(&l, &format!("flood{i}"), 1, 0).unwrap();
            if d.reason == Some(DenyReason::StoreFull) {
                refused += 1;
            }
        }
        assert!(store.len() <= SHARDS * 10, "{} keys held", store.len());
        assert!(refused >= 100_000 - SHARDS * 10, "{refused} refused");
        // The held key keeps its count: still denied, and over limit, not full.
        let d = store.check_at(&l, "held", 1, 0).unwrap();
        assert_eq!((d.allowed, d.reason), (false, Some(DenyReason::OverLimit)));
        // Once the window is over, expired keys make room again.
        let later = 120_000_000;
        assert!(store.check_at(&l, "fresh", 1, later).unwrap().allowed);
    }

    /// The per-key bound the type's doc states: an entry's own bytes (a
    /// long name and a sliding log's timestamps live in their own
    /// allocations).
    #[test]
    fn an_entry_is_no_larger_than_documented() {
        const ENTRY_BYTES: usize = 128;
        assert!(
            std::mem::size_of::<Entry>() <= ENTRY_BYTES,
            "{} bytes",
            std::mem::size_of::<Entry>()
        );
    }

    /// The memory the type's doc and `SHARDS` promise: a default store
    /// filled to its capacity keeps every shard's table at 16,384 slots.
    #[test]
    fn a_full_default_store_takes_141_mib_of_tables() {
        let store = MemoryStore::new();
        let l = limit(Algorithm::FixedWindow, 10);
        for i in 0..DEFAULT_CAPACITY {
            store.check_at(&l, &format!("customer-{i}"), 1, 0).unwrap();
        }
        // Keys over a shard's share are refused (StoreFull), so a few
        // hundred fewer than a million are held.
        assert!(
            store.len() > DEFAULT_CAPACITY * 99 / 100,
            "{} held",
            store.len()
        );
        let per_shard = 16_384 * (std::mem::size_of::<Entry>() + 1) + 64;
        assert!(
            store.table_bytes() <= SHARDS * per_shard,
            "{} bytes of tables, more than {SHARDS} × {per_shard}",
            store.table_bytes()
        );
    }

    /// A name held in the entry and one in its own allocation count alike,
    /// and either way a rule and a key are told apart at their boundary.
    #[test]
    fn short_and_long_names_keep_their_own_counts() {
        let store = MemoryStore::new();
        let long = "k".repeat(INLINE_NAME);
        let long_b = format!("b{long}");
        let ids = [("ab", "c"), ("a", "bc"), ("ab", &long), ("a", &long_b)];
        for round in 0..2 {
            for (rule, key) in ids {
                let l = Limit {
                    rule: rule.into(),
                    ..limit(Algorithm::FixedWindow, 1)
                };
                let d = store.check_at(&l, key, 1, 0).unwrap();
                assert_eq!(d.allowed, round == 0, "{rule:?} {key:?} in round {round}");
            }
        }
        assert_eq!(store.len(), ids.len());
    }

    #[test]
    fn bad_input_is_an_error_and_oversized_cost_a_reasoned_denial() {
        let store = MemoryStore::new();
        let l = limit(Algorithm::TokenBucket, 10);
        assert_eq!(store.check_at(&l, "k", 0, 0).unwrap_err().field, "cost");
        let d = store.check_at(&l, "k", 11, 0).unwrap();
        assert!(!d.allowed);
        assert_eq!(
            d.reason,
            Some(DenyReason::CostExceedsCapacity {
                cost: 11,
                capacity: 10
            })
        );
        let long = "k".repeat(600);
        assert_eq!(store.check_at(&l, &long, 1, 0).unwrap_err().field, "key");
    }
}
