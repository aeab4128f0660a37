//! The pod's accounting of global rules: allocations, reports, intervals.

use std::sync::Arc;
use std::time::Duration;

use super::reporter::IntervalSource;
use super::saved::{MAX_SAVED_TABLE_BYTES, Phase};
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

    let flagged = Global::new("r", "pod", true).with_report_interval(Some(Duration::from_secs(5)));
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

#[test]
fn what_the_pod_enforces_is_told_and_without_a_shared_store_nothing_is_kept() {
    let global = Global::new("r", "pod", true);
    let status = global.allocation_status();
    assert_eq!(
        (status.origin, status.phase, status.saved_epoch),
        (Origin::None, Phase::None, None)
    );
    let (rules, rule) = (global_rules(), global_rule());
    allocate(&global, &rules, &rule, 6);
    let status = global.allocation_status();
    assert_eq!(
        (status.origin, status.epoch, status.phase),
        (Origin::Coordinator, 1, Phase::Lease)
    );
    assert!(
        status
            .to_string()
            .starts_with("allocation: source=coordinator epoch=1 lease_valid_until_unix_ms=")
            && status.to_string().ends_with(" phase=lease saved_epoch=off"),
        "{status}"
    );
    // The memory store keeps nothing: the epoch is acknowledged as held.
    let acked = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(global.save_through(1));
    assert_eq!(acked, 1);
}

/// The bound `MAX_SAVED_TABLE_BYTES` is stated against: a rule with 1,000
/// key entries of 40-byte keys, and of 512-byte keys (the longest).
#[test]
fn a_kept_table_of_a_thousand_entries_is_tens_to_hundreds_of_kilobytes() {
    let size = |key_len: usize| {
        let global = Global::new("r", "pod", true);
        let (rules, rule) = (global_rules(), global_rule());
        let update = pb::AllocationUpdate {
            epoch: 1,
            valid_until_unix_ms: now_unix_ms() + 60_000,
            full: true,
            rules: vec![pb::RuleAllocation {
                rule: rule.id.clone(),
                limit: 1_000_000,
                fallback: 200_000,
                split: Some(400_000),
                keys: (0..1_000)
                    .map(|i| pb::KeyAllocation {
                        key: format!("{i:0>key_len$}"),
                        value: Some(123_456),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        global.apply(&update, &rules);
        let table = global.table.read().expect("table").saved();
        serde_json::to_vec(&table).expect("serializes").len()
    };
    let (short, long) = (size(40), size(512));
    eprintln!("1,000 entries: {short} bytes (40-byte keys), {long} bytes (512-byte keys)");
    assert!(short < 100_000, "{short}");
    assert!(long < 600_000, "{long}");
    assert!(MAX_SAVED_TABLE_BYTES >= 16 * long, "room for 16 such rules");
}
