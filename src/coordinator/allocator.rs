//! Global limits on the coordinator: demand reports in, allocation epochs out.
//!
//! Every node accepts reports; a follower forwards them to the leader. The
//! decisions — demand, acknowledgements, when a round is due and what it
//! commits — are the pure [`Leader`]'s, the same type the simulator drives;
//! this wrapper holds it behind a lock, runs its rounds on a tokio loop,
//! commits each epoch through Raft and registers regions that report. A new
//! leader seeds its demand from the committed state, so it continues without
//! a learning period; it starts with no acknowledgements, which only delays
//! grows (shrinks stay counted at their old value until pods report again).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use tokio::sync::Notify;
use tonic::Status;
use tracing::Instrument;

use super::drill::Mode;
use super::drill::observe::{HitCounts, WindowCounts};
use super::hits::{Hits, ReportedHits};
use super::node::{Node, Write};
use super::raft::storage::Applied;
use super::resets::RegionAnswer;
use super::state::{Command, RegionState, Registry};
use crate::allocation::demand::PodEpoch;
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::leader::{ACK_DEBOUNCE_MS, Leader, LeaderConfig, PodReport, RegionDef};
use crate::allocation::ledger::{Ledger, Terms};
use crate::allocation::{EpochDelta, Millis, RegionStatus};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::tls::Expect;

/// gRPC metadata marking a report relayed by another node.
pub const FORWARDED: &str = "x-meridian-forwarded";

/// The coordinator's side of global limits on one node.
pub struct Allocator {
    node: Arc<Node>,
    /// The leader's state; a `std` mutex because no `.await` happens while
    /// it is held (rounds are computed under it, committed after).
    leading: Mutex<Leading>,
    /// Woken when a report makes a round due before the next scheduled one.
    wake: Notify,
    /// The connection to the leader, reused for forwarded reports.
    leader_client:
        tokio::sync::Mutex<Option<(String, CoordinatorClient<tonic::transport::Channel>)>>,
    /// `--auto-register-regions`: a report from an unknown region registers
    /// it (dev and the demo); otherwise such reports are refused.
    auto_register_regions: bool,
    /// Hits reported to this node while it led, for `ctl top`'s
    /// rejections (bounded as `hits.rs` says). A `std` mutex: held for a
    /// few map updates, never across `.await`.
    hits: Mutex<ReportedHits>,
    /// Counted rules' window use as reports tell it, kept while a drill is
    /// observed (its report's per-window figures); bounded as
    /// [`DRILL_WINDOWS`] says.
    drill_windows: Mutex<WindowCounts>,
    /// Rules whose `meridian_global_*` gauges this node set (one per
    /// global rule), so they go to 0 when it stops leading or the rule
    /// leaves. Touched only by the round loop.
    ledger_series: Mutex<BTreeSet<String>>,
}

/// The leader exports the ledger's gauges at least this often (the round
/// loop wakes for it), so a period's figure follows within a second.
const LEDGER_EXPORT_EVERY: Duration = Duration::from_secs(1);

/// Window-use entries kept for drills: (rule, window) pairs, the newest
/// kept; windows older than [`DRILL_WINDOW_AGE_MS`] are dropped too.
pub const DRILL_WINDOWS: usize = 10_000;
const DRILL_WINDOW_AGE_MS: i64 = 600_000;

/// The [`Leader`] and the Raft term it leads for.
struct Leading {
    leader: Leader,
    /// The Raft term whose leadership seeded `leader`; `None` while following.
    term: Option<u64>,
}

impl Allocator {
    pub fn new(
        node: Arc<Node>,
        config: LeaderConfig,
        auto_register_regions: bool,
    ) -> Arc<Allocator> {
        super::ledger::describe();
        Arc::new(Allocator {
            auto_register_regions,
            leading: Mutex::new(Leading {
                leader: Leader::new(config),
                term: None,
            }),
            node,
            wake: Notify::new(),
            leader_client: tokio::sync::Mutex::new(None),
            hits: Mutex::new(ReportedHits::default()),
            drill_windows: Mutex::new(WindowCounts::new()),
            ledger_series: Mutex::new(BTreeSet::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leading> {
        // A panic while holding the lock leaves counters, not invariants.
        self.leading.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The leader's state for this node's current term when it leads:
    /// seeded from the committed state on the first use in a term, with the
    /// enforced rule set's global rules.
    fn leading<'a>(
        &'a self,
        applied: &Applied,
        now: i64,
    ) -> Option<std::sync::MutexGuard<'a, Leading>> {
        let metrics = self.node.raft.metrics().borrow().clone();
        let mut guard = self.lock();
        if metrics.current_leader != Some(self.node.id) {
            guard.term = None;
            return None;
        }
        if guard.term != Some(metrics.current_term) {
            guard.leader.seed(&applied.registry.allocations, now);
            guard.term = Some(metrics.current_term);
            tracing::info!(
                epoch = applied.registry.allocations.epoch,
                "leading: demand seeded from the last epoch"
            );
        }
        refresh_rules(&mut guard.leader, &applied.registry);
        refresh_overrides(&mut guard.leader, &applied.registry, now);
        Some(guard)
    }

    /// Whether this node leads now (and so counts reports).
    pub fn is_leader(&self) -> bool {
        let m = self.node.raft.metrics().borrow().clone();
        m.current_leader == Some(self.node.id)
    }

    /// Accepts a report here (leader) or relays it to the leader.
    pub async fn report(&self, report: pb::DemandReport, forwarded: bool) -> Result<u64, Status> {
        // Checked where it arrives: a follower relays only what it accepted.
        let accepted = super::report_bounds::accept(&report)?;
        let drill = self
            .node
            .applied
            .borrow()
            .registry
            .drills
            .active_on(&report.region)
            .map(|d| (d.id, d.mode));
        if let Some((id, Mode::Partition)) = drill {
            counter!("meridian_coordinator_reports_refused_total", "field" => "drill").increment(1);
            return Err(Status::unavailable(format!(
                "region {:?} is cut off from the coordinators by drill {id} (partition)",
                report.region
            )));
        }
        let registered = self
            .node
            .applied
            .borrow()
            .registry
            .regions
            .contains_key(&report.region);
        if !registered && !self.auto_register_regions {
            counter!("meridian_coordinator_reports_refused_total", "field" => "region")
                .increment(1);
            return Err(Status::not_found(format!(
                "region {:?} is not registered: an admin registers it with PUT /api/v1/regions/{}",
                report.region, report.region
            )));
        }
        // When this node last heard each region (a region is registered, or
        // auto-registered in development, so the label stays bounded): the
        // "region silent" alert takes the newest over every node.
        metrics::gauge!(
            "meridian_coordinator_region_last_report_timestamp_seconds",
            "region" => report.region.clone()
        )
        .set(now_unix_ms() as f64 / 1000.0);
        if self.is_leader() {
            if !self
                .lock()
                .leader
                .admits_pod(&accepted.region, &accepted.pod)
            {
                counter!("meridian_coordinator_reports_refused_total", "field" => "pod")
                    .increment(1);
                return Err(Status::resource_exhausted(format!(
                    "region {:?} already has {} pods reporting; a new pod is taken once \
                     silent ones are forgotten (two leases)",
                    accepted.region,
                    crate::allocation::demand::MAX_PODS_PER_REGION
                )));
            }
            self.record_windows(&accepted);
            self.count_hits(&report);
            self.answer_resets(&report);
            if let Some((id, Mode::Fail)) = drill {
                // Treated as dead: the report moves nothing (no demand, no
                // acknowledgement, no lease renewal); its hits and window use
                // are still counted for the drill's report.
                counter!("meridian_coordinator_reports_ignored_total", "reason" => "drill")
                    .increment(1);
                tracing::debug!(region = %report.region, drill = id, "report ignored: region failed by a drill");
                return Ok(self.node.applied.borrow().registry.allocations.epoch);
            }
            self.ingest(&accepted);
            return Ok(self.node.applied.borrow().registry.allocations.epoch);
        }
        if forwarded {
            return Err(Status::unavailable(
                "not the leader (a relayed report is not relayed again)",
            ));
        }
        let (leader_id, leader) = self
            .node
            .leader()
            .ok_or_else(|| Status::unavailable("no leader known; retry"))?;
        let mut cached = self.leader_client.lock().await;
        let client = match cached.as_ref() {
            Some((addr, client)) if *addr == leader.raft_addr => client.clone(),
            _ => {
                let url = self.node.transport.url(&leader.raft_addr);
                let channel = self
                    .node
                    .transport
                    .channel(&url, Expect::Node(leader_id), |e| {
                        e.connect_timeout(Duration::from_secs(1))
                            .timeout(Duration::from_secs(5))
                    })
                    .map_err(Status::internal)?;
                let client = CoordinatorClient::new(channel);
                *cached = Some((leader.raft_addr.clone(), client.clone()));
                client
            }
        };
        drop(cached);
        let mut request = tonic::Request::new(report);
        request
            .metadata_mut()
            .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
        let mut client = client;
        counter!("meridian_coordinator_reports_forwarded_total").increment(1);
        Ok(client.report(request).await?.into_inner().epoch)
    }

    /// Commits the first answer of the report's region to each reset still
    /// pending for it (every pod repeats its answers until then).
    fn answer_resets(&self, report: &pb::DemandReport) {
        if report.resets_applied.is_empty() {
            return;
        }
        let applied = self.node.applied.borrow().clone();
        let now = now_unix_ms();
        for a in &report.resets_applied {
            let pending = applied
                .registry
                .resets
                .by_id
                .get(&a.id)
                .is_some_and(|o| o.pending_for(&report.region, now));
            if !pending {
                continue;
            }
            let command = Command::ResetAnswered {
                id: a.id,
                region: report.region.clone(),
                answer: RegionAnswer {
                    at_unix_ms: a.at_unix_ms,
                    pod: report.pod.clone(),
                    ok: a.ok,
                    detail: a.detail.clone(),
                },
            };
            let node = Arc::clone(&self.node);
            tokio::spawn(async move {
                if let Err(e) = node.raft.client_write(command).await {
                    tracing::warn!(error = %e, "a reset's answer was not committed; the next report repeats it");
                }
            });
        }
    }

    fn ingest(&self, report: &PodReport) {
        let now = now_unix_ms();
        let applied = self.node.applied.borrow().clone();
        let Some(mut guard) = self.leading(&applied, now) else {
            return;
        };
        let regions = region_defs(&applied.registry);
        let heard = guard
            .leader
            .ingest(report, &applied.registry.allocations, &regions, now);
        let cadence = guard.leader.report_cadence_mut();
        let (slow, expected_ms) = (cadence.take_warnings(), cadence.expected_ms());
        let mismatched = cadence.slow_pods(now).len();
        drop(guard);
        gauge!("meridian_report_interval_mismatched_pods").set(mismatched as f64);
        for pod in slow {
            tracing::warn!(
                region = %pod.region,
                pod = %pod.pod,
                interval_ms = pod.interval_ms,
                expected_ms,
                "a limiter reports demand less often than the coordinators ask: rounds \
                 without its news flap allocations; upgrade it, or drop its \
                 --report-interval (logged again in 5 minutes if it persists)"
            );
        }
        counter!("meridian_coordinator_reports_total").increment(1);
        counter!("meridian_coordinator_demand_steps_total").increment(u64::from(heard.steps));
        counter!("meridian_coordinator_top_ups_total").increment(report.top_ups.len() as u64);
        if heard.wake {
            self.wake.notify_one();
        }
    }

    /// Adds an accepted report's hits to [`Allocator::hits`]: for rules
    /// with an allocation, from registered regions.
    fn count_hits(&self, report: &pb::DemandReport) {
        let applied = self.node.applied.borrow().clone();
        let registry = &applied.registry;
        self.hits.lock().unwrap_or_else(|p| p.into_inner()).record(
            report,
            |rule| registry.allocations.rules.contains_key(rule),
            |rule, key| {
                registry
                    .allocations
                    .rules
                    .get(rule)
                    .is_some_and(|r| r.keys.contains_key(key))
            },
            |region| registry.regions.contains_key(region),
        );
    }

    /// Notes a report's window use while some drill is observed: each
    /// region heard in a window counts (0 if it reported none), with the
    /// most any key reached.
    fn record_windows(&self, report: &PodReport) {
        let applied = self.node.applied.borrow().clone();
        let drills = &applied.registry.drills;
        if drills.unfinished().next().is_none() {
            return;
        }
        let now = now_unix_ms();
        let mut windows = self.drill_windows.lock().unwrap_or_else(|p| p.into_inner());
        let periods: BTreeMap<String, i64> = drills
            .unfinished()
            .flat_map(|d| d.baseline.iter())
            .filter(|b| b.period_ms > 0)
            .map(|b| (b.rule.clone(), b.period_ms as i64))
            .collect();
        for (rule, &p) in &periods {
            let start = now.div_euclid(p) * p;
            windows
                .entry((rule.clone(), start))
                .or_default()
                .entry(report.region.clone())
                .or_default();
            // Heard after the last window ended: its figure there is final.
            if let Some(h) = windows
                .get_mut(&(rule.clone(), start - p))
                .and_then(|w| w.get_mut(&report.region))
            {
                h.last = true;
            }
        }
        for u in &report.used {
            let Some(&p) = periods.get(&u.rule) else {
                continue;
            };
            let current = now.div_euclid(p) * p;
            // The current window, or one that ended (its final count, which
            // a leader that took over since has no entry for yet); nothing
            // older than the retention below, nothing in the future.
            if u.window_start_ms > current || u.window_start_ms < now - DRILL_WINDOW_AGE_MS {
                continue;
            }
            let h = windows
                .entry((u.rule.clone(), u.window_start_ms))
                .or_default()
                .entry(report.region.clone())
                .or_default();
            h.count = h.count.max(u.used.count);
            h.cap = h.cap.max(u.used.cap);
            if u.window_start_ms < current {
                h.last = true;
            }
        }
        windows.retain(|(_, start), _| *start >= now - DRILL_WINDOW_AGE_MS);
        while windows.len() > DRILL_WINDOWS {
            let Some(oldest) = windows.keys().min_by_key(|(_, s)| *s).cloned() else {
                break;
            };
            windows.remove(&oldest);
        }
    }

    /// The window use recorded for drills.
    pub fn drill_windows(&self) -> WindowCounts {
        self.drill_windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Hits reported per global rule and region while this node led,
    /// `(asked, allowed)`.
    pub fn hit_counts(&self, rules: impl Iterator<Item = String>) -> HitCounts {
        let hits = self.hits.lock().unwrap_or_else(|p| p.into_inner());
        rules
            .map(|rule| {
                let per = hits
                    .rule(&rule)
                    .into_iter()
                    .map(|(region, h)| (region, (h.asked, h.allowed)))
                    .collect();
                (rule, per)
            })
            .collect()
    }

    /// A drill began or ended: the next round runs at once.
    pub fn nudge(&self) {
        self.lock().leader.regions_changed();
        self.wake.notify_one();
    }

    /// Hits reported for `rule` per region while this node led.
    pub fn hits(&self, rule: &str) -> BTreeMap<String, Hits> {
        self.hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rule(rule)
    }

    /// Hits reported for `key` of `rule` per region while this node led,
    /// counted only while the key has an allocation entry of its own.
    pub fn key_hits(&self, rule: &str, key: &str) -> BTreeMap<String, Hits> {
        self.hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .key(rule, key)
    }

    /// The leader's loop; runs on every node, acts only while leading.
    pub async fn run(self: Arc<Self>) {
        loop {
            let due_at = self.lock().leader.next_due();
            let wait = Duration::from_millis((due_at.saturating_sub(now_unix_ms())).max(0) as u64)
                .min(LEDGER_EXPORT_EVERY);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {
                    // Acknowledgements arriving together make one round.
                    tokio::time::sleep(Duration::from_millis(ACK_DEBOUNCE_MS as u64)).await;
                }
            }
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "rebalance round failed");
                counter!("meridian_coordinator_rebalance_failures_total").increment(1);
            }
            self.export_ledger();
        }
    }

    /// Finishes the ledger's due periods and sets its gauges (leader), or
    /// zeroes them (follower); see `coordinator::ledger`.
    fn export_ledger(&self) {
        let now = now_unix_ms();
        let applied = self.node.applied.borrow().clone();
        let mut series = self.ledger_series.lock().unwrap_or_else(|p| p.into_inner());
        match self.leading(&applied, now) {
            Some(mut guard) => {
                let ledger = guard.leader.ledger_mut();
                ledger.advance(now);
                super::ledger::export(Some(ledger), now, &mut series);
            }
            None => super::ledger::export(None, now, &mut series),
        }
    }

    /// Runs `f` over the leader's ledger with its due periods finished;
    /// `None` when this node does not lead (a follower holds no ledger).
    /// The lock is held while `f` runs: keep it to copying out.
    pub fn with_ledger<R>(&self, f: impl FnOnce(&Ledger, Millis) -> R) -> Option<R> {
        let now = now_unix_ms();
        let applied = self.node.applied.borrow().clone();
        let mut guard = self.leading(&applied, now)?;
        let ledger = guard.leader.ledger_mut();
        ledger.advance(now);
        Some(f(ledger, now))
    }

    /// [`Allocator::with_ledger`], with the open reservations the pods
    /// reported beside it (`ctl usage`'s reserved vs settled).
    pub fn with_usage<R>(
        &self,
        f: impl FnOnce(&Ledger, &crate::allocation::reserved::ReservedBook, Millis) -> R,
    ) -> Option<R> {
        let now = now_unix_ms();
        let applied = self.node.applied.borrow().clone();
        let mut guard = self.leading(&applied, now)?;
        guard.leader.ledger_mut().advance(now);
        Some(f(guard.leader.ledger(), guard.leader.reserved(), now))
    }

    /// Runs the round the leader says is due, if any, and commits its epoch.
    async fn round(&self) -> Result<(), String> {
        let applied: Arc<Applied> = self.node.applied.borrow().clone();
        let now = now_unix_ms();
        let started = Instant::now();
        // A span per round the leader runs (rounds are seconds apart).
        let span;
        let (delta, unknown) = {
            let Some(mut guard) = self.leading(&applied, now) else {
                // Not leading: sleep until the next scheduled instant.
                let mut guard = self.lock();
                let _ = guard.leader.due(now);
                return Ok(());
            };
            let Some(kind) = guard.leader.due(now) else {
                return Ok(());
            };
            span = tracing::info_span!(
                target: crate::traces::TARGET,
                "coordinator.round",
                kind = ?kind,
                epoch = tracing::field::Empty,
            );
            let regions = region_defs(&applied.registry);
            let delta = span.in_scope(|| {
                guard
                    .leader
                    .round(kind, now, &applied.registry.allocations, &regions)
            });
            (delta, guard.leader.take_unknown_regions())
        };
        self.commit(delta, unknown, now, started)
            .instrument(span)
            .await
    }

    /// Registers `unknown` regions and commits a round's epoch, if it made one.
    async fn commit(
        &self,
        delta: Option<EpochDelta>,
        unknown: std::collections::BTreeSet<String>,
        now: i64,
        started: Instant,
    ) -> Result<(), String> {
        histogram!("meridian_coordinator_rebalance_seconds")
            .record(started.elapsed().as_secs_f64());
        for name in unknown {
            // Only with --auto-register-regions (reports from unknown regions
            // are refused otherwise): register it with weight 1 so it gets a
            // share. Its next report finds it registered without a lease,
            // which runs a round at once.
            tracing::info!(region = %name, "registering a region that reported");
            let command = Command::PutRegion {
                name,
                weight: 1.0,
                state: RegionState::Active,
                at_unix_ms: now,
            };
            if let Err(e) = self.node.write(Write::Command(command), false).await {
                tracing::warn!(error = %e, "cannot register region");
            }
        }
        let Some(delta) = delta else {
            return Ok(());
        };
        let epoch = delta.epoch;
        tracing::Span::current().record("epoch", epoch);
        let bytes = bincode::serialized_size(&delta).unwrap_or(0);
        self.node
            .raft
            .client_write(Command::Epoch(delta))
            .await
            .map_err(|e| e.to_string())?;
        gauge!("meridian_coordinator_allocation_epoch").set(epoch as f64);
        histogram!("meridian_coordinator_epoch_delta_bytes").record(bytes as f64);
        counter!("meridian_coordinator_epochs_total").increment(1);
        tracing::debug!(epoch, bytes, "allocation epoch committed");
        Ok(())
    }

    /// Pods and the epoch each holds (leader only), for the admin API.
    pub fn pods(&self) -> Vec<PodEpoch> {
        self.lock().leader.pods()
    }

    /// The report interval limiters are given and the pods whose reports
    /// cover more than 1.5 times it (leader only), for `/readyz` and the
    /// dashboard.
    pub fn report_cadence(&self) -> (u64, Vec<crate::allocation::cadence::SlowPod>) {
        let guard = self.lock();
        let cadence = guard.leader.report_cadence();
        (cadence.expected_ms(), cadence.slow_pods(now_unix_ms()))
    }

    /// Keys with tracked demand per global rule (leader only), for the admin API.
    pub fn tracked_keys(&self, rule: &str) -> usize {
        self.lock().leader.tracked_keys(rule)
    }
}

/// The registered regions as the leader needs them. A region in a drain
/// drill is draining whatever its registered state; a failed or cut-off one
/// keeps its state (the leader simply stops hearing it, as in an outage).
fn region_defs(registry: &Registry) -> Vec<RegionDef> {
    registry
        .regions
        .values()
        .map(|r| RegionDef {
            name: r.name.clone(),
            weight: r.weight,
            status: match (r.state, registry.drills.mode_of(&r.name)) {
                (RegionState::Failed, _) => RegionStatus::Failed,
                (_, Some(Mode::Drain)) | (RegionState::Draining, _) => RegionStatus::Draining,
                (RegionState::Active, _) => RegionStatus::Active,
            },
        })
        .collect()
}

/// Gives the leader the global rules of the enforced rule-set version when
/// that version changed.
/// Gives the leader the overrides in force when the set's version moved or
/// one of them lapsed.
fn refresh_overrides(leader: &mut Leader, registry: &Registry, now: Millis) {
    let overrides = &registry.overrides;
    if leader.overrides_mut().is_current(overrides.version, now) {
        return;
    }
    leader
        .overrides_mut()
        .set(overrides.version, overrides.by_id.values(), now);
}

fn refresh_rules(leader: &mut Leader, registry: &Registry) {
    let number = registry.enforced().map(|v| v.number);
    if leader.rules_version() == number && number.is_some() {
        return;
    }
    match registry.enforced_rule_set() {
        None => leader.set_rules(None, Vec::new()),
        Some(Ok(set)) => {
            leader.set_rules(number, GlobalRule::of_rule_set(&set));
            // The ledger states bounds from what the leader's rules lack (a
            // bucket's burst, the approximate path's max_batch).
            leader.ledger_mut().set_terms(Terms::of_rule_set(&set));
        }
        Some(Err(e)) => {
            // Validated before commit; a parser change could still refuse it.
            tracing::error!(version = number, error = %e, "enforced rule set no longer parses");
            leader.set_rules(number, Vec::new());
        }
    }
}
