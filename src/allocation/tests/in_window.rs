//! Within a window: shrinks that apply at once or step down, grows that fit
//! in whole or in part, and the pods' table holding each to its window.

use super::super::table::{Now, Table};
use super::super::*;
use super::*;

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
        recent: None,
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
        recent: None,
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
        let got = s[0].shrink_now.then_some(s[0].before);
        assert_eq!(got, step, "M's demand {paces:?}");
        // Without a step the shrink waits for the boundary, and the slot
        // remembers M keeps 600 until then (for a later round's step).
        assert_eq!(
            (s[0].before, s[0].before_until_ms),
            (step.unwrap_or(600), 60_000)
        );
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
    assert!(!restarted[0].shrink_now);
    assert_eq!((restarted[0].before, restarted[0].granted), (600, 300));

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

/// A region's pace now is the rise of its count between two reports of one
/// pod within the window — the fastest of its pods — and nothing across a
/// window's boundary or a count that fell (a pod that restarted).
#[test]
fn a_region_pace_is_the_rise_of_its_count_between_two_reports_of_a_window() {
    let mut acks = AckTracker::default();
    let report = |acks: &mut AckTracker, pod: &str, at: Millis, start: Millis, count: u64| {
        acks.record(pod, "m", 3, at);
        acks.record_use(pod, "m", "r", start, use_of(count, 300));
    };
    report(&mut acks, "m-0", 1_000, 0, 40);
    assert_eq!(acks.region_use("m", "r", 0, 1_000, 5_000).recent, None);
    report(&mut acks, "m-0", 1_500, 0, 80);
    let pace = Recent {
        hits: 40,
        over_ms: 500,
    };
    assert_eq!(
        acks.region_use("m", "r", 0, 1_500, 5_000).recent,
        Some(pace)
    );
    assert_eq!(pace.per_window(5_000), 400.0);
    // A slower pod does not hide the faster one's pace; a faster one wins.
    report(&mut acks, "m-1", 1_100, 0, 50);
    report(&mut acks, "m-1", 1_600, 0, 60);
    assert_eq!(
        acks.region_use("m", "r", 0, 1_600, 5_000).recent,
        Some(pace)
    );
    report(&mut acks, "m-1", 1_700, 0, 100);
    let faster = Recent {
        hits: 40,
        over_ms: 100,
    };
    assert_eq!(
        acks.region_use("m", "r", 0, 1_700, 5_000).recent,
        Some(faster)
    );
    // A report heard at the same moment keeps the pace; a count that fell
    // has none.
    report(&mut acks, "m-1", 1_700, 0, 101);
    assert_eq!(
        acks.region_use("m", "r", 0, 1_700, 5_000).recent,
        Some(faster)
    );
    report(&mut acks, "m-1", 2_000, 0, 3);
    assert_eq!(
        acks.region_use("m", "r", 0, 2_000, 5_000).recent,
        Some(pace)
    );
    // The next window starts without a pace until a pod reports it twice.
    report(&mut acks, "m-0", 5_100, 5_000, 5);
    report(&mut acks, "m-1", 5_200, 5_000, 9);
    assert_eq!(acks.region_use("m", "r", 5_000, 5_200, 5_000).recent, None);
}

/// A step down is floored at the region's pace now where a pod measured it
/// (the smoothed estimate trails a swing by rounds: a region whose demand
/// fell to 80 a window still read 322, then 140), else at the larger of two
/// rounds' estimates; with headroom either way.
#[test]
fn a_step_is_floored_at_the_pace_now_where_measured_else_two_rounds_estimates() {
    let config = Config {
        headroom: 0.1,
        ..Config::default()
    };
    let names = ["m", "h"];
    let before: BTreeMap<String, f64> = [("m".to_string(), 322.0), ("h".to_string(), 80.0)].into();
    let now = [140.0, 320.0];
    let region = |recent: Option<Recent>| RegionWindow {
        used: use_of(40, 160),
        live: 1,
        reported: 1,
        settled_since: 0,
        recent,
    };
    let mut w = InWindow {
        start_ms: 0,
        until_ms: 5_000,
        elapsed: 0.2,
        regions: vec![region(None), region(None)],
    };
    let paces = |w: Option<&InWindow>| super::rebalance::paces(&before, &now, &names, w, &config);
    let close = |got: Vec<f64>, want: [f64; 2]| {
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-9),
            "{got:?} != {want:?}"
        );
    };
    close(paces(None), [322.0 * 1.1, 320.0 * 1.1]);
    close(paces(Some(&w)), [322.0 * 1.1, 320.0 * 1.1]);
    w.regions[0].recent = Some(Recent {
        hits: 8,
        over_ms: 500,
    });
    close(paces(Some(&w)), [80.0 * 1.1, 320.0 * 1.1]);
}

/// A shrink that waited for the boundary — its region still ran at its old
/// share's pace when the round decided it — steps down in a later round of
/// the same window once the region's pace shows its demand fell, and is
/// left alone in the next window (the boundary applied it).
#[test]
fn a_shrink_that_waited_steps_down_in_a_later_round_once_the_pace_falls() {
    let window = |start: Millis, elapsed: f64, m: WindowUse| InWindow {
        start_ms: start,
        until_ms: start + 60_000,
        elapsed,
        regions: [m, use_of(390, 400)]
            .map(|used| RegionWindow {
                used,
                live: 1,
                reported: 1,
                settled_since: 0,
                recent: None,
            })
            .to_vec(),
    };
    let mut slots = m600_h400_to_m300_h700();
    let first = window(0, 0.25, use_of(150, 600));
    super::rebalance::transition_tracked(
        &mut slots,
        1000,
        2,
        None,
        Some((&first, Some(&[600.0, 900.0]))),
    );
    assert!(!slots[0].shrink_now, "M still ran at 600's pace");
    assert_eq!(
        (slots[0].granted, slots[0].before, slots[0].before_until_ms),
        (300, 600, 60_000)
    );
    let waited = slots;

    // Half the window gone, M counted 260 (more than 300's pace allows for
    // a shrink at once) and runs at 220 a window now: it steps to
    // 260 + 300 × ½ = 410 until the boundary.
    slots[0].bound = slots[0].granted;
    let later = window(0, 0.5, use_of(260, 600));
    super::rebalance::transition_tracked(
        &mut slots,
        1000,
        3,
        None,
        Some((&later, Some(&[220.0, 900.0]))),
    );
    assert!(slots[0].shrink_now);
    assert_eq!(
        (slots[0].granted, slots[0].before, slots[0].now_until_ms),
        (300, 410, 60_000)
    );
    assert_eq!(
        (slots[0].since, slots[0].bound),
        (3, 600),
        "published now: M counts at 600 until it acknowledges the step"
    );

    // Still at its old pace: it keeps waiting.
    let mut still = waited;
    super::rebalance::transition_tracked(
        &mut still,
        1000,
        3,
        None,
        Some((&later, Some(&[600.0, 900.0]))),
    );
    assert_eq!(still[0], waited[0]);

    // In the next window the boundary applied the shrink: nothing waits.
    let mut next = waited;
    let after = window(60_000, 0.25, use_of(20, 300));
    super::rebalance::transition_tracked(
        &mut next,
        1000,
        3,
        None,
        Some((&after, Some(&[50.0, 900.0]))),
    );
    assert!(!next[0].shrink_now);
    assert_eq!((next[0].granted, next[0].before_until_ms), (300, 60_000));
}

/// Found by the real swing test: a key entry created within a window from
/// a split that steps down (its region holds 115 this window, 40 from the
/// boundary) arrived as an immediate grow 40 → 43 — and the pod, which
/// held the key at the split's 115, lowered it to 43 at once, cutting off
/// a region that had counted 50. An immediate change raises; a lower
/// value waits for the boundary (what the centre counts meanwhile is the
/// pods' reported cap).
#[test]
fn an_immediate_change_never_lowers_the_value_in_force() {
    let w: Option<u64> = Some(60_000);
    let t0: Millis = 1_800_000_000_000; // a minute boundary
    let mut table = Table::default();
    let mut first = update(1, t0 + 600_000, Some(159), vec![]);
    first.full = true;
    table.apply(&first, t0, |_| w).expect("first");
    let mut step = update(2, t0 + 600_000, Some(40), vec![]);
    step.rules[0].split_now = Now {
        shrink_now: true,
        until_ms: t0 + 60_000,
        starting: Some((115, t0 + 60_000)),
        ..Now::default()
    };
    table.apply(&step, t0 + 11_000, |_| w).expect("step");
    assert_eq!(table.limit("r", "k", t0 + 11_001), Some(115));
    let mut entry = update(3, t0 + 600_000, None, vec![("k", Some(43))]);
    entry.rules[0].keys_now = vec![(
        "k".to_string(),
        Now {
            immediate: true,
            until_ms: t0 + 60_000,
            ..Now::default()
        },
    )];
    table.apply(&entry, t0 + 11_500, |_| w).expect("entry");
    assert_eq!(table.limit("r", "k", t0 + 11_501), Some(115));
    assert_eq!(table.limit("r", "k", t0 + 60_000), Some(43));
    // A raise still applies at once.
    let mut raise = update(4, t0 + 600_000, None, vec![("k", Some(150))]);
    raise.rules[0].keys_now = entry.rules[0].keys_now.clone();
    table.apply(&raise, t0 + 12_000, |_| w).expect("raise");
    assert_eq!(table.limit("r", "k", t0 + 12_001), Some(150));
}
