//! Region failover drills against real processes: 3 coordinators, and two
//! regions each with its own Redis and limiter, traffic on two global rules
//! (`partition: strict` and `available`) above their limit, so every region
//! uses all it is granted. The test measures the world's admitted hits per
//! window from its own decisions and holds them against L (strict) and the
//! stated bound (available), watches the split move, and checks that the
//! drill's report agrees with what it measured.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::global::{Load, Record, World, admitted_per_window, now_us, strict_and_available};
use serde_json::{Value, json};

const L: u64 = 200;
const PERIOD: Duration = Duration::from_secs(4);
/// fallback 0.5 × the static share (L / 2 regions).
const FALLBACK: u64 = 50;
/// The floor a drained region keeps: 0.1 × its static share.
const FLOOR: u64 = 10;

/// A world under load on both rules, each region asking 40/s of each (160
/// a window against a share of about 100), with both regions allocated.
async fn loaded_world() -> (World, Load, Load) {
    let world = World::start(&strict_and_available(L), &["east", "west"]).await;
    let strict = Load::start(&world, "api", "strict", "acme", &[40, 40]);
    let avail = Load::start(&world, "api", "avail", "acme", &[40, 40]);
    for rule in ["api|strict", "api|avail"] {
        world.wait_allocated(rule, Duration::from_secs(20)).await;
    }
    // Demand settles over a few rounds.
    tokio::time::sleep(Duration::from_secs(6)).await;
    (world, strict, avail)
}

/// `GET /api/v1/drills/{id}` from any running node that answers.
async fn drill(world: &World, id: u64) -> Value {
    for node in world.cluster.running() {
        if let Some((200, body)) = world
            .cluster
            .get(node, &format!("/api/v1/drills/{id}"))
            .await
        {
            return body;
        }
    }
    panic!("no coordinator answers GET /api/v1/drills/{id}");
}

/// Waits until drill `id`'s report is complete (observation ended).
async fn wait_finished(world: &World, id: u64, within: Duration) -> Value {
    let started = Instant::now();
    loop {
        let body = drill(world, id).await;
        if body["report"]["complete"] == json!(true) {
            return body;
        }
        assert!(
            started.elapsed() < within,
            "drill {id} not finished within {within:?}: {}",
            body["markdown"].as_str().unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn timeline_at(report: &Value, prefix: &str) -> Option<i64> {
    report["timeline"].as_array()?.iter().find_map(|l| {
        l["what"]
            .as_str()
            .is_some_and(|w| w.contains(prefix))
            .then(|| l["at_unix_ms"].as_i64())
            .flatten()
    })
}

/// East (the drilled region) enforced its fallback from its lease's lapse
/// (plus 600 ms for its limiter to notice) until the drill stopped.
fn east_fell_back(records: &[Record], report: &Value) {
    let lapsed_ms = timeline_at(report, "lease lapsed").expect("the lease lapsed");
    let stop_ms = report["stopped"]["at_unix_ms"]
        .as_i64()
        .expect("the drill stopped");
    let east_after: Vec<u64> = records
        .iter()
        .filter(|r| r.region == 0 && r.sent_us as i64 / 1000 > lapsed_ms + 600)
        .filter(|r| (r.recv_us as i64 / 1000) < stop_ms)
        .map(|r| r.limit)
        .collect();
    assert!(
        !east_after.is_empty() && east_after.iter().all(|l| *l <= FALLBACK),
        "after its lease east enforces its fallback ({FALLBACK}): {east_after:?}"
    );
}

/// The world's admitted hits per window, by window start in ms.
fn windows_ms(records: &[Record]) -> BTreeMap<i64, Vec<u64>> {
    let period_ms = PERIOD.as_millis() as i64;
    admitted_per_window(records, PERIOD, false, 2)
        .into_iter()
        .map(|(w, v)| (w as i64 * period_ms, v))
        .collect()
}

/// How far a region's reported admissions in a window may be from the
/// test's own count: 8 % of L. The report's figure is the region's Redis
/// count as its pods saw it; the test counts the decisions it received and
/// places each in a window by its reset time, so checks in flight at a
/// window's edge, and calls whose answer was lost under load, land apart.
const TOLERANCE: u64 = L * 8 / 100;

/// Holds the report's per-window figures against the test's own counts of
/// the same windows (within [`TOLERANCE`]).
fn report_agrees(report: &Value, rule: &str, measured: &BTreeMap<i64, Vec<u64>>, regions: &[&str]) {
    let windows = report["figures"]["windows"].as_array().expect("windows");
    let mut compared = 0;
    for w in windows.iter().filter(|w| w["rule"] == json!(rule)) {
        let start = w["start_ms"].as_i64().expect("start");
        let Some(ours) = measured.get(&start) else {
            continue;
        };
        for (i, region) in regions.iter().enumerate() {
            let estimated = w["estimated"]
                .as_array()
                .is_some_and(|e| e.contains(&json!(region)));
            let theirs = w["admitted"][region].as_u64().unwrap_or(0);
            if estimated {
                // Not heard: the report counts what it could enforce, a
                // bound on what it did.
                assert!(
                    theirs + 3 >= ours[i],
                    "{rule} window {start}: {region} estimated at {theirs}, admitted {}",
                    ours[i]
                );
            } else {
                assert!(
                    theirs.abs_diff(ours[i]) <= TOLERANCE,
                    "{rule} window {start}: {region} reported {theirs}, the test counted {}",
                    ours[i]
                );
            }
        }
        compared += 1;
    }
    assert!(compared >= 2, "{rule}: only {compared} windows compared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_moves_the_share_at_the_ack_then_a_partition_cuts_the_region_off() {
    let (world, strict, avail) = loaded_world().await;

    // Refusals first: an unknown mode, no token, the last region.
    let (status, body) = world
        .start_drill(json!({ "region": "east", "mode": "nap" }))
        .await;
    assert_eq!(
        (status, body["field"].clone()),
        (422, json!("mode")),
        "{body}"
    );
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    let url = format!("{}/api/v1/drills", world.cluster.node(leader).url());
    let anonymous = reqwest::Client::new()
        .post(url)
        .json(&json!({ "region": "east", "mode": "drain" }))
        .send()
        .await
        .expect("request");
    assert_eq!(anonymous.status().as_u16(), 401);

    // Drain east.
    let drain_at = now_us();
    let (status, body) = world
        .start_drill(json!({ "region": "east", "mode": "drain", "note": "planned" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let id = body["drill"].as_u64().expect("drill id");
    let (status, body) = world
        .start_drill(json!({ "region": "west", "mode": "fail" }))
        .await;
    assert_eq!(status, 409, "west is the last region serving: {body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no region to serve"),
        "{body}"
    );
    let (status, body) = world
        .start_drill(json!({ "region": "east", "mode": "fail" }))
        .await;
    assert_eq!(status, 409, "one drill per region: {body}");

    // West's grant as the test sees it, until it holds 95 % of what moved:
    // L less east's floor (demand is above L). The cover happened after the
    // last read that did not see it began and before the read that did
    // returned: the test's bracket, whatever the machine's load.
    let started = Instant::now();
    let mut not_yet_us = drain_at;
    let covered_us = loop {
        let asked_us = now_us();
        let split = world.split("api|strict").await;
        if split.get("west").copied().unwrap_or(0) as f64 >= 0.95 * (L - FLOOR) as f64 {
            break now_us();
        }
        not_yet_us = asked_us;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "west never held 95 % of the drained share: {split:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The leader notes the acknowledgement within its next look (250 ms).
    let started = Instant::now();
    let acked_ms = loop {
        let report = drill(&world, id).await["report"].clone();
        if let Some(t) = timeline_at(&report, "east acknowledged") {
            break t;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the report never noted east's acknowledgement: {report}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "drain: east acknowledged {} ms after the start; the test saw west covered between \
         {} and {} ms after that",
        acked_ms - drain_at as i64 / 1000,
        not_yet_us as i64 / 1000 - acked_ms,
        covered_us as i64 / 1000 - acked_ms
    );
    tokio::time::sleep(Duration::from_secs(9)).await;
    let (status, body) = world.stop_drill(id).await;
    assert_eq!(status, 200, "{body}");
    let drained = wait_finished(&world, id, Duration::from_secs(30)).await;
    let report = &drained["report"];
    eprintln!("{}", drained["markdown"].as_str().unwrap_or_default());
    let covered_ms = report["figures"]["covered_after_ms"]["value"]
        .as_i64()
        .expect("the report measured the cover");
    assert!(
        covered_ms <= 1_000,
        "west held 95 % of the shifted demand {covered_ms} ms after east's acknowledgement"
    );
    // The report's instant lies in the test's bracket (50 ms for the two
    // clocks' reads: the report's is the epoch's computation, before the
    // read could see it).
    let covered_at_ms = acked_ms + covered_ms;
    assert!(
        covered_at_ms >= not_yet_us as i64 / 1000 - 50 && covered_at_ms <= covered_us as i64 / 1000,
        "the report's cover at {covered_at_ms} is outside the test's bracket [{}, {}]",
        not_yet_us / 1000,
        covered_us / 1000
    );
    assert!(
        report["figures"]["recovered_after_ms"]["value"]
            .as_i64()
            .is_some()
    );
    assert_eq!(
        report["started_by"]["credential"]
            .as_str()
            .map(|c| c.starts_with("admin token sha256:")),
        Some(true)
    );
    assert!(
        report["stopped"]["by"]["from"]
            .as_str()
            .is_some_and(|f| f.starts_with("127.0.0.1:"))
    );

    // Then cut east off for 12 s (its lease is 6 s): its limiter's watch is
    // refused and ended.
    let cut_at = now_us();
    let (status, body) = world
        .start_drill(json!({ "region": "east", "mode": "partition", "duration": "12s" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let cut_id = body["drill"].as_u64().expect("drill id");
    let cut = wait_finished(&world, cut_id, Duration::from_secs(60)).await;
    eprintln!("{}", cut["markdown"].as_str().unwrap_or_default());
    let cut_report = &cut["report"];
    assert_eq!(cut_report["stopped"]["reason"], json!("duration_elapsed"));
    let covered = cut_report["figures"]["covered_after_ms"]["value"].as_i64();
    let lapsed = timeline_at(cut_report, "lease lapsed");
    assert!(
        lapsed.is_some(),
        "east's lease lapses while it is cut off: {cut_report}"
    );
    // Strict: nothing of east's is re-granted before its lease lapsed —
    // the last lease the centre published, renewed with a third of its 6 s
    // left at the latest, so 2–6 s after the cut.
    let started = cut_report["started_at_unix_ms"].as_i64();
    let covered_at = started.zip(covered).map(|(s, c)| s + c);
    assert!(
        covered_at.zip(lapsed).is_some_and(|(c, l)| c >= l),
        "strict: west covers the shift only after east's lease lapsed: covered {covered:?} ms \
         after the cut, at {covered_at:?}; lapsed at {lapsed:?}"
    );
    let strict_records = strict.stop().await;
    let avail_records = avail.stop().await;

    // East enforced its fallback once its lease lapsed.
    east_fell_back(&strict_records, cut_report);

    // Strict: never above L in any window, drain and partition alike.
    let strict_windows = windows_ms(&strict_records);
    for (start, per_region) in &strict_windows {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "strict: window at {start} admitted {total} ({per_region:?})"
        );
    }
    // Available: within L + east's share at the cut.
    let bound = cut_report["figures"]["windows"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["rule"] == json!("api|avail")))
        .and_then(|w| w["bound"].as_u64())
        .expect("the report states the available rule's bound");
    assert!(bound > L && bound <= L + L, "bound {bound}");
    let avail_windows = windows_ms(&avail_records);
    for (start, per_region) in avail_windows.range(cut_at as i64 / 1000 - 4_000..) {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= bound,
            "available: window at {start} admitted {total} > {bound}"
        );
    }
    report_agrees(report, "api|strict", &strict_windows, &["east", "west"]);
    report_agrees(cut_report, "api|strict", &strict_windows, &["east", "west"]);
    report_agrees(cut_report, "api|avail", &avail_windows, &["east", "west"]);
    let worst = &cut_report["figures"]["worst_window"]["value"];
    assert!(
        worst["over_bound"].as_i64().is_some_and(|o| o <= 0),
        "{worst}"
    );

    // The same drills through `meridian ctl drill`.
    let list = ctl(&world, &["--output", "json", "drill", "list"]).await;
    assert_eq!(list.0, 0, "{list:?}");
    let body: Value = serde_json::from_str(&list.1).expect("ctl drill list --output json");
    let ids: Vec<u64> = body["drills"]
        .as_array()
        .expect("drills")
        .iter()
        .filter_map(|d| d["id"].as_u64())
        .collect();
    assert_eq!(ids, [2, 1], "newest first");
    let table = ctl(&world, &["drill", "list"]).await;
    assert!(
        table.0 == 0 && table.1.contains("partition") && table.1.contains("finished"),
        "{table:?}"
    );
    let report = ctl(&world, &["drill", "report", "1"]).await;
    assert!(
        report.0 == 0 && report.1.starts_with("# Drill 1: drain east"),
        "{report:?}"
    );
    let json = ctl(&world, &["--output", "json", "drill", "report", "2"]).await;
    let parsed: Value = serde_json::from_str(&json.1).expect("report as JSON");
    assert_eq!(parsed["mode"], json!("partition"));
    // Refusals exit 3 with the coordinator's reason.
    let again = ctl(&world, &["drill", "stop", "1"]).await;
    assert_eq!(again.0, 3, "{again:?}");
    assert!(again.2.contains("already stopped"), "{again:?}");
    let east = ctl(
        &world,
        &["drill", "start", "--region", "east", "--mode", "fail"],
    )
    .await;
    assert_eq!(east.0, 0, "east may fail while west serves: {east:?}");
    let west = ctl(
        &world,
        &["drill", "start", "--region", "west", "--mode", "drain"],
    )
    .await;
    assert_eq!(west.0, 3, "{west:?}");
    assert!(
        west.2.contains("--force"),
        "the refusal says what to do: {west:?}"
    );
    let stop = ctl(&world, &["drill", "stop", "3"]).await;
    assert_eq!(stop.0, 0, "{stop:?}");
}

/// Runs `meridian ctl` against every coordinator with the admin token:
/// (exit code, stdout, stderr).
async fn ctl(world: &World, args: &[&str]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(common::meridian_bin());
    command.arg("ctl");
    for id in world.cluster.running() {
        command.args(["--coordinator", &world.cluster.node(id).url()]);
    }
    let out = command
        .args(args)
        .env_remove("MERIDIAN_COORDINATOR")
        .env("MERIDIAN_ADMIN_TOKEN", common::coordinator::TOKEN)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run meridian ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_region_lapses_to_its_fallback_and_the_drill_outlives_its_leader() {
    let (mut world, strict, avail) = loaded_world().await;
    let (status, body) = world
        .start_drill(
            json!({ "region": "east", "mode": "fail", "duration": "12s", "note": "leader kill" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let id = body["drill"].as_u64().expect("drill id");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let old = world.cluster.wait_leader(Duration::from_secs(20)).await;
    world.cluster.kill(old);
    eprintln!("killed leader {old} (SIGKILL) during drill {id}");
    let done = wait_finished(&world, id, Duration::from_secs(60)).await;
    eprintln!("{}", done["markdown"].as_str().unwrap_or_default());
    let report = &done["report"];
    let observers = report["observed_by"].as_array().expect("observers");
    assert!(
        observers.len() >= 2 && observers[0] == json!(old),
        "the killed leader observed first, another after it: {observers:?}"
    );
    assert_eq!(report["stopped"]["reason"], json!("duration_elapsed"));
    assert!(timeline_at(report, "lease lapsed").is_some(), "{report}");
    assert!(
        timeline_at(report, "other regions' allocation covers").is_some(),
        "{report}"
    );
    assert!(
        report["figures"]["recovered_after_ms"]["value"]
            .as_i64()
            .is_some(),
        "{report}"
    );

    let strict_records = strict.stop().await;
    let avail_records = avail.stop().await;
    let strict_windows = windows_ms(&strict_records);
    for (start, per_region) in &strict_windows {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "strict: window at {start} admitted {total} ({per_region:?})"
        );
    }
    east_fell_back(&avail_records, report);
    let avail_windows = windows_ms(&avail_records);
    let bound = report["figures"]["windows"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["rule"] == json!("api|avail")))
        .and_then(|w| w["bound"].as_u64())
        .expect("the report states the available rule's bound");
    assert!(bound > L && bound <= L + L, "bound {bound}");
    for (start, per_region) in &avail_windows {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= bound,
            "available: window at {start} admitted {total}"
        );
    }
    report_agrees(report, "api|strict", &strict_windows, &["east", "west"]);
}

/// Domain `api`, one global sliding-window-counter rule `sw` of `limit`
/// per 2 s, `partition: strict`, failing closed.
fn sliding_rule(limit: u64) -> String {
    format!(
        "domain: api
descriptors:
  - key: sw
    scope: global
    fail_mode: closed
    fallback: 0.5
    algorithm: sliding_window_counter
    period: 2s
    rate_limit:
      name: sw
      requests_per_unit: {limit}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sliding_counter_drill_reports_each_periods_world_figure_as_the_test_counted_it() {
    let period = Duration::from_secs(2);
    let world = World::start(&sliding_rule(L), &["east", "west"]).await;
    // 160 a period asked in each region against L = 200 world-wide.
    let load = Load::start(&world, "api", "sw", "acme", &[80, 80]);
    world
        .wait_allocated("api|sw", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (status, body) = world
        .start_drill(json!({ "region": "east", "mode": "drain", "duration": "8s" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let id = body["drill"].as_u64().expect("drill id");
    let done = wait_finished(&world, id, Duration::from_secs(60)).await;
    eprintln!("{}", done["markdown"].as_str().unwrap_or_default());
    let records = load.stop().await;
    let report = &done["report"];
    // Each admitted decision in the window its reset time places it in
    // (a sliding counter's count expires one period after its window).
    let period_ms = period.as_millis() as i64;
    let ours: BTreeMap<i64, Vec<u64>> = admitted_per_window(&records, period, true, 2)
        .into_iter()
        .map(|(w, v)| (w as i64 * period_ms, v))
        .collect();

    let windows = report["figures"]["windows"].as_array().expect("windows");
    let mut compared = 0;
    for w in windows.iter().filter(|w| w["rule"] == json!("api|sw")) {
        assert_eq!(w["measured"], json!("ledger"), "{w}");
        assert_eq!(w["period_ms"], json!(2_000), "{w}");
        assert_eq!(
            (w["limit"].as_u64(), w["bound"].as_u64()),
            (Some(L), Some(L)),
            "{w}"
        );
        assert!(
            w["bound_is"]
                .as_str()
                .is_some_and(|b| b.contains("sliding_window_counter")),
            "{w}"
        );
        let start = w["start_ms"].as_i64().expect("start");
        let total = w["total"].as_u64().expect("total");
        assert!(
            total <= L,
            "strict: the period at {start} admitted {total}: {w}"
        );
        if w["partial"] == json!(true) {
            continue;
        }
        let Some(counted) = ours.get(&start) else {
            continue;
        };
        for (i, region) in ["east", "west"].iter().enumerate() {
            let theirs = w["admitted"][region].as_u64().unwrap_or(0);
            assert!(
                theirs.abs_diff(counted[i]) <= TOLERANCE,
                "period at {start}: {region} reported {theirs}, the test counted {}",
                counted[i]
            );
        }
        compared += 1;
    }
    assert!(
        compared >= 3,
        "only {compared} periods of the sliding rule compared: {windows:?}"
    );
    let worst = &report["figures"]["worst_window"];
    assert!(
        worst["value"]["over_bound"]
            .as_i64()
            .is_some_and(|o| o <= 0),
        "{worst}"
    );
    assert!(
        worst["how"]
            .as_str()
            .is_some_and(|h| h.contains("clock-aligned rule period")),
        "{worst}"
    );
    // The test's own count holds the same bound in every period.
    for (start, per_region) in &ours {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "the test counted {total} in the period at {start}"
        );
    }
}
