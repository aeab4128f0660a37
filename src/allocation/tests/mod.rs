//! The rebalancer's promises, checked on random traffic, acknowledgement
//! orders and silences.

use proptest::prelude::*;

use super::demand::{AckTracker, DemandTracker, KeyDemand, bound_report};
use super::rebalance::{Round, rebalance, transition, water_fill};
use super::table::{RegionUpdate, RuleUpdate, Table, region_update};
use super::*;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn regions(
    n: usize,
    status: &[RegionStatus],
    heard: &[Option<Millis>],
    acked: &[Option<Epoch>],
) -> Vec<RegionInput> {
    (0..n)
        .map(|i| RegionInput {
            name: NAMES[i].to_string(),
            weight: 1.0 + i as f64,
            status: status[i],
            last_heard_ms: heard[i],
            acked: acked[i],
        })
        .collect()
}

/// Runs a round and commits its delta, as the coordinator's leader does.
fn commit(
    state: &mut Allocations,
    now_ms: Millis,
    regions: &[RegionInput],
    rules: &[RulePolicy],
    demand: Option<&DemandTracker>,
    config: &Config,
) {
    let round = Round {
        now_ms,
        regions,
        rules,
        demand,
        in_window: None,
    };
    let next = rebalance(state, &round, config);
    let delta = state.diff(&next);
    state.apply(&delta);
}

fn policy(limit: u64, partition: Partition) -> Vec<RulePolicy> {
    vec![RulePolicy {
        rule: "r".into(),
        limit,
        partition,
        fallback: 0.5,
        // Short, so the property test below also sees regions step down.
        fallback_hold_ms: 2_000,
        window_ms: Some(1_000),
    }]
}

fn report(t: &mut DemandTracker, region: &str, keys: &[(&str, u64)]) {
    let keys: Vec<KeyDemand> = keys
        .iter()
        .map(|(k, n)| KeyDemand {
            key: k.to_string(),
            asked: *n,
            allowed: *n,
        })
        .collect();
    // One pod's report covering one whole period: its pace is its count.
    t.count_report(region);
    t.record(region, "r", 60_000, &keys, 0, 60_000);
}

#[test]
fn water_fill_is_max_min_fair() {
    assert_eq!(
        water_fill(1000, &[300.0, 900.0], &[1.0, 1.0]),
        vec![300, 700]
    );
    assert_eq!(
        water_fill(1000, &[900.0, 900.0], &[1.0, 1.0]),
        vec![500, 500]
    );
    assert_eq!(
        water_fill(1000, &[900.0, 900.0], &[1.0, 3.0]),
        vec![250, 750]
    );
    assert_eq!(
        water_fill(1000, &[100.0, 200.0], &[1.0, 1.0]),
        vec![100, 200]
    );
    assert_eq!(
        water_fill(10, &[10.0, 10.0, 10.0], &[1.0, 1.0, 1.0])
            .iter()
            .sum::<u64>(),
        10
    );
}

#[test]
fn shrink_is_published_before_the_grow_it_pays_for() {
    // The worked example in docs/architecture.md: M 600 / H 400 → demand M 300 / H 700.
    let mut slots = [
        Slot {
            granted: 600,
            bound: 600,
            target: 300,
            since: 7,
            immediate: false,
            ..Slot::default()
        },
        Slot {
            granted: 400,
            bound: 400,
            target: 700,
            since: 7,
            immediate: false,
            ..Slot::default()
        },
    ];
    transition(&mut slots, 1000, 8);
    assert_eq!(
        (slots[0].granted, slots[1].granted),
        (300, 400),
        "epoch 8: only the shrink"
    );
    assert_eq!(
        slots[0].bound, 600,
        "M may still enforce 600 until it acknowledges"
    );
    // M acknowledges epoch 8: its bound falls, and epoch 9 grows H.
    slots[0].bound = slots[0].granted;
    transition(&mut slots, 1000, 9);
    assert_eq!((slots[0].granted, slots[1].granted), (300, 700));
}

#[test]
fn only_grows_from_never_issued_capacity_apply_at_once() {
    let mut hw = 0;
    // Mumbai alone: everything it gets was never issued.
    let mut slots = [
        Slot {
            target: 1000,
            ..Slot::default()
        },
        Slot::default(),
    ];
    super::rebalance::transition_tracked(&mut slots, 1000, 1, Some(&mut hw), None);
    assert!(slots[0].immediate && slots[0].granted == 1000);
    // Hyderabad joins: its share was mumbai's, possibly in use this window.
    slots[0].target = 500;
    slots[1].target = 500;
    super::rebalance::transition_tracked(&mut slots, 1000, 2, Some(&mut hw), None);
    slots[0].bound = slots[0].granted;
    super::rebalance::transition_tracked(&mut slots, 1000, 3, Some(&mut hw), None);
    assert_eq!(slots[1].granted, 500);
    assert!(
        !slots[1].immediate,
        "released capacity waits for the window boundary"
    );

    // Both regions from the start: both at once.
    let mut hw = 0;
    let mut slots = [
        Slot {
            target: 600,
            ..Slot::default()
        },
        Slot {
            target: 400,
            ..Slot::default()
        },
    ];
    super::rebalance::transition_tracked(&mut slots, 1000, 1, Some(&mut hw), None);
    assert!(slots.iter().all(|s| s.immediate));
    assert_eq!(hw, 1000);
}

#[test]
fn allocations_follow_a_shift_in_demand() {
    let config = Config {
        ewma_alpha: 1.0,
        ..Config::default()
    };
    let rules = policy(1000, Partition::Strict);
    let mut state = Allocations::default();
    let mut t = DemandTracker::new(config.ewma_alpha);
    let status = [RegionStatus::Active; 2];
    let mut now = 1_000_000;
    // 80/20, then 20/80; every region acknowledges each epoch.
    for (m, h) in [(800, 200), (800, 200), (200, 800), (200, 800), (200, 800)] {
        report(&mut t, "a", &[("k", m)]);
        report(&mut t, "b", &[("k", h)]);
        t.roll(&|_| 1);
        let acked = [Some(state.epoch), Some(state.epoch)];
        let rs = regions(2, &status, &[Some(now), Some(now)], &acked);
        commit(&mut state, now, &rs, &rules, Some(&t), &config);
        // The acks of the epoch just committed arrive: a transition round.
        let acked = [Some(state.epoch), Some(state.epoch)];
        let rs = regions(2, &status, &[Some(now), Some(now)], &acked);
        commit(&mut state, now + 10, &rs, &rules, None, &config);
        now += 60_000;
    }
    let split = &state.rules["r"].split;
    assert!(
        split["b"].granted >= 700,
        "b should hold most of L: {split:?}"
    );
    assert!(split["a"].granted <= 300, "a should have shrunk: {split:?}");
    assert!(split["a"].granted + split["b"].granted <= 1000);
}

#[test]
fn a_silent_region_keeps_its_share_until_its_lease_lapses_then_its_fallback_for_the_hold() {
    let config = Config {
        ewma_alpha: 1.0,
        lease_ms: 10_000,
        suspect_after_ms: 3_000,
        ..Config::default()
    };
    let rules = policy(1000, Partition::Strict);
    let status = [RegionStatus::Active; 2];
    let mut state = Allocations::default();
    let mut t = DemandTracker::new(1.0);
    let mut now = 0;
    let mut a_heard = 0;
    for step in 0..30 {
        report(&mut t, "b", &[("k", 900)]);
        if step < 3 {
            report(&mut t, "a", &[("k", 900)]);
            a_heard = now;
        }
        t.roll(&|_| 1);
        let acked = [
            Some(state.epoch.min(if step < 3 { u64::MAX } else { 3 })),
            Some(state.epoch),
        ];
        let rs = regions(2, &status, &[Some(a_heard), Some(now)], &acked);
        commit(&mut state, now, &rs, &rules, Some(&t), &config);
        let a = state.rules["r"].split["a"];
        let lease = state.regions["a"].valid_until_ms;
        let hold = rules[0].fallback_hold_ms;
        if now <= lease + config.skew_margin_ms {
            // Both ask 900 of 1000 at weights 1:2: a's share is ~1/3.
            assert!(
                a.bound >= 300,
                "a's share is kept while its lease runs: {a:?} at {now}"
            );
        } else if now <= lease + hold + config.skew_margin_ms {
            // Static share of a (weight 1 of 3) = 333; fallback 50 % = 166.
            assert_eq!(a.bound, 166, "after the lease a keeps exactly its fallback");
        } else {
            // a stepped down on its own clock at lease + hold: nothing of
            // it is reserved any more.
            assert_eq!(a.bound, 0, "after the hold a keeps nothing: {a:?} at {now}");
        }
        let b = state.rules["r"].split["b"];
        assert!(a.bound + b.bound <= 1000);
        now += 1_000;
    }
    assert!(
        state.rules["r"].split["b"].granted >= 1000 - 1,
        "the survivor holds all of L once the hold ran out"
    );
}

#[test]
fn a_hot_key_with_its_own_mix_gets_an_entry() {
    let config = Config {
        ewma_alpha: 1.0,
        ..Config::default()
    };
    let rules = policy(1000, Partition::Strict);
    let status = [RegionStatus::Active; 2];
    let mut state = Allocations::default();
    let mut t = DemandTracker::new(1.0);
    let mut now = 0;
    for _ in 0..4 {
        // Most keys come from a; key "x" comes from b.
        let many: Vec<(String, u64)> = (0..50).map(|i| (format!("k{i}"), 100)).collect();
        let many: Vec<(&str, u64)> = many.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        report(&mut t, "a", &many);
        report(&mut t, "b", &[("x", 900)]);
        t.roll(&|_| 1);
        let acked = [Some(state.epoch), Some(state.epoch)];
        let rs = regions(2, &status, &[Some(now), Some(now)], &acked);
        commit(&mut state, now, &rs, &rules, Some(&t), &config);
        now += 60_000;
    }
    let rule = &state.rules["r"];
    assert!(
        rule.split["a"].granted > rule.split["b"].granted,
        "{:?}",
        rule.split
    );
    let x = &rule.keys["x"].shares;
    assert!(
        x["b"].granted > x["a"].granted,
        "x follows its own mix: {x:?}"
    );
    assert!(
        !rule.keys.contains_key("k1"),
        "keys that follow the split need no entry"
    );
}

#[test]
fn the_table_fences_old_epochs_switches_at_window_boundaries_and_falls_back() {
    let mut state = Allocations {
        epoch: 5,
        ..Default::default()
    };
    state.regions.insert(
        "a".into(),
        RegionLease {
            valid_until_ms: 100_000,
            acked: 5,
            last_heard_ms: 0,
        },
    );
    let mut rule = RuleAllocation {
        limit: 1000,
        ..Default::default()
    };
    rule.fallback.insert("a".into(), 100);
    rule.split.insert(
        "a".into(),
        Slot {
            granted: 600,
            bound: 600,
            target: 600,
            since: 5,
            immediate: false,
            ..Slot::default()
        },
    );
    state.rules.insert("r".into(), rule);
    let window = |_: &str| Some(60_000);
    let mut table = Table::default();
    let full = region_update(&state, "a", None).expect("a full update");
    table
        .apply(&full, 10_000, window)
        .expect("first update applies");
    assert_eq!(table.limit("r", "k", 10_000), Some(600));

    let mut next = state.clone();
    next.epoch = 6;
    next.rules
        .get_mut("r")
        .expect("rule")
        .split
        .get_mut("a")
        .expect("slot")
        .granted = 300;
    let delta = state.diff(&next);
    let update = region_update(&next, "a", Some(&delta)).expect("a changed");
    table
        .apply(&update, 20_000, window)
        .expect("newer epoch applies");
    assert_eq!(
        table.limit("r", "k", 59_999),
        Some(600),
        "this window keeps its value"
    );
    assert_eq!(
        table.limit("r", "k", 60_000),
        Some(300),
        "the next window switches"
    );
    assert!(
        table.apply(&update, 30_000, window).is_err(),
        "a replayed epoch is fenced"
    );
    assert_eq!(
        table.limit("r", "k", 100_001),
        Some(100),
        "a lapsed lease falls to the fallback"
    );
    assert_eq!(
        table.split_limit("r", 99_999),
        Some(300),
        "the rule-level value"
    );
    assert_eq!(
        table.split_limit("r", 100_001),
        Some(100),
        "… and its fallback"
    );
    assert_eq!(table.limit("other", "k", 0), None);
    assert_eq!(table.split_limit("other", 0), None);

    // The lease is renewed mid-window (the region reconnected) with the
    // value it was cut off with: it keeps enforcing the fallback it fell
    // to, not the old value, until the window ends.
    let mut renewed = next.clone();
    renewed.epoch = 7;
    renewed.regions.get_mut("a").expect("lease").valid_until_ms = 300_000;
    let delta = next.diff(&renewed);
    let update = region_update(&renewed, "a", Some(&delta)).expect("lease changed");
    table.apply(&update, 130_000, window).expect("applies");
    assert_eq!(table.limit("r", "k", 130_001), Some(100));
    assert_eq!(
        table.limit("r", "k", 180_000),
        Some(300),
        "the next window takes the value"
    );
}

#[test]
fn reports_keep_the_top_keys_and_a_remainder() {
    let keys: Vec<KeyDemand> = (0..100)
        .map(|i| KeyDemand {
            key: format!("k{i:03}"),
            asked: i,
            allowed: i / 2,
        })
        .collect();
    let (top, asked, allowed) = bound_report(keys, 10);
    assert_eq!(top.len(), 10);
    assert_eq!(top[0].key, "k099");
    assert_eq!(asked, (0..90).sum::<u64>());
    assert_eq!(allowed, (0..90).map(|i| i / 2).sum::<u64>());
}

#[test]
fn a_region_acknowledges_when_every_recent_pod_holds_the_epoch() {
    let mut acks = AckTracker::default();
    acks.record("p1", "a", 7, 1_000);
    acks.record("p2", "a", 6, 1_000);
    assert_eq!(acks.region("a", 1_500, 10_000).0, Some(6));
    acks.record("p2", "a", 7, 1_200);
    assert_eq!(acks.region("a", 1_500, 10_000).0, Some(7));
    // p1 went quiet long ago: it no longer holds the region back.
    acks.record("p2", "a", 9, 20_000);
    assert_eq!(acks.region("a", 20_000, 10_000).0, Some(9));
}

#[test]
fn pods_of_the_same_name_in_two_regions_acknowledge_apart() {
    // Two Kubernetes clusters both run `limiter-0`: one region's report
    // must not move the other's acknowledgement.
    let mut acks = AckTracker::default();
    acks.record("limiter-0", "a", 7, 1_000);
    acks.record("limiter-0", "b", 3, 1_000);
    assert_eq!(acks.region("a", 1_500, 10_000).0, Some(7));
    assert_eq!(acks.region("b", 1_500, 10_000).0, Some(3));
    assert_eq!(acks.pods().len(), 2);
}

#[test]
fn a_region_tracks_at_most_its_pod_cap_until_silent_pods_are_forgotten() {
    use super::demand::MAX_PODS_PER_REGION;
    let mut acks = AckTracker::default();
    for i in 0..MAX_PODS_PER_REGION {
        acks.record(&format!("p{i}"), "a", 1, 1_000);
    }
    assert!(!acks.admits("a", "one-more"), "a pod beyond the cap");
    assert!(acks.admits("a", "p7"), "a known pod refused");
    assert!(acks.admits("b", "p0"), "another region's room was used");
    acks.record("p0", "a", 1, 5_000);
    acks.forget_before(2_000);
    assert!(acks.admits("a", "one-more"), "forgotten pods still count");
    assert_eq!(acks.pods().len(), 1);
}

/// One random round: demand per region, which regions are reachable and
/// which epoch each reachable region acknowledges (fraction of the way
/// from what it acked to the newest).
#[derive(Debug, Clone)]
struct Step {
    demand: Vec<u64>,
    reachable: Vec<bool>,
    ack_progress: Vec<u8>,
    full: bool,
    status: Vec<u8>,
}

fn steps(n: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop::collection::vec(0u64..2_000, n),
            prop::collection::vec(prop::bool::weighted(0.8), n),
            prop::collection::vec(0u8..=4, n),
            any::<bool>(),
            prop::collection::vec(0u8..12, n),
        )
            .prop_map(|(demand, reachable, ack_progress, full, status)| Step {
                demand,
                reachable,
                ack_progress,
                full,
                status,
            }),
        1..40,
    )
}

/// What a region may enforce at most: a pod may hold any epoch from the one
/// the region acknowledged on, and enforces that epoch's grant — capped by
/// the fallback once that epoch's lease has run out, and nothing once the
/// hold after it has too.
fn possible(history: &[Allocations], acked: Epoch, region: &str, key: &str, now: Millis) -> u64 {
    let newest = history.last().map_or(0, |s| s.epoch);
    history
        .iter()
        .filter(|s| s.epoch >= acked.min(newest))
        .filter_map(|s| {
            let granted = s.slot("r", key, region)?.granted;
            let lease = s.regions.get(region).map_or(0, |l| l.valid_until_ms);
            let fallback = s.rules.get("r")?.fallback.get(region).copied().unwrap_or(0);
            Some(super::lapsed_value(granted, fallback, lease, 2_000, now))
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn sum_of_what_regions_may_enforce_never_exceeds_the_limit(
        limit in 1u64..5_000,
        n in 2usize..=4,
        plan in steps(4),
        max_shift in prop::option::of(0.05f64..0.5),
    ) {
        let config = Config {
            ewma_alpha: 0.7,
            lease_ms: 5_000,
            suspect_after_ms: 2_000,
            skew_margin_ms: 0,
            max_shift,
            max_key_entries: 2,
            ..Config::default()
        };
        let rules = policy(limit, Partition::Strict);
        let mut state = Allocations::default();
        let mut history = vec![state.clone()];
        let mut tracker = DemandTracker::new(config.ewma_alpha);
        let mut heard: Vec<Option<Millis>> = vec![None; n];
        let mut acked: Vec<Epoch> = vec![0; n];
        let mut now: Millis = 1_000;
        for step in &plan {
            let status: Vec<RegionStatus> = step.status[..n]
                .iter()
                .map(|s| match s { 0 => RegionStatus::Draining, 1 => RegionStatus::Failed, _ => RegionStatus::Active })
                .collect();
            for i in 0..n {
                if step.reachable[i] {
                    heard[i] = Some(now);
                    let span = state.epoch - acked[i];
                    acked[i] += span * step.ack_progress[i] as u64 / 4;
                    report(&mut tracker, NAMES[i], &[("k", step.demand[i]), ("hot", step.demand[(i + 1) % n])]);
                }
            }
            tracker.roll(&|_| 1);
            let acks: Vec<Option<Epoch>> = (0..n).map(|i| heard[i].map(|_| acked[i])).collect();
            let rs = regions(n, &status, &heard, &acks);
            let round = Round { now_ms: now, regions: &rs, rules: &rules, demand: step.full.then_some(&tracker) , in_window: None};
            let next = rebalance(&state, &round, &config);
            prop_assert_eq!(next.epoch, state.epoch + 1, "epochs are monotonic");
            let delta = state.diff(&next);
            let mut applied = state.clone();
            applied.apply(&delta);
            prop_assert_eq!(&applied, &{ let mut n2 = next.clone(); n2.history = applied.history.clone(); n2 });
            state = applied;
            history.push(state.clone());

            for key in ["k", "hot", "cold"] {
                let mut sum = 0;
                for (i, name) in NAMES[..n].iter().enumerate() {
                    sum += possible(&history, acked[i], name, key, now);
                }
                prop_assert!(sum <= limit, "key {key}: regions may enforce {sum} > L {limit} at epoch {}", state.epoch);
                let bounds: u64 = NAMES[..n].iter().filter_map(|r| state.slot("r", key, r)).map(|s| s.bound).sum();
                prop_assert!(bounds <= limit);
            }
            now += 1_000;
        }
    }

    #[test]
    fn steady_demand_converges_to_demand_or_proportional_shares_above_floors(
        limit in 100u64..10_000,
        demand in prop::collection::vec(0u64..10_000, 3),
    ) {
        let config = Config { ewma_alpha: 1.0, hysteresis: 0.0, headroom: 0.0, ..Config::default() };
        let rules = policy(limit, Partition::Strict);
        let mut state = Allocations::default();
        let mut tracker = DemandTracker::new(1.0);
        let status = [RegionStatus::Active; 3];
        for round_no in 0..6 {
            let now = round_no * 1_000;
            for (i, d) in demand.iter().enumerate() {
                tracker.count_report(NAMES[i]);
                tracker.record(NAMES[i], "r", 1_000, &[KeyDemand { key: "k".into(), asked: *d, allowed: 0 }], 0, 1_000);
            }
            tracker.roll(&|_| 1);
            let acked = [Some(state.epoch); 3];
            let rs = regions(3, &status, &[Some(now); 3], &acked);
            commit(&mut state, now, &rs, &rules, Some(&tracker), &config);
            let acked = [Some(state.epoch); 3];
            let rs = regions(3, &status, &[Some(now); 3], &acked);
            commit(&mut state, now + 1, &rs, &rules, None, &config);
        }
        let rs = regions(3, &status, &[Some(0); 3], &[None; 3]);
        let statics = static_shares(limit, &rs);
        let got: Vec<u64> = NAMES[..3].iter().map(|r| state.slot("r", "k", r).map_or(0, |s| s.granted)).collect();
        let total: u64 = got.iter().sum();
        prop_assert!(total <= limit);
        for i in 0..3 {
            let floor = (statics[i] as f64 * config.floor).floor() as u64;
            prop_assert!(got[i] >= floor, "region {i} below its floor: {got:?}");
        }
        let floors: Vec<u64> = statics.iter().map(|s| (*s as f64 * config.floor).floor() as u64).collect();
        // Every region keeps its floor, an idle one too: what is left of L
        // after the floors is what demand can claim.
        let claimed: u64 = (0..3).map(|i| demand[i].max(floors[i])).sum();
        if claimed <= limit {
            // Enough for everyone: each region gets at least its demand.
            for i in 0..3 {
                prop_assert!(got[i] + 1 >= demand[i], "region {i} short of {}: {got:?}", demand[i]);
            }
        } else {
            // Scarce: above the floors, shares follow weight × demand — the
            // split an exact global counter makes — give or take rounding.
            let claims: Vec<f64> = (0..3)
                .map(|i| demand[i].saturating_sub(floors[i]) as f64 * (1.0 + i as f64))
                .collect();
            let left = (limit - floors.iter().sum::<u64>()) as f64;
            let total: f64 = claims.iter().sum();
            for i in 0..3 {
                let want = floors[i] as f64 + left * claims[i] / total;
                prop_assert!((got[i] as f64 - want).abs() <= 2.0,
                    "region {i} got {} instead of {want:.1}: {got:?} demand {demand:?}", got[i]);
            }
        }
    }
}

fn update(
    epoch: Epoch,
    valid_until_ms: Millis,
    split: Option<u64>,
    keys: Vec<(&str, Option<u64>)>,
) -> RegionUpdate {
    RegionUpdate {
        epoch,
        valid_until_ms,
        full: false,
        rules: vec![RuleUpdate {
            rule: "r".into(),
            limit: 1000,
            fallback: 100,
            split,
            keys: keys.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..Default::default()
        }],
        removed_rules: Vec::new(),
    }
}

#[test]
fn a_removed_key_entry_keeps_its_value_until_the_window_boundary() {
    // Found by the simulator: the key jumped to the split mid-window, while
    // the region that paid for the grow still enforced its old value.
    let window = |_: &str| Some(60_000);
    let first = update(1, 1_000_000, Some(600), vec![("k", Some(300))]);
    let gone = update(2, 1_000_000, None, vec![("k", None)]);
    let mut table = Table::default();
    table.apply(&first, 0, window).expect("applies");
    assert_eq!(table.limit("r", "k", 60_000), Some(300));
    table.apply(&gone, 70_000, window).expect("applies");
    assert_eq!(
        table.limit("r", "k", 119_999),
        Some(300),
        "this window keeps its value"
    );
    assert_eq!(
        table.limit("r", "k", 120_000),
        Some(600),
        "the next one follows the split"
    );
    // An entry back before the boundary continues from the retiring value.
    let mut table = Table::default();
    table.apply(&first, 0, window).expect("applies");
    table.apply(&gone, 70_000, window).expect("applies");
    let back = update(3, 1_000_000, None, vec![("k", Some(500))]);
    table.apply(&back, 80_000, window).expect("applies");
    assert_eq!(table.limit("r", "k", 90_000), Some(300));
    assert_eq!(table.limit("r", "k", 120_000), Some(500));
}

mod estimator;
mod in_window;
