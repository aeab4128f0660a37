//! The dashboard in a real headless Chromium (Debian's `chromium`, driven
//! through `chromedriver` with fantoccini), against a live local cluster: 3
//! coordinators, 2 regions each with its own Redis and limiter, traffic on
//! a global rule.
//!
//! - both regions' allocations are drawn, and after a traffic shift the
//!   drawn split follows within two rebalance intervals;
//! - the drawn split is the API's within 1 s of a new epoch;
//! - the rollback button needs the token; with it, it creates a version the
//!   limiters enforce;
//! - a reload keeps the history; a follower's page shows the leader's epoch;
//! - a page whose node restarted reconnects by itself;
//! - every chart has a table; every control is reachable by keyboard;
//! - the world ledger draws each period's world-wide admitted with L and
//!   the stated bound as lines, on the leader's page and a follower's;
//! - the Usage section's top-keys table lists the test's key against L,
//!   and its button and the search form show the key's use per region and
//!   world-wide;
//! - a drain drill is drawn as a band on the allocation chart and listed
//!   in the Drills table; its report page (`#drill=N`) shows its mode,
//!   region, note (as text) and timeline; once stopped the table says so.
//!
//! Screenshots go to `target/tmp/dashboard-*.png`.

use crate::common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::coordinator::TOKEN;
use common::global::{Load, REBALANCE, World};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const L: u64 = 200;
const RULE: &str = "api|fw";

fn rules(limit: u64) -> String {
    common::global::fixed_window_rule(limit)
}

const INSTALL_HINT: &str = "The dashboard test drives Debian's Chromium through chromedriver. \
     Install both (Debian/Ubuntu: `sudo apt-get install -y chromium chromium-driver`), or run \
     the README's test command, which installs them.";

fn require(binary: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(binary))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| panic!("{binary} not found on PATH. {INSTALL_HINT}"))
}

/// A chromedriver process on a free port, killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let binary = require("chromedriver");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn browser(&self) -> Client {
        let chromium = require("chromium");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,2200"],
            }),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&self.url)
                .await
            {
                Ok(client) => return client,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("waiting for chromedriver: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("chromedriver at {} never took a session: {e}", self.url),
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `script` in the page until it returns something other than null
/// (or false), or panics with `what` after `within`.
async fn wait_js(page: &Client, script: &str, within: Duration, what: &str) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let v = page.execute(script, vec![]).await.unwrap_or(Value::Null);
        if !v.is_null() && v != Value::Bool(false) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}; last {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `nums(tr, from, to)`: the numbers in cells `from..to` of a table row
/// (thousands separators dropped), or null when one is not a number.
const NUMS: &str = "const nums = (tr, from, to) => { const v = [...tr.cells].slice(from, to).map(c => c.textContent.replace(/,/g, '').trim());
    return v.length === to - from && v.every(x => x !== '' && Number.isFinite(Number(x))) ? v.map(Number) : null; };";

/// The "per region" chart draws a bar of each series (demand, allocation,
/// admitted, rejected) for each region, with admitted hits counted; the
/// "world-wide admitted" chart draws its admitted line and, with one key
/// tracked, L; and both tables have rows of numbers. Waits for the history
/// to be a rule period old (admitted per period needs a sample that old).
/// Then the same for key acme's own series, against its L.
async fn assert_charts_drawn(page: &Client) {
    let kinds = ["demand", "allocation", "admitted", "rejected"];
    let drawn = wait_js(
        page,
        &format!(
            "{NUMS}
             const bars = [...document.querySelectorAll('#chart-regions svg rect.bar')];
             const rows = [...document.querySelectorAll('#table-regions tbody tr')];
             const path = document.querySelector('#chart-world svg path.admitted');
             const world = [...document.querySelectorAll('#table-world tbody tr')];
             const l = document.querySelector('#chart-world svg line.ref');
             const counted = (tr) => nums(tr, 2, 4);
             if (!path || !l || !bars.some(b => b.dataset.kind === 'admitted') || !world.length || !counted(world[0])) return null;
             // The line needs two samples (M…L…): the first may come alone.
             if (!/L/.test(path.getAttribute('d') || '')) return null;
             return {{ bars: bars.map(b => [b.dataset.region, b.dataset.kind, Number(b.dataset.value), Number(b.getAttribute('height'))]),
                      rows: rows.map(r => [r.cells[0].textContent, nums(r, 1, 5)]),
                      path: path.getAttribute('d'), max: Number(path.dataset.max), limit: Number(l.dataset.value),
                      world: world.map(counted).filter(Boolean).length, newest: counted(world[0]) }};"
        ),
        Duration::from_secs(20),
        "admitted per period drawn on the per-region and world-wide charts",
    )
    .await;
    let bars = drawn["bars"].as_array().cloned().unwrap_or_default();
    for region in ["mumbai", "hyderabad"] {
        for kind in kinds {
            assert!(
                bars.iter()
                    .any(|b| b[0] == region && b[1] == kind && b[2].as_f64().is_some()),
                "no {kind} bar for {region}: {drawn}"
            );
        }
    }
    let total = |kind: &str| -> f64 {
        bars.iter()
            .filter(|b| b[1] == kind)
            .filter_map(|b| b[2].as_f64())
            .sum()
    };
    for kind in ["demand", "allocation", "admitted"] {
        assert!(total(kind) > 0.0, "no {kind} drawn: {drawn}");
    }
    assert!(
        bars.iter()
            .any(|b| b[1] == "admitted" && b[3].as_f64() > Some(0.0)),
        "admitted bars of no height: {drawn}"
    );
    let rows = drawn["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 2, "a row per region: {drawn}");
    for r in &rows {
        assert_eq!(
            r[1].as_array().map(Vec::len),
            Some(kinds.len()),
            "a number per series in {r}: {drawn}"
        );
    }
    // A line of at least two points (M…L…), at the admitted counts.
    let path = drawn["path"].as_str().unwrap_or_default();
    assert!(
        path.contains('M') && path.contains('L'),
        "world-wide line: {drawn}"
    );
    assert!(
        drawn["max"].as_f64() > Some(0.0),
        "nothing admitted: {drawn}"
    );
    // One key (acme) is tracked: the split's admitted are its, against L.
    assert_eq!(drawn["limit"], L, "L drawn on the split's chart: {drawn}");
    assert!(
        drawn["newest"][0].as_f64() > Some(0.0) && drawn["newest"][1] == L,
        "the world-wide table's newest row: admitted, then L: {drawn}"
    );
    eprintln!(
        "per-region and world-wide charts: {} bars, {} counted rows",
        bars.len(),
        drawn["world"]
    );
    screenshot("charts", &page.screenshot().await.expect("screenshot"));

    // One key: its world-wide admitted against its L (drawn as a line).
    page.execute("location.hash = '#key=acme';", vec![])
        .await
        .expect("open key acme");
    let keyed = wait_js(
        page,
        &format!(
            "{NUMS}
             const c = document.getElementById('world-caption').textContent;
             const l = document.querySelector('#chart-world svg line.ref');
             const path = document.querySelector('#chart-world svg path.admitted');
             const world = document.querySelector('#table-world tbody tr');
             if (!c.includes('acme') || !l || !path || !world || !nums(world, 2, 4)) return null;
             return [Number(l.dataset.value), Number(path.dataset.max), document.querySelectorAll('#chart-regions svg rect.bar').length, c];"
        ),
        Duration::from_secs(10),
        "key acme's world-wide admitted against L",
    )
    .await;
    assert_eq!(keyed[0], L, "L drawn for the key: {keyed}");
    assert!(
        keyed[1].as_f64() > Some(0.0),
        "the key's admitted line: {keyed}"
    );
    assert!(
        keyed[2].as_u64() >= Some(8),
        "the key's per-region bars: {keyed}"
    );
    // Back to the rule's split, which the rest of the test reads.
    page.execute("location.hash = '#key=';", vec![])
        .await
        .expect("back to the split");
    wait_js(
        page,
        "return (!document.getElementById('world-caption').textContent.includes('for key') && document.querySelectorAll('#chart-alloc polygon.area').length === 2) ? true : null;",
        Duration::from_secs(10),
        "the rule's split again",
    )
    .await;
}

/// The world ledger's chart of the rule: a bar per period with admitted
/// hits, L drawn as a line at L and the stated bound (L for an exact fixed
/// window) beside it, a table of the periods, and the note naming the
/// leader that counted them (a follower's page shows the leader's).
async fn assert_ledger_drawn(page: &Client, whose: &str) {
    let drawn = wait_js(
        page,
        &format!(
            "const fig = [...document.querySelectorAll('#ledger-charts figure')].find(f => f.dataset.rule === '{RULE}');
             if (!fig) return null;
             const l = fig.querySelector('svg line.limit');
             const b = fig.querySelector('svg line.bound');
             const bars = [...fig.querySelectorAll('svg rect.ledger-bar:not(.open)')].map(r => Number(r.dataset.value));
             const rows = fig.querySelectorAll('tbody tr').length;
             if (!l || !b || !bars.some(v => v > 0) || !rows) return null;
             // A period keeps the terms it began under: after a rule change
             // (the test's L 300 and its rollback) wait for one under L.
             if (b.dataset.value !== l.dataset.value) return null;
             return {{ limit: Number(l.dataset.value), bound: Number(b.dataset.value), bars, rows,
                      caption: fig.querySelector('figcaption').textContent,
                      note: document.getElementById('ledger-note').textContent }};"
        ),
        Duration::from_secs(30),
        "the ledger's chart with finished periods, L and the bound",
    )
    .await;
    assert_eq!(drawn["limit"], L, "L drawn: {drawn}");
    assert_eq!(
        drawn["bound"], L,
        "the bound of an exact fixed window is L: {drawn}"
    );
    assert!(
        drawn["caption"]
            .as_str()
            .is_some_and(|c| c.contains("L = 200")),
        "{drawn}"
    );
    assert!(
        drawn["note"]
            .as_str()
            .is_some_and(|n| n.contains("the leader")),
        "{drawn}"
    );
    eprintln!("ledger on {whose}'s page: {drawn}");
}

/// The Usage section: the rule's top-keys table lists the test's key
/// (acme, checked by rule name and key) with its use of L; its button
/// shows the key's use per region and world-wide; a search by domain,
/// rule name and key shows the same rows.
/// Opens `n` reservations of 1 on acme in mumbai (retrying while its
/// windows are full) and waits until the leader's usage shows them.
async fn open_reservations(world: &World, n: u64) {
    let client = reqwest::Client::new();
    let url = world.regions[0].limiter.http_url("/v1/reserve");
    let body = serde_json::json!({"domain": "api", "rule": "fw", "key": "acme", "estimate": 1, "ttl_ms": 600_000});
    let (mut opened, started) = (0, Instant::now());
    while opened < n {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "only {opened} of {n} reservations admitted in 30 s"
        );
        let response = client.post(&url).json(&body).send().await.expect("reserve");
        if response.status().as_u16() == 200 {
            opened += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    let started = Instant::now();
    loop {
        let usage = world
            .cluster
            .get(leader, "/api/v1/usage?domain=api&rule=fw&key=acme")
            .await;
        let reserved = usage
            .as_ref()
            .and_then(|(_, b)| b["limits"][0]["world"]["reserved"].as_u64());
        if reserved == Some(n) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the leader never showed {n} reserved: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Usage section: acme among the top keys, then its figures per region
/// and world-wide — with `reserved` open in mumbai, shown as reserved and
/// the rest of its use as settled.
async fn assert_usage_shown(page: &Client, reserved: u64) {
    let top = wait_js(
        page,
        &format!(
            "{NUMS}
             const t = document.querySelector('#usage-top table[data-rule=\"{RULE}\"]');
             const r = t && t.querySelector('tbody tr[data-key=\"acme\"]');
             if (!r || !nums(r, 1, 3)) return null;
             return [r.cells[0].textContent, nums(r, 1, 3), r.cells[3].textContent, t.querySelector('caption').textContent];"
        ),
        Duration::from_secs(15),
        "acme in the rule's top-keys table",
    )
    .await;
    assert_eq!(top[0], "acme", "{top}");
    assert!(top[1][0].as_f64() > Some(0.0), "acme's use: {top}");
    assert_eq!(top[1][1], L, "acme's limit is L: {top}");
    assert!(top[2].as_str().is_some_and(|u| u.contains('%')), "{top}");
    // Per region and world-wide: numbers for each region's use, its
    // allocation, L and how old the figure is.
    let rows = "const t = document.getElementById('usage-table');
         if (t.dataset.key !== 'acme' || !t.tBodies[0]) return null;
         const rows = {}; for (const tr of t.tBodies[0].rows) rows[tr.dataset.region] = [...tr.cells].map(c => c.textContent);
         // A period's first reports may not carry the key yet: wait for its figures.
         const counted = (r) => r && Number.isFinite(Number(r[2].replace(/,/g, '')));
         if (!counted(rows.mumbai) || !counted(rows.hyderabad) || !counted(rows.world)) return null;
         return { rows, caption: t.querySelector('caption').textContent };";
    let check = |shown: &Value| {
        let number = |v: &Value| {
            v.as_str()
                .and_then(|s| s.replace(',', "").parse::<f64>().ok())
        };
        for region in ["mumbai", "hyderabad", "world"] {
            let r = &shown["rows"][region];
            assert_eq!(r[0], RULE, "{region}: {shown}");
            assert!(
                number(&r[2]).is_some_and(|n| n > 0.0),
                "{region}'s use: {shown}"
            );
            assert!(
                number(&r[5]).is_some_and(|n| n > 0.0),
                "{region}'s allocation: {shown}"
            );
            assert_eq!(number(&r[6]), Some(L as f64), "L for {region}: {shown}");
            // Reserved (open) and settled: the open estimates, and the rest
            // of the use.
            let open = if region == "hyderabad" { 0 } else { reserved };
            assert_eq!(
                number(&r[3]),
                Some(open as f64),
                "{region} reserved: {shown}"
            );
            let (used, settled) = (number(&r[2]), number(&r[4]));
            assert_eq!(
                settled,
                used.map(|u| (u - open as f64).max(0.0)),
                "{region}: settled = used − reserved: {shown}"
            );
        }
        for region in ["mumbai", "hyderabad"] {
            let age = shown["rows"][region][9].as_str().unwrap_or_default();
            assert!(age.ends_with(" s"), "{region}'s age: {shown}");
        }
        assert!(
            shown["rows"]["world"][8]
                .as_str()
                .is_some_and(|u| u.contains('%')),
            "{shown}"
        );
        assert!(
            shown["caption"]
                .as_str()
                .is_some_and(|c| c.contains("acme") && c.contains(RULE)),
            "{shown}"
        );
    };
    page.execute(
        "document.querySelector('#usage-top tr[data-key=\"acme\"] button').click();",
        vec![],
    )
    .await
    .expect("click acme in the top keys");
    let shown = wait_js(
        page,
        rows,
        Duration::from_secs(10),
        "acme's use per region, from the top keys",
    )
    .await;
    check(&shown);
    // The search form: domain, the rule's name and the key.
    page.execute(
        "const t = document.getElementById('usage-table'); t.replaceChildren(); delete t.dataset.key;
         for (const id of ['usage-domain', 'usage-descriptor', 'usage-rule', 'usage-key']) document.getElementById(id).value = '';",
        vec![],
    )
    .await
    .expect("clear the search");
    for (id, text) in [
        ("usage-domain", "api"),
        ("usage-rule", "fw"),
        ("usage-key", "acme"),
    ] {
        page.find(Locator::Id(id))
            .await
            .expect(id)
            .send_keys(text)
            .await
            .expect("type");
    }
    page.find(Locator::Id("usage-search"))
        .await
        .expect("the search button")
        .click()
        .await
        .expect("click");
    let shown = wait_js(
        page,
        rows,
        Duration::from_secs(10),
        "acme's use per region, from the search",
    )
    .await;
    check(&shown);
    eprintln!("usage on the page: {shown}");
    screenshot("usage", &page.screenshot().await.expect("screenshot"));
}

/// The regions table's Live pods cell shows each region's one limiter,
/// and the note says where the figure comes from.
async fn assert_live_pods(page: &Client, whose: &str) {
    let pods = wait_js(
        page,
        "const m = {}; for (const r of ['mumbai', 'hyderabad']) {
           const c = document.querySelector('#regions-table tbody tr[data-region=' + r + '] td.pods');
           if (!c || c.textContent !== '1') return null; m[r] = c.textContent; }
         m.header = document.getElementById('pods-h').textContent;
         m.note = document.getElementById('pods-note').textContent; return m;",
        Duration::from_secs(10),
        "one live pod per region",
    )
    .await;
    assert!(
        pods["header"]
            .as_str()
            .is_some_and(|h| h.contains("last 30 s")),
        "the header says what live means: {pods}"
    );
    assert!(
        pods["note"].as_str().is_some_and(|n| n.contains("leader")),
        "the note says the figure is the leader's: {pods}"
    );
    eprintln!("live pods on {whose}'s page: {pods}");
}

/// The split as the page draws it: region → the newest value of its area.
/// Scripts start with it and go on with `m` (the page's split, or `null`
/// while fewer than two regions are drawn).
const DRAWN: &str = "const a = [...document.querySelectorAll('#chart-alloc polygon.area')];
    const m = a.length < 2 ? null : {}; a.forEach(p => { if (m) m[p.dataset.region] = Number(p.dataset.last); });
    if (!m) return null;";

fn drawn(v: &Value, region: &str) -> u64 {
    v[region].as_u64().unwrap_or(0)
}

fn screenshot(name: &str, png: &[u8]) {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dashboard-{name}.png"));
    std::fs::write(&path, png).expect("write screenshot");
    eprintln!("screenshot: {}", path.display());
}

async fn leader_epoch(world: &World) -> u64 {
    world.allocations("").await["epoch"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_draws_live_allocations_rolls_back_and_survives_restarts() {
    require("chromium");
    let driver = Driver::start();
    let mut world = World::start(&rules(L), &["mumbai", "hyderabad"]).await;
    let load = Load::start(&world, "api", "fw", "acme", &[60, 15]);
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let leader = world.cluster.wait_leader(Duration::from_secs(10)).await;
    let page = driver.browser().await;
    // `key=`: the rule's split (without it the page opens on the busiest key).
    page.goto(&format!("{}/#key=", world.cluster.node(leader).url()))
        .await
        .expect("open the dashboard");

    // Both regions drawn; mumbai (80 % of the traffic) holds more.
    let before = wait_js(
        &page,
        &format!("{DRAWN} return (m.mumbai > m.hyderabad) ? m : null;"),
        Duration::from_secs(30),
        "mumbai drawn with the larger share",
    )
    .await;
    assert!(drawn(&before, "hyderabad") > 0, "hyderabad drawn: {before}");
    let rows = wait_js(
        &page,
        "const r = document.querySelector('#rules-table tbody tr'); return r ? r.innerText : null;",
        Duration::from_secs(5),
        "the rules table",
    )
    .await;
    assert!(
        rows.as_str()
            .is_some_and(|r| r.contains(RULE) && r.contains("200")),
        "{rows}"
    );
    screenshot("leader", &page.screenshot().await.expect("screenshot"));

    // The drawn split is the API's within 1 s of each new epoch. Epochs may
    // come in quick pairs (a shrink, then the grow it paid for once the
    // region acknowledged), so the page must catch up with whatever the API
    // shows within 1 s of the API showing it. One late draw (up to 5 s) is
    // excused, not two: on a 2-core CI box running the whole suite, a
    // coordinator once went 1.5 s without hearing its peers, and a stall
    // like that delays the page as much as the cluster.
    const ON_TIME: Duration = Duration::from_secs(1);
    const EXCUSED: Duration = Duration::from_secs(5);
    let mut late: Option<Duration> = None;
    let mut matched = 0;
    let mut last_change = Instant::now();
    let mut last_api = world.split(RULE).await;
    let deadline = Instant::now() + REBALANCE * 4;
    while matched < 3 {
        let api = world.split(RULE).await;
        if api != last_api {
            last_change = Instant::now();
            last_api = api.clone();
        }
        let page_split = page
            .execute(&format!("{DRAWN} return m;"), vec![])
            .await
            .unwrap_or(Value::Null);
        let agrees = api
            .iter()
            .all(|(region, v)| drawn(&page_split, region) == *v);
        if agrees && last_change.elapsed() > Duration::from_millis(1) {
            let lag = last_change.elapsed();
            if lag <= ON_TIME {
                eprintln!("drawn {page_split} within {lag:?} of the API");
                matched += 1;
            } else {
                assert!(
                    late.is_none(),
                    "drawn {page_split} {lag:?} after the API, and an earlier draw {late:?} after it"
                );
                eprintln!("drawn {page_split} {lag:?} after the API: late, excused once");
                late = Some(lag);
            }
            // The next check waits for the next change.
            let epoch = leader_epoch(&world).await;
            let until = Instant::now() + REBALANCE * 3;
            while leader_epoch(&world).await == epoch {
                assert!(Instant::now() < until, "no new epoch after {epoch}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            last_change = Instant::now();
            continue;
        }
        let allowed = if late.is_none() { EXCUSED } else { ON_TIME };
        if last_change.elapsed() >= allowed {
            let history = world
                .cluster
                .get(leader, "/api/v1/history?rule=api%7Cfw")
                .await
                .map(|(_, b)| b["samples"].as_array().and_then(|s| s.last().cloned()));
            let state = page
                .execute("return [location.hash, document.getElementById('conn').textContent, document.getElementById('node').dataset.epoch];", vec![])
                .await;
            panic!(
                "the page draws {page_split}, the API has shown {api:?} for {:?} (an earlier draw was late by {late:?}); history's last sample {history:?}; page {state:?}",
                last_change.elapsed()
            );
        }
        assert!(
            Instant::now() < deadline + REBALANCE * 6,
            "epochs kept changing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Shift the traffic: the drawn hyderabad share grows within two
    // rebalance intervals (plus the 1 s report interval for the new demand).
    load.set(&[15, 60]);
    let shifted = Instant::now();
    let start = wait_js(
        &page,
        &format!("{DRAWN} return m;"),
        Duration::from_secs(1),
        "split",
    )
    .await;
    let after = wait_js(
        &page,
        &format!(
            "{DRAWN} return (m.hyderabad > {}) ? m : null;",
            drawn(&start, "hyderabad")
        ),
        REBALANCE * 2 + Duration::from_secs(1),
        "the drawn split following the shift",
    )
    .await;
    eprintln!(
        "after the shift: {start} → {after} in {:?}",
        shifted.elapsed()
    );

    // The per-region and world-wide charts, drawn with data once the
    // history is a rule period (4 s) old; and each region's live pods.
    let charted = Instant::now();
    assert_charts_drawn(&page).await;
    assert_live_pods(&page, "the leader").await;
    assert_ledger_drawn(&page, "the leader").await;
    open_reservations(&world, 3).await;
    assert_usage_shown(&page, 3).await;
    eprintln!(
        "per-region and world-wide charts and live pods checked in {:?}",
        charted.elapsed()
    );

    // A reload keeps the history.
    let samples = |p: &Client| {
        let p = p.clone();
        async move {
            wait_js(
                &p,
                "const s = document.querySelector('#chart-alloc svg'); const n = s ? Number(s.getAttribute('data-samples')) : 0; return n > 1 ? n : null;",
                Duration::from_secs(10),
                "samples drawn",
            )
            .await
            .as_u64()
            .unwrap_or(0)
        }
    };
    let kept = samples(&page).await;
    page.refresh().await.expect("reload");
    let reloaded = samples(&page).await;
    assert!(
        reloaded >= kept,
        "reload drew {reloaded} samples, {kept} before"
    );

    // Accessibility: every chart has a table; every control is reachable by
    // keyboard, in order.
    let charts = page
        .execute(
            "return [document.querySelectorAll('figure .chart').length, document.querySelectorAll('figure details table').length];",
            vec![],
        )
        .await
        .expect("count charts");
    // The three of the allocation section and the ledger's (one global rule).
    assert_eq!(charts, json!([4, 4]), "a table per chart");
    page.execute("document.activeElement.blur(); window.focus();", vec![])
        .await
        .expect("blur");
    let mut reached = Vec::new();
    for _ in 0..50 {
        page.active_element()
            .await
            .expect("active element")
            .send_keys(&Key::Tab.to_string())
            .await
            .expect("tab");
        let id = page
            .execute(
                "return document.activeElement.id || document.activeElement.tagName;",
                vec![],
            )
            .await
            .expect("focused");
        reached.push(id.as_str().unwrap_or("").to_string());
    }
    for control in [
        "skip",
        "token",
        "token-save",
        "token-forget",
        "usage-domain",
        "usage-descriptor",
        "usage-rule",
        "usage-key",
        "usage-search",
        "rule-select",
        "key-select",
        "sum-alloc",
        "sum-regions",
        "sum-world",
        "diff-from",
        "diff-to",
        "diff-show",
        "rollout-stage",
        "rollout-regions",
        "rollout",
        "rollback-to",
        "rollback",
    ] {
        assert!(
            reached.iter().any(|r| r == control),
            "{control} not reached by Tab: {reached:?}"
        );
    }

    // A second version (L 300), then roll back from the page.
    let (status, body) = world.cluster.put_text(leader, &rules(300)).await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");
    wait_js(
        &page,
        "return document.querySelector('#versions-table tbody tr[data-version=\"2\"]') ? true : null;",
        Duration::from_secs(5),
        "version 2 listed",
    )
    .await;
    // Without a token the page says what is missing and sends nothing.
    page.find(Locator::Id("rollback"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    let said = page
        .find(Locator::Id("action-result"))
        .await
        .expect("result")
        .text()
        .await
        .expect("text");
    assert!(said.contains("needs the admin token"), "{said}");
    // A wrong token: the server's reason.
    page.find(Locator::Id("token"))
        .await
        .expect("token")
        .send_keys("not-the-token")
        .await
        .expect("type");
    page.find(Locator::Id("token-save"))
        .await
        .expect("save")
        .click()
        .await
        .expect("click");
    page.find(Locator::Id("rollback"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    let refused = wait_js(
        &page,
        "const t = document.getElementById('action-result').textContent; return t.includes('refused') ? t : null;",
        Duration::from_secs(5),
        "a refusal",
    )
    .await;
    eprintln!("wrong token: {refused}");
    page.find(Locator::Id("token"))
        .await
        .expect("token")
        .send_keys(TOKEN)
        .await
        .expect("type");
    page.find(Locator::Id("token-save"))
        .await
        .expect("save")
        .click()
        .await
        .expect("click");
    let stored = page
        .execute(
            "return [sessionStorage.getItem('meridian-admin-token') !== null, document.cookie];",
            vec![],
        )
        .await
        .expect("storage");
    assert_eq!(
        stored,
        json!([true, ""]),
        "the token is in session storage, never a cookie"
    );
    page.find(Locator::Id("rollback"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    let done = wait_js(
        &page,
        "const t = document.getElementById('action-result').textContent; return t.includes('done') ? t : null;",
        Duration::from_secs(10),
        "the rollback",
    )
    .await;
    eprintln!("rollback: {done}");
    let versions = world
        .cluster
        .get(leader, "/api/v1/rules/versions")
        .await
        .expect("versions")
        .1;
    let newest = versions["versions"]
        .as_array()
        .and_then(|v| v.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(newest["number"], 3, "{versions}");
    assert_eq!(newest["origin"], json!({ "kind": "rollback", "of": 1 }));
    // The limiters enforce it: version 3, and the limit back at L.
    let deadline = Instant::now() + Duration::from_secs(15);
    for region in &world.regions {
        loop {
            let text = common::http_get(region.limiter.http_url("/metrics"))
                .await
                .expect("limiter metrics")
                .text()
                .await
                .unwrap_or_default();
            let version = text
                .lines()
                .filter(|l| l.starts_with("meridian_rules_version"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .fold(0.0, f64::max);
            if version >= 3.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} never enforced version 3",
                region.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let deadline = Instant::now() + REBALANCE * 3;
    while world.allocations(&format!("rule={RULE}")).await["limit"] != L {
        assert!(
            Instant::now() < deadline,
            "the allocation's limit never went back to {L}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A drain drill: a band on the allocation chart, a row in the Drills
    // table, a report page at #drill=N; stopped, the table says so.
    let drill_started = Instant::now();
    let note = "<b>planned</b> & drawn";
    let (status, body) = world
        .start_drill(json!({ "region": "hyderabad", "mode": "drain", "note": note }))
        .await;
    assert_eq!(status, 200, "start the drill: {body}");
    let id = body["drill"].as_u64().expect("drill id");
    let band = wait_js(
        &page,
        &format!(
            "const g = document.querySelector('#chart-alloc svg g[data-drill=\"{id}\"]');
             const r = g && g.querySelector('rect');
             return (r && Number(r.getAttribute('width')) > 0) ? [g.dataset.state, g.textContent, document.querySelector('#chart-alloc svg').getAttribute('aria-label')] : null;"
        ),
        Duration::from_secs(5),
        "the drill's band on the allocation chart",
    )
    .await;
    assert_eq!(band[0], "active", "{band}");
    assert!(
        band[1]
            .as_str()
            .is_some_and(|t| t.contains(&format!("drill {id}: drain hyderabad"))),
        "the band's label and title: {band}"
    );
    assert!(
        band[2]
            .as_str()
            .is_some_and(|t| t.contains(&format!("drill {id} (drain of hyderabad)"))),
        "the chart's accessible name names the drill: {band}"
    );
    screenshot("drill-band", &page.screenshot().await.expect("screenshot"));
    let listed = wait_js(
        &page,
        &format!(
            "const r = document.querySelector('#drills-table tbody tr[data-drill=\"{id}\"]'); return r ? r.innerText : null;"
        ),
        Duration::from_secs(5),
        "the drill in the Drills table",
    )
    .await;
    let listed = listed.as_str().unwrap_or_default();
    for word in ["hyderabad", "drain", "active", "admin token sha256:"] {
        assert!(listed.contains(word), "{word} in the row: {listed}");
    }
    // The table is redrawn by live updates: a link found a moment ago may
    // be gone by the click (stale), so the page clicks what it holds now.
    page.execute(
        &format!("document.querySelector('#drills-table a[data-drill=\"{id}\"]').click();"),
        vec![],
    )
    .await
    .expect("open the report");
    let shown = wait_js(
        &page,
        "const p = document.getElementById('drill-page');
         const t = document.getElementById('drill-timeline');
         if (p.hidden || !t || !document.getElementById('rules-h').closest('section').hidden) return null;
         return [location.hash, document.getElementById('drill-h').textContent,
                 document.getElementById('drill-mode').textContent, document.getElementById('drill-region').textContent,
                 document.getElementById('drill-note').textContent, document.querySelectorAll('#drill-note *').length,
                 t.innerText, document.activeElement.id];",
        Duration::from_secs(5),
        "the report page",
    )
    .await;
    assert!(
        shown[0]
            .as_str()
            .is_some_and(|h| h.contains(&format!("drill={id}"))),
        "{shown}"
    );
    assert!(
        shown[1]
            .as_str()
            .is_some_and(|h| h.contains("drain") && h.contains("hyderabad")),
        "{shown}"
    );
    assert_eq!(shown[2], "drain", "{shown}");
    assert_eq!(shown[3], "hyderabad", "{shown}");
    assert_eq!(shown[4], note, "the note is text, not markup: {shown}");
    assert_eq!(shown[5], 0, "no element made from the note: {shown}");
    assert!(
        shown[6]
            .as_str()
            .is_some_and(|t| t.contains(&format!("drill {id} started"))),
        "the timeline: {shown}"
    );
    assert_eq!(shown[7], "drill-h", "focus moves to the report: {shown}");
    // The figures come with how they were measured; the timeline follows
    // the drill as the leader observes it.
    wait_js(
        &page,
        "const t = document.getElementById('drill-timeline'); return (t && t.innerText.includes('acknowledged') && document.querySelectorAll('#drill-figures dd.how').length === 4) ? true : null;",
        Duration::from_secs(10),
        "hyderabad's acknowledgement in the timeline",
    )
    .await;

    let (status, body) = world.stop_drill(id).await;
    assert_eq!(status, 200, "stop the drill: {body}");
    wait_js(
        &page,
        "const t = document.getElementById('drill-timeline'); return (t && t.innerText.includes('drill stopped')) ? true : null;",
        Duration::from_secs(5),
        "the report showing the stop",
    )
    .await;
    screenshot("drill", &page.screenshot().await.expect("screenshot"));
    // Back to the overview by keyboard.
    page.find(Locator::Id("drill-back"))
        .await
        .expect("the back link")
        .send_keys(&Key::Enter.to_string())
        .await
        .expect("press Enter");
    let stopped = wait_js(
        &page,
        &format!(
            "if (!document.getElementById('drill-page').hidden) return null;
             const r = document.querySelector('#drills-table tbody tr[data-drill=\"{id}\"]');
             return (r && r.dataset.state !== 'active') ? [r.dataset.state, r.cells[6].textContent, location.hash, document.activeElement.dataset.drill || null] : null;"
        ),
        Duration::from_secs(5),
        "the Drills table showing the drill stopped",
    )
    .await;
    assert!(
        ["recovering", "finished"].contains(&stopped[0].as_str().unwrap_or_default()),
        "{stopped}"
    );
    assert!(
        stopped[1]
            .as_str()
            .is_some_and(|s| s.contains(" by admin token")),
        "the stop's time and credential: {stopped}"
    );
    assert!(
        stopped[2].as_str().is_some_and(|h| !h.contains("drill=")),
        "{stopped}"
    );
    assert_eq!(
        stopped[3],
        id.to_string(),
        "focus back on the drill's link: {stopped}"
    );
    eprintln!(
        "drill {id}: drawn, listed, reported and stopped in {:?}",
        drill_started.elapsed()
    );

    // A follower's page shows the leader's epoch.
    let follower = world
        .cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    page.goto(&format!("{}/#key=", world.cluster.node(follower).url()))
        .await
        .expect("open the follower");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = page
            .execute(
                "return Number(document.getElementById('node').dataset.epoch || 0);",
                vec![],
            )
            .await
            .expect("epoch")
            .as_u64()
            .unwrap_or(0);
        let epoch = leader_epoch(&world).await;
        if shown == epoch {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "follower page at epoch {shown}, leader at {epoch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_js(
        &page,
        &format!("{DRAWN} return m;"),
        Duration::from_secs(10),
        "the follower drawing the split",
    )
    .await;
    assert_live_pods(&page, "a follower").await;
    assert_ledger_drawn(&page, "a follower").await;
    screenshot("follower", &page.screenshot().await.expect("screenshot"));

    // The follower restarts under the open page: it reconnects by itself.
    world.cluster.kill(follower);
    wait_js(
        &page,
        "return document.getElementById('conn').textContent.includes('reconnecting') ? true : null;",
        Duration::from_secs(10),
        "the page noticing its node went away",
    )
    .await;
    world.cluster.restart(follower);
    let epoch = leader_epoch(&world).await;
    wait_js(
        &page,
        &format!(
            "return (document.getElementById('conn').textContent === 'live' && Number(document.getElementById('node').dataset.epoch) > {epoch}) ? true : null;"
        ),
        Duration::from_secs(30),
        "the page live again on a new epoch",
    )
    .await;

    page.close().await.expect("close the browser");
    drop(load.stop().await);
}
