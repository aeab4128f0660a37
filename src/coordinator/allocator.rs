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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use tokio::sync::Notify;
use tonic::Status;

use super::node::{Node, Write};
use super::raft::storage::Applied;
use super::state::{Command, RegionState, Registry, RuleSetVersion, Stage};
use crate::allocation::RegionStatus;
use crate::allocation::demand::PodEpoch;
use crate::allocation::leader::{
    ACK_DEBOUNCE_MS, GlobalRule, Leader, LeaderConfig, PodReport, RegionDef,
};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::rules::{RuleFile, RuleSet};
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
}

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
        Arc::new(Allocator {
            auto_register_regions,
            leading: Mutex::new(Leading {
                leader: Leader::new(config),
                term: None,
            }),
            node,
            wake: Notify::new(),
            leader_client: tokio::sync::Mutex::new(None),
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
        Some(guard)
    }

    fn is_leader(&self) -> bool {
        let m = self.node.raft.metrics().borrow().clone();
        m.current_leader == Some(self.node.id)
    }

    /// Accepts a report here (leader) or relays it to the leader.
    pub async fn report(&self, report: pb::DemandReport, forwarded: bool) -> Result<u64, Status> {
        // Checked where it arrives: a follower relays only what it accepted.
        let accepted = super::report::accept(&report)?;
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
        drop(guard);
        counter!("meridian_coordinator_reports_total").increment(1);
        counter!("meridian_coordinator_demand_steps_total").increment(u64::from(heard.steps));
        counter!("meridian_coordinator_top_ups_total").increment(report.top_ups.len() as u64);
        if heard.wake {
            self.wake.notify_one();
        }
    }

    /// The leader's loop; runs on every node, acts only while leading.
    pub async fn run(self: Arc<Self>) {
        loop {
            let due_at = self.lock().leader.next_due();
            let wait = Duration::from_millis((due_at.saturating_sub(now_unix_ms())).max(0) as u64);
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
        }
    }

    /// Runs the round the leader says is due, if any, and commits its epoch.
    async fn round(&self) -> Result<(), String> {
        let applied: Arc<Applied> = self.node.applied.borrow().clone();
        let now = now_unix_ms();
        let started = Instant::now();
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
            let regions = region_defs(&applied.registry);
            let delta = guard
                .leader
                .round(kind, now, &applied.registry.allocations, &regions);
            (delta, guard.leader.take_unknown_regions())
        };
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

    /// Keys with tracked demand per global rule (leader only), for the admin API.
    pub fn tracked_keys(&self, rule: &str) -> usize {
        self.lock().leader.tracked_keys(rule)
    }
}

/// The registered regions as the leader needs them.
fn region_defs(registry: &Registry) -> Vec<RegionDef> {
    registry
        .regions
        .values()
        .map(|r| RegionDef {
            name: r.name.clone(),
            weight: r.weight,
            status: match r.state {
                RegionState::Active => RegionStatus::Active,
                RegionState::Draining => RegionStatus::Draining,
                RegionState::Failed => RegionStatus::Failed,
            },
        })
        .collect()
}

/// The rule-set version every region enforces: the current one once it is
/// at stage `all`, else the last stable one.
fn enforced_version(registry: &Registry) -> Option<&RuleSetVersion> {
    match registry.current() {
        Some(v) if v.stage == Stage::All => Some(v),
        _ => registry.stable(),
    }
}

/// Gives the leader the global rules of the enforced rule-set version when
/// that version changed.
fn refresh_rules(leader: &mut Leader, registry: &Registry) {
    let version = enforced_version(registry);
    let number = version.map(|v| v.number);
    if leader.rules_version() == number && number.is_some() {
        return;
    }
    let Some(version) = version else {
        leader.set_rules(None, Vec::new());
        return;
    };
    let files: Vec<RuleFile> = version
        .files
        .iter()
        .map(|(name, text)| RuleFile {
            name: name.clone(),
            text: text.clone(),
        })
        .collect();
    match RuleSet::parse(&files) {
        Ok(set) => leader.set_rules(number, GlobalRule::of_rule_set(&set)),
        Err(e) => {
            // Validated before commit; a parser change could still refuse it.
            tracing::error!(version = version.number, error = %e, "enforced rule set no longer parses");
            leader.set_rules(number, Vec::new());
        }
    }
}
