//! Global rules in a region: enforce this region's allocation, report demand,
//! acknowledge epochs, ask for early top-ups.
//!
//! The allocation arrives on the coordinator stream (`rule_feed`) and lives
//! in an [`allocation::table::Table`]: epoch fencing, window-boundary
//! switching and lease fallback are the pure module's. A check of a global
//! rule passes this region's value as the limit to the ordinary hot path —
//! no cross-region call. Without `--coordinator` there is no allocation and a
//! global rule is enforced at its whole limit (one region).
//!
//! What the pod counted and what its reports say is the pure
//! [`PodAccount`]'s (the simulator's pods report through it too); this
//! module holds it behind a lock and publishes the gauges; `reporter` sends its
//! reports over gRPC on the interval the coordinators give ([`ReportInterval`]),
//! `flight` tracks the checks a report waits for, and `saved` keeps the
//! table in the region's Redis before each acknowledgement and restores it
//! when the pod starts while no coordinator answers.

mod flight;
mod reporter;
mod saved;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use metrics::{counter, gauge};
use tokio::sync::Notify;

use crate::algorithm::{InvalidInput, Params};
use crate::allocation::Millis;
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::pod::{Decided, PodAccount, ResetTells, Settlement};
use crate::allocation::table::{RegionUpdate, Table};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::rules::{Rule, RuleSet, Scope};
use crate::store::reservation::LimitSettled;

use flight::Flight;
pub use flight::InFlight;
use reporter::ReportInterval;
use saved::{Keeper, Origin};

/// What limit a check runs against.
#[derive(Debug, Clone)]
pub enum GlobalLimit {
    /// Not a global rule here (or no coordinator): the rule's own limit.
    Rule,
    /// This region's allocation.
    Allocated(Params),
    /// The region holds nothing for this key (allocation 0, or none received
    /// yet): deny without a store call.
    Nothing,
}

/// What limits a check of a `limits:` rule runs against.
#[derive(Debug, Clone)]
pub enum GlobalLimits {
    /// Not a global rule here (or no coordinator): the rule's own limits.
    Rule,
    /// This region's allocation of each limit, in the rule's order.
    Allocated(Vec<Params>),
    /// The region holds nothing for this key under at least one limit.
    Nothing,
}

/// A decided check of a global rule, as the demand report counts it.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    /// Hits asked (0 = check only: not demand).
    pub cost: u64,
    /// Admitted (a shadow denial counts as denied: it is demand unserved).
    pub allowed: bool,
    /// The decision's limit and remaining.
    pub limit: u64,
    pub remaining: u64,
    /// The decision's time to its reset: for a fixed window, when the
    /// window it was counted in ends.
    pub reset_after_us: u64,
    /// `limit − remaining` is the key's count against the rule's allocation
    /// (false for an override, whose count is against its own limit).
    pub window_use: bool,
}

/// This pod's view of global rules: the region's allocation table (written by
/// the coordinator stream, read by every check), the demand counted since the
/// last report, and what wakes the reporter. One per process, shared by the
/// workers and the control tasks.
pub struct Global {
    /// False without `--coordinator`: every rule runs at its own limit.
    coordinated: bool,
    /// The allocations; `std::sync::RwLock`: read on every check of a global
    /// rule, written per epoch, never held across an `.await`.
    table: RwLock<Table>,
    /// What this pod counted and holds for its reports;
    /// `std::sync::Mutex`, held for one decision's update or one report's cut.
    account: Mutex<PodAccount>,
    /// Wakes the reporter early: a top-up request, or an epoch to acknowledge.
    wake: Notify,
    /// How often demand is reported (set by the coordinator stream).
    report_interval: ReportInterval,
    /// Rules counted exactly in fixed windows → their period (ms): the ones
    /// whose window use is reported (see [`crate::allocation::WindowUse`]).
    counted: RwLock<HashMap<String, u64>>,
    /// Checks under way, which a report drains before reading the window use.
    flight: Flight,
    /// The region's Redis, where the table is kept for pods that start
    /// while no coordinator answers; `None` with the memory store.
    keeper: Option<Keeper>,
    /// The newest epoch known kept in the region's Redis (0: none): reports
    /// acknowledge no newer one. Written by the reporter (and the restore).
    saved_epoch: AtomicU64,
    /// Where the table in force came from ([`Origin`] as a byte): written
    /// with the table, read by `/readyz` and the gauges.
    origin: AtomicU8,
    /// The id of the cluster the coordinator stream follows ("": none), kept
    /// with the table. `std` mutex: cloned out, never held across an await.
    cluster: Mutex<String>,
    /// This pod's answers to counter resets, repeated in every report while
    /// the order is pending for the region (a dropped report loses none);
    /// bounded by the orders pending, which the coordinators bound.
    resets_applied: Mutex<std::collections::BTreeMap<u64, pb::ResetApplied>>,
}

impl Global {
    pub fn new(region: &str, pod: &str, coordinated: bool) -> Global {
        Global {
            coordinated,
            table: RwLock::new(Table::default()),
            // The process starts now: windows that began before are not
            // its to report (a predecessor under the same name may have
            // admitted in them).
            account: Mutex::new(PodAccount::new(region, pod).started_at(now_unix_ms())),
            wake: Notify::new(),
            report_interval: ReportInterval::default(),
            counted: RwLock::new(HashMap::new()),
            flight: Flight::default(),
            keeper: None,
            saved_epoch: AtomicU64::new(0),
            origin: AtomicU8::new(Origin::None as u8),
            cluster: Mutex::new(String::new()),
            resets_applied: Mutex::default(),
        }
    }

    /// Marks a check of `rule` as under way until the guard drops; `None`
    /// for rules this region does not count against an allocation.
    pub fn flight(&self, rule: &Rule) -> Option<InFlight<'_>> {
        self.is_global(rule).then(|| self.flight.enter())
    }

    /// Limits whose window use this pod reports: exact fixed windows, where
    /// a decision's `limit − remaining` is the key's count in the window.
    fn counted_window_ms(rule: &Rule, index: usize) -> Option<u64> {
        GlobalRule::of_limit(rule, index)
            .filter(|g| g.counted && g.period_ms > 0)
            .map(|g| g.period_ms)
    }

    /// A limiter that takes no allocations (rules from files, the library).
    pub fn uncoordinated() -> Global {
        Global::new("", "", false)
    }

    /// Records this pod's answer to a reset and reports it soon.
    pub fn reset_applied(&self, answer: pb::ResetApplied) {
        self.resets_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(answer.id, answer);
        self.wake.notify_one();
    }

    /// Keeps only the answers to orders still pending (`ids`): the others
    /// were recorded, or are too old to matter.
    pub fn resets_pending(&self, ids: &std::collections::BTreeSet<u64>) {
        self.resets_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| ids.contains(id));
    }

    /// The answers to report.
    fn resets_to_report(&self) -> Vec<pb::ResetApplied> {
        self.resets_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Whether this pod reports demand (it follows coordinators).
    pub fn reports(&self) -> bool {
        self.coordinated
    }

    fn account(&self) -> std::sync::MutexGuard<'_, PodAccount> {
        self.account.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_global(&self, rule: &Rule) -> bool {
        self.coordinated && rule.scope == Scope::Global && rule.params.is_some()
    }

    /// The limit for `key` of `rule` in this region now. `overridden` is an
    /// Envoy per-descriptor limit: on a global rule it is the key's limit
    /// world-wide, of which this region holds the share its allocation holds
    /// of the rule's limit (so the regions' shares still add up to it).
    pub fn limit(
        &self,
        rule: &Rule,
        key: &str,
        overridden: Option<&Params>,
    ) -> Result<GlobalLimit, InvalidInput> {
        if !self.is_global(rule) {
            return Ok(GlobalLimit::Rule);
        }
        let Some(params) = &rule.params else {
            return Ok(GlobalLimit::Rule);
        };
        self.allocated(&rule.id, params, key, overridden)
    }

    /// The limits for `key` of a `limits:` rule in this region now: each
    /// limit is allocated on its own ([`Rule::limit_id`]), and the region
    /// holds nothing for the key when it holds nothing under any one of them.
    pub fn limits(&self, rule: &Rule, key: &str) -> Result<GlobalLimits, InvalidInput> {
        if !self.is_global(rule) {
            return Ok(GlobalLimits::Rule);
        }
        let mut limits = Vec::with_capacity(rule.also.len() + 1);
        for (index, params) in rule.limits().enumerate() {
            match self.allocated(&rule.limit_id(index), params, key, None)? {
                GlobalLimit::Allocated(p) => limits.push(p),
                GlobalLimit::Rule => limits.push(params.clone()),
                GlobalLimit::Nothing => return Ok(GlobalLimits::Nothing),
            }
        }
        Ok(GlobalLimits::Allocated(limits))
    }

    /// This region's value of the limit allocated under `id` (whose rule
    /// gives it `params`), applied to `overridden` when there is one.
    fn allocated(
        &self,
        id: &str,
        params: &Params,
        key: &str,
        overridden: Option<&Params>,
    ) -> Result<GlobalLimit, InvalidInput> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let Some(allocated) = table.limit(id, key, now_unix_ms()) else {
            return Ok(GlobalLimit::Nothing);
        };
        let allocated = allocated.min(params.limit());
        let whole = overridden.unwrap_or(params);
        if allocated == params.limit() {
            return Ok(GlobalLimit::Allocated(whole.clone()));
        }
        let share = |n: u64| (n as u128 * allocated as u128 / params.limit().max(1) as u128) as u64;
        let limit = share(whole.limit());
        if limit == 0 {
            return Ok(GlobalLimit::Nothing);
        }
        // Buckets: the burst is divided in the same proportion as the rate.
        let burst = whole
            .algorithm()
            .has_burst()
            .then(|| share(whole.burst()).max(1) as i64);
        Ok(GlobalLimit::Allocated(Params::new(
            whole.algorithm(),
            limit as i64,
            whole.period(),
            burst,
        )?))
    }

    /// Counts a decided check of a global rule; asks for a top-up when the
    /// key used 90 % of its allocation before the window is over.
    pub fn record(&self, rule: &Rule, key: &str, counted: Counted) {
        self.record_limit(rule, 0, key, counted);
    }

    /// [`Global::record`] for limit `index` of a `limits:` rule, counted
    /// under its own id ([`Rule::limit_id`]).
    pub fn record_limit(&self, rule: &Rule, index: usize, key: &str, counted: Counted) {
        let Counted {
            cost,
            allowed,
            limit,
            remaining,
            reset_after_us,
            window_use,
        } = counted;
        if !self.is_global(rule) || cost == 0 {
            return;
        }
        let Some(params) = rule.limits().nth(index) else {
            return;
        };
        let id = rule.limit_id(index);
        let algorithm = params.algorithm();
        let decided = Decided {
            rule: id.as_ref(),
            key,
            period_ms: params.period().as_millis() as u64,
            cost,
            allowed,
            limit,
            remaining,
            reset_after_us,
            window_use,
            reset_tells: ResetTells::of(algorithm),
            // Looked up only when it matters: it builds the rule's policy.
            counted: allowed && window_use && Self::counted_window_ms(rule, index).is_some(),
            windowed: !algorithm.has_burst(),
        };
        let asked_top_up = self.account().record(&decided, now_unix_ms());
        if asked_top_up {
            counter!("meridian_allocation_top_ups_total", "rule" => id.into_owned()).increment(1);
            self.wake.notify_one();
        }
    }

    /// Counts a settled reservation of limit `index` of a global rule: its
    /// refund and excess turn the estimate counted at admission into the
    /// settled cost the demand report carries (see [`PodAccount::settled`]).
    /// `window_use`: the settlement's limit is the rule's allocation (no
    /// override), so its count is the key's use of it.
    pub fn settled(
        &self,
        rule: &Rule,
        index: usize,
        key: &str,
        settled: &LimitSettled,
        age_us: u64,
        window_use: bool,
    ) {
        if !self.is_global(rule) {
            return;
        }
        let Some(params) = rule.limits().nth(index) else {
            return;
        };
        let id = rule.limit_id(index);
        let settlement = Settlement {
            rule: id.as_ref(),
            key,
            period_ms: params.period().as_millis() as u64,
            refunded: settled.refunded,
            charged: settled.charged,
            charged_age_ms: age_us / 1_000,
            used: (window_use && Self::counted_window_ms(rule, index).is_some())
                .then(|| settled.limit.saturating_sub(settled.remaining)),
        };
        self.account().settled(&settlement, now_unix_ms());
    }

    /// Adds `delta` (an estimate opened here, or minus one settled here)
    /// to the reservations open on `key` under every limit of a global
    /// `rule`, until `expires_in_ms` from now, for the reports (`ctl
    /// usage` shows reserved vs settled).
    pub fn open_reservation(&self, rule: &Rule, key: &str, delta: i64, expires_in_ms: u64) {
        if !self.is_global(rule) {
            return;
        }
        let now = now_unix_ms();
        let until = now.saturating_add(expires_in_ms.min(i64::MAX as u64) as i64);
        let mut account = self.account();
        for index in 0..=rule.also.len() {
            account.open_reservation(&rule.limit_id(index), key, delta, until);
        }
    }

    /// Applies an allocation update from the coordinator stream. True when
    /// it raised a value at once (a grant within the window): keys the
    /// over-limit cache holds as denied until the window ends may pass now.
    pub fn apply(&self, update: &pb::AllocationUpdate, rules: &RuleSet) -> bool {
        let update = RegionUpdate::from(update);
        self.set_counted(rules);
        let window = |id: &str| {
            let (rule, index) = rules.limit_of(id)?;
            GlobalRule::of_limit(rule, index)?.policy.window_ms
        };
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        let result = table.apply(&update, now_unix_ms(), window);
        // Each rule's fallback_hold comes from the rules this pod holds,
        // so the step-down happens even if no update ever comes again.
        table.set_fallback_holds(
            GlobalRule::of_rule_set(rules)
                .into_iter()
                .map(|g| (g.policy.rule, g.policy.fallback_hold_ms))
                .collect(),
        );
        drop(table);
        let now = now_unix_ms();
        let holds = |until: Millis| until == 0 || now < until;
        let raised_now = update.rules.iter().any(|r| {
            (r.split_now.immediate && holds(r.split_now.until_ms))
                || r.keys_now
                    .iter()
                    .any(|(_, n)| n.immediate && holds(n.until_ms))
        });
        match result {
            Ok(()) => {
                self.origin
                    .store(Origin::Coordinator as u8, Ordering::SeqCst);
                gauge!("meridian_allocation_epoch").set(update.epoch as f64);
                gauge!("meridian_allocation_valid_until_seconds")
                    .set(update.valid_until_ms as f64 / 1000.0);
                tracing::debug!(
                    epoch = update.epoch,
                    full = update.full,
                    "allocation applied"
                );
                // Acknowledge at once: grows elsewhere wait for it.
                self.wake.notify_one();
                raised_now
            }
            Err(refused) => {
                counter!("meridian_allocation_stale_updates_total").increment(1);
                tracing::debug!(?refused, "allocation update ignored");
                false
            }
        }
    }

    /// The limits of `rules` whose window use this pod reports.
    fn set_counted(&self, rules: &RuleSet) {
        *self.counted.write().unwrap_or_else(|p| p.into_inner()) = rules
            .rules()
            .flat_map(|r| {
                (0..=r.also.len()).filter_map(move |i| {
                    Some((r.limit_id(i).into_owned(), Self::counted_window_ms(r, i)?))
                })
            })
            .collect();
    }

    /// Publishes each global rule's allocation here (called when /metrics is
    /// scraped): `meridian_allocation_limit` is the rule-level value keys
    /// without an entry of their own get, `meridian_allocation_global_limit`
    /// the world-wide limit it is a share of, and
    /// `meridian_allocation_key_entries` the keys with their own value. One
    /// series each per global rule (the operator's rules, never a client's keys).
    pub fn report_gauges(&self) {
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        for rule in table.rules() {
            if let Some(split) = table.split_limit(rule, now) {
                gauge!("meridian_allocation_limit", "rule" => rule.to_owned()).set(split as f64);
            }
            if let Some(limit) = table.global_limit(rule) {
                gauge!("meridian_allocation_global_limit", "rule" => rule.to_owned())
                    .set(limit as f64);
            }
            gauge!("meridian_allocation_key_entries", "rule" => rule.to_owned())
                .set(table.key_entries(rule) as f64);
        }
        drop(table);
        // Summed over a region's pods and the regions: an upper bound of the
        // busiest key's world-wide count in this window (exact when one key
        // is the busiest everywhere), for the alert on admitted > L.
        let account = self.account();
        for (rule, end, used) in account.window_peaks() {
            // A window that has ended counts 0: its peak is no longer "now".
            let used = if now < end { used } else { 0 };
            gauge!("meridian_allocation_window_admitted_max", "rule" => rule.to_owned())
                .set(used as f64);
        }
        drop(account);
        if self.coordinated {
            gauge!("meridian_report_interval_seconds").set(self.report_interval().0.as_secs_f64());
            let restored = self.origin.load(Ordering::SeqCst) == Origin::Restored as u8;
            gauge!("meridian_allocation_restored").set(if restored { 1.0 } else { 0.0 });
        }
    }
}
