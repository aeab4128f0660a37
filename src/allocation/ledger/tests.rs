//! The ledger's tests: counts replaced not added, every algorithm's bound,
//! reports out of line dropped, the memory bound under a flood.

use super::*;
use crate::algorithm::Algorithm;
use crate::rules::{Accuracy, Partition, RuleSet};

const T0: Millis = 1_700_000_040_000; // a multiple of 2 s and 60 s

fn rule(id: &str, limit: u64, algorithm: Algorithm, period_ms: u64) -> GlobalRule {
    GlobalRule::new(
        id,
        limit,
        algorithm,
        Accuracy::Exact,
        period_ms,
        Partition::Strict,
        0.5,
    )
}

fn counted(rule: &str, key: Option<&str>, start: Millis, admitted: u64) -> PeriodAdmitted {
    PeriodAdmitted {
        rule: rule.into(),
        key: key.map(str::to_string),
        period_start_ms: start,
        admitted,
    }
}

/// A sliding-counter rule of 100 per 2 s, reported by two regions.
fn sliding() -> (Ledger, Vec<GlobalRule>) {
    let rules = vec![rule("api|sw", 100, Algorithm::SlidingWindowCounter, 2_000)];
    (Ledger::default(), rules)
}

#[test]
fn a_repeated_or_late_report_replaces_the_pods_count_and_the_world_sums_pods_and_regions() {
    let (mut ledger, rules) = sliding();
    let at = |ms| T0 + ms;
    let report = |ledger: &mut Ledger, region, pod, key, n, now| {
        ledger.record(
            region,
            pod,
            &[
                counted("api|sw", None, T0, n),
                counted("api|sw", Some(key), T0, n),
            ],
            &rules,
            now,
        );
    };
    report(&mut ledger, "east", "e-0", "acme", 10, at(500));
    report(&mut ledger, "east", "e-0", "acme", 30, at(1_000));
    // The same report again (a retry): no change.
    report(&mut ledger, "east", "e-0", "acme", 30, at(1_100));
    report(&mut ledger, "east", "e-1", "acme", 5, at(1_200));
    report(&mut ledger, "west", "w-0", "acme", 40, at(1_500));
    let now = ledger.rule("api|sw").expect("rule").current(at(1_600));
    assert_eq!((now.admitted, now.all_keys, now.pods), (75, 75, 3));
    assert_eq!(now.key.as_deref(), Some("acme"));
    let regions: Vec<(&str, u64)> = now.regions.iter().map(|(r, n)| (&**r, *n)).collect();
    assert_eq!(regions, [("east", 35), ("west", 40)]);
    assert!(!now.complete, "no pod was heard after the period ended");
    // The final counts arrive in the next period's reports; a late one
    // for the period before (already final) is dropped.
    report(&mut ledger, "east", "e-0", "acme", 50, at(2_100));
    report(&mut ledger, "east", "e-1", "acme", 5, at(2_200));
    report(&mut ledger, "west", "w-0", "acme", 45, at(2_300));
    ledger.advance(at(4_000));
    let rule = ledger.rule("api|sw").expect("rule");
    let done = rule.finished().back().expect("finished");
    assert_eq!((done.start_ms, done.admitted, done.bound), (T0, 100, 100));
    assert!(done.complete && !done.over_bound());
    report(&mut ledger, "west", "w-0", "acme", 99, at(4_100));
    assert_eq!(ledger.dropped().late, 2, "two entries of the late report");
    let rule = ledger.rule("api|sw").expect("rule");
    assert_eq!(rule.finished().back().map(|f| f.admitted), Some(100));
}

#[test]
fn the_leader_feeds_its_ledger_from_every_pod_report() {
    use crate::allocation::leader::{Leader, LeaderConfig, PodReport};
    use crate::allocation::{Allocations, Config};
    let (_, rules) = sliding();
    let mut leader = Leader::new(LeaderConfig {
        rebalancer: Config::default(),
        rebalance_interval_ms: 2_000,
        round_lead_ms: 500,
        top_up: true,
    });
    leader.set_rules(None, rules);
    let state = Allocations::default();
    let report = |region: &str, n| PodReport {
        region: region.into(),
        pod: format!("{region}-0"),
        admitted: vec![
            counted("api|sw", None, T0, n),
            counted("api|sw", Some("acme"), T0, n),
        ],
        ..PodReport::default()
    };
    for (region, n, at) in [("east", 30, 900), ("west", 50, 1_000), ("east", 45, 2_100)] {
        leader.ingest(&report(region, n), &state, &[], T0 + at);
    }
    let figure = leader
        .ledger()
        .rule("api|sw")
        .expect("rule")
        .current(T0 + 1_500);
    assert_eq!((figure.admitted, figure.pods), (95, 2));
    leader.ledger_mut().advance(T0 + 4_000);
    let rule = leader.ledger().rule("api|sw").expect("rule");
    assert_eq!(rule.finished().back().map(|f| f.admitted), Some(95));
}

#[test]
fn the_busiest_key_compares_with_l_and_all_keys_are_kept_beside_it() {
    let (mut ledger, rules) = sliding();
    ledger.record(
        "east",
        "e-0",
        &[
            counted("api|sw", None, T0, 150),
            counted("api|sw", Some("acme"), T0, 90),
            counted("api|sw", Some("globex"), T0, 60),
        ],
        &rules,
        T0 + 2_500,
    );
    ledger.record(
        "west",
        "w-0",
        &[
            counted("api|sw", None, T0, 20),
            counted("api|sw", Some("globex"), T0, 20),
        ],
        &rules,
        T0 + 2_500,
    );
    ledger.advance(T0 + 4_000);
    let rule = ledger.rule("api|sw").expect("rule");
    let f = rule.finished().back().expect("finished");
    // acme 90, globex 80: acme is the busiest; all keys 170 > L is no
    // overshoot (each key has its own L).
    assert_eq!(
        (f.key.as_deref(), f.admitted, f.all_keys),
        (Some("acme"), 90, 170)
    );
    assert!(!f.over_bound());
    assert_eq!(rule.over_bound_within(T0 + 4_000, HOUR_MS), 0);
}

#[test]
fn each_algorithm_states_its_bound() {
    let set_terms = |algorithm, burst, slack| {
        let mut t = Terms::of_global_rule(&rule("r", 100, algorithm, 1_000));
        t.algorithm = algorithm;
        t.burst = burst;
        t.per_pod_slack = slack;
        t.assumed = false;
        t
    };
    assert_eq!(set_terms(Algorithm::FixedWindow, 0, None).bound(4), 100);
    assert_eq!(
        set_terms(Algorithm::SlidingWindowLog, 0, None).bound(4),
        100
    );
    assert_eq!(set_terms(Algorithm::TokenBucket, 20, None).bound(4), 120);
    assert_eq!(set_terms(Algorithm::LeakyBucket, 30, None).bound(4), 130);
    // Approximate: + max_batch per pod that reported.
    assert_eq!(set_terms(Algorithm::FixedWindow, 0, Some(5)).bound(4), 120);
    let bucket = set_terms(Algorithm::TokenBucket, 20, None);
    assert!(
        bucket.bound_is().contains("burst + L"),
        "{}",
        bucket.bound_is()
    );
    // Without the rule set, a bucket's burst is assumed to be L.
    let assumed = Terms::of_global_rule(&rule("r", 100, Algorithm::TokenBucket, 1_000));
    assert_eq!(assumed.bound(1), 200);
    assert!(assumed.bound_is().contains("assumed"));
}

#[test]
fn terms_come_from_the_rule_set_with_burst_and_max_batch() {
    let yaml = "domain: api
descriptors:
  - key: tb
    scope: global
    algorithm: token_bucket
    burst: 30
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: ap
    scope: global
    accuracy: approximate
    max_batch: 7
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: local
    rate_limit: {unit: minute, requests_per_unit: 5}
";
    let set = RuleSet::parse(&[crate::rules::RuleFile {
        name: "rules.yaml".into(),
        text: yaml.into(),
    }])
    .expect("rules");
    let terms = Terms::of_rule_set(&set);
    let tb = terms.iter().find(|t| t.rule == "api|tb").expect("tb");
    assert_eq!((tb.bound(2), tb.period_ms), (40, 1_000));
    let ap = terms.iter().find(|t| t.rule == "api|ap").expect("ap");
    assert_eq!(ap.bound(3), 1_000 + 3 * 7);
    assert_eq!(terms.len(), 2, "only global rules: {terms:?}");
}

#[test]
fn a_period_in_which_the_limit_was_lowered_is_stated_against_the_higher() {
    let (mut ledger, rules) = sliding();
    let n = |k| [counted("api|sw", Some("acme"), T0, k)];
    let raised = vec![rule("api|sw", 300, Algorithm::SlidingWindowCounter, 2_000)];
    ledger.record("east", "e-0", &n(10), &rules, T0 + 100);
    // Raised to 300 mid-period, 250 admitted, then back to 100.
    ledger.record("east", "e-0", &n(250), &raised, T0 + 900);
    ledger.record("east", "e-0", &n(250), &rules, T0 + 2_100);
    ledger.advance(T0 + 4_000);
    let rule = ledger.rule("api|sw").expect("rule");
    let f = rule.finished().back().expect("finished");
    assert_eq!((f.admitted, f.limit, f.bound), (250, 300, 300));
    assert!(!f.over_bound());
    // The next period is stated against the limit then in force.
    assert_eq!(rule.current(T0 + 4_000).limit, 100);
}

#[test]
fn reports_out_of_line_are_dropped_and_counted() {
    let (mut ledger, rules) = sliding();
    ledger.record(
        "east",
        "e-0",
        &[
            counted("api|other", None, T0, 5),
            counted("api|sw", None, T0 + 1, 5),
            counted("api|sw", None, T0 + 10_000, 5),
            counted("api|sw", None, T0 - 10_000, 5),
        ],
        &rules,
        T0,
    );
    let d = ledger.dropped();
    assert_eq!(
        (d.unknown_rule, d.misaligned, d.future, d.late),
        (1, 1, 1, 1)
    );
    // A rule that leaves the rule set leaves the ledger.
    ledger.record("east", "e-0", &[], &[], T0);
    assert!(ledger.rule("api|sw").is_none());
}

#[test]
fn the_worst_period_of_the_last_hour_and_those_over_their_bound() {
    let (mut ledger, rules) = sliding();
    for (i, n) in [80u64, 120, 95].iter().enumerate() {
        let start = T0 + 2_000 * i as Millis;
        ledger.record(
            "east",
            "e-0",
            &[counted("api|sw", Some("acme"), start, *n)],
            &rules,
            start + 2_100,
        );
    }
    let now = T0 + 10_000;
    ledger.advance(now);
    let rule = ledger.rule("api|sw").expect("rule");
    assert_eq!(rule.finished().len(), 3);
    let worst = rule.worst_within(now, HOUR_MS).expect("worst");
    assert_eq!((worst.start_ms, worst.admitted), (T0 + 2_000, 120));
    assert!((worst.ratio() - 1.2).abs() < 1e-9);
    assert_eq!(rule.over_bound_within(now, HOUR_MS), 1);
    // An hour later they have aged out of the window; the newest two stay.
    let later = now + HOUR_MS + 10_000;
    ledger.advance(later);
    let rule = ledger.rule("api|sw").expect("rule");
    assert_eq!(rule.finished().len(), 2);
    assert!(rule.worst_within(later, HOUR_MS).is_none());
}

#[test]
fn a_flood_of_keys_pods_and_periods_stays_within_the_stated_bytes() {
    let regions = 3;
    let rules = vec![rule(
        "api|sw",
        1_000,
        Algorithm::SlidingWindowCounter,
        1_000,
    )];
    let mut ledger = Ledger::default();
    let long = |prefix: &str, i: usize, len: usize| {
        let mut s = format!("{prefix}-{i}-");
        while s.len() < len {
            s.push('x');
        }
        s
    };
    // 800 one-second periods, each reported by more pods than the bound
    // allows, each pod with more keys than are tracked.
    for period in 0..800i64 {
        let start = T0 + period * 1_000;
        for region in 0..regions {
            for pod in 0..MAX_PODS_PER_REGION + 8 {
                if period % 100 != 0 && pod > 2 {
                    // Most periods lightly: the flood of pods and keys
                    // in one of a hundred keeps the test quick.
                    continue;
                }
                let admitted: Vec<PeriodAdmitted> = (0..20)
                    .map(|k| {
                        let key = long("key", (pod * 20 + k) % 200, KEY_BYTES);
                        counted("api|sw", Some(&key), start, (k + pod) as u64)
                    })
                    .chain([counted("api|sw", None, start, 1)])
                    .collect();
                ledger.record(
                    &format!("region-{region}"),
                    &long("pod", pod, POD_BYTES),
                    &admitted,
                    &rules,
                    start + 500,
                );
            }
        }
    }
    let rule = ledger.rule("api|sw").expect("rule");
    assert!(rule.finished().len() <= MAX_FINISHED);
    assert!(rule.open.len() <= OPEN_PERIODS);
    for period in rule.open.values() {
        assert!(period.keys.len() <= MAX_KEYS);
        for pods in period.pods.values() {
            assert!(pods.len() <= MAX_PODS_PER_REGION);
            assert!(pods.values().all(|p| p.keys.len() <= MAX_KEYS));
        }
    }
    let d = ledger.dropped();
    assert!(d.pods > 0 && d.keys > 0, "{d:?}");
    let stated = stated_bytes(1, regions);
    assert!(
        ledger.bytes() <= stated,
        "{} bytes against the stated {stated}",
        ledger.bytes()
    );
    // The figure of a flooded period says it is incomplete.
    let flooded = rule
        .finished()
        .iter()
        .find(|f| f.pods as usize >= regions * MAX_PODS_PER_REGION)
        .expect("a flooded period");
    assert!(!flooded.complete);
    // What the docs state, with 3 regions.
    assert!(
        stated_bytes_per_rule(3) < 4 << 20,
        "{}",
        stated_bytes_per_rule(3)
    );
}

#[test]
fn a_new_key_busier_than_the_least_tracked_takes_its_slot() {
    let (mut ledger, rules) = sliding();
    let keys: Vec<PeriodAdmitted> = (0..MAX_KEYS)
        .map(|k| counted("api|sw", Some(&format!("k{k}")), T0, 10 + k as u64))
        .collect();
    ledger.record("east", "e-0", &keys, &rules, T0 + 100);
    ledger.record(
        "east",
        "e-1",
        &[
            counted("api|sw", Some("quiet"), T0, 1),
            counted("api|sw", Some("hot"), T0, 500),
        ],
        &rules,
        T0 + 200,
    );
    let rule = ledger.rule("api|sw").expect("rule");
    let top = rule.top_keys(T0 + 300, 2);
    assert_eq!(top[0], (Arc::from("hot"), 500));
    assert_eq!(ledger.dropped().keys, 1, "quiet is not tracked");
    let f = rule.current(T0 + 300);
    assert_eq!((f.keys as usize, f.admitted), (MAX_KEYS, 500));
}

#[test]
fn a_keys_figure_sums_its_pods_per_region_says_how_old_and_not_tracked_is_not_zero() {
    let (mut ledger, rules) = sliding();
    let at = |ms| T0 + ms;
    let report = |ledger: &mut Ledger, region, pod, counts: &[(&str, u64)], now| {
        let mut admitted = vec![counted("api|sw", None, T0, 0)];
        admitted.extend(
            counts
                .iter()
                .map(|(key, n)| counted("api|sw", Some(key), T0, *n)),
        );
        ledger.record(region, pod, &admitted, &rules, now);
    };
    report(
        &mut ledger,
        "east",
        "e-0",
        &[("acme", 10), ("bolt", 3)],
        at(200),
    );
    report(&mut ledger, "east", "e-1", &[("acme", 5)], at(700));
    report(&mut ledger, "west", "w-0", &[("bolt", 4)], at(900));
    let rule = ledger.rule("api|sw").expect("rule");
    assert_eq!(rule.period_start(at(1_500)), T0);
    let acme = rule.key_figure("acme", T0).expect("the period is open");
    assert_eq!(
        (acme.admitted, acme.limit, acme.period_ms),
        (Some(15), 100, 2_000)
    );
    let east = &acme.regions[0];
    assert_eq!(&*east.region, "east");
    assert_eq!(
        (east.admitted, east.pods, east.pods_with_key),
        (Some(15), 2, 2)
    );
    assert_eq!(
        (east.newest_report_ms, east.oldest_report_ms),
        (at(700), at(200))
    );
    // West reported the period but not acme: 0 of a tracked key, said so.
    let west = &acme.regions[1];
    assert_eq!(
        (west.admitted, west.pods, west.pods_with_key),
        (Some(0), 1, 0)
    );
    // A key no pod reported is not tracked: no count, not 0.
    let none = rule.key_figure("zed", T0).expect("the period is open");
    assert_eq!(none.admitted, None);
    assert!(none.regions.iter().all(|r| r.admitted.is_none()));
    assert_eq!(
        none.regions.len(),
        2,
        "the regions still say how old they are"
    );
    // A period no pod reported is not open.
    assert!(rule.key_figure("acme", T0 + 2_000).is_none());
    // Open periods that began, with their keys, busiest first.
    let keys = rule.tracked_keys(at(1_500));
    assert_eq!(keys.len(), 1);
    let listed: Vec<(&str, u64)> = keys[0].1.iter().map(|(k, n)| (&**k, *n)).collect();
    assert_eq!((keys[0].0, listed), (T0, vec![("acme", 15), ("bolt", 7)]));
}
