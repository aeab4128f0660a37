//! `PodAccount`'s unit tests: what a pod counts and reports.

use super::*;

const RULE: &str = "api|customer";
/// A minute boundary.
const T0: Millis = 1_700_006_400_000;
const MINUTE: u64 = 60_000;

/// One hit of `key` decided at `now` with `remaining` of 10 left, in a
/// one-minute fixed window counted exactly.
fn hit(key: &str, allowed: bool, remaining: u64, now: Millis) -> Decided<'_> {
    let end = (now.div_euclid(MINUTE as Millis) + 1) * MINUTE as Millis;
    Decided {
        rule: RULE,
        key,
        period_ms: MINUTE,
        cost: 1,
        allowed,
        limit: 10,
        remaining,
        reset_after_us: (end - now) as u64 * 1_000,
        window_use: true,
        reset_tells: ResetTells::WindowEnd,
        counted: true,
        windowed: true,
    }
}

fn holding(cap: u64) -> Holding {
    Holding {
        epoch: 3,
        counted: vec![CountedRule {
            rule: RULE.into(),
            period_ms: MINUTE,
            cap,
        }],
    }
}

fn admitted(report: &PodReport) -> Vec<(Millis, Option<&str>, u64)> {
    report
        .admitted
        .iter()
        .map(|a| (a.period_start_ms - T0, a.key.as_deref(), a.admitted))
        .collect()
}

#[test]
fn demand_stays_bounded_under_a_flood_of_keys_and_nothing_is_lost() {
    let mut account = PodAccount::new("r", "pod");
    let n = MAX_TRACKED_KEYS + 500;
    for i in 0..n {
        account.record(&hit(&format!("k{i}"), i % 2 == 0, 9, T0), T0);
    }
    assert_eq!(account.rules[RULE].keys.len(), MAX_TRACKED_KEYS);
    assert_eq!(account.tracked, MAX_TRACKED_KEYS);
    assert!(account.period_keys <= MAX_PERIOD_KEYS);
    let report = account.report(&holding(10), true, T0 + 1_000);
    let rd = &report.rules[0];
    assert_eq!(rd.keys.len(), REPORT_TOP_KEYS);
    let asked: u64 = rd.keys.iter().map(|k| k.asked).sum::<u64>() + rd.remainder_asked;
    let allowed: u64 = rd.keys.iter().map(|k| k.allowed).sum::<u64>() + rd.remainder_allowed;
    assert_eq!((asked, allowed), (n as u64, n.div_ceil(2) as u64));
    assert_eq!(report.interval_ms, 1_000, "since the first hit");
    // The period's whole-rule count holds every admitted hit, even of
    // keys beyond the bound; the report lists the busiest 16 keys.
    assert_eq!(report.admitted[0].key, None);
    assert_eq!(report.admitted[0].admitted, n.div_ceil(2) as u64);
    assert_eq!(report.admitted.len(), 1 + ADMITTED_TOP_KEYS);
    assert!(
        account
            .report(&holding(10), true, T0 + 2_000)
            .rules
            .is_empty(),
        "a demand report drains the counts"
    );
}

#[test]
fn a_smaller_report_folds_the_rest_into_the_remainder() {
    let mut account = PodAccount::new("r", "pod").with_top_keys(2);
    for (key, n) in [("a", 5), ("b", 3), ("c", 2), ("d", 1)] {
        for _ in 0..n {
            account.record(&hit(key, true, 5, T0), T0);
        }
    }
    let report = account.report(&holding(10), true, T0 + 10_000);
    let rd = &report.rules[0];
    let keys: Vec<(&str, u64)> = rd.keys.iter().map(|k| (k.key.as_str(), k.asked)).collect();
    assert_eq!(keys, vec![("a", 5), ("b", 3)]);
    assert_eq!((rd.remainder_asked, rd.remainder_allowed), (3, 3));
}

#[test]
fn admitted_counts_are_cumulative_in_a_period_and_a_repeated_report_replaces() {
    let mut account = PodAccount::new("r", "pod");
    let at = T0 + 5_000;
    for _ in 0..3 {
        account.record(&hit("a", true, 5, at), at);
    }
    account.record(&hit("b", true, 5, at), at);
    account.record(&hit("b", false, 0, at), at);
    let first = account.report(&holding(10), true, at + 1_000);
    assert_eq!(
        admitted(&first),
        vec![(0, None, 4), (0, Some("a"), 3), (0, Some("b"), 1)]
    );
    // An acknowledgement repeats the same counts: the period's, not
    // the interval's.
    let again = account.report(&holding(10), false, at + 1_500);
    assert_eq!(admitted(&again), admitted(&first));
    // More in the same period: the counts grow from where they were.
    account.record(&hit("a", true, 5, at + 2_000), at + 2_000);
    let next = account.report(&holding(10), true, at + 3_000);
    assert_eq!(
        admitted(&next),
        vec![(0, None, 5), (0, Some("a"), 4), (0, Some("b"), 1)]
    );
}

#[test]
fn a_new_period_keeps_the_one_just_ended_and_drops_older_ones() {
    let mut account = PodAccount::new("r", "pod");
    let minute = MINUTE as Millis;
    account.record(&hit("a", true, 5, T0 + 1_000), T0 + 1_000);
    account.record(&hit("a", true, 5, T0 + minute + 1_000), T0 + minute + 1_000);
    account.record(&hit("b", true, 5, T0 + minute + 2_000), T0 + minute + 2_000);
    let report = account.report(&holding(10), true, T0 + minute + 3_000);
    assert_eq!(
        admitted(&report),
        vec![
            (0, None, 1),
            (0, Some("a"), 1),
            (minute, None, 2),
            (minute, Some("a"), 1),
            (minute, Some("b"), 1),
        ]
    );
    // A late answer of the ended window still counts there (placed by
    // its reset time), not in the current one.
    let late = Decided {
        reset_after_us: 500,
        ..hit("a", true, 5, T0 + minute + 4_000)
    };
    account.record(&late, T0 + minute + 4_000);
    let report = account.report(&holding(10), false, T0 + minute + 5_000);
    assert_eq!(admitted(&report)[0], (0, None, 2));
    // A period later the one before is dropped; two later, all of them,
    // and their keys are freed.
    let report = account.report(&holding(10), true, T0 + 2 * minute + 1);
    assert_eq!(
        admitted(&report),
        vec![
            (minute, None, 2),
            (minute, Some("a"), 1),
            (minute, Some("b"), 1)
        ]
    );
    let report = account.report(&holding(10), true, T0 + 3 * minute);
    assert!(report.admitted.is_empty());
    assert_eq!(account.period_keys, 0);
}

#[test]
fn every_algorithm_fills_the_ledger_by_clock_aligned_periods() {
    let mut account = PodAccount::new("r", "pod");
    // A token bucket of 10 a minute: no window, no window use.
    let bucket = |now: Millis| Decided {
        reset_tells: ResetTells::Nothing,
        counted: false,
        windowed: false,
        reset_after_us: 6_000_000,
        ..hit("k", true, 5, now)
    };
    account.record(&bucket(T0 + 59_999), T0 + 59_999);
    account.record(&bucket(T0 + 60_000), T0 + 60_000);
    let report = account.report(&Holding::default(), true, T0 + 60_001);
    assert_eq!(
        admitted(&report),
        vec![
            (0, None, 1),
            (0, Some("k"), 1),
            (60_000, None, 1),
            (60_000, Some("k"), 1)
        ]
    );
    assert!(report.used.is_empty());
}

#[test]
fn period_keys_stay_bounded_and_the_rule_total_counts_every_hit() {
    let mut account = PodAccount::new("r", "pod");
    let n = MAX_PERIOD_KEYS + 100;
    for i in 0..n {
        account.record(&hit(&format!("k{i}"), true, 5, T0), T0);
    }
    assert_eq!(account.period_keys, MAX_PERIOD_KEYS);
    let report = account.report(&holding(10), true, T0 + 1);
    assert_eq!(report.admitted[0].admitted, n as u64);
}

/// A decision Redis made in the last moment of a window can be answered
/// after the boundary: it is that window's use, not the new one's (the
/// drills test saw a region's final count of one window reported again
/// as the next window's, 160 against a grant of 100).
#[test]
fn a_late_answer_counts_in_the_window_that_decided_it() {
    let mut account = PodAccount::new("r", "pod").started_at(T0);
    let minute = MINUTE as Millis;
    let now = T0 + minute + 100;
    // The previous window's last decision (9 of 10 used), answered now.
    let late = |remaining| Decided {
        reset_after_us: 1_000,
        ..hit("k", true, remaining, now)
    };
    account.record(&late(1), now);
    // The current window's first decision.
    account.record(&hit("k", true, 9, now), now);
    // And a later answer from the previous window, after it.
    account.record(&late(0), now);
    let report = account.report(&holding(10), false, now);
    let used: Vec<(Millis, u64, u64)> = report
        .used
        .iter()
        .map(|u| (u.window_start_ms - T0, u.used.count, u.used.cap))
        .collect();
    assert_eq!(used, vec![(0, 10, 10), (minute, 1, 10)]);
    assert_eq!(report.epoch, 3);
}

/// A pod restarted within a window (same name, new process) reports no
/// use of it: its count would miss what the process before it admitted
/// (the simulator's property test put a window 8 over L through an
/// in-window grant), so the region's use is not complete until the
/// next window.
#[test]
fn a_window_that_began_before_the_pod_started_is_not_reported() {
    let minute = MINUTE as Millis;
    let mut account = PodAccount::new("r", "pod").started_at(T0 + minute + 500);
    let now = T0 + minute + 1_000;
    account.record(&hit("k", true, 9, now), now);
    let report = account.report(&holding(10), false, now);
    assert!(report.used.is_empty(), "{:?}", report.used);
    // From the next window on it is.
    let next = T0 + 2 * minute + 10;
    account.record(&hit("k", true, 8, next), next);
    let report = account.report(&holding(10), false, next);
    let used: Vec<(Millis, u64)> = report
        .used
        .iter()
        .map(|u| (u.window_start_ms - T0, u.used.count))
        .collect();
    assert_eq!(used, vec![(2 * minute, 2)]);
}

#[test]
fn top_ups_are_asked_once_a_second_per_key_within_what_a_report_carries() {
    let mut account = PodAccount::new("r", "pod");
    // A report a second ago: the pace is measured since then.
    account.report(&holding(10), true, T0);
    // Every key at its allocation asks for a top-up: a flood of them.
    let now = T0 + 1_000;
    let mut asked = 0;
    for i in 0..(MAX_REPORT_TOP_UPS + 2_000) {
        asked += usize::from(account.record(&hit(&format!("k{i}"), true, 0, now), now));
    }
    assert_eq!(asked, MAX_REPORT_TOP_UPS);
    assert!(account.last_top_up.len() <= MAX_TOP_UP_KEYS);
    let report = account.report(&holding(10), false, now);
    assert_eq!(report.top_ups.len(), MAX_REPORT_TOP_UPS);
    assert_eq!(report.top_ups[0].interval_ms, 1_000);
    // The same key within the second does not ask again; after it, it does.
    assert!(!account.record(&hit("k0", true, 0, now + 500), now + 500));
    assert!(account.record(&hit("k0", true, 0, now + 1_000), now + 1_000));
    // Below 90 % of the allocation, nothing is asked.
    assert!(!account.record(&hit("x", true, 2, now + 2_000), now + 2_000));
}

#[test]
fn a_top_up_waits_until_the_pace_is_measured_over_a_fifth_of_a_second() {
    let mut account = PodAccount::new("r", "pod");
    account.report(&holding(10), true, T0);
    assert!(!account.record(&hit("k", true, 0, T0 + 100), T0 + 100));
    assert!(account.record(&hit("k", true, 0, T0 + 200), T0 + 200));
}

/// A sliding-window-counter admission Redis made in the last moment of a
/// period, answered after the boundary, is that period's: every
/// clock-aligned period of the algorithm holds ≤ L, and counting it in the
/// next one made the ledger read a period over its bound (seen once in the
/// dashboard_api test under full-suite load: `api|sw` over L).
#[test]
fn a_late_sliding_window_answer_counts_in_the_period_that_decided_it() {
    let mut account = PodAccount::new("r", "pod").started_at(T0);
    let minute = MINUTE as Millis;
    let now = T0 + minute + 100;
    // Decided 1 ms before the boundary: the key's current window count is
    // read as "previous" through the window after, so Redis answers a reset
    // of that window's end, a period and 1 ms away.
    let late = Decided {
        reset_tells: ResetTells::NextWindowEnd,
        counted: false,
        reset_after_us: (minute + 1) as u64 * 1_000,
        ..hit("k", true, 1, now)
    };
    account.record(&late, now);
    // Decided after the boundary, in the new period.
    let fresh = Decided {
        reset_tells: ResetTells::NextWindowEnd,
        counted: false,
        reset_after_us: (2 * minute - 100) as u64 * 1_000,
        ..hit("k", true, 0, now)
    };
    account.record(&fresh, now);
    let report = account.report(&holding(10), true, now);
    assert_eq!(
        admitted(&report),
        vec![
            (0, None, 1),
            (0, Some("k"), 1),
            (minute, None, 1),
            (minute, Some("k"), 1)
        ]
    );
}

/// A reservation of `estimate` on `key` admitted at `now`, as a check of
/// that cost.
fn reserved(key: &str, estimate: u64, now: Millis) -> Decided<'_> {
    Decided {
        cost: estimate,
        limit: 10_000,
        remaining: 10_000 - estimate,
        ..hit(key, true, 0, now)
    }
}

fn settlement(key: &str, refunded: u64, charged: u64, age_ms: u64) -> Settlement<'_> {
    Settlement {
        rule: RULE,
        key,
        period_ms: MINUTE,
        refunded,
        charged,
        charged_age_ms: age_ms,
        used: None,
    }
}

#[test]
fn a_settled_reservation_reports_its_settled_cost_not_its_estimate() {
    let mut account = PodAccount::new("r", "pod");
    // Two reservations of 100: one commits at 40 (60 back), the other at
    // 130 (30 excess charged).
    account.record(&reserved("42", 100, T0 + 1_000), T0 + 1_000);
    account.record(&reserved("42", 100, T0 + 2_000), T0 + 2_000);
    account.settled(&settlement("42", 60, 0, 3_000), T0 + 4_000);
    account.settled(&settlement("42", 0, 30, 3_000), T0 + 5_000);
    let report = account.report(&holding(10_000), true, T0 + 6_000);
    let key = &report.rules[0].keys[0];
    assert_eq!((key.asked, key.allowed), (170, 170), "200 − 60 + 30");
    assert_eq!(
        admitted(&report),
        vec![(0, None, 170), (0, Some("42"), 170)]
    );
}

#[test]
fn a_refund_leaves_the_period_its_estimate_was_counted_in() {
    let mut account = PodAccount::new("r", "pod");
    account.record(&reserved("42", 100, T0 + 50_000), T0 + 50_000);
    account.record(&reserved("42", 100, T0 + 70_000), T0 + 70_000);
    // Settled in the next minute, 20 s after admission: the refund comes
    // off the first minute; the excess of the second goes to the current.
    account.settled(&settlement("42", 80, 0, 20_000), T0 + 70_000);
    account.settled(&settlement("42", 0, 5, 1_000), T0 + 71_000);
    let report = account.report(&holding(10_000), true, T0 + 72_000);
    let minute = MINUTE as Millis;
    assert_eq!(
        admitted(&report),
        vec![
            (0, None, 20),
            (0, Some("42"), 20),
            (minute, None, 105),
            (minute, Some("42"), 105)
        ]
    );
    let key = &report.rules[0].keys[0];
    assert_eq!(key.asked, 125, "200 − 80 + 5");
}

#[test]
fn a_refund_larger_than_the_demand_since_the_last_report_comes_off_the_next_ones() {
    let mut account = PodAccount::new("r", "pod");
    account.record(&reserved("42", 100, T0 + 1_000), T0 + 1_000);
    let first = account.report(&holding(10_000), true, T0 + 2_000);
    assert_eq!(first.rules[0].keys[0].asked, 100);
    account.record(&reserved("42", 10, T0 + 3_000), T0 + 3_000);
    account.settled(&settlement("42", 90, 0, 2_000), T0 + 3_000);
    // A refund of a key another pod reserved has no demand to come off
    // here; it comes off this pod's total of the period, so the region's
    // sum over its pods stays right (each total stops at 0, erring high).
    account.settled(&settlement("7", 10, 0, 2_000), T0 + 3_000);
    let report = account.report(&holding(10_000), true, T0 + 4_000);
    let rd = &report.rules[0];
    assert!(rd.keys.is_empty(), "10 − 90: nothing, 80 owed: {rd:?}");
    assert_eq!(rd.remainder_asked, 0);
    // The admitted counts of the minute are exact: 110 − 90 − 10, and
    // 110 − 90 for the key.
    assert_eq!(admitted(&report), vec![(0, None, 10), (0, Some("42"), 20)]);
    // The 80 owed come off the key's next demand: 50 + 50 − 80.
    account.record(&reserved("42", 50, T0 + 5_000), T0 + 5_000);
    let next = account.report(&holding(10_000), true, T0 + 6_000);
    assert!(next.rules[0].keys.is_empty(), "50 − 80: 30 still owed");
    account.record(&reserved("42", 50, T0 + 7_000), T0 + 7_000);
    let last = account.report(&holding(10_000), true, T0 + 8_000);
    assert_eq!(last.rules[0].keys[0].asked, 20);
    assert_eq!(account.rules[RULE].owed.get("42"), None, "paid off");
    assert_eq!(account.owed_keys, 1, "key 7's 10 wait for its demand");
}

#[test]
fn refunds_owed_stay_bounded_under_a_flood_of_keys_and_expire() {
    let mut account = PodAccount::new("r", "pod");
    for i in 0..MAX_OWED_KEYS + 100 {
        account.settled(&settlement(&format!("k{i}"), 10, 0, 1_000), T0 + 1_000);
    }
    assert_eq!(account.owed_keys, MAX_OWED_KEYS);
    assert_eq!(account.rules[RULE].owed.len(), MAX_OWED_KEYS);
    for n in 0..OWED_REPORTS as i64 {
        account.record(&hit("other", true, 5, T0 + 2_000 + n), T0 + 2_000 + n);
        account.report(&holding(10), true, T0 + 3_000 + n);
    }
    assert_eq!(account.owed_keys, 0, "dropped after {OWED_REPORTS} reports");
    assert!(account.rules[RULE].owed.is_empty());
}
