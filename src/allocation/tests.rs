//! The rebalancer's promises, checked on random traffic, acknowledgement
//! orders and silences.

use proptest::prelude::*;

use super::demand::{AckTracker, DemandTracker, KeyDemand, Pace, bound_report};
use super::rebalance::{Round, rebalance, transition, water_fill};
use super::table::{Now, RegionUpdate, RuleUpdate, Table, region_update};
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

#[test]
fn a_top_up_raises_demand_only_when_the_pace_clearly_exceeds_it() {
    let mut t = DemandTracker::new(1.0);
    report(&mut t, "a", &[("k", 1_000)]);
    t.roll(&|_| 1);
    let demand = |t: &DemandTracker| {
        let mut d = 0.0;
        t.for_each_key("r", &["a"], &mut |_, v| d = v[0]);
        d
    };
    // One pod of one, pace known to the hit (no noise test).
    let exact = |per_period: f64| Pace {
        pod_per_period: per_period,
        interval_ms: 0,
        pods: 1,
    };
    // Noise around the average is no reason to grow: a contended key asks
    // for a top-up every window.
    assert!(!t.bump("a", "r", 60_000, "k", exact(1_200.0)));
    assert_eq!(demand(&t), 1_000.0);
    assert!(t.bump("a", "r", 60_000, "k", exact(1_300.0)));
    assert_eq!(demand(&t), 1_300.0);
    let mut totals = Vec::new();
    t.rule_totals("r", &["a"], &mut totals);
    assert_eq!(totals, vec![1_300.0], "the rule's demand follows the key's");
    // A key the tracker has not seen yet starts at nothing: any pace counts.
    assert!(t.bump("a", "r", 60_000, "new", exact(10.0)));
}

#[test]
fn a_top_up_measured_over_a_short_span_must_stand_out_of_poisson_noise() {
    let mut t = DemandTracker::new(1.0);
    report(&mut t, "a", &[("k", 1_200)]);
    t.roll(&|_| 1);
    // 3 pods, 5 s since the pod's last report: it expects 1200 / 3 / 12 =
    // 33 hits, σ ≈ 5.8. 45 hits (region pace 1620, 1.35×) is within 3σ.
    let pace = |hits: u64| Pace::of_report(hits, 5_000, 60_000, 3);
    assert!(!t.bump("a", "r", 60_000, "k", pace(45)));
    // 55 hits (1980, 1.65×) is beyond it.
    assert!(t.bump("a", "r", 60_000, "k", pace(55)));
    let mut d = Vec::new();
    t.rule_totals("r", &["a"], &mut d);
    assert_eq!(d, vec![1_980.0]);
}

#[test]
fn a_step_in_one_report_moves_demand_at_once_and_the_roll_keeps_it() {
    let mut t = DemandTracker::new(0.5);
    for (region, hits) in [("a", 4_800), ("b", 1_200)] {
        report(&mut t, region, &[("k", hits)]);
    }
    t.roll(&|_| 1);
    let totals = |t: &DemandTracker| {
        let mut d = Vec::new();
        t.rule_totals("r", &["a", "b"], &mut d);
        d
    };
    let key = |t: &DemandTracker| {
        let mut d = vec![];
        t.for_each_key("r", &["a", "b"], &mut |_, v| d = v.to_vec());
        d
    };
    // Traffic turns to 20/80. One of b's 3 pods reports 10 s at the new
    // pace: 4800 / 3 / 6 = 267 hits.
    let shifted = |t: &mut DemandTracker, region: &str, hits: u64| {
        let keys = [KeyDemand {
            key: "k".into(),
            asked: hits,
            allowed: hits,
        }];
        t.count_report(region);
        t.record(region, "r", 60_000, &keys, 0, 10_000);
        t.follow_steps(region, "r", 60_000, &keys, 0, 10_000, 3)
    };
    assert!(shifted(&mut t, "b", 267));
    assert_eq!(totals(&t), vec![4_800.0, 4_806.0]);
    assert_eq!(key(&t), vec![4_800.0, 4_806.0]);
    // A's report straddled the shift: 150 hits (2700 per period) is no step
    // yet (> half of 4800) ...
    assert!(!shifted(&mut t, "a", 150));
    // ... the next one is.
    assert!(shifted(&mut t, "a", 67));
    assert_eq!(totals(&t), vec![1_206.0, 4_806.0]);
    // Reports at the new pace, within noise, move nothing more.
    assert!(!shifted(&mut t, "a", 70));
    assert!(!shifted(&mut t, "b", 260));
    // The roll drops the interval's sample, which mixes both paces.
    t.roll(&|_| 1);
    assert_eq!(totals(&t), vec![1_206.0, 4_806.0]);
    assert_eq!(key(&t), vec![1_206.0, 4_806.0]);
    // And the next interval's sample is smoothed as usual.
    report(&mut t, "a", &[("k", 1_206)]);
    report(&mut t, "b", &[("k", 4_806)]);
    t.roll(&|_| 1);
    assert_eq!(totals(&t), vec![1_206.0, 4_806.0]);
}

#[test]
fn after_a_step_that_a_straddling_report_understated_later_reports_refine_it() {
    let mut t = DemandTracker::new(0.5);
    report(&mut t, "a", &[("k", 1_200)]);
    t.roll(&|_| 1);
    let keys = |hits: u64| {
        [KeyDemand {
            key: "k".into(),
            asked: hits,
            allowed: hits,
        }]
    };
    // 1200 → 4800 per period; the first report (one pod of 3, 10 s) saw
    // half of each: 150 hits = 2700.
    t.record("a", "r", 60_000, &keys(150), 0, 10_000);
    assert!(t.follow_steps("a", "r", 60_000, &keys(150), 0, 10_000, 3));
    // 267 hits = 4806: not twice 2700, but beyond noise after a step.
    t.record("a", "r", 60_000, &keys(267), 0, 10_000);
    assert!(t.follow_steps("a", "r", 60_000, &keys(267), 0, 10_000, 3));
    let mut d = Vec::new();
    t.rule_totals("r", &["a"], &mut d);
    assert_eq!(d, vec![4_806.0]);
    // Without a step first, the same move is left to the EWMA.
    let mut u = DemandTracker::new(0.5);
    report(&mut u, "a", &[("k", 2_700)]);
    u.roll(&|_| 1);
    u.record("a", "r", 60_000, &keys(267), 0, 10_000);
    assert!(!u.follow_steps("a", "r", 60_000, &keys(267), 0, 10_000, 3));
}

#[test]
fn a_regions_pace_is_a_pods_pace_times_its_recently_heard_pods() {
    let mut acks = AckTracker::default();
    assert_eq!(
        acks.live_pods("a", 100_000, 30_000),
        1,
        "never fewer than one"
    );
    acks.record("p1", "a", 1, 100_000);
    acks.record("p2", "a", 1, 90_000);
    acks.record("p3", "a", 1, 10_000);
    acks.record("q1", "b", 1, 100_000);
    assert_eq!(acks.live_pods("a", 100_000, 30_000), 2, "p3 is silent");
    assert_eq!(acks.live_pods("b", 100_000, 30_000), 1);
}

#[test]
fn scheduled_rounds_end_the_lead_before_each_multiple_of_the_interval() {
    // 60 s interval, 5 s lead: rounds at :55 of every minute.
    assert_eq!(next_round_at(0, 60_000, 5_000), 55_000);
    assert_eq!(next_round_at(54_999, 60_000, 5_000), 55_000);
    assert_eq!(
        next_round_at(55_000, 60_000, 5_000),
        115_000,
        "strictly later"
    );
    assert_eq!(
        next_round_at(1_700_000_012_345, 60_000, 5_000),
        1_700_000_035_000
    );
    // The lead is at most half the interval.
    assert_eq!(next_round_at(0, 2_000, 5_000), 1_000);
    assert_eq!(next_round_at(0, 2_000, 0), 2_000);
}

fn use_of(count: u64, cap: u64) -> WindowUse {
    WindowUse { count, cap }
}

/// The worked example in docs/architecture.md, before its first epoch: M 600 / H 400 with
/// targets M 300 / H 700.
fn m600_h400_to_m300_h700() -> [Slot; 2] {
    [
        Slot {
            granted: 600,
            bound: 600,
            target: 300,
            ..Slot::default()
        },
        Slot {
            granted: 400,
            bound: 400,
            target: 700,
            ..Slot::default()
        },
    ]
}

#[test]
fn within_a_window_an_unused_shrink_applies_at_once_and_pays_for_an_immediate_grow() {
    // M 600 / H 400 → M 300 / H 700, 15 s into a 60 s window in which M
    // counted 100 (its pace fits 300 for the window, with room for noise)
    // and H 390.
    let heard = |used: WindowUse, reported: usize| RegionWindow {
        used,
        live: 2,
        reported,
        settled_since: 0,
    };
    let window = |m: WindowUse, h: WindowUse, complete: bool| InWindow {
        start_ms: 0,
        until_ms: 60_000,
        elapsed: 0.25,
        regions: vec![heard(m, 2), heard(h, if complete { 2 } else { 1 })],
    };
    let mut slots = m600_h400_to_m300_h700();
    let w = window(use_of(100, 600), use_of(390, 400), true);
    super::rebalance::transition_tracked(&mut slots, 1000, 2, None, Some((&w, None)));
    assert!(slots[0].shrink_now, "M used 100 of the 300 it keeps");
    assert_eq!(slots[0].now_until_ms, 60_000, "for this window only");
    assert_eq!(
        slots[1].granted, 400,
        "nothing to grant before M acknowledges"
    );

    // M acknowledges with its pods at 300: H's grow applies at once.
    slots[0].bound = slots[0].granted;
    let w = window(use_of(130, 300), use_of(400, 400), true);
    super::rebalance::transition_tracked(&mut slots, 1000, 3, None, Some((&w, None)));
    assert_eq!(slots[1].granted, 700);
    assert!(slots[1].immediate && slots[1].now_until_ms == 60_000);

    // The same with one pod of H not heard this window: at the boundary.
    let mut late = slots;
    late[1].granted = 400;
    late[1].bound = 400;
    let w = window(use_of(130, 300), use_of(400, 400), false);
    super::rebalance::transition_tracked(&mut late, 1000, 3, None, Some((&w, None)));
    assert_eq!(late[1].granted, 700);
    assert!(!late[1].immediate, "an unreported pod may enforce anything");

    // M had already counted 450 — at that pace 300 would cut it off: its
    // shrink waits for the boundary, and what it counted stays reserved.
    let mut used = m600_h400_to_m300_h700();
    let w = window(use_of(450, 600), use_of(390, 400), true);
    super::rebalance::transition_tracked(&mut used, 1000, 2, None, Some((&w, None)));
    assert!(!used[0].shrink_now);
    used[0].bound = used[0].granted;
    super::rebalance::transition_tracked(&mut used, 1000, 3, None, Some((&w, None)));
    assert_eq!(used[1].granted, 700);
    assert!(
        !used[1].immediate,
        "M may still admit up to 600 this window"
    );

    // No pod of M heard this window (back from a partition): its count is
    // unknown, so its shrink waits for the boundary.
    let mut unheard = m600_h400_to_m300_h700();
    let w = InWindow {
        start_ms: 0,
        until_ms: 60_000,
        elapsed: 0.25,
        regions: vec![heard(use_of(0, 0), 0), heard(use_of(390, 400), 2)],
    };
    super::rebalance::transition_tracked(&mut unheard, 1000, 2, None, Some((&w, None)));
    assert!(!unheard[0].shrink_now);
}

/// The swing cases the real two-region test fell short on: a shrinking
/// region that ran above its new value's pace steps down at once to what it
/// counted plus that pace for the rest of the window; a grow only part of
/// which fits this window takes that part now; and a grow that waited for
/// the boundary takes what fits once a later round shows it.
#[test]
fn within_a_window_a_swing_hands_over_what_fits_at_once() {
    let heard = |used: WindowUse| RegionWindow {
        used,
        live: 2,
        reported: 2,
        settled_since: 0,
    };
    let window = |m: WindowUse, h: WindowUse| InWindow {
        start_ms: 0,
        until_ms: 60_000,
        elapsed: 0.25,
        regions: vec![heard(m), heard(h)],
    };
    // M counted 150 a quarter into the window (it ran at 600's pace until
    // the swing; its demand is 250 a window now): 300 at once would cut it
    // off early, 600 to the boundary would keep H from the rest of the
    // window. It steps to 150 + 300 × ¾.
    let swung = [250.0, 900.0];
    let mut slots = m600_h400_to_m300_h700();
    let w = window(use_of(150, 600), use_of(390, 400));
    super::rebalance::transition_tracked(&mut slots, 1000, 2, None, Some((&w, Some(&swung))));
    assert!(slots[0].shrink_now && slots[0].now_until_ms == 60_000);
    assert_eq!(
        (slots[0].granted, slots[0].before, slots[0].before_until_ms),
        (300, 375, 60_000),
        "375 until the boundary, 300 from it"
    );
    // Never below the pace of M's own demand: at 400 a window it keeps
    // 150 + 400 × ¾ = 450; still asking 600 (it lost its share to H's
    // growth, not its traffic), or with no demand measured, no step.
    for (paces, step) in [
        (Some([400.0, 900.0]), Some(450)),
        (Some([600.0, 900.0]), None),
        (None, None),
    ] {
        let mut s = m600_h400_to_m300_h700();
        let p = paces.as_ref().map(|p| &p[..]);
        super::rebalance::transition_tracked(&mut s, 1000, 2, None, Some((&w, p)));
        let got = (s[0].before_until_ms > 0).then_some(s[0].before);
        assert_eq!(got, step, "M's demand {paces:?}");
        assert_eq!(s[0].shrink_now, step.is_some());
    }
    // A region restarted within the window may have counted less than it
    // admitted: no step.
    let mut restarted = m600_h400_to_m300_h700();
    let mut w_restart = window(use_of(150, 600), use_of(390, 400));
    w_restart.regions[0].settled_since = 5_000;
    super::rebalance::transition_tracked(
        &mut restarted,
        1000,
        2,
        None,
        Some((&w_restart, Some(&swung))),
    );
    assert!(!restarted[0].shrink_now && restarted[0].before_until_ms == 0);

    // M acknowledges with its pods at 375, having counted 160: H may admit
    // 625 this window, not 700 — it takes the 625 now (a step grow) and the
    // whole 700 from the boundary.
    slots[0].bound = slots[0].granted;
    let w = window(use_of(160, 375), use_of(400, 400));
    super::rebalance::transition_tracked(&mut slots, 1000, 3, None, Some((&w, None)));
    assert_eq!(
        (slots[1].granted, slots[1].before, slots[1].before_until_ms),
        (700, 625, 60_000),
        "625 until the boundary, 700 from it"
    );
    assert!(slots[1].immediate && slots[1].now_until_ms == 60_000);
    // Late in the window too: M may still admit 450, so H 550 now.
    let mut late = m600_h400_to_m300_h700();
    late[0].bound = 300;
    late[0].granted = 300;
    let w_late = InWindow {
        elapsed: 0.75,
        ..window(use_of(450, 300), use_of(400, 400))
    };
    super::rebalance::transition_tracked(&mut late, 1000, 3, None, Some((&w_late, None)));
    assert_eq!((late[1].granted, late[1].before), (700, 550));
    assert!(late[1].immediate);
    // Nothing fits (M may still admit 600): the whole grow waits.
    let mut full = m600_h400_to_m300_h700();
    full[0].bound = 300;
    full[0].granted = 300;
    let w_full = window(use_of(600, 300), use_of(400, 400));
    super::rebalance::transition_tracked(&mut full, 1000, 3, None, Some((&w_full, None)));
    assert_eq!(full[1].granted, 700);
    assert!(!full[1].immediate);

    // A grow that waited for the boundary (M's report still showed its old
    // value): a later round of the window, with M reported at 300 and 200
    // counted, lets it apply at once.
    let mut waiting = m600_h400_to_m300_h700();
    waiting[0].granted = 300;
    waiting[0].bound = 300;
    waiting[1].granted = 700;
    waiting[1].bound = 700;
    waiting[1].before = 400;
    waiting[1].before_until_ms = 60_000;
    let w = window(use_of(200, 300), use_of(400, 400));
    super::rebalance::transition_tracked(&mut waiting, 1000, 4, None, Some((&w, None)));
    assert_eq!(waiting[1].granted, 700);
    assert!(waiting[1].immediate && waiting[1].now_until_ms == 60_000);
    // Not when a pod of a region started within the window.
    let mut restarted = waiting;
    restarted[1].immediate = false;
    restarted[1].now_until_ms = 0;
    let mut w = window(use_of(200, 300), use_of(400, 400));
    w.regions[0].settled_since = 10_000;
    super::rebalance::transition_tracked(&mut restarted, 1000, 4, None, Some((&w, None)));
    assert!(
        !restarted[1].immediate,
        "M's count may miss what it admitted before"
    );
}

#[test]
fn the_table_applies_now_flags_only_within_their_window() {
    let w: Option<u64> = Some(60_000);
    let t0: Millis = 1_800_000_000_000; // a minute boundary
    let mut table = Table::default();
    let mut first = update(1, t0 + 600_000, Some(600), vec![]);
    first.full = true;
    table.apply(&first, t0, |_| w).expect("first");
    // A shrink-now lowers at once...
    let mut shrink = update(2, t0 + 600_000, Some(300), vec![]);
    shrink.rules[0].split_now = Now {
        shrink_now: true,
        until_ms: t0 + 60_000,
        ..Now::default()
    };
    table.apply(&shrink, t0 + 10_000, |_| w).expect("shrink");
    assert_eq!(table.limit("r", "k", t0 + 10_001), Some(300));
    assert_eq!(table.window_cap("r", t0 + 10_001), Some(300));
    // ...an immediate grow raises at once within its window...
    let mut grow = update(3, t0 + 600_000, Some(400), vec![]);
    grow.rules[0].split_now = Now {
        immediate: true,
        until_ms: t0 + 60_000,
        ..Now::default()
    };
    table.apply(&grow, t0 + 20_000, |_| w).expect("grow");
    assert_eq!(table.limit("r", "k", t0 + 20_001), Some(400));
    // ...but the same flags arriving after their window switch at a boundary
    // (a snapshot to a pod that reconnects later).
    let mut late = update(4, t0 + 600_000, Some(500), vec![]);
    late.full = true;
    late.rules[0].split_now = Now {
        immediate: true,
        until_ms: t0 + 60_000,
        ..Now::default()
    };
    table.apply(&late, t0 + 70_000, |_| w).expect("late");
    assert_eq!(table.limit("r", "k", t0 + 70_001), Some(400));
    assert_eq!(table.limit("r", "k", t0 + 120_000), Some(500));
    // A shrink-now never raises a value (here: a pending lower one).
    let mut low = update(5, t0 + 600_000, Some(450), vec![]);
    low.rules[0].split_now = Now {
        shrink_now: true,
        until_ms: t0 + 180_000,
        ..Now::default()
    };
    table.apply(&low, t0 + 130_000, |_| w).expect("low");
    assert_eq!(table.limit("r", "k", t0 + 130_001), Some(450));
    // A step shrink: 420 until its boundary, 200 from there — never above
    // the value in force (a later step of 480 leaves 420).
    let step = |epoch, at: u64| {
        let mut step = update(epoch, t0 + 600_000, Some(200), vec![]);
        step.rules[0].split_now = Now {
            shrink_now: true,
            until_ms: t0 + 240_000,
            starting: Some((at, t0 + 240_000)),
            ..Now::default()
        };
        step
    };
    table
        .apply(&step(6, 420), t0 + 190_000, |_| w)
        .expect("step");
    assert_eq!(table.limit("r", "k", t0 + 190_001), Some(420));
    assert_eq!(table.window_cap("r", t0 + 190_001), Some(420));
    table
        .apply(&step(7, 480), t0 + 200_000, |_| w)
        .expect("step");
    assert_eq!(table.limit("r", "k", t0 + 200_001), Some(420));
    assert_eq!(table.limit("r", "k", t0 + 240_000), Some(200));
    // A step grow: 350 until its boundary, 600 from there; once the window
    // it was decided for is over, the whole grow waits for a boundary.
    let grow = |epoch, until: Millis| {
        let mut grow = update(epoch, t0 + 600_000, Some(600), vec![]);
        grow.rules[0].split_now = Now {
            immediate: true,
            until_ms: until,
            starting: Some((350, until)),
            ..Now::default()
        };
        grow
    };
    table
        .apply(&grow(8, t0 + 300_000), t0 + 250_000, |_| w)
        .expect("step grow");
    assert_eq!(table.limit("r", "k", t0 + 250_001), Some(350));
    assert_eq!(table.limit("r", "k", t0 + 300_000), Some(600));
    let mut late = Table::default();
    late.apply(
        &update(1, t0 + 600_000, Some(200), vec![]),
        t0 + 300_000,
        |_| w,
    )
    .expect("first");
    late.apply(&grow(2, t0 + 300_000), t0 + 310_000, |_| w)
        .expect("late step grow");
    assert_eq!(late.limit("r", "k", t0 + 310_001), Some(200));
    assert_eq!(late.limit("r", "k", t0 + 360_000), Some(600));

    // A pod that starts while a grow waits for the boundary takes the value
    // the region began the window with.
    let mut fresh = Table::default();
    let mut snapshot = update(6, t0 + 600_000, Some(700), vec![("hot", Some(900))]);
    snapshot.full = true;
    snapshot.rules[0].split_now = Now {
        starting: Some((400, t0 + 60_000)),
        ..Now::default()
    };
    snapshot.rules[0].keys_now = vec![(
        "hot".into(),
        Now {
            starting: Some((800, t0 + 60_000)),
            ..Now::default()
        },
    )];
    fresh
        .apply(&snapshot, t0 + 30_000, |_| w)
        .expect("snapshot");
    assert_eq!(fresh.limit("r", "k", t0 + 30_001), Some(400));
    assert_eq!(fresh.limit("r", "hot", t0 + 30_001), Some(800));
    assert_eq!(fresh.limit("r", "k", t0 + 60_000), Some(700));
    assert_eq!(fresh.limit("r", "hot", t0 + 60_000), Some(900));
}

#[test]
fn a_region_use_is_complete_only_when_every_live_pod_reported_the_window() {
    let mut acks = AckTracker::default();
    acks.record("m-0", "m", 3, 1_000);
    acks.record("m-1", "m", 3, 1_000);
    acks.record_use("m-0", "m", "r", 0, use_of(40, 300));
    let got = acks.region_use("m", "r", 0, 1_000, 5_000);
    assert_eq!((got.used, got.known()), (use_of(40, 300), false));
    acks.record_use("m-1", "m", "r", 0, use_of(70, 250));
    let got = acks.region_use("m", "r", 0, 1_000, 5_000);
    assert_eq!((got.used, got.known()), (use_of(70, 300), true));
    // Another window: nothing known of it yet.
    let got = acks.region_use("m", "r", 60_000, 61_000, 100_000);
    assert_eq!((got.reported, got.known()), (0, false));
    // A pod silent for longer than `within` no longer counts.
    acks.record("m-0", "m", 3, 9_000);
    acks.record_use("m-0", "m", "r", 0, use_of(50, 300));
    let got = acks.region_use("m", "r", 0, 9_000, 5_000);
    assert_eq!((got.used, got.known()), (use_of(50, 300), true));
    assert!(!acks.region_use("x", "r", 0, 9_000, 5_000).known());
}
