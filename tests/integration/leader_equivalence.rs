//! The coordinator's allocator and the simulator run one leader: the same
//! sequence of reports and acknowledgements, fed to a real coordinator over
//! gRPC and to an [`allocation::leader::Leader`] driven in virtual time as the
//! simulator drives it, gives the same epochs — same numbers, same grants,
//! bounds and targets in every region, same smoothed demand.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meridian::allocation::demand::KeyDemand;
use meridian::allocation::global_rule::GlobalRule;
use meridian::allocation::leader::{
    ACK_DEBOUNCE_MS, Leader, LeaderConfig, PodReport, RegionDef, RuleDemand, TopUp,
};
use meridian::allocation::{Allocations, Config, RegionStatus};
use meridian::proto::meridian::v1 as pb;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use meridian::rules::{RuleFile, RuleSet};
use serde_json::Value;

use common::coordinator::{Cluster, Options};

const RULE: &str = "api|customer";
const RULES: &str = "domain: api
descriptors:
  - key: customer
    scope: global
    partition: strict
    algorithm: sliding_window_counter
    rate_limit:
      unit: minute
      requests_per_unit: 1000
";
/// No scheduled round falls inside the test: every round it sees was started
/// by a report (a new region, a top-up, an acknowledgement).
const INTERVAL: &str = "1000h";
/// A lease spans at least three rounds (the coordinator refuses less).
const LEASE: &str = "3000h";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One slot as both sides show it: (granted, bound, target).
type Slots = BTreeMap<String, (u64, u64, u64)>;

/// The split and demand of `RULE` in a committed state.
fn of_state(state: &Allocations) -> (u64, Slots, BTreeMap<String, i64>) {
    let Some(rule) = state.rules.get(RULE) else {
        return (state.epoch, Slots::new(), BTreeMap::new());
    };
    let split = rule
        .split
        .iter()
        .map(|(r, s)| (r.clone(), (s.granted, s.bound, s.target)))
        .collect();
    let demand = rule
        .demand
        .iter()
        .map(|(r, d)| (r.clone(), d.round() as i64))
        .collect();
    (state.epoch, split, demand)
}

/// The same, from the coordinator's admin API.
fn of_api(body: &Value) -> (u64, Slots, BTreeMap<String, i64>) {
    let epoch = body["epoch"].as_u64().unwrap_or(0);
    let mut split = Slots::new();
    if let Some(map) = body["split"].as_object() {
        for (region, s) in map {
            let n = |f: &str| s[f].as_u64().unwrap_or(u64::MAX);
            split.insert(region.clone(), (n("granted"), n("bound"), n("target")));
        }
    }
    let mut demand = BTreeMap::new();
    if let Some(map) = body["demand"].as_object() {
        for (region, d) in map {
            demand.insert(region.clone(), d.as_f64().unwrap_or(-1.0).round() as i64);
        }
    }
    (epoch, split, demand)
}

/// The leader as `meridian coordinator` configures it with these flags.
fn leader() -> Leader {
    let mut leader = Leader::new(LeaderConfig {
        rebalancer: Config {
            lease_ms: 3000 * 3_600_000,
            ..Config::default()
        },
        rebalance_interval_ms: 1000 * 3_600_000,
        round_lead_ms: 5_000,
        top_up: true,
    });
    let files = [RuleFile {
        name: "rules.yaml".into(),
        text: RULES.into(),
    }];
    let set = match RuleSet::parse(&files) {
        Ok(set) => set,
        Err(e) => panic!("rules: {e}"),
    };
    leader.set_rules(None, GlobalRule::of_rule_set(&set));
    leader
}

struct Twin {
    cluster: Cluster,
    client: CoordinatorClient<tonic::transport::Channel>,
    leader: Leader,
    state: Allocations,
    regions: Vec<RegionDef>,
    seeded: bool,
}

impl Twin {
    /// Sends `report` to the coordinator and to the local leader, waits for
    /// the coordinator to settle, and requires both to hold the same epoch.
    async fn step(&mut self, what: &str, report: PodReport) {
        let now = now_ms();
        if !self.seeded {
            self.leader.seed(&self.state, now);
            self.seeded = true;
        }
        let heard = self.leader.ingest(&report, &self.state, &self.regions, now);
        if heard.wake {
            // The coordinator debounces a wake before it asks.
            let at = now + ACK_DEBOUNCE_MS;
            while let Some(kind) = self.leader.due(at) {
                if let Some(delta) = self.leader.round(kind, at, &self.state, &self.regions) {
                    self.state.apply(&delta);
                }
            }
        }
        let sent = self.client.report(to_pb(&report)).await;
        assert!(sent.is_ok(), "{what}: report refused: {sent:?}");
        let coordinator = self.settled().await;
        let local = of_state(&self.state);
        eprintln!(
            "{what}: epoch {} split {:?} demand {:?}",
            local.0, local.1, local.2
        );
        assert_eq!(
            coordinator, local,
            "{what}: the coordinator (left) and the leader in virtual time (right) differ"
        );
        // Out-of-cycle rounds run at most once a second: `settled` waited a
        // second past the last epoch; a little more keeps clear of the gap.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    /// The coordinator's state once no epoch has been committed for a second
    /// (a round runs 20 ms after the report that makes it due; a loaded
    /// machine may take some hundreds).
    async fn settled(&self) -> (u64, Slots, BTreeMap<String, i64>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = None;
        let mut since = Instant::now();
        loop {
            let body = match self
                .cluster
                .get(1, &format!("/api/v1/allocations?rule={RULE}"))
                .await
            {
                Some((200, body)) => Some(of_api(&body)),
                _ => None,
            };
            if body != last {
                last = body;
                since = Instant::now();
            } else if since.elapsed() >= Duration::from_millis(1_000) {
                return last.unwrap_or_default();
            }
            assert!(Instant::now() < deadline, "the coordinator never settled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn to_pb(r: &PodReport) -> pb::DemandReport {
    pb::DemandReport {
        region: r.region.clone(),
        pod: r.pod.clone(),
        epoch: r.epoch,
        interval_ms: r.interval_ms,
        rules: r
            .rules
            .iter()
            .map(|rd| pb::RuleDemand {
                rule: rd.rule.clone(),
                keys: rd
                    .keys
                    .iter()
                    .map(|k| pb::KeyDemand {
                        key: k.key.clone(),
                        asked: k.asked,
                        allowed: k.allowed,
                    })
                    .collect(),
                remainder_asked: rd.remainder_asked,
                remainder_allowed: rd.remainder_allowed,
            })
            .collect(),
        top_ups: r
            .top_ups
            .iter()
            .map(|t| pb::TopUp {
                rule: t.rule.clone(),
                key: t.key.clone(),
                per_period: t.per_period,
                interval_ms: t.interval_ms,
            })
            .collect(),
        used: Vec::new(),
        admitted: r
            .admitted
            .iter()
            .map(|a| pb::PeriodAdmitted {
                rule: a.rule.clone(),
                key: a.key.clone().unwrap_or_default(),
                period_start_unix_ms: a.period_start_ms,
                admitted: a.admitted,
            })
            .collect(),
        resets_applied: Vec::new(),
        reserved: Vec::new(),
    }
}

fn ack(region: &str, pod: &str, epoch: u64) -> PodReport {
    PodReport {
        region: region.into(),
        pod: pod.into(),
        epoch,
        ..PodReport::default()
    }
}

fn demand(region: &str, pod: &str, epoch: u64, key: &str, asked: u64) -> PodReport {
    PodReport {
        interval_ms: 10_000,
        rules: vec![RuleDemand {
            rule: RULE.into(),
            keys: vec![KeyDemand {
                key: key.into(),
                asked,
                allowed: asked,
            }],
            remainder_asked: 0,
            remainder_allowed: 0,
        }],
        ..ack(region, pod, epoch)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_and_acks_give_the_same_epochs_on_the_coordinator_and_in_the_simulator() {
    let options = Options {
        extra_args: vec![
            "--rebalance-interval".into(),
            INTERVAL.into(),
            "--lease".into(),
            LEASE.into(),
        ],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    cluster.wait_leader(Duration::from_secs(20)).await;
    for region in ["hyderabad", "mumbai"] {
        cluster.register_region(1, region).await;
    }
    let (status, body) = cluster.put_text(1, RULES).await;
    assert_eq!(status, 200, "rules: {body}");
    cluster.wait_version(1, 1, Duration::from_secs(10)).await;
    let client = CoordinatorClient::new(cluster.channel(1));
    let regions = ["hyderabad", "mumbai"]
        .iter()
        .map(|name| RegionDef {
            name: (*name).into(),
            weight: 1.0,
            status: RegionStatus::Active,
        })
        .collect();
    let mut twin = Twin {
        cluster,
        client,
        leader: leader(),
        state: Allocations::default(),
        regions,
        seeded: false,
    };

    // Each region's first pod is heard: it gets a lease and a share.
    twin.step("mumbai heard", ack("mumbai", "m-0", 0)).await;
    let epoch = twin.state.epoch;
    assert!(epoch >= 1, "no epoch for a region heard without a lease");
    twin.step("hyderabad heard", ack("hyderabad", "h-0", epoch))
        .await;
    let epoch = twin.state.epoch;
    twin.step("mumbai acks", ack("mumbai", "m-0", epoch)).await;
    twin.step(
        "hyderabad demand",
        demand("hyderabad", "h-0", epoch, "7", 200),
    )
    .await;
    twin.step("mumbai demand", demand("mumbai", "m-0", epoch, "42", 300))
        .await;
    // Mumbai asks for a top-up: an out-of-cycle round gives it the most.
    twin.step(
        "mumbai asks for a top-up",
        top_up("mumbai", "m-0", epoch, 12_000.0),
    )
    .await;
    let epoch = twin.state.epoch;
    twin.step("hyderabad acks", ack("hyderabad", "h-0", epoch))
        .await;
    twin.step("mumbai acks", ack("mumbai", "m-0", epoch)).await;
    // Then hyderabad does, far more: mumbai's shrink is published first and
    // hyderabad's grow waits for mumbai's acknowledgement.
    twin.step(
        "hyderabad asks for a top-up",
        top_up("hyderabad", "h-0", epoch, 40_000.0),
    )
    .await;
    let split = twin.state.rules[RULE].split.clone();
    assert!(
        split["mumbai"].bound > split["mumbai"].granted
            && split["hyderabad"].granted < split["hyderabad"].target,
        "no shrink awaiting its acknowledgement: {split:?}"
    );
    let epoch = twin.state.epoch;
    twin.step("mumbai acks the shrink", ack("mumbai", "m-0", epoch))
        .await;
    let split = twin.state.rules[RULE].split.clone();
    assert!(
        twin.state.epoch > epoch && split["hyderabad"].granted == split["hyderabad"].target,
        "the acknowledgement did not release hyderabad's grow: {split:?}"
    );
    let epoch = twin.state.epoch;
    twin.step("hyderabad acks the grow", ack("hyderabad", "h-0", epoch))
        .await;
    twin.step("mumbai acks the grow", ack("mumbai", "m-0", epoch))
        .await;
}

fn top_up(region: &str, pod: &str, epoch: u64, per_period: f64) -> PodReport {
    let mut report = ack(region, pod, epoch);
    report.top_ups.push(TopUp {
        rule: RULE.into(),
        key: "42".into(),
        per_period,
        interval_ms: 10_000,
    });
    report
}
