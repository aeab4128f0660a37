//! Global limits on the coordinator: demand reports in, allocation epochs out.
//!
//! Every node accepts reports; a follower forwards them to the leader. The
//! leader keeps demand (EWMA) and acknowledgements in memory, runs the pure
//! rebalancer (`crate::allocation::rebalance`) every `--rebalance-interval`,
//! after acknowledgements (to grant what shrinks released) and after early
//! top-up requests, and commits each epoch through Raft as a delta with the
//! smoothed demand it used. A new leader seeds its demand from that committed
//! state, so it continues without a learning period; it starts with no
//! acknowledgements, which only delays grows (shrinks stay counted at their
//! old value until pods report again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use tokio::sync::Notify;
use tonic::Status;

use super::node::{Node, Write};
use super::raft::storage::Applied;
use super::state::{Command, RegionState, Registry, Stage};
use crate::algorithm::Algorithm;
use crate::allocation::demand::{AckTracker, DemandTracker, KeyDemand, Pace};
use crate::allocation::rebalance::{Round, is_noop, rebalance};
use crate::allocation::{self, InWindow, Millis, RegionInput, RegionStatus, RulePolicy, WindowUse};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::rules::{Accuracy, RuleFile, RuleSet, Scope};

/// gRPC metadata marking a report relayed by another node.
pub const FORWARDED: &str = "x-meridian-forwarded";

/// Out-of-cycle rounds for top-ups run at most this often.
const TOP_UP_GAP: Duration = Duration::from_secs(1);
/// Acknowledgements arriving together are handled in one round.
const ACK_DEBOUNCE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone)]
pub struct AllocatorConfig {
    pub rebalance_interval: Duration,
    /// Scheduled rounds end this long before a multiple of the interval.
    pub round_lead: Duration,
    pub rebalancer: allocation::Config,
}

pub struct Allocator {
    node: Arc<Node>,
    config: AllocatorConfig,
    inbox: Mutex<Inbox>,
    wake: Notify,
    leader_client:
        tokio::sync::Mutex<Option<(String, CoordinatorClient<tonic::transport::Channel>)>>,
}

#[derive(Default)]
struct Inbox {
    demand: DemandTracker,
    acks: AckTracker,
    /// The Raft term whose leadership seeded `demand`; `None` while following.
    seeded_term: Option<u64>,
    last_roll: Option<Instant>,
    top_up: bool,
    last_top_up_round: Option<Instant>,
    /// A region was registered: give it a lease and a share in the next
    /// round, whatever the top-up rate limit says.
    regions_changed: bool,
    /// Regions that reported but are not registered.
    unknown_regions: BTreeSet<String>,
    policies: Policies,
}

/// The global rules of the enforced rule-set version.
#[derive(Default, Clone)]
struct Policies {
    version: Option<u64>,
    rules: Vec<RulePolicy>,
    period_ms: HashMap<String, u64>,
    /// Rules counted exactly in fixed windows → period: regions report
    /// their window use for these, and they may be re-divided within a window.
    counted_ms: BTreeMap<String, u64>,
}

impl Allocator {
    pub fn new(node: Arc<Node>, config: AllocatorConfig) -> Arc<Allocator> {
        Arc::new(Allocator {
            inbox: Mutex::new(Inbox {
                demand: DemandTracker::new(config.rebalancer.ewma_alpha),
                acks: AckTracker::new(config.rebalancer.suspect_after_ms),
                ..Inbox::default()
            }),
            node,
            config,
            wake: Notify::new(),
            leader_client: tokio::sync::Mutex::new(None),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inbox> {
        // A panic while holding the lock leaves counters, not invariants.
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_leader(&self) -> bool {
        let m = self.node.raft.metrics().borrow().clone();
        m.current_leader == Some(self.node.id)
    }

    /// Accepts a report here (leader) or relays it to the leader.
    pub async fn report(&self, report: pb::DemandReport, forwarded: bool) -> Result<u64, Status> {
        if report.region.is_empty() || report.pod.is_empty() {
            return Err(Status::invalid_argument("region and pod must not be empty"));
        }
        if self.is_leader() {
            self.ingest(&report);
            return Ok(self.node.applied.borrow().registry.allocations.epoch);
        }
        if forwarded {
            return Err(Status::unavailable(
                "not the leader (a relayed report is not relayed again)",
            ));
        }
        let Some((_, leader)) = self.node.leader() else {
            return Err(Status::unavailable("no leader known; retry"));
        };
        let mut cached = self.leader_client.lock().await;
        let client = match cached.as_ref() {
            Some((addr, client)) if *addr == leader.raft_addr => client.clone(),
            _ => {
                let endpoint =
                    tonic::transport::Endpoint::from_shared(format!("http://{}", leader.raft_addr))
                        .map_err(|e| Status::internal(e.to_string()))?
                        .connect_timeout(Duration::from_secs(1))
                        .timeout(Duration::from_secs(5));
                let client = CoordinatorClient::new(endpoint.connect_lazy());
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

    fn ingest(&self, report: &pb::DemandReport) {
        let now = now_unix_ms();
        let applied = self.node.applied.borrow().clone();
        let mut inbox = self.lock();
        refresh_policies(&mut inbox.policies, &applied.registry);
        if !applied.registry.regions.contains_key(&report.region) {
            inbox.unknown_regions.insert(report.region.clone());
        }
        // A region heard without a valid lease (new, or back from a
        // partition) gets one in the next round, not the next scheduled one.
        let leased = applied
            .registry
            .allocations
            .regions
            .get(&report.region)
            .is_some_and(|l| l.valid_until_ms > now);
        if !leased {
            inbox.regions_changed = true;
        }
        let before = inbox
            .acks
            .region(&report.region, now, self.config.rebalancer.lease_ms)
            .0;
        inbox
            .acks
            .record(&report.pod, &report.region, report.epoch, now);
        for u in &report.used {
            let used = WindowUse {
                count: u.count,
                cap: u.cap,
            };
            inbox
                .acks
                .record_use(&report.pod, &u.rule, u.window_start_unix_ms, used);
        }
        let after = inbox
            .acks
            .region(&report.region, now, self.config.rebalancer.lease_ms)
            .0;
        let recent = self.config.rebalancer.suspect_after_ms;
        let mut wake = after > before || !leased;
        for rd in &report.rules {
            let Some(period) = inbox.policies.period_ms.get(&rd.rule).copied() else {
                continue;
            };
            let keys: Vec<KeyDemand> = rd
                .keys
                .iter()
                .map(|k| KeyDemand {
                    key: k.key.clone(),
                    asked: k.asked,
                    allowed: k.allowed,
                })
                .collect();
            inbox
                .demand
                .record(&report.region, &rd.rule, period, &keys, rd.remainder_asked);
            let pods = inbox.acks.live_pods(&report.region, now, recent);
            if inbox.demand.follow_steps(
                &report.region,
                &rd.rule,
                period,
                &keys,
                rd.remainder_asked,
                report.interval_ms,
                pods,
            ) {
                counter!("meridian_coordinator_demand_steps_total").increment(1);
                inbox.top_up = true;
                wake = true;
            }
        }
        for t in &report.top_ups {
            let Some(period) = inbox.policies.period_ms.get(&t.rule).copied() else {
                continue;
            };
            if !(t.per_period.is_finite() && t.per_period >= 0.0) {
                continue;
            }
            counter!("meridian_coordinator_top_ups_total").increment(1);
            let pace = Pace {
                pod_per_period: t.per_period,
                interval_ms: t.interval_ms,
                pods: inbox.acks.live_pods(&report.region, now, recent),
            };
            if inbox
                .demand
                .bump(&report.region, &t.rule, period, &t.key, pace)
            {
                inbox.top_up = true;
                wake = true;
            }
        }
        counter!("meridian_coordinator_reports_total").increment(1);
        drop(inbox);
        if wake {
            self.wake.notify_one();
        }
    }

    /// The leader's loop; runs on every node, acts only while leading.
    pub async fn run(self: Arc<Self>) {
        let interval_ms = self.config.rebalance_interval.as_millis() as i64;
        let lead_ms = self.config.round_lead.as_millis() as i64;
        let mut due = allocation::next_round_at(now_unix_ms(), interval_ms, lead_ms);
        loop {
            let wait = Duration::from_millis((due - now_unix_ms()).max(0) as u64);
            let scheduled = tokio::select! {
                () = tokio::time::sleep(wait) => {
                    due = allocation::next_round_at(now_unix_ms(), interval_ms, lead_ms);
                    true
                }
                () = self.wake.notified() => {
                    tokio::time::sleep(ACK_DEBOUNCE).await;
                    false
                }
            };
            if !self.is_leader() {
                self.lock().seeded_term = None;
                continue;
            }
            if let Err(e) = self.round(scheduled).await {
                tracing::warn!(error = %e, "rebalance round failed");
                counter!("meridian_coordinator_rebalance_failures_total").increment(1);
            }
        }
    }

    async fn round(&self, scheduled: bool) -> Result<(), String> {
        let applied: Arc<Applied> = self.node.applied.borrow().clone();
        let term = self.node.raft.metrics().borrow().current_term;
        let now = now_unix_ms();
        let started = Instant::now();
        let cfg = &self.config.rebalancer;
        let (next, unknown) = {
            let mut inbox = self.lock();
            if inbox.seeded_term != Some(term) {
                // New leadership: continue from the committed demand.
                inbox.demand = DemandTracker::new(cfg.ewma_alpha);
                inbox.demand.seed(&applied.registry.allocations);
                inbox.seeded_term = Some(term);
                inbox.last_roll = Some(Instant::now());
                tracing::info!(
                    epoch = applied.registry.allocations.epoch,
                    "leading: demand seeded from the last epoch"
                );
            }
            refresh_policies(&mut inbox.policies, &applied.registry);
            let policies = inbox.policies.clone();
            inbox
                .demand
                .retain_rules(|r| policies.period_ms.contains_key(r));
            let since_roll = inbox.last_roll.map_or(Duration::ZERO, |t| t.elapsed());
            // A scheduled round rolls the interval's reports into the EWMA;
            // right after seeding there is nothing to roll yet.
            let full = scheduled && since_roll >= self.config.rebalance_interval / 2;
            let top_up = !full
                && (std::mem::take(&mut inbox.regions_changed)
                    || inbox.top_up
                        && inbox
                            .last_top_up_round
                            .is_none_or(|t| t.elapsed() >= TOP_UP_GAP));
            if full {
                inbox.demand.roll(since_roll.as_millis() as u64);
                inbox.last_roll = Some(Instant::now());
            }
            if full || top_up {
                inbox.top_up = false;
                inbox.last_top_up_round = Some(Instant::now());
            }
            inbox.acks.forget_before(now - 2 * cfg.lease_ms);
            let regions = region_inputs(&applied.registry, &inbox.acks, now, cfg.lease_ms);
            let in_window = in_window(&policies, &regions, &inbox.acks, now, cfg.lease_ms);
            let round = Round {
                now_ms: now,
                regions: &regions,
                rules: &policies.rules,
                demand: (full || top_up).then_some(&inbox.demand),
                in_window: Some(&in_window),
            };
            let next = rebalance(&applied.registry.allocations, &round, cfg);
            (next, std::mem::take(&mut inbox.unknown_regions))
        };
        histogram!("meridian_coordinator_rebalance_seconds")
            .record(started.elapsed().as_secs_f64());
        if !unknown.is_empty() {
            // Give the new regions a lease and a share without waiting for
            // the next scheduled round.
            self.lock().regions_changed = true;
            self.wake.notify_one();
        }
        for name in unknown {
            // A region exists once its limiters report: register it with
            // weight 1 so it gets a share (operators adjust the weight).
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
        let state = &applied.registry.allocations;
        if is_noop(state, &next) {
            return Ok(());
        }
        let delta = state.diff(&next);
        let epoch = delta.epoch;
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

    /// Pods and the epoch each holds, for the admin API.
    pub fn pods(&self) -> Vec<(String, String, u64, Millis)> {
        self.lock().acks.pods()
    }

    /// Keys with tracked demand per global rule (leader only), for the admin API.
    pub fn tracked_keys(&self, rule: &str) -> usize {
        self.lock().demand.key_count(rule)
    }
}

fn region_inputs(
    registry: &Registry,
    acks: &AckTracker,
    now: Millis,
    lease_ms: i64,
) -> Vec<RegionInput> {
    registry
        .regions
        .values()
        .map(|r| {
            let (acked, heard) = acks.region(&r.name, now, lease_ms);
            RegionInput {
                name: r.name.clone(),
                weight: r.weight,
                status: match r.state {
                    RegionState::Active => RegionStatus::Active,
                    RegionState::Draining => RegionStatus::Draining,
                    RegionState::Failed => RegionStatus::Failed,
                },
                last_heard_ms: heard,
                acked,
            }
        })
        .collect()
}

/// The rule-set version every region enforces: the current one once it is
/// at stage `all`, else the last stable one.
fn enforced_version(registry: &Registry) -> Option<&super::state::RuleSetVersion> {
    match registry.current() {
        Some(v) if v.stage == Stage::All => Some(v),
        _ => registry.stable(),
    }
}

fn refresh_policies(policies: &mut Policies, registry: &Registry) {
    let version = enforced_version(registry);
    let number = version.map(|v| v.number);
    if policies.version == number && number.is_some() {
        return;
    }
    *policies = Policies {
        version: number,
        ..Policies::default()
    };
    let Some(version) = version else { return };
    let files: Vec<RuleFile> = version
        .files
        .iter()
        .map(|(name, text)| RuleFile {
            name: name.clone(),
            text: text.clone(),
        })
        .collect();
    let set = match RuleSet::parse(&files) {
        Ok(set) => set,
        Err(e) => {
            // Validated before commit; a parser change could still refuse it.
            tracing::error!(version = version.number, error = %e, "enforced rule set no longer parses");
            return;
        }
    };
    for rule in set.rules() {
        let Some(params) = &rule.params else { continue };
        if rule.scope != Scope::Global {
            continue;
        }
        policies.rules.push(RulePolicy {
            rule: rule.id.clone(),
            limit: params.limit(),
            partition: rule.partition,
            fallback: rule.fallback,
            window_ms: (!params.algorithm().has_burst())
                .then(|| params.period().as_millis() as u64),
        });
        policies
            .period_ms
            .insert(rule.id.clone(), params.period().as_millis() as u64);
        if params.algorithm() == Algorithm::FixedWindow && rule.accuracy == Accuracy::Exact {
            policies
                .counted_ms
                .insert(rule.id.clone(), params.period().as_millis() as u64);
        }
    }
    policies.rules.sort_by(|a, b| a.rule.cmp(&b.rule));
}

/// The current window's use of every counted rule in every region, from the
/// reports of the pods heard within the lease.
fn in_window(
    policies: &Policies,
    regions: &[RegionInput],
    acks: &AckTracker,
    now: Millis,
    within_ms: i64,
) -> BTreeMap<String, InWindow> {
    policies
        .counted_ms
        .iter()
        .filter(|(_, period)| **period > 0)
        .map(|(rule, period)| {
            let p = *period as Millis;
            let start = now.div_euclid(p) * p;
            let window = InWindow {
                start_ms: start,
                until_ms: start + p,
                elapsed: (now - start) as f64 / p as f64,
                regions: regions
                    .iter()
                    .map(|r| acks.region_use(&r.name, rule, start, now, within_ms))
                    .collect(),
            };
            (rule.clone(), window)
        })
        .collect()
}
