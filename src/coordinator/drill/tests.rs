//! The drill record's rules, the observer and the report, without I/O.

use std::collections::BTreeMap;

use super::observe::{
    HitCounts, LedgerFigures, LedgerPeriod, LedgerRule, Memory, Seen, WindowCounts, observe,
};
use super::report::{markdown, report};
use super::*;
use crate::allocation::{Allocations, RegionLease, RuleAllocation, Slot};

fn slot(granted: u64) -> Slot {
    Slot {
        granted,
        bound: granted,
        target: granted,
        ..Slot::default()
    }
}

/// Two regions with 50 each of a rule of 100, demand 40 each.
fn allocations(epoch: u64, east: u64, west: u64) -> Allocations {
    Allocations {
        epoch,
        regions: ["east", "west"]
            .iter()
            .map(|r| {
                (
                    r.to_string(),
                    RegionLease {
                        valid_until_ms: 10_000,
                        acked: epoch,
                        last_heard_ms: 0,
                    },
                )
            })
            .collect(),
        rules: BTreeMap::from([(
            "api|fw".to_string(),
            RuleAllocation {
                limit: 100,
                fallback: BTreeMap::from([("east".into(), 25), ("west".into(), 25)]),
                split: BTreeMap::from([("east".into(), slot(east)), ("west".into(), slot(west))]),
                demand: BTreeMap::from([("east".into(), 40.0), ("west".into(), 40.0)]),
                ..RuleAllocation::default()
            },
        )]),
        ..Allocations::default()
    }
}

fn start(region: &str, mode: Mode) -> StartDrill {
    StartDrill {
        region: region.into(),
        mode,
        duration_ms: None,
        note: String::new(),
        force: false,
        by: Actor::default(),
        at_unix_ms: 1_000,
    }
}

fn serving() -> Vec<String> {
    vec!["east".into(), "west".into()]
}

#[test]
fn one_drill_per_region_and_never_the_last_region_without_force() {
    let mut drills = Drills::default();
    let a = allocations(3, 50, 50);
    let s = start("east", Mode::Drain);
    assert_eq!(drills.check_start(&s, true, &serving(), 1), Ok(1));
    drills.start(s.clone(), &a, &[("api|fw".into(), 4_000, true)]);
    let again = drills.check_start(&s, true, &serving(), 1);
    assert!(again.is_err_and(|e| e.contains("already in drill 1")));
    // West is the last region serving: refused unless forced.
    let west = start("west", Mode::Fail);
    let refused = drills.check_start(&west, true, &["west".to_string()], 1);
    assert!(refused.is_err_and(|e| e.contains("no region to serve")));
    let forced = StartDrill {
        force: true,
        ..west
    };
    assert_eq!(
        drills.check_start(&forced, true, &["west".to_string()], 1),
        Ok(2)
    );
    // No global rule: nothing to leave unserved.
    let no_rules = start("west", Mode::Fail);
    assert_eq!(
        drills.check_start(&no_rules, true, &["west".to_string()], 0),
        Ok(2)
    );
    assert!(
        drills
            .check_start(&start("north", Mode::Drain), false, &serving(), 1)
            .is_err_and(|e| e.contains("not registered"))
    );
}

#[test]
fn a_stopped_drill_frees_its_region_and_cannot_be_stopped_twice() {
    let mut drills = Drills::default();
    let id = drills.start(start("east", Mode::Partition), &allocations(1, 50, 50), &[]);
    assert_eq!(drills.mode_of("east"), Some(Mode::Partition));
    let stop = Stop {
        at_unix_ms: 5_000,
        by: Actor::default(),
        reason: StopReason::Stopped,
    };
    assert_eq!(drills.stop(id, stop.clone()), Ok(()));
    assert_eq!(drills.mode_of("east"), None);
    assert!(matches!(
        drills.stop(id, stop.clone()),
        Err(Refused::Rejected(_))
    ));
    assert!(matches!(drills.stop(9, stop), Err(Refused::NotFound(_))));
}

#[test]
fn events_beyond_the_bound_are_counted_not_kept() {
    let mut drills = Drills::default();
    let id = drills.start(start("east", Mode::Fail), &allocations(1, 50, 50), &[]);
    let many: Vec<Event> = (0..MAX_EVENTS + 10)
        .map(|i| Event {
            at_unix_ms: i as i64,
            what: What::Acknowledged { epoch: i as u64 },
        })
        .collect();
    assert_eq!(drills.observed(id, many), Ok(()));
    let d = &drills.by_id[&id];
    assert_eq!(d.events.len(), MAX_EVENTS);
    assert_eq!(d.dropped, 11, "the start's own event came first");
}

#[test]
fn old_finished_drills_make_room_and_active_ones_stay() {
    let mut drills = Drills::default();
    let a = allocations(1, 50, 50);
    let first = drills.start(start("east", Mode::Drain), &a, &[]);
    for i in 0..MAX_DRILLS {
        let id = drills.start(start(&format!("r{i}"), Mode::Drain), &a, &[]);
        let stop = Stop {
            at_unix_ms: 2,
            by: Actor::default(),
            reason: StopReason::Stopped,
        };
        let _ = drills.stop(id, stop);
        let _ = drills.observed(
            id,
            vec![Event {
                at_unix_ms: 3,
                what: What::Finished { recovered: true },
            }],
        );
    }
    assert!(drills.by_id.len() <= MAX_DRILLS);
    assert!(
        drills.by_id.contains_key(&first),
        "the active drill is kept"
    );
    assert_eq!(drills.last_id, MAX_DRILLS as u64 + 1);
}

/// Observes `drill` once at `now` over `a`, and records what it saw.
fn step(drills: &mut Drills, id: u64, a: &Allocations, now: i64, memory: &mut Memory) {
    let hits = HitCounts::new();
    let windows = WindowCounts::new();
    let seen = Seen {
        now,
        node: 1,
        allocations: a,
        hits: &hits,
        windows: &windows,
        ledger: &LedgerFigures::new(),
    };
    let events = observe(&drills.by_id[&id], &seen, memory);
    if !events.is_empty() {
        drills.observed(id, events).expect("observed");
    }
}

#[test]
fn a_drain_is_acknowledged_then_covered_then_recovered() {
    let mut drills = Drills::default();
    let base = allocations(3, 50, 50);
    let id = drills.start(
        start("east", Mode::Drain),
        &base,
        &[("api|fw".into(), 0, true)],
    );
    let mut memory = Memory::default();
    // Epoch 4 came from a round already under way: east keeps its share,
    // and west's 50 is not "covering" anything yet, though east acked it.
    let mut a = allocations(4, 50, 50);
    step(&mut drills, id, &a, 1_050, &mut memory);
    let d = &drills.by_id[&id];
    assert!(
        !d.events.iter().any(|e| matches!(
            e.what,
            What::Covered { .. } | What::Drained { .. } | What::Acknowledged { .. }
        )),
        "{:?}",
        d.events
    );
    // Epoch 5 shrinks east to its floor; east holds it (acked 5).
    a = allocations(5, 25, 50);
    step(&mut drills, id, &a, 1_100, &mut memory);
    // Epoch 6 grants west what east gave up.
    a = allocations(6, 25, 75);
    step(&mut drills, id, &a, 1_400, &mut memory);
    let d = &drills.by_id[&id];
    let whats: Vec<&What> = d.events.iter().map(|e| &e.what).collect();
    assert!(whats.contains(&&What::Drained { epoch: 5 }), "{whats:?}");
    assert!(
        whats.contains(&&What::Acknowledged { epoch: 5 }),
        "{whats:?}"
    );
    assert!(whats.contains(&&What::Regranted { epoch: 6 }), "{whats:?}");
    assert!(whats.contains(&&What::Covered { epoch: 6 }), "{whats:?}");
    let r = report(d);
    assert_eq!(
        r.figures.covered_after_ms.value,
        Some(300),
        "from the ack at 1.1 s"
    );
    // Stopped, then east gets its share back in epoch 6 and holds it.
    drills
        .stop(
            id,
            Stop {
                at_unix_ms: 2_000,
                by: Actor::default(),
                reason: StopReason::Stopped,
            },
        )
        .expect("stop");
    a = allocations(7, 50, 50);
    step(&mut drills, id, &a, 2_500, &mut memory);
    step(&mut drills, id, &a, 2_750, &mut memory);
    let d = &drills.by_id[&id];
    assert!(d.finished, "{:?}", d.events);
    let r = report(d);
    assert_eq!(r.figures.recovered_after_ms.value, Some(750));
    assert!(r.complete);
    let md = markdown(&r);
    assert!(md.contains("# Drill 1: drain east"), "{md}");
    assert!(md.contains("covered the shifted demand**: 300 ms"), "{md}");
}

#[test]
fn a_failed_regions_lapse_is_seen_once_and_unheard_windows_count_what_it_could_enforce() {
    let mut drills = Drills::default();
    let base = allocations(3, 50, 50);
    let id = drills.start(
        start("east", Mode::Fail),
        &base,
        &[("api|fw".into(), 4_000, true)],
    );
    let mut memory = Memory::default();
    let a = allocations(3, 50, 50);
    // West reported 45 in the window at 0; east was not heard.
    let mut windows = WindowCounts::new();
    windows.insert(
        ("api|fw".into(), 0),
        BTreeMap::from([(
            "west".to_string(),
            super::observe::Heard {
                count: 45,
                last: true,
                cap: 50,
            },
        )]),
    );
    let hits = HitCounts::new();
    for now in [6_500, 12_000, 12_250] {
        let seen = Seen {
            now,
            node: 2,
            allocations: &a,
            hits: &hits,
            windows: &windows,
            ledger: &LedgerFigures::new(),
        };
        let events = observe(&drills.by_id[&id], &seen, &mut memory);
        drills.observed(id, events).expect("observed");
    }
    let d = &drills.by_id[&id];
    let lapses = d
        .events
        .iter()
        .filter(|e| matches!(e.what, What::LeaseLapsed { .. }))
        .count();
    assert_eq!(lapses, 1);
    let r = report(d);
    let w0 = r
        .figures
        .windows
        .iter()
        .find(|w| w.start_ms == 0)
        .expect("window 0");
    assert_eq!(w0.admitted.get("west"), Some(&45));
    assert_eq!(
        w0.admitted.get("east"),
        Some(&50),
        "its grant: the lease held then"
    );
    assert_eq!(w0.estimated, vec!["east".to_string()]);
    // After the lapse (at 10 s) east counts at its fallback.
    let w8 = r.figures.windows.iter().find(|w| w.start_ms == 8_000);
    assert!(
        w8.is_none(),
        "the window at 8 s ends at 12 s: not final yet at 12.25 s"
    );
    assert_eq!(r.observed_by, vec![2]);
}

#[test]
fn a_sliding_rules_periods_come_from_the_ledger_with_their_bound_and_a_partial_one_is_no_worst() {
    let mut drills = Drills::default();
    let base = allocations(3, 50, 50);
    // Not counted in fixed windows: the baseline has no period.
    let id = drills.start(
        start("east", Mode::Drain),
        &base,
        &[("api|fw".into(), 0, true)],
    );
    let period = |east: u64, west: u64, complete: bool| LedgerPeriod {
        admitted: BTreeMap::from([("east".into(), east), ("west".into(), west)]),
        limit: 100,
        bound: 100,
        pods: 2,
        complete,
    };
    let mut ledger = LedgerFigures::from([(
        "api|fw".to_string(),
        LedgerRule {
            period_ms: 2_000,
            bound_is: "L = 100 (sliding_window_counter: every clock-aligned period ≤ L)".into(),
            periods: BTreeMap::from([
                // Before the drill: not its business.
                (-2_000, period(70, 70, true)),
                (0, period(40, 55, true)),
                (2_000, period(10, 88, true)),
            ]),
        },
    )]);
    let a = allocations(3, 50, 50);
    let hits = HitCounts::new();
    let windows = WindowCounts::new();
    let mut memory = Memory::default();
    let mut look = |drills: &mut Drills, ledger: &LedgerFigures, now| {
        let seen = Seen {
            now,
            node: 1,
            allocations: &a,
            hits: &hits,
            windows: &windows,
            ledger,
        };
        let events = observe(&drills.by_id[&id], &seen, &mut memory);
        drills.observed(id, events).expect("observed");
    };
    look(&mut drills, &ledger, 5_000);
    look(&mut drills, &ledger, 5_250);
    drills
        .stop(
            id,
            Stop {
                at_unix_ms: 5_500,
                by: Actor::default(),
                reason: StopReason::Stopped,
            },
        )
        .expect("stop");
    // The period the drill stopped in, reported in part only.
    if let Some(rule) = ledger.get_mut("api|fw") {
        rule.periods.insert(4_000, period(60, 61, false));
        rule.periods.insert(6_000, period(1, 1, true));
    }
    look(&mut drills, &ledger, 9_000);
    let d = &drills.by_id[&id];
    let periods = d
        .events
        .iter()
        .filter(|e| matches!(e.what, What::Period { .. }))
        .count();
    assert_eq!(periods, 3, "0, 2 s and 4 s, each once: {:?}", d.events);
    let r = report(d);
    let figures: Vec<(i64, u64, bool)> = r
        .figures
        .windows
        .iter()
        .map(|w| (w.start_ms, w.total, w.partial))
        .collect();
    assert_eq!(
        figures,
        [(0, 95, false), (2_000, 98, false), (4_000, 121, true)]
    );
    assert!(
        r.figures
            .windows
            .iter()
            .all(|w| w.measured == super::report::Measured::Ledger && w.bound == 100)
    );
    // The partial period (a lower bound, here over L) is not the worst
    // complete one; the how says how every figure was measured.
    let worst = r.figures.worst_window.value.as_ref().expect("worst");
    assert_eq!(
        (worst.start_ms, worst.total, worst.over_bound),
        (2_000, 98, -2)
    );
    assert!(
        r.figures
            .worst_window
            .how
            .contains("clock-aligned rule period")
    );
    let md = markdown(&r);
    assert!(md.contains("ledger (partial: a lower bound)"), "{md}");
}
