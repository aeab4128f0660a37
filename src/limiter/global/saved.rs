//! The region's allocation table, kept in the region's own Redis so that a
//! pod that starts while no coordinator answers enforces its region's last
//! table — and lapses from it on the lease schedule — instead of denying
//! every check of a global rule.
//!
//! Why the region's Redis and not the pod's own disk: a pod that was down
//! while the centre shrank its region (the region's other pods acknowledged,
//! the freed share went elsewhere) would restore a value the centre no
//! longer reserves, and the region's pods share one counter, so the whole
//! region would admit up to it. Each pod therefore keeps the table it
//! applies *before* it acknowledges the epoch ([`Global::save_through`]),
//! compare-and-set by epoch: the table kept is never older than what the
//! region acknowledged, and whatever it holds stays within what the centre
//! reserves for the region (the values published since that
//! acknowledgement). The memory store has no shared place: nothing is kept
//! or restored there.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use metrics::counter;

use super::Global;
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::table::{SAVED_TABLE_VERSION, SavedTable, Table};
use crate::allocation::{Millis, lapsed_value};
use crate::clock::now_unix_ms;
use crate::cluster_id::ClusterId;
use crate::rules::RuleSet;
use crate::store::RedisStore;
use crate::store::redis::StoredTable;

/// The largest table kept, in bytes of JSON. A table holds at most, per
/// global rule, the coordinators' `--max-key-entries` keys (and as many
/// retiring ones until the next window boundary) of at most 512 bytes:
/// about 20 bytes plus the key per entry (a value pending a window boundary
/// adds ~20, a control character in a key takes 6), so 1,000 entries take
/// 59 KB with 40-byte keys and 531 KB with 512-byte ones (measured by
/// `a_kept_table_of_a_thousand_entries_is_tens_to_hundreds_of_kilobytes`).
/// A larger table is not kept: its epoch is, with no table, so nothing
/// older is restored either.
pub const MAX_SAVED_TABLE_BYTES: usize = 16 << 20;

/// The key outlives the table's lease and longest hold by this much: past
/// them the table admits nothing, but an operator may still read it.
const KEEP_AFTER_LAPSE_MS: i64 = 60_000;

/// Where the table in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// No table: every check of a global rule is denied (`no_allocation`).
    None = 0,
    /// The coordinator stream.
    Coordinator = 1,
    /// The region's Redis, at start, while no coordinator has answered.
    Restored = 2,
}

impl Origin {
    fn from_u8(v: u8) -> Origin {
        match v {
            1 => Origin::Coordinator,
            2 => Origin::Restored,
            _ => Origin::None,
        }
    }

    /// As `/readyz` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::None => "none",
            Origin::Coordinator => "coordinator",
            Origin::Restored => "restored",
        }
    }
}

/// Where in the lease schedule the table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No table.
    None,
    /// Within the lease: the allocation.
    Lease,
    /// Past the lease, within a rule's `fallback_hold`: at most its fallback.
    Fallback,
    /// Past every rule's hold: nothing.
    Lapsed,
}

impl Phase {
    /// As `/readyz` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::None => "none",
            Phase::Lease => "lease",
            Phase::Fallback => "fallback",
            Phase::Lapsed => "lapsed",
        }
    }
}

/// What this pod enforces for global rules, for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationStatus {
    pub origin: Origin,
    pub epoch: u64,
    pub valid_until_ms: Millis,
    pub phase: Phase,
    /// The newest epoch known kept in the region's Redis; `None` when no
    /// table is kept (the memory store).
    pub saved_epoch: Option<u64>,
}

impl std::fmt::Display for AllocationStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "allocation: source={} epoch={} lease_valid_until_unix_ms={} phase={} saved_epoch={}",
            self.origin.as_str(),
            self.epoch,
            self.valid_until_ms,
            self.phase.as_str(),
            self.saved_epoch
                .map_or_else(|| "off".to_string(), |e| e.to_string())
        )
    }
}

/// The region's Redis and name: where its table is kept.
pub(super) struct Keeper {
    store: RedisStore,
    region: String,
}

impl Global {
    /// The same pod keeping its table in the region's Redis (`--store
    /// redis` with `--coordinator`).
    pub fn keeping_table_in(mut self, store: RedisStore, region: &str) -> Global {
        self.keeper = Some(Keeper {
            store,
            region: region.to_string(),
        });
        self
    }

    /// The cluster the coordinator stream follows (`None`: it names none),
    /// kept with each table so a table of another cluster is never restored.
    pub fn follow_cluster(&self, cluster: Option<ClusterId>) {
        let id = cluster.map(|c| c.to_string()).unwrap_or_default();
        *self.cluster.lock().unwrap_or_else(|p| p.into_inner()) = id;
    }

    /// At start, before the coordinator stream: enforces the table the
    /// region's pods kept for `cluster` (the one this pod follows), with
    /// the rules it holds (`rules`, from its cache). Each rule's hold is the
    /// shorter of the kept one and the rules': a pod that missed a rule
    /// change never holds a fallback longer than the centre reserves it.
    /// Does nothing when the region keeps no table of that cluster.
    pub async fn restore(&self, cluster: ClusterId, rules: &RuleSet) {
        let Some(keeper) = &self.keeper else {
            return;
        };
        let stored = match keeper.store.load_table(&keeper.region).await {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                tracing::info!("the region keeps no allocation table: none restored");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the region's allocation table; none restored");
                return;
            }
        };
        if stored.cluster != cluster.to_string() {
            tracing::warn!(kept = %stored.cluster, following = %cluster,
                "the region's allocation table is of another cluster; not restored");
            return;
        }
        self.saved_epoch.fetch_max(stored.epoch, Ordering::SeqCst);
        if stored.table.len() > MAX_SAVED_TABLE_BYTES {
            tracing::warn!(
                bytes = stored.table.len(),
                max = MAX_SAVED_TABLE_BYTES,
                "the region's allocation table is larger than a pod keeps; none restored"
            );
            return;
        }
        if stored.table.is_empty() {
            tracing::warn!(
                epoch = stored.epoch,
                "the region's allocation table was too large to keep; none restored"
            );
            return;
        }
        let saved: SavedTable = match serde_json::from_slice(&stored.table) {
            Ok(saved) => saved,
            Err(e) => {
                tracing::warn!(error = %e, "the region's allocation table is unreadable; none restored");
                return;
            }
        };
        if saved.version != SAVED_TABLE_VERSION || saved.epoch != stored.epoch {
            tracing::warn!(
                version = saved.version,
                epoch = saved.epoch,
                kept = stored.epoch,
                "the region's allocation table is of another format; none restored"
            );
            return;
        }
        let mut table = Table::restored(&saved);
        let mut holds: HashMap<String, i64> = saved.holds.iter().cloned().collect();
        for g in GlobalRule::of_rule_set(rules) {
            let hold = g.policy.fallback_hold_ms;
            holds
                .entry(g.policy.rule)
                .and_modify(|h| *h = (*h).min(hold))
                .or_insert(hold);
        }
        table.set_fallback_holds(holds);
        self.set_counted(rules);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = table;
        self.origin.store(Origin::Restored as u8, Ordering::SeqCst);
        self.follow_cluster(Some(cluster));
        tracing::info!(
            epoch = saved.epoch,
            lease_valid_until_unix_ms = saved.valid_until_ms,
            rules = saved.rules.len(),
            "enforcing the region's last allocation (kept in its Redis) until a coordinator answers"
        );
    }

    /// Keeps the table in the region's Redis if it holds `epoch` or newer
    /// and no newer one is known kept; returns the epoch this pod may
    /// acknowledge: `epoch`, or the last one kept when keeping failed (the
    /// centre then waits, as for a pod that has not applied it). Without a
    /// keeper (memory store), `epoch`.
    pub(super) async fn save_through(&self, epoch: u64) -> u64 {
        let Some(keeper) = &self.keeper else {
            return epoch;
        };
        if epoch == 0 || self.saved_epoch.load(Ordering::SeqCst) >= epoch {
            return epoch;
        }
        match self.save(keeper).await {
            Ok(kept) => {
                self.saved_epoch.fetch_max(kept, Ordering::SeqCst);
            }
            Err(e) => {
                counter!("meridian_allocation_table_saves_total", "outcome" => "failed")
                    .increment(1);
                tracing::warn!(epoch, error = %e,
                    "cannot keep the allocation table in the region's Redis; not acknowledging it yet");
            }
        }
        epoch.min(self.saved_epoch.load(Ordering::SeqCst))
    }

    /// Writes the table in force unless the region's key holds this
    /// cluster's at its epoch or newer; the epoch kept afterwards.
    async fn save(&self, keeper: &Keeper) -> Result<u64, crate::store::StoreError> {
        let cluster = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let epoch = self.table.read().unwrap_or_else(|p| p.into_inner()).epoch();
        // Another pod of the region usually kept it already: one small read
        // instead of the whole table.
        if let Some((kept_cluster, kept)) = keeper.store.saved_table_epoch(&keeper.region).await?
            && kept_cluster == cluster
            && kept >= epoch
        {
            counter!("meridian_allocation_table_saves_total", "outcome" => "kept").increment(1);
            return Ok(kept);
        }
        let (saved, expire_at_ms) = {
            let table = self.table.read().unwrap_or_else(|p| p.into_inner());
            let hold = table
                .rules()
                .map(|r| table.fallback_hold_ms(r))
                .max()
                .unwrap_or(0);
            let until = table.valid_until_ms().saturating_add(hold.max(0));
            (table.saved(), until.saturating_add(KEEP_AFTER_LAPSE_MS))
        };
        let mut table = serde_json::to_vec(&saved).map_err(|e| {
            crate::store::StoreError::Reply(format!("the table does not serialize: {e}"))
        })?;
        let mut outcome = "written";
        if table.len() > MAX_SAVED_TABLE_BYTES {
            tracing::error!(
                epoch = saved.epoch,
                bytes = table.len(),
                max = MAX_SAVED_TABLE_BYTES,
                "the allocation table is too large to keep in the region's Redis: a pod that \
                 starts without a coordinator will enforce no global rule"
            );
            table.clear();
            outcome = "too_large";
        }
        let stored = StoredTable {
            cluster,
            epoch: saved.epoch,
            table,
        };
        let kept = keeper
            .store
            .save_table(&keeper.region, &stored, expire_at_ms)
            .await?;
        counter!("meridian_allocation_table_saves_total", "outcome" => outcome).increment(1);
        Ok(kept)
    }

    /// What this pod enforces for global rules now, and where it came from.
    pub fn allocation_status(&self) -> AllocationStatus {
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let (epoch, valid_until_ms) = (table.epoch(), table.valid_until_ms());
        let phase = if epoch == 0 {
            Phase::None
        } else if now <= valid_until_ms {
            Phase::Lease
        } else if table
            .rules()
            .any(|r| lapsed_value(1, 1, valid_until_ms, table.fallback_hold_ms(r), now) > 0)
        {
            Phase::Fallback
        } else {
            Phase::Lapsed
        };
        drop(table);
        AllocationStatus {
            origin: Origin::from_u8(self.origin.load(Ordering::SeqCst)),
            epoch,
            valid_until_ms,
            phase,
            saved_epoch: self
                .keeper
                .as_ref()
                .map(|_| self.saved_epoch.load(Ordering::SeqCst)),
        }
    }
}
