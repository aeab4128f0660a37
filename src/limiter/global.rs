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
use crate::allocation::demand::{KeyDemand, REPORT_TOP_KEYS, bound_report};
use crate::allocation::leader::{GlobalRule, TopUp};
use crate::allocation::table::{RegionUpdate, Table};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::rules::{Rule, RuleSet, Scope};
use crate::tasks::Stop;
use crate::tls::Expect;

/// Distinct keys per rule counted between two reports; further keys only
/// add to the rule's remainder, so a flood of random keys cannot grow memory.
pub const MAX_TRACKED_KEYS: usize = 100_000;
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

    /// Rules whose window use this pod reports: exact fixed windows, where a
    /// decision's `limit − remaining` is the key's count in the window.
    fn counted_window_ms(rule: &Rule) -> Option<u64> {
        GlobalRule::of_rule(rule)
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

    /// The limit for `key` of `rule` in this region now.
    pub fn limit(&self, rule: &Rule, key: &str) -> Result<GlobalLimit, InvalidInput> {
        if !self.is_global(rule) {
            return Ok(GlobalLimit::Rule);
        }
        let Some(params) = &rule.params else {
            return Ok(GlobalLimit::Rule);
        };
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let Some(allocated) = table.limit(&rule.id, key, now_unix_ms()) else {
            return Ok(GlobalLimit::Nothing);
        };
        if allocated == 0 {
            return Ok(GlobalLimit::Nothing);
        }
        let allocated = allocated.min(params.limit());
        if allocated == params.limit() {
            return Ok(GlobalLimit::Allocated(params.clone()));
        }
        // Buckets: the burst is divided in the same proportion as the rate.
        let burst = params.algorithm().has_burst().then(|| {
            let b =
                (params.burst() as u128 * allocated as u128 / params.limit().max(1) as u128) as i64;
            b.max(1)
        });
        Ok(GlobalLimit::Allocated(Params::new(
            params.algorithm(),
            allocated as i64,
            params.period(),
            burst,
        )?))
    }

    /// Counts a decided check of a global rule; asks for a top-up when the
    /// key used 90 % of its allocation before the window is over.
    pub fn record(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        allowed: bool,
        limit: u64,
        remaining: u64,
    ) {
        if !self.is_global(rule) || cost == 0 {
            return;
        }
        let mut demand = self.demand();
        if demand.since.is_none() {
            demand.since = Some(Instant::now());
        }
        // Looked up by reference: a known key costs no allocation.
        if !demand.hits.contains_key(rule.id.as_str()) {
            demand.hits.insert(rule.id.clone(), RuleHits::default());
        }
        let Some(rule_hits) = demand.hits.get_mut(rule.id.as_str()) else {
            return;
        };
        if rule_hits.keys.len() < MAX_TRACKED_KEYS && !rule_hits.keys.contains_key(key) {
            rule_hits.keys.insert(key.to_string(), (0, 0));
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
        if allowed && let Some(period) = Self::counted_window_ms(rule) {
            let p = period as Millis;
            let start = now_unix_ms().div_euclid(p) * p;
            match demand.seen.get_mut(rule.id.as_str()) {
                Some(seen) if seen.0 == start => seen.1 = seen.1.max(used),
                Some(seen) if seen.0 < start => *seen = (start, used),
                Some(_) => {}
                None => {
                    demand.seen.insert(rule.id.clone(), (start, used));
                }
            }
        }
        if !TopUp::wanted(used, limit) {
            return;
        }
        let id = (rule.id.clone(), key.to_string());
        let due = demand
            .last_top_up
            .get(&id)
            .is_none_or(|t| t.elapsed() >= TOP_UP_EVERY);
        let Some(params) = &rule.params else { return };
        if !due {
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
            &rule.id,
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
        if demand.last_top_up.len() > 10_000 {
            demand.last_top_up.retain(|_, t| t.elapsed() < TOP_UP_EVERY);
        }
        drop(demand);
        counter!("meridian_allocation_top_ups_total", "rule" => rule.id.clone()).increment(1);
        self.wake.notify_one();
    }

    /// Applies an allocation update from the coordinator stream. True when
    /// it raised a value at once (a grant within the window): keys the
    /// over-limit cache holds as denied until the window ends may pass now.
    pub fn apply(&self, update: &pb::AllocationUpdate, rules: &RuleSet) -> bool {
        let update = RegionUpdate::from(update);
        *self.counted.write().unwrap_or_else(|p| p.into_inner()) = rules
            .rules()
            .filter_map(|r| Some((r.id.clone(), Self::counted_window_ms(r)?)))
            .collect();
        let window = |id: &str| GlobalRule::of_rule(rules.rule(id)?)?.policy.window_ms;
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
        let mut used: Vec<pb::WindowUse> = counted
            .iter()
            .filter_map(|(rule, period)| {
                let p = *period as Millis;
                let start = now.div_euclid(p) * p;
                let count = match demand.seen.get(rule) {
                    Some((s, c)) if *s == start => *c,
                    _ => 0,
                };
                Some(pb::WindowUse {
                    rule: rule.clone(),
                    window_start_unix_ms: start,
                    count,
                    cap: table
                        .window_cap(rule, now)?
                        .max(caps_before.get(rule).copied().unwrap_or(0)),
                })
            })
            .collect();
        used.sort_by(|a, b| a.rule.cmp(&b.rule));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleFile;

    fn global_rules() -> RuleSet {
        let text = "domain: d\ndescriptors:\n  - key: k\n    scope: global\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
        RuleSet::parse(&[RuleFile {
            name: "r.yaml".into(),
            text: text.into(),
        }])
        .expect("valid rules")
    }

    fn global_rule() -> Arc<Rule> {
        global_rules().rules().next().expect("one rule").clone()
    }

    #[tokio::test]
    async fn reports_carry_the_window_use_after_checks_in_flight_finish() {
        let global = Global::new("r", "pod", true);
        let rules = global_rules();
        let rule = global_rule();
        let update = pb::AllocationUpdate {
            epoch: 1,
            valid_until_unix_ms: now_unix_ms() + 60_000,
            full: true,
            rules: vec![pb::RuleAllocation {
                rule: rule.id.clone(),
                limit: 10,
                fallback: 2,
                split: Some(6),
                ..Default::default()
            }],
            ..Default::default()
        };
        global.apply(&update, &rules);

        // A check under way: a drain waits for it, up to its limit.
        let check = global.flight(&rule).expect("a global rule is tracked");
        assert!(!global.flight.drain(Duration::from_millis(30)).await);
        // Its decision: 4 of the 6 admitted so far this window.
        global.record(&rule, "k", 1, true, 6, 2);
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

    #[test]
    fn demand_stays_bounded_under_a_flood_of_keys_and_nothing_is_lost() {
        let global = Global::new("r", "pod", true);
        let rule = global_rule();
        let n = MAX_TRACKED_KEYS + 500;
        for i in 0..n {
            global.record(&rule, &format!("k{i}"), 1, i % 2 == 0, 10, 9);
        }
        assert_eq!(global.demand().hits[&rule.id].keys.len(), MAX_TRACKED_KEYS);
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
        uncoordinated.record(&rule, "k", 1, true, 10, 9);
        assert!(uncoordinated.take_report(true).rules.is_empty());
        assert!(matches!(
            uncoordinated.limit(&rule, "k"),
            Ok(GlobalLimit::Rule)
        ));
        let coordinated = Global::new("r", "pod", true);
        assert!(
            matches!(coordinated.limit(&rule, "k"), Ok(GlobalLimit::Nothing)),
            "no allocation received yet: nothing is admitted"
        );
    }
}
