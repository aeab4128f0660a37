//! The usage answers' unit tests: a key's figures per region and
//! world-wide from a real ledger fed as pods feed it, an untracked key said
//! so (never 0), an override read in the key's units, a region-scope rule
//! without figures, every limit of a `limits:` rule, the fields a bad query
//! is refused for, and top keys ranked against their own limit.

use super::*;
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::ledger::PeriodAdmitted;
use crate::allocation::reserved::{KeyReserved, ReservedBook};
use crate::allocation::{KeyAllocation, RuleAllocation, Slot};
use crate::rules::RuleFile;

/// A multiple of 60 s: the start of a minute period.
const T0: Millis = 1_700_000_040_000;

fn rules() -> RuleSet {
    let text = r#"
domain: api
descriptors:
  - key: customer
    scope: global
    algorithm: fixed_window
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: both
    scope: global
    limits:
      - rate_limit: { unit: second, requests_per_unit: 10 }
      - rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: free
"#;
    RuleSet::parse(&[RuleFile {
        name: "api.yaml".into(),
        text: text.into(),
    }])
    .expect("rules parse")
}

fn query(
    domain: Option<&str>,
    descriptor: Option<&str>,
    rule: Option<&str>,
    key: Option<&str>,
) -> UsageQuery {
    UsageQuery {
        domain: domain.map(str::to_string),
        descriptor: descriptor.map(str::to_string),
        rule: rule.map(str::to_string),
        key: key.map(str::to_string),
        consistent: None,
    }
}

fn customer(id: &str) -> Target {
    target(
        &rules(),
        &query(Some("api"), Some(&format!("customer={id}")), None, None),
    )
    .expect("resolves")
}

fn counted(rule: &str, key: Option<&str>, admitted: u64) -> PeriodAdmitted {
    PeriodAdmitted {
        rule: rule.into(),
        key: key.map(str::to_string),
        period_start_ms: T0,
        admitted,
    }
}

/// Pods of two regions reporting customer 42 (east 300 + 100, west 200)
/// and customer 7 (east 50) in the minute starting at T0.
fn ledger() -> Ledger {
    let set = rules();
    let global = GlobalRule::of_rule_set(&set);
    let mut ledger = Ledger::default();
    let mut report = |region: &str, pod: &str, keys: &[(&str, u64)], at: Millis| {
        let mut admitted = vec![counted(
            "api|customer",
            None,
            keys.iter().map(|k| k.1).sum(),
        )];
        admitted.extend(
            keys.iter()
                .map(|(k, n)| counted("api|customer", Some(k), *n)),
        );
        ledger.record(region, pod, &admitted, &global, at);
    };
    report(
        "east",
        "e-0",
        &[("customer=42", 300), ("customer=7", 50)],
        T0 + 10_000,
    );
    report("east", "e-1", &[("customer=42", 100)], T0 + 12_000);
    report("west", "w-0", &[("customer=42", 200)], T0 + 11_000);
    ledger
}

fn slot(granted: u64) -> Slot {
    Slot {
        granted,
        bound: granted,
        target: granted,
        ..Slot::default()
    }
}

/// The rule's split east 600 / west 400; customer 42's own 700 / 300.
fn allocations() -> Allocations {
    let mut a = Allocations::default();
    a.rules.insert(
        "api|customer".into(),
        RuleAllocation {
            limit: 1000,
            split: [("east".into(), slot(600)), ("west".into(), slot(400))].into(),
            keys: [(
                "customer=42".to_string(),
                KeyAllocation {
                    shares: [("east".into(), slot(700)), ("west".into(), slot(300))].into(),
                    demand: BTreeMap::new(),
                },
            )]
            .into(),
            ..RuleAllocation::default()
        },
    );
    a
}

fn override_of(key: &str, limit: u64, expires: Option<i64>) -> Override {
    Override {
        domain: "api".into(),
        entries: vec![(
            "customer".into(),
            key.trim_start_matches("customer=").into(),
        )],
        rule: "api|customer".into(),
        rule_name: None,
        key: key.into(),
        limit,
        burst: None,
        expires_at_unix_ms: expires,
        reason: "enterprise plan".into(),
        set_by: "admin token sha256:00".into(),
        set_at_unix_ms: T0 - 1,
    }
}

fn answer(t: &Target, ledger: &Ledger, overrides: &Overrides, now: Millis) -> Value {
    answer_reserved(t, ledger, &ReservedBook::default(), overrides, now)
}

fn answer_reserved(
    t: &Target,
    ledger: &Ledger,
    reserved: &ReservedBook,
    overrides: &Overrides,
    now: Millis,
) -> Value {
    let allocations = allocations();
    let snapshot = Snapshot {
        now,
        regions: vec!["east".into(), "west".into(), "north".into()],
        overrides,
        allocations: &allocations,
        figures: figures_of(ledger, reserved, t, now, 3_000),
        report_interval_ms: 1000,
        node_id: 1,
    };
    usage_json(t, &snapshot)
}

fn region<'a>(limit: &'a Value, name: &str) -> &'a Value {
    limit["regions"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["region"] == name))
        .unwrap_or_else(|| panic!("no region {name}: {limit}"))
}

#[test]
fn a_tracked_key_shows_each_regions_use_allocation_and_age_and_the_world_against_its_limit() {
    let now = T0 + 13_000;
    let a = answer(&customer("42"), &ledger(), &Overrides::default(), now);
    assert_eq!(
        (a["rule"].as_str(), a["key"].as_str()),
        (Some("api|customer"), Some("customer=42"))
    );
    assert_eq!(a["descriptor"], json!(["customer=42"]));
    let limits = a["limits"].as_array().expect("limits");
    assert_eq!(limits.len(), 1);
    let l = &limits[0];
    assert_eq!(
        (l["scope"].as_str(), l["status"].as_str()),
        (Some("global"), Some("tracked"))
    );
    assert_eq!(
        (l["limit"].as_u64(), l["key_limit"].as_u64()),
        (Some(1000), Some(1000))
    );
    assert!(l["override"].is_null());
    assert_eq!(l["period"]["start_unix_ms"], T0);
    assert_eq!(l["period"]["end_unix_ms"], T0 + 60_000);
    let east = region(l, "east");
    assert_eq!(east["used"], 400, "both east pods summed: {east}");
    assert_eq!(
        (east["pods"].as_u64(), east["pods_with_key"].as_u64()),
        (Some(2), Some(2))
    );
    // The key's own entry, not the rule's split.
    assert_eq!(
        (
            east["allocation"].as_u64(),
            east["allocation_source"].as_str()
        ),
        (Some(700), Some("key_entry"))
    );
    // Its newest count was taken at +12 s, its oldest pod's at +10 s.
    assert_eq!(
        (east["age_ms"].as_i64(), east["oldest_pod_age_ms"].as_i64()),
        (Some(1_000), Some(3_000))
    );
    let west = region(l, "west");
    assert_eq!(
        (
            west["used"].as_u64(),
            west["allocation"].as_u64(),
            west["age_ms"].as_i64()
        ),
        (Some(200), Some(300), Some(2_000))
    );
    // A registered region that never reported: no count, no age, said so.
    let north = region(l, "north");
    assert!(
        north["used"].is_null() && north["age_ms"].is_null(),
        "{north}"
    );
    assert_eq!(north["figure"], "no_reports");
    assert_eq!(
        (east["figure"].as_str(), west["figure"].as_str()),
        (Some("counted"), Some("counted"))
    );
    assert_eq!(l["world"]["used"], 600);
    assert_eq!(l["world"]["ratio"], 0.6);
    assert_eq!(l["world"]["allocation"], 1000);
    assert_eq!(l["world"]["over"], false);
    assert_eq!(a["report_interval_ms"], 1000);
}

#[test]
fn open_reservations_show_as_reserved_and_the_rest_of_the_use_as_settled() {
    let mut reserved = ReservedBook::default();
    let open = |outstanding| {
        vec![KeyReserved {
            rule: "api|customer".into(),
            key: "customer=42".into(),
            outstanding,
        }]
    };
    // East's two pods: one opened 250, the other settled 100 of them.
    reserved.record("east", "e0", &open(250), T0 + 12_000);
    reserved.record("east", "e1", &open(-100), T0 + 12_000);
    // A west pod not heard for 3 s no longer counts.
    reserved.record("west", "w0", &open(80), T0 + 9_000);
    let now = T0 + 13_000;
    let a = answer_reserved(
        &customer("42"),
        &ledger(),
        &reserved,
        &Overrides::default(),
        now,
    );
    let l = &a["limits"][0];
    let east = region(l, "east");
    assert_eq!(
        (
            east["used"].as_u64(),
            east["reserved"].as_u64(),
            east["settled"].as_u64()
        ),
        (Some(400), Some(150), Some(250)),
        "{east}"
    );
    let west = region(l, "west");
    assert_eq!(
        (west["reserved"].as_u64(), west["settled"].as_u64()),
        (Some(0), Some(200))
    );
    assert_eq!(
        (
            l["world"]["reserved"].as_u64(),
            l["world"]["settled"].as_u64()
        ),
        (Some(150), Some(450))
    );
}

#[test]
fn a_key_the_ledger_does_not_track_is_not_tracked_never_zero() {
    let a = answer(
        &customer("99"),
        &ledger(),
        &Overrides::default(),
        T0 + 13_000,
    );
    let l = &a["limits"][0];
    assert_eq!(l["status"], "not_tracked");
    let east = region(l, "east");
    assert!(east["used"].is_null(), "not 0: {east}");
    assert_eq!(east["figure"], "not_tracked");
    // How old the region's counts are is still known; the allocation is
    // the rule's split that serves the key.
    assert_eq!(east["age_ms"], 1_000);
    assert_eq!(
        (
            east["allocation"].as_u64(),
            east["allocation_source"].as_str()
        ),
        (Some(600), Some("rule_split"))
    );
    assert!(
        l["world"]["used"].is_null() && l["world"]["ratio"].is_null(),
        "{l}"
    );
    // In the next period no pod reported yet: no reports, the period's
    // bounds still given, the last period's figure beside it.
    let next = answer(
        &customer("42"),
        &ledger(),
        &Overrides::default(),
        T0 + 61_000,
    );
    let l = &next["limits"][0];
    assert_eq!(l["status"], "no_reports");
    assert_eq!(l["period"]["start_unix_ms"], T0 + 60_000);
    assert_eq!(l["previous_period"]["used"], 600);
    assert_eq!(
        region(l, "east")["age_ms"],
        49_000,
        "from the period before"
    );
}

#[test]
fn a_region_whose_pods_did_not_report_the_key_has_no_figure_and_one_some_did_is_partial() {
    // Customer 7: reported by e-0 only; e-1 and west reported the period
    // without it (no hits, or not among their busiest: unknown).
    let a = answer(
        &customer("7"),
        &ledger(),
        &Overrides::default(),
        T0 + 13_000,
    );
    let l = &a["limits"][0];
    assert_eq!(l["status"], "tracked");
    let east = region(l, "east");
    assert_eq!(
        (east["figure"].as_str(), east["used"].as_u64()),
        (Some("partial"), Some(50))
    );
    assert_eq!(
        (east["pods"].as_u64(), east["pods_with_key"].as_u64()),
        (Some(2), Some(1))
    );
    let west = region(l, "west");
    assert_eq!(west["figure"], "not_reported");
    assert!(west["used"].is_null(), "unknown, not 0: {west}");
    assert_eq!(l["world"]["used"], 50);
}

#[test]
fn an_overridden_key_reads_in_its_own_units_against_its_own_limit() {
    // Override 5,000 on L 1,000: the leader scales the key's counts by
    // L / O, so the ledger holds a fifth of its hits (2,000 → 400 east).
    let mut overrides = Overrides::default();
    let o = override_of("customer=42", 5000, Some(T0 + 3_600_000));
    overrides.by_id.insert(o.id(), o);
    let a = answer(&customer("42"), &ledger(), &overrides, T0 + 13_000);
    let l = &a["limits"][0];
    assert_eq!(l["key_limit"], 5000);
    assert_eq!(l["override"]["limit"], 5000);
    assert_eq!(l["override"]["reason"], "enterprise plan");
    assert_eq!(l["override"]["expired"], false);
    let east = region(l, "east");
    assert_eq!(east["used"], 2000);
    // Granted 700 of L: the region enforces 700 × 5,000 / 1,000.
    assert_eq!(
        (
            east["allocation"].as_u64(),
            east["granted_of_limit"].as_u64()
        ),
        (Some(3500), Some(700))
    );
    assert_eq!(l["world"]["used"], 3000);
    assert_eq!(l["world"]["ratio"], 0.6);
    // Expired but still held (the next change drops it): the rule's limit
    // applies, and the counts still read in the key's units.
    let mut expired = Overrides::default();
    let o = override_of("customer=42", 5000, Some(T0 + 1_000));
    expired.by_id.insert(o.id(), o);
    let a = answer(&customer("42"), &ledger(), &expired, T0 + 13_000);
    let l = &a["limits"][0];
    assert_eq!(
        (l["key_limit"].as_u64(), l["override"]["expired"].as_bool()),
        (Some(1000), Some(true))
    );
    assert_eq!(l["world"]["used"], 3000);
    assert_eq!(l["world"]["ratio"], 3.0);
    assert_eq!(l["world"]["over"], true);
    assert_eq!(region(l, "east")["allocation"], 700);
}

#[test]
fn a_region_scope_rule_is_answered_without_figures_and_a_limits_rule_by_every_limit() {
    let t = target(
        &rules(),
        &query(Some("api"), Some("ip=10.0.0.1"), None, None),
    )
    .expect("resolves");
    let a = answer(&t, &ledger(), &Overrides::default(), T0 + 13_000);
    let l = &a["limits"][0];
    assert_eq!(l["scope"], "region");
    assert!(l["figures"].is_null() && l.get("regions").is_none(), "{l}");
    assert!(
        l["note"].as_str().is_some_and(|n| n.contains("no figure")),
        "{l}"
    );
    assert_eq!(l["limit"], 10);

    let t = target(&rules(), &query(Some("api"), Some("both=x"), None, None)).expect("resolves");
    let a = answer(&t, &ledger(), &Overrides::default(), T0 + 13_000);
    let ids: Vec<&str> = a["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter_map(|l| l["limit_id"].as_str())
        .collect();
    assert_eq!(ids, ["api|both", "api|both%limit2"]);
    let hour = &a["limits"][1];
    assert_eq!(
        (hour["limit"].as_u64(), hour["period_ms"].as_u64()),
        (Some(1000), Some(3_600_000))
    );
    // In no ledger yet (no pod reported it): said so.
    assert_eq!(hour["status"], "no_reports");
}

#[test]
fn a_rule_and_key_name_the_counter_as_a_check_by_rule_name_does() {
    let set = rules();
    let by_id =
        target(&set, &query(None, None, Some("api|customer"), Some("acme"))).expect("by id");
    assert_eq!(
        (by_id.rule.id.as_str(), by_id.key.as_str()),
        ("api|customer", "acme")
    );
    assert!(by_id.descriptor.is_empty());
    assert_eq!(by_id.domain, "api");
}

async fn refused(q: UsageQuery) -> (u16, Value) {
    let e = target(&rules(), &q).expect_err("refused");
    let response = e.into_response();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("body");
    (status, serde_json::from_slice(&bytes).expect("json"))
}

#[tokio::test]
async fn a_query_that_matches_nothing_is_refused_naming_the_field() {
    let cases = [
        (
            query(Some("web"), Some("customer=42"), None, None),
            "domain",
        ),
        (
            query(Some("api"), Some("plan=gold"), None, None),
            "descriptor",
        ),
        (
            query(Some("api"), Some("customer"), None, None),
            "descriptor",
        ),
        (query(Some("api"), Some("free=x"), None, None), "descriptor"),
        (query(None, Some("customer=42"), None, None), "domain"),
        (
            query(Some("api"), None, Some("api|nope"), Some("k")),
            "rule",
        ),
        (query(Some("api"), None, Some("api|customer"), None), "key"),
        (query(Some("api"), None, None, None), "descriptor"),
        (
            query(Some("api"), Some("customer=42"), None, Some("k")),
            "key",
        ),
    ];
    for (q, field) in cases {
        let shown = format!("{:?} {:?} {:?} {:?}", q.domain, q.descriptor, q.rule, q.key);
        let (status, body) = refused(q).await;
        assert_eq!(status, 422, "{shown}: {body}");
        assert_eq!(body["field"], field, "{shown}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }
}

fn top_rule(tracked: Vec<(Millis, Vec<(&str, u64)>)>, current_start: Millis) -> TopRule {
    TopRule {
        id: "api|customer".into(),
        limit: 1000,
        period_ms: 60_000,
        current_start,
        tracked: tracked
            .into_iter()
            .map(|(s, keys)| {
                (
                    s,
                    keys.into_iter().map(|(k, n)| (Arc::from(k), n)).collect(),
                )
            })
            .collect(),
        busiest_finished: None,
    }
}

#[test]
fn top_keys_rank_by_use_of_their_own_limit_over_the_open_periods_and_are_bounded() {
    let now = T0 + 70_000;
    let current = T0 + 60_000;
    // a: 900 of 1,000 in the period that ended, 100 so far;
    // b: 500 now; c: overridden to 200, its 190 hits held as 950 (× L / O);
    // d: 1,200, over its limit.
    let rule = top_rule(
        vec![
            (T0, vec![("customer=a", 900), ("customer=b", 300)]),
            (
                current,
                vec![
                    ("customer=a", 100),
                    ("customer=b", 500),
                    ("customer=c", 950),
                    ("customer=d", 1200),
                ],
            ),
        ],
        current,
    );
    let mut overrides = Overrides::default();
    let o = override_of("customer=c", 200, None);
    overrides.by_id.insert(o.id(), o);
    let top = top_json(std::slice::from_ref(&rule), &overrides, 3, now);
    let r = &top["api|customer"];
    let keys: Vec<(&str, f64)> = r["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap_or(""),
                k["ratio"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("customer=d", 1.2),
            ("customer=c", 0.95),
            ("customer=a", 0.9)
        ]
    );
    assert_eq!(r["candidates"], 4, "b left out by n");
    let d = &r["keys"][0];
    assert_eq!(
        (
            d["over"].as_bool(),
            d["used"].as_u64(),
            d["current_used"].as_u64()
        ),
        (Some(true), Some(1200), Some(1200))
    );
    let c = &r["keys"][1];
    assert_eq!(
        (c["used"].as_u64(), c["key_limit"].as_u64()),
        (Some(190), Some(200))
    );
    assert_eq!(c["override"]["limit"], 200);
    let a = &r["keys"][2];
    assert_eq!(
        (
            a["worst_period_start_unix_ms"].as_i64(),
            a["current_used"].as_u64()
        ),
        (Some(T0), Some(100))
    );
    assert_eq!(a["periods"].as_array().map(Vec::len), Some(2));
    assert_eq!(a["periods"][0]["current"], true, "newest first");
}

#[test]
fn top_keys_come_from_a_real_ledger_with_the_newest_finished_periods_busiest() {
    let ledger = ledger();
    let rule = ledger.rule("api|customer").expect("rule");
    let now = T0 + 13_000;
    let top = top_json(
        &[TopRule::of("api|customer", rule, now)],
        &Overrides::default(),
        10,
        now,
    );
    let keys: Vec<&str> = top["api|customer"]["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter_map(|k| k["key"].as_str())
        .collect();
    assert_eq!(keys, ["customer=42", "customer=7"]);
    assert_eq!(top["api|customer"]["keys"][0]["used"], 600);
    // A finished period's busiest key is listed when its period is no
    // longer open.
    let mut only_finished = TopRule::of("api|customer", rule, now);
    only_finished.tracked.clear();
    only_finished.busiest_finished = Some((T0 - 60_000, Arc::from("customer=5"), 990));
    let top = top_json(&[only_finished], &Overrides::default(), 10, now);
    assert_eq!(top["api|customer"]["keys"][0]["key"], "customer=5");
    assert_eq!(top["api|customer"]["keys"][0]["ratio"], 0.99);
}
