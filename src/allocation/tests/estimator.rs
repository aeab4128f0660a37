//! The demand estimator on its own: top-ups, steps within one report, paces,
//! the rounds' schedule (through the Leader: ../demand_tests.rs).

use super::super::demand::{DemandTracker, KeyDemand, Pace};
use super::super::*;
use super::*;

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
