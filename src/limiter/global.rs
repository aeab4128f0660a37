//! Global rules in a region: enforce this region's allocation, report demand,
//! acknowledge epochs, ask for early top-ups.
//!
//! The allocation arrives on the coordinator stream (`rule_feed`) and lives
//! in an [`allocation::table::Table`]: epoch fencing, window-boundary
//! switching and lease fallback are the pure module's. A check of a global
//! rule passes this region's value as the limit to the ordinary hot path —
//! no cross-region call. Without `--coordinator` there is no allocation and a
//! global rule is enforced at its whole limit (one region).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use tokio::sync::Notify;

use crate::algorithm::{InvalidInput, Params};
use crate::allocation::Millis;
use crate::allocation::demand::{KeyDemand, MAX_REPORT_TOP_UPS, REPORT_TOP_KEYS, bound_report};
use crate::allocation::leader::{GlobalRule, TopUp};
use crate::allocation::table::{RegionUpdate, Table};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::rules::{Rule, RuleSet, Scope};
use crate::tasks::Stop;
use crate::tls::Expect;

/// Distinct keys counted between two reports, over all global rules;
/// further keys only add to their rule's remainder, so a flood of random
/// keys cannot grow memory. Keys are at most `store::key::MAX_KEY_LEN` (512)
/// bytes, checked before they get here: at most ~60 MB, and ~10 MB for keys
/// of 40 bytes.
pub const MAX_TRACKED_KEYS: usize = 100_000;
/// Keys whose last top-up request is remembered (to ask at most every
/// `TOP_UP_EVERY`); a key beyond it does not ask until older ones expire.
const MAX_TOP_UP_KEYS: usize = 10_000;
/// A key asks for a top-up at most this often.
const TOP_UP_EVERY: Duration = Duration::from_secs(1);

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
    /// This pod's region, as reports name it.
    region: String,
    /// This pod's name in reports (unique within the region).
    pod: String,
    /// False without `--coordinator`: every rule runs at its own limit.
    coordinated: bool,
    /// The allocations; `std::sync::RwLock`: read on every check of a global
    /// rule, written per epoch, never held across an `.await`.
    table: RwLock<Table>,
    /// Hits since the last report; `std::sync::Mutex`, held for one update.
    demand: Mutex<Demand>,
    /// Wakes the reporter early: a top-up request, or an epoch to acknowledge.
    wake: Notify,
    /// Rules counted exactly in fixed windows → their period (ms): the ones
    /// whose window use is reported (see [`crate::allocation::WindowUse`]).
    counted: RwLock<HashMap<String, u64>>,
    /// Checks under way, which a report drains before reading the window use.
    flight: Flight,
}

/// Checks under way, so a report can wait for those that read the table
/// before it changed: their counts belong in the window use it reports.
///
/// A check enters under the current era; [`Flight::drain`] starts a new era
/// and waits until the old one's checks have left. Drains are serialised
/// (one reporter task), so a slot is never shared by two live eras.
#[derive(Default)]
struct Flight {
    /// Bumped by each drain; its parity picks the slot a check enters.
    era: AtomicU64,
    /// Checks inside, per era parity.
    inside: [AtomicU64; 2],
}

/// What the table held when a report began.
struct Held {
    epoch: u64,
    caps: HashMap<String, u64>,
}

/// Leaves the flight when dropped (also when a check fails or is cancelled).
pub struct InFlight<'a> {
    slot: &'a AtomicU64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Flight {
    fn enter(&self) -> InFlight<'_> {
        loop {
            let era = self.era.load(Ordering::SeqCst);
            let slot = &self.inside[(era & 1) as usize];
            slot.fetch_add(1, Ordering::SeqCst);
            if self.era.load(Ordering::SeqCst) == era {
                return InFlight { slot };
            }
            slot.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits (at most `limit`) for every check that entered before now to
    /// leave; false if some did not in time.
    async fn drain(&self, limit: Duration) -> bool {
        let era = self.era.fetch_add(1, Ordering::SeqCst);
        let slot = &self.inside[(era & 1) as usize];
        let start = Instant::now();
        while slot.load(Ordering::SeqCst) != 0 {
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

/// What the next report carries: per-rule hits, top-up requests and the
/// window use seen by this pod's checks.
#[derive(Default)]
struct Demand {
    /// rule → hits since the last report.
    hits: HashMap<String, RuleHits>,
    /// Keys in `hits`, over every rule: at most [`MAX_TRACKED_KEYS`].
    tracked: usize,
    /// When the first hit of this report was counted (the pace's denominator).
    since: Option<Instant>,
    /// Top-up requests waiting for the reporter.
    top_ups: Vec<pb::TopUp>,
    /// Each (rule, key)'s last top-up request, so a key asks at most every
    /// `TOP_UP_EVERY`; pruned when it grows large.
    last_top_up: HashMap<(String, String), Instant>,
    /// Counted rule → (window start, the most any key was admitted in it),
    /// as this pod's checks saw the count.
    seen: HashMap<String, (Millis, u64)>,
    /// Counted rule → the window before `seen`'s and its final count, so
    /// the first report after a window ends still carries what it reached
    /// (a drill's report counts each window from these).
    ended: HashMap<String, (Millis, u64)>,
    /// Global windowed rule (fixed or sliding, exact or approximate) →
    /// (window start, window end, the most any key had used of its limit in
    /// it): for `meridian_allocation_window_admitted_max` only, never
    /// reported. One entry per global rule.
    peak: HashMap<String, (Millis, Millis, u64)>,
}

/// One rule's hits since the last report.
#[derive(Default)]
struct RuleHits {
    /// key → (asked, allowed).
    keys: HashMap<String, (u64, u64)>,
    /// Keys beyond `MAX_TRACKED_KEYS`, summed.
    rest: (u64, u64),
}

impl Global {
    pub fn new(region: &str, pod: &str, coordinated: bool) -> Global {
        Global {
            region: region.to_string(),
            pod: pod.to_string(),
            coordinated,
            table: RwLock::new(Table::default()),
            demand: Mutex::new(Demand::default()),
            wake: Notify::new(),
            counted: RwLock::new(HashMap::new()),
            flight: Flight::default(),
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

    fn demand(&self) -> std::sync::MutexGuard<'_, Demand> {
        self.demand.lock().unwrap_or_else(|p| p.into_inner())
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
        let id = id.as_ref();
        let mut guard = self.demand();
        // One borrow of the whole, so its fields can be borrowed apart.
        let demand = &mut *guard;
        if demand.since.is_none() {
            demand.since = Some(Instant::now());
        }
        // Looked up by reference: a known key costs no allocation.
        if !demand.hits.contains_key(id) {
            demand.hits.insert(id.to_owned(), RuleHits::default());
        }
        let Some(rule_hits) = demand.hits.get_mut(id) else {
            return;
        };
        if demand.tracked < MAX_TRACKED_KEYS && !rule_hits.keys.contains_key(key) {
            rule_hits.keys.insert(key.to_string(), (0, 0));
            demand.tracked += 1;
        }
        let hits = match rule_hits.keys.get_mut(key) {
            Some(h) => h,
            None => &mut rule_hits.rest,
        };
        hits.0 += cost;
        if allowed {
            hits.1 += cost;
        }
        let asked = *hits;
        let used = limit.saturating_sub(remaining);
        if allowed
            && window_use
            && let Some(period) = Self::counted_window_ms(rule, index)
        {
            let start = decided_window(now_unix_ms(), reset_after_us, period as Millis);
            match demand.seen.get_mut(id) {
                Some(seen) if seen.0 == start => seen.1 = seen.1.max(used),
                Some(seen) if seen.0 < start => {
                    let ended = std::mem::replace(seen, (start, used));
                    demand.ended.insert(id.to_owned(), ended);
                }
                // Answered after a newer window's first: the window
                // before is still the last ended one, so it is not lost.
                Some(_) => {
                    if let Some(ended) = demand.ended.get_mut(id)
                        && ended.0 == start
                    {
                        ended.1 = ended.1.max(used);
                    }
                }
                None => {
                    demand.seen.insert(id.to_owned(), (start, used));
                }
            }
        }
        if allowed && window_use && !params.algorithm().has_burst() {
            let p = (params.period().as_millis() as Millis).max(1);
            let start = now_unix_ms().div_euclid(p) * p;
            match demand.peak.get_mut(id) {
                Some(peak) if peak.0 == start => peak.2 = peak.2.max(used),
                Some(peak) if peak.0 < start => *peak = (start, start + p, used),
                Some(_) => {}
                None => {
                    demand.peak.insert(id.to_owned(), (start, start + p, used));
                }
            }
        }
        if !TopUp::wanted(used, limit) {
            return;
        }
        let rule_id = id;
        let id = (rule_id.to_owned(), key.to_string());
        let due = demand
            .last_top_up
            .get(&id)
            .is_none_or(|t| t.elapsed() >= TOP_UP_EVERY);
        // A report carries at most MAX_REPORT_TOP_UPS (the coordinator refuses
        // more), and the keys asking within a second are bounded the same way.
        if !due
            || demand.top_ups.len() >= MAX_REPORT_TOP_UPS
            || demand.last_top_up.len() >= MAX_TOP_UP_KEYS && !demand.last_top_up.contains_key(&id)
        {
            return;
        }
        // The key's pace here since the last report, per period.
        let Some(since) = demand.since.map(|t| t.elapsed()) else {
            return;
        };
        if since < Duration::from_millis(200) {
            return;
        }
        let top_up = TopUp::measured(
            rule_id,
            key,
            asked.0,
            since.as_millis() as u64,
            params.period().as_millis() as u64,
        );
        demand.last_top_up.insert(id, Instant::now());
        demand.top_ups.push(pb::TopUp {
            rule: top_up.rule,
            key: top_up.key,
            per_period: top_up.per_period,
            interval_ms: top_up.interval_ms,
        });
        if demand.last_top_up.len() >= MAX_TOP_UP_KEYS / 2 {
            demand.last_top_up.retain(|_, t| t.elapsed() < TOP_UP_EVERY);
        }
        drop(guard);
        counter!("meridian_allocation_top_ups_total", "rule" => rule_id.to_owned()).increment(1);
        self.wake.notify_one();
    }

    /// Applies an allocation update from the coordinator stream. True when
    /// it raised a value at once (a grant within the window): keys the
    /// over-limit cache holds as denied until the window ends may pass now.
    pub fn apply(&self, update: &pb::AllocationUpdate, rules: &RuleSet) -> bool {
        let update = RegionUpdate::from(update);
        *self.counted.write().unwrap_or_else(|p| p.into_inner()) = rules
            .rules()
            .flat_map(|r| {
                (0..=r.also.len()).filter_map(move |i| {
                    Some((r.limit_id(i).into_owned(), Self::counted_window_ms(r, i)?))
                })
            })
            .collect();
        let window = |id: &str| {
            let (rule, index) = rules.limit_of(id)?;
            GlobalRule::of_limit(rule, index)?.policy.window_ms
        };
        let result = self.table.write().unwrap_or_else(|p| p.into_inner()).apply(
            &update,
            now_unix_ms(),
            window,
        );
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
        let demand = self.demand();
        for (rule, (_, end, used)) in &demand.peak {
            // A window that has ended counts 0: its peak is no longer "now".
            let used = if now < *end { *used } else { 0 };
            gauge!("meridian_allocation_window_admitted_max", "rule" => rule.clone())
                .set(used as f64);
        }
    }

    /// The report to send now: demand since the last one (bounded per rule),
    /// pending top-ups, and the epoch held.
    #[cfg(test)]
    fn take_report(&self, with_demand: bool) -> pb::DemandReport {
        self.take_report_held(with_demand, self.held())
    }

    /// The epoch held and each counted rule's largest value, read together.
    fn held(&self) -> Held {
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let counted = self.counted.read().unwrap_or_else(|p| p.into_inner());
        Held {
            epoch: table.epoch(),
            caps: counted
                .keys()
                .filter_map(|rule| Some((rule.clone(), table.window_cap(rule, now)?)))
                .collect(),
        }
    }

    /// The report for `held`, the epoch read before in-flight checks were
    /// drained: only checks that may have read an older table were waited
    /// for, so the report acknowledges no newer epoch, and a rule's cap is
    /// the larger of its value then and now.
    fn take_report_held(&self, with_demand: bool, held: Held) -> pb::DemandReport {
        let mut demand = self.demand();
        let top_ups = std::mem::take(&mut demand.top_ups);
        let mut report = pb::DemandReport {
            region: self.region.clone(),
            pod: self.pod.clone(),
            epoch: held.epoch,
            top_ups,
            ..Default::default()
        };
        report.used = self.window_use(&demand, &held.caps);
        if !with_demand {
            return report;
        }
        report.interval_ms = demand
            .since
            .replace(Instant::now())
            .map_or(0, |t| t.elapsed().as_millis() as u64);
        let hits = std::mem::take(&mut demand.hits);
        demand.tracked = 0;
        drop(demand);
        for (rule, rule_hits) in hits {
            let keys = rule_hits
                .keys
                .into_iter()
                .map(|(key, (asked, allowed))| KeyDemand {
                    key,
                    asked,
                    allowed,
                })
                .collect();
            let (top, rest_asked, rest_allowed) = bound_report(keys, REPORT_TOP_KEYS);
            let (rest_asked, rest_allowed) = (
                rest_asked + rule_hits.rest.0,
                rest_allowed + rule_hits.rest.1,
            );
            report.rules.push(pb::RuleDemand {
                rule,
                keys: top
                    .into_iter()
                    .map(|k| pb::KeyDemand {
                        key: k.key,
                        asked: k.asked,
                        allowed: k.allowed,
                    })
                    .collect(),
                remainder_asked: rest_asked,
                remainder_allowed: rest_allowed,
            });
        }
        report.rules.sort_by(|a, b| a.rule.cmp(&b.rule));
        report
    }

    /// What this pod saw of each counted rule's current window, and the
    /// largest value it enforces for it now.
    fn window_use(
        &self,
        demand: &Demand,
        caps_before: &HashMap<String, u64>,
    ) -> Vec<pb::WindowUse> {
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let counted = self.counted.read().unwrap_or_else(|p| p.into_inner());
        let mut used: Vec<pb::WindowUse> = Vec::with_capacity(2 * counted.len());
        for (rule, period) in counted.iter() {
            let p = *period as Millis;
            let start = now.div_euclid(p) * p;
            let Some(cap) = table.window_cap(rule, now) else {
                continue;
            };
            let cap = cap.max(caps_before.get(rule).copied().unwrap_or(0));
            // The window that just ended, with its final count (older
            // than the current one, so the centre's in-window view keeps
            // the current one).
            let last = match demand.seen.get(rule) {
                Some((s, c)) if *s == start - p => Some(*c),
                _ => match demand.ended.get(rule) {
                    Some((s, c)) if *s == start - p => Some(*c),
                    _ => None,
                },
            };
            if let Some(count) = last {
                used.push(pb::WindowUse {
                    rule: rule.clone(),
                    window_start_unix_ms: start - p,
                    count,
                    cap,
                });
            }
            let count = match demand.seen.get(rule) {
                Some((s, c)) if *s == start => *c,
                _ => 0,
            };
            used.push(pb::WindowUse {
                rule: rule.clone(),
                window_start_unix_ms: start,
                count,
                cap,
            });
        }
        used.sort_by(|a, b| {
            (a.rule.as_str(), a.window_start_unix_ms)
                .cmp(&(b.rule.as_str(), b.window_start_unix_ms))
        });
        used
    }

    /// Sends demand every `interval`, and an acknowledgement (with any
    /// top-ups) as soon as an epoch is applied or a top-up is due, until
    /// `stop`; then one last demand report, so the hits counted since the
    /// previous one reach the centre instead of dying with the pod. A report
    /// that cannot be delivered is dropped: demand is a rate, the next one
    /// carries on.
    pub async fn report_until(
        self: Arc<Self>,
        coordinators: Vec<String>,
        transport: crate::tls::Transport,
        interval: Duration,
        mut stop: Stop,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reports = Reports {
            coordinators,
            transport,
            next: 0,
            client: None,
        };
        loop {
            let (with_demand, last) = tokio::select! {
                _ = tick.tick() => (true, false),
                () = self.wake.notified() => (false, false),
                () = stop.stopped() => (true, true),
            };
            // Checks that read the table before it changed are counted
            // first; if some take too long, the window use is left out (the
            // centre then grants nothing within the window).
            let held = self.held();
            let drained = self.flight.drain(Duration::from_millis(200)).await;
            let mut report = self.take_report_held(with_demand, held);
            if !drained {
                report.used.clear();
            }
            let kind = match (with_demand, last) {
                (_, true) => "last",
                (true, false) => "demand",
                (false, false) => "ack",
            };
            reports.send(&report, kind).await;
            if last {
                return;
            }
        }
    }
}

/// Where a pod's reports go: any coordinator node (a follower relays to the
/// leader), the one that answered last first.
struct Reports {
    /// The nodes' gRPC URLs (`--coordinator`), tried in turn.
    coordinators: Vec<String>,
    /// TLS with this region's certificate, or plaintext (`--insecure`).
    transport: crate::tls::Transport,
    /// Index (modulo the count) of the node to dial when none is connected.
    next: usize,
    /// The channel to the node that answered last; `None` after a failure,
    /// so the next report dials the next node.
    client: Option<CoordinatorClient<tonic::transport::Channel>>,
}

impl Reports {
    /// Delivers `report` to the first node that takes it, trying each once.
    async fn send(&mut self, report: &pb::DemandReport, kind: &'static str) {
        for _ in 0..self.coordinators.len() {
            let mut client = match &self.client {
                Some(c) => c.clone(),
                None => {
                    let url = &self.coordinators[self.next % self.coordinators.len()];
                    let channel = self.transport.channel(url, Expect::AnyNode, |e| {
                        e.connect_timeout(Duration::from_secs(1))
                            .timeout(Duration::from_secs(3))
                    });
                    match channel {
                        Ok(channel) => {
                            let c = CoordinatorClient::new(channel)
                                .max_encoding_message_size(crate::proto::MAX_REPORT_BYTES);
                            self.client = Some(c.clone());
                            c
                        }
                        Err(e) => {
                            tracing::error!(%url, error = %e, "bad coordinator URL");
                            self.next += 1;
                            continue;
                        }
                    }
                }
            };
            match client.report(report.clone()).await {
                Ok(_) => {
                    counter!("meridian_allocation_reports_total", "kind" => kind).increment(1);
                    return;
                }
                Err(status) => {
                    counter!("meridian_allocation_report_failures_total").increment(1);
                    tracing::debug!(error = %status, "report failed; trying the next coordinator");
                    self.client = None;
                    self.next += 1;
                }
            }
        }
        if kind == "last" {
            tracing::warn!("no coordinator took the last demand report; its hits are lost");
        }
    }
}

/// The start of the fixed window a decision was counted in, from its reset
/// time (when that window ends) and the clock when its answer arrived. Not
/// from the clock alone: an answer can arrive after the boundary of the
/// window that decided it. Rounding to the nearest boundary absorbs the
/// answer's latency and clock skew with Redis of up to half a window.
fn decided_window(answered: Millis, reset_after_us: u64, period: Millis) -> Millis {
    let period = period.max(1);
    let end = answered.saturating_add((reset_after_us / 1_000) as Millis);
    ((end + period / 2).div_euclid(period) - 1) * period
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleFile;

    fn global_rules() -> RuleSet {
        global_rules_per("minute")
    }

    fn global_rules_per(unit: &str) -> RuleSet {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    scope: global\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: 10\n"
        );
        RuleSet::parse(&[RuleFile {
            name: "r.yaml".into(),
            text,
        }])
        .expect("valid rules")
    }

    fn global_rule() -> Arc<Rule> {
        global_rules().rules().next().expect("one rule").clone()
    }

    /// One hit of a check decided at `limit` with `remaining` left, in the
    /// current window of the one-minute rule.
    fn hit(allowed: bool, limit: u64, remaining: u64) -> Counted {
        let now = now_unix_ms();
        Counted {
            cost: 1,
            allowed,
            limit,
            remaining,
            reset_after_us: ((now.div_euclid(60_000) + 1) * 60_000 - now) as u64 * 1_000,
            window_use: true,
        }
    }

    /// An epoch giving this region `split` of the rule's 10.
    fn allocate(global: &Global, rules: &RuleSet, rule: &Rule, split: u64) {
        let update = pb::AllocationUpdate {
            epoch: 1,
            valid_until_unix_ms: now_unix_ms() + 60_000,
            full: true,
            rules: vec![pb::RuleAllocation {
                rule: rule.id.clone(),
                limit: 10,
                fallback: 2,
                split: Some(split),
                ..Default::default()
            }],
            ..Default::default()
        };
        global.apply(&update, rules);
    }

    #[test]
    fn an_override_on_a_global_rule_is_divided_like_the_rule() {
        let global = Global::new("r", "pod", true);
        let (rules, rule) = (global_rules(), global_rule());
        allocate(&global, &rules, &rule, 6);
        let limit_of = |overridden: Option<&Params>| match global.limit(&rule, "k", overridden) {
            Ok(GlobalLimit::Allocated(p)) => p.limit(),
            other => panic!("expected an allocation, got {other:?}"),
        };
        assert_eq!(limit_of(None), 6, "6 of the rule's 10");
        // An override of 1,000 a minute is the key's world-wide limit: this
        // region holds 6/10 of it, not all of it.
        let wide = Params::new(
            crate::algorithm::Algorithm::FixedWindow,
            1_000,
            Duration::from_secs(60),
            None,
        )
        .expect("valid params");
        assert_eq!(limit_of(Some(&wide)), 600);
        // A share that rounds to nothing admits nothing (and asks for more).
        let tiny = Params::new(
            crate::algorithm::Algorithm::FixedWindow,
            1,
            Duration::from_secs(60),
            None,
        )
        .expect("valid params");
        assert!(matches!(
            global.limit(&rule, "k", Some(&tiny)),
            Ok(GlobalLimit::Nothing)
        ));
        // Uncoordinated, the override is the whole limit, as before.
        assert!(matches!(
            Global::uncoordinated().limit(&rule, "k", Some(&wide)),
            Ok(GlobalLimit::Rule)
        ));
    }

    #[test]
    fn top_ups_stay_within_what_one_report_may_carry() {
        let global = Global::new("r", "pod", true);
        let rule = global_rule();
        global.demand().since = Some(Instant::now() - Duration::from_secs(1));
        // Every key at its allocation asks for a top-up: a flood of them.
        for i in 0..(MAX_REPORT_TOP_UPS + 2_000) {
            global.record(&rule, &format!("k{i}"), hit(true, 10, 0));
        }
        let demand = global.demand();
        assert_eq!(demand.top_ups.len(), MAX_REPORT_TOP_UPS);
        assert!(demand.last_top_up.len() <= MAX_TOP_UP_KEYS);
    }

    #[tokio::test]
    async fn reports_carry_the_window_use_after_checks_in_flight_finish() {
        let global = Global::new("r", "pod", true);
        let rules = global_rules();
        let rule = global_rule();
        allocate(&global, &rules, &rule, 6);

        // A check under way: a drain waits for it, up to its limit.
        let check = global.flight(&rule).expect("a global rule is tracked");
        assert!(!global.flight.drain(Duration::from_millis(30)).await);
        // Its decision: 4 of the 6 admitted so far this window.
        global.record(&rule, "k", hit(true, 6, 2));
        drop(check);
        assert!(global.flight.drain(Duration::from_millis(30)).await);

        let report = global.take_report(false);
        assert_eq!(report.epoch, 1);
        let used = &report.used[0];
        assert_eq!(
            (used.rule.as_str(), used.count, used.cap),
            (rule.id.as_str(), 4, 6)
        );
        let period = 60_000;
        assert_eq!(
            used.window_start_unix_ms,
            now_unix_ms().div_euclid(period) * period
        );
    }

    /// A decision Redis made in the last moment of a window can be answered
    /// after the boundary: it is that window's use, not the new one's (the
    /// drills test saw a region's final count of one window reported again
    /// as the next window's, 160 against a grant of 100).
    #[test]
    fn a_late_answer_counts_in_the_window_that_decided_it() {
        let global = Global::new("r", "pod", true);
        let rules = global_rules_per("second");
        let rule = rules.rules().next().expect("one rule").clone();
        allocate(&global, &rules, &rule, 6);
        // Early in a one-second window, so a late answer is unambiguous.
        while now_unix_ms() % 1_000 > 300 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let start = now_unix_ms().div_euclid(1_000) * 1_000;
        let until_end = || (start + 1_000 - now_unix_ms()).max(0) as u64 * 1_000;
        // The previous window's last decision (5 of 6 used), answered now:
        // its window ended a moment before the answer arrived.
        global.record(
            &rule,
            "k",
            Counted {
                reset_after_us: 1_000,
                ..hit(true, 6, 1)
            },
        );
        // The current window's first decision.
        global.record(
            &rule,
            "k",
            Counted {
                reset_after_us: until_end(),
                ..hit(true, 6, 5)
            },
        );
        // And a late one from the previous window, after it.
        global.record(
            &rule,
            "k",
            Counted {
                reset_after_us: 500,
                ..hit(true, 6, 0)
            },
        );

        let report = global.take_report(false);
        let used: Vec<(Millis, u64)> = report
            .used
            .iter()
            .map(|u| (u.window_start_unix_ms, u.count))
            .collect();
        assert_eq!(used, vec![(start - 1_000, 6), (start, 1)]);
    }

    #[test]
    fn demand_stays_bounded_under_a_flood_of_keys_and_nothing_is_lost() {
        let global = Global::new("r", "pod", true);
        let rule = global_rule();
        let n = MAX_TRACKED_KEYS + 500;
        for i in 0..n {
            global.record(&rule, &format!("k{i}"), hit(i % 2 == 0, 10, 9));
        }
        assert_eq!(global.demand().hits[&rule.id].keys.len(), MAX_TRACKED_KEYS);
        assert_eq!(global.demand().tracked, MAX_TRACKED_KEYS);
        let report = global.take_report(true);
        let rd = &report.rules[0];
        assert_eq!(rd.keys.len(), REPORT_TOP_KEYS);
        let asked: u64 = rd.keys.iter().map(|k| k.asked).sum::<u64>() + rd.remainder_asked;
        let allowed: u64 = rd.keys.iter().map(|k| k.allowed).sum::<u64>() + rd.remainder_allowed;
        assert_eq!((asked, allowed), (n as u64, n.div_ceil(2) as u64));
        assert!(
            global.take_report(true).rules.is_empty(),
            "a report drains the counts"
        );
    }

    #[test]
    fn a_rule_that_is_not_global_or_not_coordinated_is_not_counted() {
        let rule = global_rule();
        let uncoordinated = Global::uncoordinated();
        uncoordinated.record(&rule, "k", hit(true, 10, 9));
        assert!(uncoordinated.take_report(true).rules.is_empty());
        assert!(matches!(
            uncoordinated.limit(&rule, "k", None),
            Ok(GlobalLimit::Rule)
        ));
        let coordinated = Global::new("r", "pod", true);
        assert!(
            matches!(
                coordinated.limit(&rule, "k", None),
                Ok(GlobalLimit::Nothing)
            ),
            "no allocation received yet: nothing is admitted"
        );
    }
}
