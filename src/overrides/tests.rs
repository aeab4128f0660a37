//! The overrides' unit tests: the set's changes and bound, what a proposed
//! override is refused for, the limiter's index, and bulk rows.

use super::*;
use crate::rules::{RuleFile, RuleSet};

const NOW: i64 = 1_800_000_000_000;

fn rules() -> RuleSet {
    let text = r#"
domain: api
descriptors:
  - key: customer
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: bucket
    algorithm: token_bucket
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: path
    value: "/a*"
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 600 }
  - key: both
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

fn proposed(entries: &[(&str, &str)], limit: u64) -> Proposed {
    Proposed {
        domain: "api".into(),
        entries: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        rule: None,
        key: None,
        limit,
        burst: None,
        expires_at_unix_ms: None,
        reason: "enterprise plan".into(),
    }
}

fn held(customer: &str, limit: u64, expires: Option<i64>) -> Override {
    let mut p = proposed(&[("customer", customer)], limit);
    p.expires_at_unix_ms = expires;
    resolve(&rules(), &p, 60.0, "admin token sha256:00", NOW - 10).expect("valid")
}

fn change(set: Vec<Override>, remove: Vec<(String, String)>) -> OverrideChange {
    OverrideChange {
        set,
        remove,
        replace_all: false,
        import: None,
        at_unix_ms: NOW,
    }
}

#[test]
fn an_override_resolves_to_its_rule_and_the_key_that_rule_counts() {
    let o = held("42", 5_000, None);
    assert_eq!(
        (o.rule.as_str(), o.key.as_str()),
        ("api|customer", "customer=42")
    );
    assert_eq!(o.set_by, "admin token sha256:00");
    assert!(o.live_at(NOW));
}

#[test]
fn each_bad_override_is_refused_naming_its_field() {
    let set = rules();
    let refused = |p: Proposed| {
        resolve(&set, &p, 60.0, "t", NOW)
            .expect_err("refused")
            .field
    };
    let mut p = proposed(&[("customer", "42")], 5_000);
    p.domain = "nope".into();
    assert_eq!(refused(p), "domain");
    assert_eq!(refused(proposed(&[("nothing", "x")], 5_000)), "descriptor");
    assert_eq!(refused(proposed(&[], 5_000)), "descriptor");
    assert_eq!(refused(proposed(&[("free", "x")], 5_000)), "descriptor");
    // A shared glob counts every matching path in one counter.
    assert_eq!(refused(proposed(&[("path", "/abc")], 5_000)), "descriptor");
    assert_eq!(refused(proposed(&[("both", "x")], 5_000)), "rule");
    let mut p = proposed(&[("customer", "42")], 5_000);
    p.rule = Some("api|bucket".into());
    assert_eq!(refused(p), "rule");
    // Under the floor of 60 a minute, and zero.
    assert_eq!(refused(proposed(&[("customer", "42")], 59)), "limit");
    assert_eq!(refused(proposed(&[("customer", "42")], 0)), "limit");
    assert_eq!(refused(proposed(&[("customer", "42")], u64::MAX)), "limit");
    let mut p = proposed(&[("customer", "42")], 5_000);
    p.burst = Some(10);
    assert_eq!(refused(p), "burst");
    let mut p = proposed(&[("customer", "42")], 5_000);
    p.expires_at_unix_ms = Some(NOW);
    assert_eq!(refused(p), "expires_at_unix_ms");
    let mut p = proposed(&[("customer", "42")], 5_000);
    p.reason = "x".repeat(MAX_REASON_BYTES + 1);
    assert_eq!(refused(p), "reason");
    // A bucket takes a burst.
    let mut p = proposed(&[("bucket", "7")], 20);
    p.burst = Some(100);
    assert!(resolve(&set, &p, 60.0, "t", NOW).is_ok());
}

#[test]
fn a_change_applies_whole_and_drops_what_expired() {
    let mut overrides = Overrides::default();
    let touched = overrides
        .apply(&change(
            vec![held("1", 2_000, Some(NOW + 5)), held("2", 3_000, None)],
            vec![],
        ))
        .expect("applied");
    assert_eq!(touched.len(), 2);
    assert_eq!(overrides.version, 1);
    assert_eq!(overrides.live_at(NOW + 10).count(), 1, "1 lapsed by itself");
    // The next change, after 1's expiry, drops it.
    let later = OverrideChange {
        at_unix_ms: NOW + 10,
        ..change(vec![held("3", 4_000, None)], vec![])
    };
    let touched = overrides.apply(&later).expect("applied");
    assert_eq!(
        touched,
        vec![
            ("api|customer".to_string(), "customer=1".to_string()),
            ("api|customer".to_string(), "customer=3".to_string())
        ]
    );
    assert_eq!(overrides.by_id.len(), 2);
    // Removing one not held refuses the whole change.
    let before = overrides.clone();
    let refused = overrides.apply(&change(
        vec![held("4", 4_000, None)],
        vec![("api|customer".into(), "customer=99".into())],
    ));
    assert!(matches!(refused, Err(Refused::NotFound(_))), "{refused:?}");
    assert_eq!(overrides, before);
}

#[test]
fn the_bound_refuses_a_change_whole_and_a_replace_counts_only_what_it_sets() {
    let mut overrides = Overrides::default();
    let template = held("0", 2_000, None);
    let many: Vec<Override> = (0..MAX_OVERRIDES)
        .map(|i| Override {
            key: format!("customer={i}"),
            ..template.clone()
        })
        .collect();
    overrides
        .apply(&change(many, vec![]))
        .expect("at the bound");
    let refused = overrides.apply(&change(vec![held("x", 2_000, None)], vec![]));
    match refused {
        Err(Refused::Rejected(reason)) => assert!(reason.contains("100000"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(overrides.by_id.len(), MAX_OVERRIDES);
    // Replacing an existing one is no growth.
    overrides
        .apply(&change(vec![held("7", 9_000, None)], vec![]))
        .expect("a replacement fits");
    let replace = OverrideChange {
        replace_all: true,
        import: None,
        ..change(vec![held("x", 2_000, None)], vec![])
    };
    overrides.apply(&replace).expect("replaced");
    assert_eq!(overrides.by_id.len(), 1);
}

#[test]
fn the_index_finds_a_key_in_force_with_the_rules_algorithm_and_period() {
    let set = rules();
    let o = held("42", 5_000, Some(NOW + 1_000));
    let mut p = proposed(&[("bucket", "7")], 20);
    p.burst = Some(100);
    let b = resolve(&set, &p, 60.0, "t", NOW).expect("valid");
    let index = OverrideIndex::new(3, [&o, &b]);
    assert_eq!(index.len(), 2);
    let customer = set
        .resolve("api", &[("customer", "42")])
        .and_then(|r| r.rule)
        .expect("rule");
    let params = index
        .params(customer, "customer=42", NOW)
        .expect("in force");
    assert_eq!(params.limit(), 5_000);
    assert_eq!(params.period(), std::time::Duration::from_secs(60));
    assert_eq!(
        params.algorithm(),
        customer.params.as_ref().expect("p").algorithm()
    );
    assert_eq!(index.params(customer, "customer=43", NOW), None);
    assert_eq!(
        index.params(customer, "customer=42", NOW + 1_000),
        None,
        "expired"
    );
    let bucket = set
        .resolve("api", &[("bucket", "7")])
        .and_then(|r| r.rule)
        .expect("rule");
    let params = index.params(bucket, "bucket=7", NOW).expect("in force");
    assert_eq!((params.limit(), params.burst()), (20, 100));
}

#[cfg(feature = "server")]
#[test]
fn bulk_rows_read_from_csv_and_json_and_an_export_reads_back() {
    let csv = "domain,descriptor,limit,ttl,reason\n\
               api,customer=42,5000,30d,enterprise\n\
               api,customer=43,2000,,\n";
    let rows = parse_csv(csv.as_bytes()).expect("csv");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].descriptor, vec!["customer=42".to_string()]);
    assert_eq!(rows[0].ttl.as_deref(), Some("30d"));
    assert_eq!(rows[1].ttl, None);
    let p = rows[0].proposed(NOW).expect("proposed");
    assert_eq!(p.expires_at_unix_ms, Some(NOW + 30 * 86_400_000));
    let json = br#"[{"domain":"api","descriptor":["customer=42"],"limit":5000}]"#;
    assert_eq!(parse_json(json).expect("json")[0].limit, 5_000);
    let bad = parse_csv(b"domain,descriptor,limit\napi,customer=1,10\napi,customer=2,ten\n")
        .expect_err("row 2");
    assert_eq!(bad.row, 2, "{bad}");
    let bad = parse_json(br#"[{"domain":"api","descriptor":["c=1"],"limit":1,"color":1}]"#)
        .expect_err("unknown field");
    assert_eq!(bad.row, 1);
    assert!(bad.reason.contains("color"), "{bad}");
    let exported = to_csv([&held("42", 5_000, None)]);
    let back = parse_csv(exported.as_bytes()).expect("reads back");
    assert_eq!(back[0].descriptor, vec!["customer=42".to_string()]);
    assert_eq!(back[0].limit, 5_000);
    assert_eq!(back[0].rule.as_deref(), Some("api|customer"));
}

#[test]
fn an_override_by_rule_name_holds_the_key_as_checks_by_name_give_it() {
    let set = RuleSet::parse(&[RuleFile {
        name: "demo.yaml".into(),
        text: "domain: demo\ndescriptors:\n  - key: customer\n    rate_limit: { name: per_customer, unit: minute, requests_per_unit: 1000 }\n".into(),
    }])
    .expect("rules");
    let mut p = proposed(&[], 2_000);
    p.domain = "demo".into();
    p.rule = Some("per_customer".into());
    p.key = Some("cust-3".into());
    let o = resolve(&set, &p, 60.0, "t", NOW).expect("valid");
    assert_eq!(
        (o.rule.as_str(), o.key.as_str()),
        ("demo|customer", "cust-3")
    );
    assert_eq!(o.rule_name.as_deref(), Some("per_customer"));
    // By the rule's id too (as an export writes it).
    p.rule = Some("demo|customer".into());
    assert!(resolve(&set, &p, 60.0, "t", NOW).is_ok());
    p.rule = Some("nope".into());
    assert_eq!(
        resolve(&set, &p, 60.0, "t", NOW)
            .expect_err("unknown")
            .field,
        "rule"
    );
    p.rule = None;
    assert_eq!(
        resolve(&set, &p, 60.0, "t", NOW)
            .expect_err("no rule")
            .field,
        "rule"
    );
    // Not both forms at once.
    let mut both = proposed(&[("customer", "1")], 2_000);
    both.key = Some("x".into());
    assert_eq!(
        resolve(&rules(), &both, 60.0, "t", NOW)
            .expect_err("both")
            .field,
        "key"
    );
}
