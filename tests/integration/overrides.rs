//! Per-key overrides with real processes: 3 coordinators, 2 regions each
//! with its own redis-server and limiter. An override is set through the
//! admin API, committed through Raft, sent to every region's limiters on
//! their Watch stream and enforced per check of the key it names — the
//! rule's counter key of a descriptor (`customer=42`), so every check here
//! is a descriptor check, as Envoy's are.
//!
//! Covered: an override on a global rule raises one customer's world-wide
//! admitted to its limit while another customer stays at the rule's; it is
//! removed, and lapses, on time in both regions; commit → enforced in both
//! regions (printed, for the README); it survives a leader kill -9, a rules
//! rollback and a limiter restarted from its cache with no coordinator; bad
//! input is refused naming the field (a bulk import naming the row, and
//! changing nothing); 100,000 overrides import, propagate and are enforced
//! (time and memory printed).

use crate::common;

use std::time::{Duration, Instant};

use common::coordinator::{Cluster, Options, TOKEN, percentile_ms};
use common::global::{Load, World, admitted_per_window, limiter_gauge, now_us, summarize};
use common::limiter::LimiterProcess;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest, Decision, Entry};
use serde_json::{Value, json};
use tonic::transport::Channel;

/// The global rule's limit per window, and its window.
const L: u64 = 100;
const PERIOD: Duration = Duration::from_secs(4);
/// The global rule on `customer`.
const RULE: &str = "api|customer";
const REGIONS: [&str; 2] = ["mumbai", "hyderabad"];

/// Domain `api`: `customer` global (fixed window, [`L`] per 4 s, failing
/// closed), `tenant` regional (`tenant` per 4 s in each region).
fn rules(tenant: u64) -> String {
    format!(
        "domain: api
descriptors:
  - key: customer
    scope: global
    fail_mode: closed
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: customer
      requests_per_unit: {L}
  - key: tenant
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: tenant
      requests_per_unit: {tenant}
"
    )
}

/// Check-only (or charging) descriptor checks against every region's limiter
/// over connections kept open, so polling measures the limiter, not connects.
struct Probe {
    clients: Vec<Option<LimiterClient<Channel>>>,
}

impl Probe {
    async fn connect(world: &World) -> Probe {
        let mut clients = Vec::new();
        for region in &world.regions {
            clients.push(LimiterClient::connect(region.limiter.grpc_url()).await.ok());
        }
        Probe { clients }
    }

    /// `n` checks of one descriptor `key=value` in region `region`, each of
    /// `cost` (0: check only), in one batch.
    async fn decide(
        &mut self,
        region: usize,
        entry: (&str, &str),
        cost: u64,
        n: usize,
    ) -> Option<Vec<Decision>> {
        let client = self.clients.get_mut(region)?.as_mut()?;
        let check = Check {
            domain: "api".into(),
            descriptor: vec![Entry {
                key: entry.0.into(),
                value: entry.1.into(),
            }],
            cost,
            check_only: cost == 0,
            ..Default::default()
        };
        let response = client
            .check(CheckRequest {
                checks: vec![check; n],
            })
            .await
            .ok()?;
        Some(response.into_inner().decisions)
    }

    /// The limit region `region` holds `key=value` to now (check only;
    /// `None`: no answer).
    async fn limit(&mut self, region: usize, entry: (&str, &str)) -> Option<u64> {
        let d = self.decide(region, entry, 0, 1).await?;
        d.first().map(|d| d.limit)
    }

    /// [`Probe::limit`] in every region.
    async fn limits(&mut self, entry: (&str, &str)) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for region in 0..self.clients.len() {
            out.push(self.limit(region, entry).await);
        }
        out
    }

    /// Polls until every region's limit for `entry` satisfies `want`;
    /// returns the time it took, failing after `within`.
    async fn wait(
        &mut self,
        entry: (&str, &str),
        want: impl Fn(u64) -> bool,
        within: Duration,
    ) -> Duration {
        let started = Instant::now();
        loop {
            let limits = self.limits(entry).await;
            if limits.iter().all(|l| l.is_some_and(&want)) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "{}={} not as wanted in every region within {within:?}: {limits:?}",
                entry.0,
                entry.1
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// On a global rule of limit [`L`], a region without an override holds a
/// key to at most `L` (its share of it); with an override of `3 L` or more
/// and a share over a third of `L` (two regions of even demand), to more.
fn overridden(limit: u64) -> bool {
    limit > L
}

/// The rule's own limit (a region's share of it): not overridden, and not
/// `no_allocation` (0).
fn plain(limit: u64) -> bool {
    (1..=L).contains(&limit)
}

/// `PUT /api/v1/overrides` through node `node`: (status, answer).
async fn put_override(cluster: &Cluster, node: u64, body: Value) -> (u16, Value) {
    cluster
        .send(node, reqwest::Method::PUT, "/api/v1/overrides", Some(body))
        .await
}

/// `DELETE /api/v1/overrides?domain=api&descriptor=…` through node `node`.
async fn delete_override(cluster: &Cluster, node: u64, descriptor: &str) -> (u16, Value) {
    let path = format!(
        "/api/v1/overrides?domain=api&descriptor={}",
        descriptor.replace('=', "%3D")
    );
    cluster
        .send(node, reqwest::Method::DELETE, &path, None)
        .await
}

/// `GET /api/v1/overrides?…` from node `node`.
async fn list(cluster: &Cluster, node: u64, query: &str) -> Value {
    let path = format!("/api/v1/overrides?{query}");
    match cluster.get(node, &path).await {
        Some((200, body)) => body,
        other => panic!("GET {path}: {other:?}"),
    }
}

/// `POST /api/v1/overrides/import?format=csv` with `csv` as the raw body.
async fn import_csv(cluster: &Cluster, node: u64, csv: String) -> (u16, Value) {
    let url = format!(
        "{}/api/v1/overrides/import?format=csv",
        cluster.node(node).url()
    );
    let sent = cluster
        .http
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "text/csv")
        .body(csv)
        .send()
        .await;
    match sent {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, json!({ "error": e.to_string() })),
    }
}

/// Asserts a write was accepted; its answer.
fn accepted(what: &str, (status, body): (u16, Value)) -> Value {
    assert_eq!(status, 200, "{what}: {body}");
    body
}

/// VmRSS of process `pid`, in kB (0 when unreadable).
fn rss_kb(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The limiter's `meridian_overrides` gauge (0 when it does not answer).
async fn held(limiter: &LimiterProcess) -> u64 {
    limiter_gauge(limiter, "meridian_overrides")
        .await
        .map_or(0, |v| v as u64)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_override_on_a_global_rule_raises_one_customer_world_wide_and_is_removed_or_lapses_on_time()
 {
    let world = World::start(&rules(L), &REGIONS).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    let mut probe = Probe::connect(&world).await;
    let c42 = ("customer", "42");

    // Customer 42: 300 per window world-wide instead of 100.
    const RAISED: u64 = 3 * L;
    let body = accepted(
        "PUT customer=42",
        put_override(
            &world.cluster,
            leader,
            json!({"domain": "api", "descriptor": ["customer=42"], "limit": RAISED,
                   "reason": "enterprise trial"}),
        )
        .await,
    );
    assert_eq!(body["override"]["rule"], RULE, "{body}");
    assert_eq!(body["override"]["key"], "customer=42", "{body}");
    let took = probe.wait(c42, overridden, Duration::from_secs(5)).await;
    eprintln!(
        "customer=42 → {RAISED}: enforced in both regions {:.0} ms after the answer; limits {:?}",
        millis(took),
        probe.limits(c42).await
    );

    // Twice each customer's limit asked, split evenly between the regions.
    let per_second = |limit: u64| limit * 2 / PERIOD.as_secs() / 2;
    let load42 = Load::start_descriptor(&world, "api", &[c42], &[per_second(RAISED); 2]);
    let load43 = Load::start_descriptor(&world, "api", &[("customer", "43")], &[per_second(L); 2]);
    // A partial window, two to settle, three measured, a partial one.
    tokio::time::sleep(PERIOD * 6).await;
    let (records42, records43) = (load42.stop().await, load43.stop().await);
    let windows42 = admitted_per_window(&records42, PERIOD, false, 2);
    let windows43 = admitted_per_window(&records43, PERIOD, false, 2);
    summarize("customer=42", &records42, &windows42, RAISED, PERIOD);
    summarize("customer=43", &records43, &windows43, L, PERIOD);
    eprintln!("customer=42 per window and region: {windows42:?}");
    eprintln!("customer=43 per window and region: {windows43:?}");
    for (w, per_region) in &windows42 {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= RAISED,
            "customer 42: window {w} admitted {total} > its override {RAISED} ({per_region:?})"
        );
    }
    for (w, per_region) in &windows43 {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "customer 43: window {w} admitted {total} > the rule's {L} ({per_region:?})"
        );
    }
    // Full windows past the settling ones: the first (partial) and the next
    // one or two, and the last (partial), are left out.
    let full: Vec<(u64, u64)> = windows42
        .iter()
        .skip(2)
        .take(windows42.len().saturating_sub(3))
        .map(|(w, r)| (*w, r.iter().sum()))
        .collect();
    assert!(full.len() >= 2, "too few full windows: {windows42:?}");
    for (w, total) in &full {
        assert!(
            *total * 100 >= RAISED * 95,
            "customer 42: full window {w} admitted {total} < 95 % of {RAISED} under 2× demand"
        );
    }

    // Removed: the rule's limit again in both regions within 1 s.
    let before = probe.limits(c42).await;
    assert!(
        before.iter().all(|l| l.is_some_and(overridden)),
        "customer=42 should still be overridden before the DELETE: {before:?}"
    );
    let body = accepted(
        "DELETE customer=42",
        delete_override(&world.cluster, leader, "customer=42").await,
    );
    assert_eq!(body["removed"], 1, "{body}");
    let took = probe.wait(c42, plain, Duration::from_secs(5)).await;
    eprintln!(
        "customer=42 removed: the rule's limit in both regions {:.0} ms after the answer; limits {:?}",
        millis(took),
        probe.limits(c42).await
    );
    assert!(
        took < Duration::from_secs(1),
        "removal took {took:?} to reach both regions"
    );
    for region in &world.regions {
        assert_eq!(
            held(&region.limiter).await,
            0,
            "{} holds overrides",
            region.name
        );
    }

    // A short ttl lapses on time in both regions, by the limiters' own clock.
    let c44 = ("customer", "44");
    let body = accepted(
        "PUT customer=44 ttl 3s",
        put_override(
            &world.cluster,
            leader,
            json!({"domain": "api", "descriptor": ["customer=44"], "limit": 10 * L,
                   "ttl": "3s", "reason": "incident"}),
        )
        .await,
    );
    let expires_ms = body["override"]["expires_at_unix_ms"]
        .as_u64()
        .expect("an expiry");
    probe.wait(c44, overridden, Duration::from_secs(2)).await;
    let mut samples = Vec::new();
    while now_us() / 1000 < expires_ms + 1_000 {
        let before = now_us() / 1000;
        let limits = probe.limits(c44).await;
        let after = now_us() / 1000;
        samples.push((before, after, limits));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let margin = 50;
    let (mut live, mut lapsed, mut first_plain) = (0, 0, None);
    for (before, after, limits) in &samples {
        if *after + margin < expires_ms {
            live += 1;
            assert!(
                limits.iter().all(|l| l.is_some_and(overridden)),
                "customer=44 lapsed {} ms early: {limits:?}",
                expires_ms - after
            );
        } else if *before > expires_ms + margin {
            lapsed += 1;
            assert!(
                limits.iter().all(|l| l.is_some_and(plain)),
                "customer=44 still overridden {} ms after its expiry: {limits:?}",
                before - expires_ms
            );
        }
        if first_plain.is_none() && limits.iter().all(|l| l.is_some_and(plain)) {
            first_plain = Some(*after as i64 - expires_ms as i64);
        }
    }
    eprintln!(
        "customer=44 (ttl 3s): {live} samples overridden before its expiry, {lapsed} plain after; \
         first seen plain in both regions at expiry {:+} ms",
        first_plain.unwrap_or(i64::MAX)
    );
    assert!(live > 0 && lapsed > 0, "{samples:?}");
    let shown = list(
        &world.cluster,
        leader,
        "domain=api&descriptor=customer%3D44",
    )
    .await;
    assert_eq!(
        shown["count"], 0,
        "an expired override is not listed: {shown}"
    );
    let shown = list(
        &world.cluster,
        leader,
        "domain=api&descriptor=customer%3D44&expired=true",
    )
    .await;
    assert_eq!(shown["overrides"][0]["expired"], true, "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn override_commit_to_enforced_in_both_regions_is_measured() {
    const SETS: usize = 10;
    let world = World::start(&rules(L), &REGIONS).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    let mut probe = Probe::connect(&world).await;
    // From the PUT's answer (the commit applied on the leader) and from its
    // sending, to both limiters answering with the override's limit.
    let (mut from_answer, mut from_sent) = (Vec::new(), Vec::new());
    for i in 0..SETS {
        let value = format!("p{i}");
        let entry = ("customer", value.as_str());
        probe.wait(entry, plain, Duration::from_secs(5)).await;
        let sent = Instant::now();
        accepted(
            "PUT",
            put_override(
                &world.cluster,
                leader,
                json!({"domain": "api", "descriptor": [format!("customer={value}")],
                       "limit": 10 * L}),
            )
            .await,
        );
        let answered = Instant::now();
        probe.wait(entry, overridden, Duration::from_secs(5)).await;
        let enforced = Instant::now();
        from_answer.push(enforced - answered);
        from_sent.push(enforced - sent);
        // Not in step with the coordinators' rebalance.
        tokio::time::sleep(Duration::from_millis(150 + 37 * i as u64)).await;
    }
    let (p50, p99) = (
        percentile_ms(&from_answer, 50.0),
        percentile_ms(&from_answer, 99.0),
    );
    eprintln!(
        "override commit → enforced in both regions over {SETS} sets: p50 {p50:.0} ms, p99 {p99:.0} ms \
         after the PUT's answer; p50 {:.0} ms, p99 {:.0} ms after it was sent",
        percentile_ms(&from_sent, 50.0),
        percentile_ms(&from_sent, 99.0)
    );
    assert!(p99 < 1_000.0, "an override took {p99:.0} ms to be enforced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_override_survives_a_leader_kill_a_rules_rollback_and_a_limiter_restart_from_cache() {
    const TENANT: u64 = 250;
    let mut world = World::start(&rules(L), &REGIONS).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    let mut probe = Probe::connect(&world).await;
    let (c42, t7, t8) = (("customer", "42"), ("tenant", "7"), ("tenant", "8"));
    accepted(
        "PUT customer=42",
        put_override(
            &world.cluster,
            leader,
            json!({"domain": "api", "descriptor": ["customer=42"], "limit": 3 * L}),
        )
        .await,
    );
    let body = accepted(
        "PUT tenant=7",
        put_override(
            &world.cluster,
            leader,
            json!({"domain": "api", "descriptor": ["tenant=7"], "limit": TENANT}),
        )
        .await,
    );
    let version = body["version"].as_u64().expect("a version");
    probe.wait(c42, overridden, Duration::from_secs(5)).await;
    probe
        .wait(t7, |l| l == TENANT, Duration::from_secs(5))
        .await;

    // The leader is killed -9: the new one lists both and they stay enforced.
    world.cluster.kill(leader);
    let new_leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    let shown = list(&world.cluster, new_leader, "domain=api").await;
    assert_eq!(shown["count"], 2, "after the leader kill: {shown}");
    assert_eq!(shown["version"].as_u64(), Some(version), "{shown}");
    // A change through the new leader builds on the set it holds.
    let body = accepted(
        "PUT customer=45 on the new leader",
        put_override(
            &world.cluster,
            new_leader,
            json!({"domain": "api", "descriptor": ["customer=45"], "limit": 3 * L}),
        )
        .await,
    );
    assert_eq!(body["version"].as_u64(), Some(version + 1), "{body}");
    assert_eq!(list(&world.cluster, new_leader, "").await["count"], 3);
    probe
        .wait(("customer", "45"), overridden, Duration::from_secs(5))
        .await;
    probe.wait(c42, overridden, Duration::from_secs(5)).await;
    probe
        .wait(t7, |l| l == TENANT, Duration::from_secs(5))
        .await;
    eprintln!(
        "after the leader kill: node {new_leader} leads, the overrides are listed and enforced"
    );

    // Rules v2 (tenant 120), then rolled back: the rule's limit is back, the
    // overrides were not touched.
    let (status, body) = world.cluster.put_text(new_leader, &rules(120)).await;
    assert!(
        (200..300).contains(&status),
        "PUT rules v2: {status} {body}"
    );
    probe.wait(t8, |l| l == 120, Duration::from_secs(5)).await;
    let (status, body) = world
        .cluster
        .send(
            new_leader,
            reqwest::Method::POST,
            "/api/v1/rules/rollback",
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200, "rollback: {body}");
    probe.wait(t8, |l| l == L, Duration::from_secs(5)).await;
    let shown = list(&world.cluster, new_leader, "").await;
    assert_eq!(shown["count"], 3, "after the rollback: {shown}");
    probe.wait(c42, overridden, Duration::from_secs(5)).await;
    probe
        .wait(t7, |l| l == TENANT, Duration::from_secs(5))
        .await;
    eprintln!("after the rollback: rules back at tenant {L}, the overrides listed and enforced");

    // Mumbai's limiter restarts while no coordinator answers: from its caches.
    let mumbai = &mut world.regions[0];
    for p in &mumbai.proxies {
        p.cut();
    }
    mumbai.limiter.kill();
    mumbai.start_again();
    let limiter = &world.regions[0].limiter;
    let mut probe = Probe::connect(&world).await;
    assert_eq!(
        probe.limit(0, t7).await,
        Some(TENANT),
        "tenant=7 after the restart"
    );
    assert_eq!(
        probe.limit(0, t8).await,
        Some(L),
        "tenant=8 after the restart"
    );
    assert_eq!(held(limiter).await, 3, "overrides held after the restart");
    eprintln!(
        "restarted without a coordinator: tenant=7 {:?}, customer=42 {:?}",
        probe.limit(0, t7).await,
        probe.limit(0, c42).await
    );
    // And enforced, not only shown: a window's worth and more, at once.
    common::clear_of_window_boundary(PERIOD, Duration::from_millis(1_500)).await;
    let decisions = probe
        .decide(0, t7, 1, TENANT as usize + 50)
        .await
        .expect("the restarted limiter answers");
    let admitted = decisions.iter().filter(|d| d.allowed).count() as u64;
    assert_eq!(
        admitted, TENANT,
        "tenant=7 admitted in one window after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_overrides_are_refused_naming_the_field_and_a_bad_import_row_changes_nothing() {
    let cluster = Cluster::start(3, Options::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let (status, body) = cluster.put_text(leader, &rules(L)).await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");
    accepted(
        "a good override",
        put_override(
            &cluster,
            leader,
            json!({"domain": "api", "descriptor": ["customer=42"], "limit": 3 * L}),
        )
        .await,
    );
    let held_before = list(&cluster, leader, "").await;
    assert_eq!(held_before["count"], 1, "{held_before}");

    let good = json!({"domain": "api", "descriptor": ["customer=43"], "limit": 3 * L});
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    let now_ms = now_us() / 1000;
    let cases = [
        ("unknown domain", with("domain", json!("nope")), "domain"),
        (
            "a descriptor matching no rule",
            with("descriptor", json!(["plan=gold"])),
            "descriptor",
        ),
        (
            "a rule named that the descriptor does not resolve to",
            with("rule", json!("api|tenant")),
            "rule",
        ),
        ("limit 0", with("limit", json!(0)), "limit"),
        // 1 per 4 s is 15 a minute, under the test cluster's floor of 60.
        ("a limit under the floor", with("limit", json!(1)), "limit"),
        ("burst on a fixed window", with("burst", json!(10)), "burst"),
        (
            "an expiry in the past",
            with("expires_at_unix_ms", json!(now_ms - 1_000)),
            "expires_at_unix_ms",
        ),
        ("a ttl of nothing", with("ttl", json!("0s")), "ttl"),
        (
            "a ttl that is no duration",
            with("ttl", json!("-3s")),
            "ttl",
        ),
        (
            "a reason too long",
            with("reason", json!("x".repeat(300))),
            "reason",
        ),
    ];
    let mut wrong = Vec::new();
    for (what, body, field) in cases {
        let (status, answer) = put_override(&cluster, leader, body).await;
        eprintln!("{what}: {status} {answer}");
        if status != 422 || answer["field"] != field {
            wrong.push(format!(
                "{what}: want 422 naming {field:?}, got {status} {answer}"
            ));
        }
    }
    assert_eq!(
        list(&cluster, leader, "").await,
        held_before,
        "refused overrides changed the set"
    );

    // A bulk import with one bad row (the third) changes nothing and names it.
    let csv = "domain,descriptor,limit,reason\n\
               api,customer=100,300,ok\n\
               api,customer=101,300,ok\n\
               api,customer=102,0,bad\n\
               api,customer=103,300,ok\n\
               api,customer=104,300,ok\n"
        .to_string();
    let (status, answer) = import_csv(&cluster, leader, csv).await;
    eprintln!("import with a bad third row: {status} {answer}");
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["row"], 3, "{answer}");
    assert_eq!(answer["field"], "limit", "{answer}");
    assert_eq!(
        list(&cluster, leader, "").await,
        held_before,
        "a refused import changed the set"
    );

    // One row past the bound is refused whole, naming the bound.
    let (status, answer) = import_csv(&cluster, leader, bulk_csv(0..BOUND + 1)).await;
    let shown = answer["error"].as_str().unwrap_or_default();
    eprintln!("import of {} rows: {status} {shown}", BOUND + 1);
    assert_eq!(status, 422, "{answer}");
    assert!(
        shown.contains(&BOUND.to_string()),
        "the bound is named: {answer}"
    );
    assert_eq!(
        list(&cluster, leader, "").await,
        held_before,
        "an import past the bound changed the set"
    );
    assert!(
        wrong.is_empty(),
        "refused without naming the field:\n{}",
        wrong.join("\n")
    );
}

/// Most overrides a cluster holds (`meridian::overrides::MAX_OVERRIDES`).
const BOUND: usize = 100_000;

/// CSV of overrides `customer=c<i>` for every `i` in `rows`, each above
/// `3 L` so that it shows as [`overridden`].
fn bulk_csv(rows: std::ops::Range<usize>) -> String {
    let mut csv = String::with_capacity(rows.len() * 40);
    csv.push_str("domain,descriptor,limit,reason\n");
    for i in rows {
        csv.push_str(&format!(
            "api,customer=c{i},{},billing sync\n",
            10 * L + i as u64 % 100
        ));
    }
    csv
}

/// What a bulk load is measured against: the leader coordinator's and a
/// limiter's RSS before it.
struct Before {
    leader: u64,
    coordinator_pid: u32,
    limiter_pid: u32,
    coordinator_kb: u64,
    limiter_kb: u64,
}

impl Before {
    async fn take(world: &World) -> Before {
        let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
        let coordinator_pid = world.cluster.node(leader).pid().expect("the leader runs");
        let limiter_pid = world.regions[0].limiter.pid();
        Before {
            leader,
            coordinator_pid,
            limiter_pid,
            coordinator_kb: rss_kb(coordinator_pid),
            limiter_kb: rss_kb(limiter_pid),
        }
    }
}

/// After [`BOUND`] overrides were imported (the last answer at
/// `answered`): waits until both limiters hold them all, checks that one is
/// enforced and a key without one is not, prints the propagation time and
/// the RSS growth, and asserts generous bounds.
async fn held_propagated_and_enforced(world: &World, before: &Before, answered: Instant) {
    let mut done = vec![None; world.regions.len()];
    while done.iter().any(Option::is_none) {
        for (i, region) in world.regions.iter().enumerate() {
            if done[i].is_none() && held(&region.limiter).await == BOUND as u64 {
                done[i] = Some(answered.elapsed());
            }
        }
        assert!(
            answered.elapsed() < Duration::from_secs(60),
            "not every limiter holds {BOUND} overrides 60 s after the import: {done:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let propagated = done.iter().flatten().max().copied().unwrap_or_default();
    eprintln!(
        "held by both limiters {:.1} s after the import's answer ({done:?})",
        propagated.as_secs_f64()
    );
    let mut probe = Probe::connect(world).await;
    let took = probe
        .wait(("customer", "c77777"), overridden, Duration::from_secs(5))
        .await;
    eprintln!("customer=c77777 enforced in both regions ({took:?} after they held the set)");
    let others = probe.limits(("customer", "other")).await;
    assert!(
        others.iter().all(|l| l.is_some_and(plain)),
        "a key without an override keeps the rule's limit: {others:?}"
    );
    let shown = list(
        &world.cluster,
        before.leader,
        "domain=api&descriptor=customer%3Dc77777",
    )
    .await;
    assert_eq!(shown["count"], 1, "{shown}");

    let coordinator_kb = rss_kb(before.coordinator_pid);
    let limiter_kb = rss_kb(before.limiter_pid);
    let per = |before: u64, after: u64| after.saturating_sub(before) as f64 * 1024.0 / BOUND as f64;
    eprintln!(
        "RSS growth for {BOUND} overrides: leader coordinator {} → {} MB ({:.0} bytes each), \
         limiter {} → {} MB ({:.0} bytes each)",
        before.coordinator_kb / 1024,
        coordinator_kb / 1024,
        per(before.coordinator_kb, coordinator_kb),
        before.limiter_kb / 1024,
        limiter_kb / 1024,
        per(before.limiter_kb, limiter_kb)
    );
    assert!(propagated < Duration::from_secs(30));
    // Generous: a debug build, allocator slack, import bodies parsed whole.
    assert!(
        coordinator_kb.saturating_sub(before.coordinator_kb) < 1024 * 1024,
        "the coordinator grew by more than 1 GB"
    );
    assert!(
        limiter_kb.saturating_sub(before.limiter_kb) < 512 * 1024,
        "the limiter grew by more than 512 MB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_thousand_overrides_import_in_one_commit_propagate_and_are_enforced() {
    // The import keeps two cores busy for 15-30 s: beside it, a world
    // timing leases or propagation missed its bounds on a loaded CI machine.
    let world = World::start_alone(&rules(L), &REGIONS).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let before = Before::take(&world).await;
    let csv = bulk_csv(0..BOUND);
    let bytes = csv.len();
    let started = Instant::now();
    let (status, body) = import_csv(&world.cluster, before.leader, csv).await;
    let imported = started.elapsed();
    assert_eq!(
        status,
        200,
        "an import of {BOUND} rows ({:.1} MB of CSV) in one commit, answered after {:.1} s: {body}",
        bytes as f64 / 1e6,
        imported.as_secs_f64()
    );
    assert_eq!(body["imported"].as_u64(), Some(BOUND as u64), "{body}");
    eprintln!(
        "import of {BOUND} overrides ({:.1} MB of CSV, one commit, version {}): {:.1} s",
        bytes as f64 / 1e6,
        body["version"],
        imported.as_secs_f64()
    );
    assert!(
        imported < Duration::from_secs(30),
        "import took {imported:?}"
    );
    held_propagated_and_enforced(&world, &before, Instant::now()).await;
}
