//! The simulator's promises: short versions of the published scenarios keep
//! every DESIGN §4 bound in every window, Meridian rejects no more than the
//! alternatives after demand shifts, and a seed fixes every output byte.

use std::path::Path;

use meridian::sim::{Run, Scenario, Strategy, StrategyRun, report, simulate};

fn load(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("simulations")
        .join(format!("{name}.toml"));
    match Scenario::load(&path) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// The scenario cut to `minutes` (events after that are simply not reached),
/// with at most 3 customers and 2 s steps so a debug build runs it in seconds.
fn short(name: &str, minutes: i64) -> Scenario {
    let mut s = load(name);
    s.duration_ms = s.duration_ms.min(minutes * 60_000);
    s.traffic.customers = s.traffic.customers.min(3);
    if s.rule.period_ms % 2000 == 0 {
        s.step_ms = 2000;
    }
    s
}

fn run(s: Scenario) -> Run {
    simulate(s, 7, &mut |_| {})
}

fn of(run: &Run, strategy: Strategy) -> &StrategyRun {
    match run.runs.iter().find(|r| r.strategy == strategy) {
        Some(r) => r,
        None => panic!("no {} run", strategy.name()),
    }
}

/// Every window of Meridian (and of the ideal counter and the static split)
/// stays within the bound DESIGN §4 states for the scenario: ≤ L for the
/// exact windowed path, + the silent region's allocation for one lease under
/// `partition: available`, ≤ B + R·T for a token bucket.
fn assert_bounds(run: &Run) {
    for strategy in [Strategy::Ideal, Strategy::Static, Strategy::Meridian] {
        let sr = of(run, strategy);
        for w in &sr.windows {
            assert!(
                w.bound_excess <= 0,
                "{}: {} exceeded the bound by {} in the window at {} s",
                run.scenario.name,
                strategy.name(),
                w.bound_excess,
                w.start_ms / 1000
            );
        }
        assert!(
            sr.windows.len() > 5,
            "{}: too short to mean anything",
            run.scenario.name
        );
    }
}

#[test]
fn steady_load_keeps_every_window_within_the_limit() {
    assert_bounds(&run(short("steady", 30)));
}

#[test]
fn a_shift_keeps_every_window_within_the_limit_and_meridian_rejects_less_than_static() {
    let r = run(short("shift", 60));
    assert_bounds(&r);
    // Not fewer than proportional share: in the window a step lands in,
    // proportional re-divides mid-window — what also takes it above L.
    assert_fewer_false_rejections(&r, &[Strategy::Static]);
}

#[test]
fn a_flash_crowd_keeps_every_window_within_the_limit() {
    let r = run(short("flash-crowd", 70));
    assert_bounds(&r);
    assert_fewer_false_rejections(&r, &[Strategy::Static]);
}

#[test]
fn region_failure_and_recovery_keep_every_window_within_the_limit() {
    let r = run(short("region-failure", 100));
    assert_bounds(&r);
}

#[test]
fn a_strict_partition_adds_nothing() {
    let r = run(short("partition-strict", 90));
    assert_bounds(&r);
}

#[test]
fn an_available_partition_adds_at_most_the_silent_region_share_for_one_lease() {
    let r = run(short("partition-available", 90));
    assert_bounds(&r);
}

#[test]
fn a_token_bucket_admits_at_most_burst_plus_rate_times_interval() {
    let r = run(short("token-bucket", 40));
    assert_bounds(&r);
}

#[test]
fn a_hot_customer_keeps_every_window_within_the_limit() {
    assert_bounds(&run(short("hot-customer", 20)));
}

#[test]
fn follow_the_sun_keeps_every_window_within_the_limit_and_meridian_rejects_less_than_the_others() {
    let mut s = short("follow-the-sun", 24 * 60);
    s.step_ms = 5_000;
    let r = run(s);
    assert_bounds(&r);
    assert_fewer_false_rejections(&r, &[Strategy::Static, Strategy::Proportional]);
}

#[test]
fn zipf_customers_keep_every_window_within_the_limit() {
    let mut s = load("zipf-100k");
    s.duration_ms = 15 * 60_000;
    s.traffic.customers = 5_000;
    assert_bounds(&run(s));
}

/// Meridian denies no more of what the exact counter would admit than
/// `others` do.
fn assert_fewer_false_rejections(run: &Run, others: &[Strategy]) {
    let meridian = of(run, Strategy::Meridian).summary.false_rejected;
    for &other in others {
        let theirs = of(run, other).summary.false_rejected;
        assert!(
            meridian <= theirs,
            "{}: meridian rejected {meridian} the ideal counter admitted, {} only {theirs}",
            run.scenario.name,
            other.name()
        );
    }
}

#[test]
fn the_same_seed_gives_byte_identical_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    for sub in ["a", "b"] {
        let r = simulate(short("partition-available", 70), 11, &mut |_| {});
        report::write(&r, &dir.path().join(sub)).expect("write");
    }
    for file in [
        "timeseries.csv",
        "summary.md",
        "allocation.svg",
        "demand.svg",
        "overshoot.svg",
    ] {
        let a = std::fs::read(dir.path().join("a").join(file)).expect("a");
        let b = std::fs::read(dir.path().join("b").join(file)).expect("b");
        assert!(a == b, "{file} differs between two runs with the same seed");
    }
    let other = simulate(short("partition-available", 70), 12, &mut |_| {});
    assert_ne!(
        report::csv(&other),
        String::from_utf8(std::fs::read(dir.path().join("a/timeseries.csv")).expect("a"))
            .expect("utf8"),
        "another seed draws other traffic"
    );
}

#[test]
fn a_bad_scenario_names_the_file_the_field_and_the_reason() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations/steady.toml"),
    )
    .expect("steady.toml");
    let bad = text.replace("latency_ms = 45", "latency_ms = -5");
    let e = Scenario::parse("x.toml", &bad).expect_err("negative latency");
    assert_eq!(
        (e.file.as_str(), e.field.as_str()),
        ("x.toml", "region[1].latency_ms")
    );
    let bad = text.replace("limit = 6000", "limit = 6000\ncolour = 1");
    let e = Scenario::parse("x.toml", &bad).expect_err("unknown field");
    assert!(e.to_string().contains("colour"), "{e}");
    let bad = text.replace("us-east = 0.5", "mars = 0.5");
    let e = Scenario::parse("x.toml", &bad).expect_err("unknown region");
    assert_eq!(e.field, "traffic.mix.mars");
    let bad = text.replace("fixed_window", "leaky_bucket");
    let e = Scenario::parse("x.toml", &bad).expect_err("not simulated");
    assert_eq!(e.field, "rule.algorithm");
}
