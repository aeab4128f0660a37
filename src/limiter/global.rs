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
//! module holds it behind a lock, sends its reports over gRPC ([`Reports`])
//! on the interval the coordinators give ([`ReportInterval`]), and publishes
//! the gauges.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use tokio::sync::Notify;

use crate::algorithm::{Algorithm, InvalidInput, Params};
use crate::allocation::Millis;
use crate::allocation::cadence::DEFAULT_REPORT_INTERVAL_MS;
use crate::allocation::leader::{GlobalRule, PodReport};
use crate::allocation::pod::{CountedRule, Decided, Holding, PodAccount};
use crate::allocation::table::{RegionUpdate, Table};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::rules::{Rule, RuleSet, Scope};
use crate::tasks::Stop;
use crate::tls::Expect;

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

    /// The same pod with `--report-interval` (`None`: follow the
    /// coordinators).
    pub fn with_report_interval(mut self, flag: Option<Duration>) -> Global {
        self.report_interval.flag_ms = flag.map_or(0, |d| d.as_millis().max(1) as u64);
        self
    }

    /// Whether this pod reports demand (it follows coordinators).
    pub fn reports(&self) -> bool {
        self.coordinated
    }

    fn account(&self) -> std::sync::MutexGuard<'_, PodAccount> {
        self.account.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How often demand is reported now, and who said so.
    pub fn report_interval(&self) -> (Duration, IntervalSource) {
        self.report_interval.effective()
    }

    /// The coordinator's report interval, from a Watch message (0: the
    /// coordinator did not say). The reporter follows a change at once.
    pub fn set_coordinator_report_interval(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let before = self
            .report_interval
            .coordinator_ms
            .swap(ms, Ordering::Relaxed);
        if before == ms {
            return;
        }
        let (effective, source) = self.report_interval();
        let flag = self.report_interval.flag_ms;
        if flag > ms {
            // The flag may only shorten the interval: an old setting would
            // leave the coordinator's rounds without news of this pod.
            tracing::warn!(
                flag_ms = flag,
                coordinator_ms = ms,
                "--report-interval is longer than the coordinators' report interval; \
                 following the coordinators"
            );
        }
        tracing::info!(interval = ?effective, source = source.as_str(), "report interval");
        self.report_interval.changed.notify_one();
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
            fixed_window: algorithm == Algorithm::FixedWindow,
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
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let counted = self.counted.read().unwrap_or_else(|p| p.into_inner());
        let holding = Holding {
            epoch: held.epoch,
            counted: counted
                .iter()
                .filter_map(|(rule, period)| {
                    let cap = table.window_cap(rule, now)?;
                    Some(CountedRule {
                        rule: rule.clone(),
                        period_ms: *period,
                        cap: cap.max(held.caps.get(rule).copied().unwrap_or(0)),
                    })
                })
                .collect(),
        };
        drop((table, counted));
        to_proto(self.account().report(&holding, with_demand, now))
    }

    /// Sends demand every report interval ([`Global::report_interval`],
    /// read again after each report), and an acknowledgement (with any
    /// top-ups) as soon as an epoch is applied or a top-up is due, until
    /// `stop`; then one last demand report, so the hits counted since the
    /// previous one reach the centre instead of dying with the pod. A report
    /// that cannot be delivered is dropped: demand is a rate, the next one
    /// carries on.
    pub async fn report_until(
        self: Arc<Self>,
        coordinators: Vec<String>,
        transport: crate::tls::Transport,
        mut stop: Stop,
    ) {
        let mut reports = Reports {
            coordinators,
            transport,
            next: 0,
            client: None,
        };
        // The first demand report goes out at once.
        let mut last_demand = tokio::time::Instant::now();
        let mut next = last_demand;
        loop {
            let (with_demand, last) = tokio::select! {
                () = tokio::time::sleep_until(next) => (true, false),
                () = self.wake.notified() => (false, false),
                () = self.report_interval.changed.notified() => {
                    // A shorter interval counts from the last report, not
                    // from the next one.
                    next = last_demand + self.report_interval().0;
                    continue;
                }
                () = stop.stopped() => (true, true),
            };
            if with_demand {
                last_demand = tokio::time::Instant::now();
                next = last_demand + self.report_interval().0;
            }
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

/// Where this pod's report interval comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalSource {
    /// No Watch message said yet: [`DEFAULT_REPORT_INTERVAL_MS`].
    Default,
    /// The coordinators' (`WatchUpdate.report_interval_ms`).
    Coordinator,
    /// `--report-interval`, shorter than the coordinators'.
    Flag,
}

impl IntervalSource {
    /// As `/readyz` and the logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            IntervalSource::Default => "default, until a coordinator says",
            IntervalSource::Coordinator => "coordinator",
            IntervalSource::Flag => "--report-interval",
        }
    }
}

/// How often this pod reports demand: the coordinators give the interval on
/// the Watch stream (they know their rounds); `--report-interval` may only
/// shorten it. Read by the reporter after every report.
#[derive(Default)]
pub struct ReportInterval {
    /// `--report-interval` in ms; 0 when not given. Set before the
    /// reporter starts.
    flag_ms: u64,
    /// The coordinators' interval in ms; 0 until a Watch message gave one.
    /// Written by the coordinator stream, read by the reporter and /readyz.
    coordinator_ms: AtomicU64,
    /// Tells the reporter the interval changed.
    changed: Notify,
}

impl ReportInterval {
    /// The interval in force and who set it.
    pub fn effective(&self) -> (Duration, IntervalSource) {
        let (given, source) = match self.coordinator_ms.load(Ordering::Relaxed) {
            0 => (DEFAULT_REPORT_INTERVAL_MS, IntervalSource::Default),
            ms => (ms, IntervalSource::Coordinator),
        };
        match self.flag_ms {
            flag if flag > 0 && flag < given => (Duration::from_millis(flag), IntervalSource::Flag),
            _ => (Duration::from_millis(given), source),
        }
    }
}

/// A report as it travels.
fn to_proto(report: PodReport) -> pb::DemandReport {
    pb::DemandReport {
        region: report.region,
        pod: report.pod,
        epoch: report.epoch,
        interval_ms: report.interval_ms,
        rules: report
            .rules
            .into_iter()
            .map(|rd| pb::RuleDemand {
                rule: rd.rule,
                keys: rd
                    .keys
                    .into_iter()
                    .map(|k| pb::KeyDemand {
                        key: k.key,
                        asked: k.asked,
                        allowed: k.allowed,
                    })
                    .collect(),
                remainder_asked: rd.remainder_asked,
                remainder_allowed: rd.remainder_allowed,
            })
            .collect(),
        used: report
            .used
            .into_iter()
            .map(|u| pb::WindowUse {
                rule: u.rule,
                window_start_unix_ms: u.window_start_ms,
                count: u.used.count,
                cap: u.used.cap,
            })
            .collect(),
        top_ups: report
            .top_ups
            .into_iter()
            .map(|t| pb::TopUp {
                rule: t.rule,
                key: t.key,
                per_period: t.per_period,
                interval_ms: t.interval_ms,
            })
            .collect(),
        admitted: report
            .admitted
            .into_iter()
            .map(|a| pb::PeriodAdmitted {
                rule: a.rule,
                key: a.key.unwrap_or_default(),
                period_start_unix_ms: a.period_start_ms,
                admitted: a.admitted,
            })
            .collect(),
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

    #[tokio::test]
    async fn reports_carry_the_window_use_after_checks_in_flight_finish() {
        let global = Global::new("r", "pod", true);
        // Running since long before this window.
        *global.account.lock().expect("account") = PodAccount::new("r", "pod").started_at(0);
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
        // Running since long before this window.
        *global.account.lock().expect("account") = PodAccount::new("r", "pod").started_at(0);
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
    fn a_report_carries_demand_and_what_was_admitted_in_the_rules_period() {
        let global = Global::new("r", "pod", true);
        let rule = global_rule();
        for i in 0..5 {
            global.record(&rule, "k", hit(i < 3, 10, 10 - i.min(3)));
        }
        let report = global.take_report(true);
        let rd = &report.rules[0];
        assert_eq!((rd.keys[0].asked, rd.keys[0].allowed), (5, 3));
        // Every report (acknowledgements too) carries the period's count.
        let ack = global.take_report(false);
        for r in [&report, &ack] {
            let whole = r.admitted.iter().find(|a| a.key.is_empty());
            assert_eq!(whole.map(|a| a.admitted), Some(3), "{:?}", r.admitted);
            let period = 60_000;
            assert_eq!(
                whole.map(|a| a.period_start_unix_ms),
                Some(now_unix_ms().div_euclid(period) * period)
            );
        }
    }

    #[test]
    fn the_report_interval_follows_the_coordinators_and_a_flag_only_shortens_it() {
        let follow = Global::new("r", "pod", true);
        assert_eq!(
            follow.report_interval(),
            (Duration::from_secs(10), IntervalSource::Default)
        );
        follow.set_coordinator_report_interval(1_000);
        assert_eq!(
            follow.report_interval(),
            (Duration::from_secs(1), IntervalSource::Coordinator)
        );
        // A message that does not say changes nothing.
        follow.set_coordinator_report_interval(0);
        assert_eq!(follow.report_interval().0, Duration::from_secs(1));

        let flagged =
            Global::new("r", "pod", true).with_report_interval(Some(Duration::from_secs(5)));
        assert_eq!(
            flagged.report_interval(),
            (Duration::from_secs(5), IntervalSource::Flag)
        );
        flagged.set_coordinator_report_interval(1_000);
        assert_eq!(
            flagged.report_interval(),
            (Duration::from_secs(1), IntervalSource::Coordinator),
            "a longer flag does not slow the coordinators' interval"
        );
        flagged.set_coordinator_report_interval(10_000);
        assert_eq!(
            flagged.report_interval(),
            (Duration::from_secs(5), IntervalSource::Flag)
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
