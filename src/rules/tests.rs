use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::algorithm::Algorithm;

fn file(name: &str, text: &str) -> RuleFile {
    RuleFile {
        name: name.to_owned(),
        text: text.to_owned(),
    }
}

fn parse(text: &str) -> RuleSet {
    RuleSet::parse(&[file("rules.yaml", text)]).unwrap_or_else(|e| panic!("{e}"))
}

fn errors(text: &str) -> Vec<RuleError> {
    match RuleSet::parse(&[file("rules.yaml", text)]) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(RuleErrors(list)) => list,
    }
}

/// Asserts that `text` is rejected with exactly one error, on `line`, for
/// `field`, whose reason contains `words`.
fn rejects(text: &str, line: usize, field: &str, words: &str) {
    let list = errors(text);
    assert_eq!(list.len(), 1, "one error expected, got: {list:#?}");
    let e = &list[0];
    assert_eq!(
        (e.file.as_str(), e.line, e.field.as_str()),
        ("rules.yaml", line, field),
        "{e}"
    );
    assert!(
        e.reason.to_lowercase().contains(&words.to_lowercase()),
        "{e:?} should contain {words:?}"
    );
}

fn limit(set: &RuleSet, domain: &str, entries: &[(&str, &str)]) -> Option<(u64, Unit)> {
    let r = set.resolve(domain, entries)?;
    r.rule.map(|r| (r.requests_per_unit, r.unit))
}

const ENVOY: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: user
    value: vip
    rate_limit: {unit: Minute, requests_per_unit: 100, name: vip}
  - key: user
    value: bot*
    rate_limit: {unit: SECOND, requests_per_unit: 1}
  - key: user
    value: b*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: user
    value: admin
  - key: path
    value: /login
    descriptors:
      - key: ip
        shadow_mode: true
        detailed_metric: true
        value_to_metric: true
        share_threshold: false
        quota_mode: false
        metadata: {owner: team-a}
        rate_limit:
          unit: hour
          requests_per_unit: 5
          name: login_ip
          quota_mode: false
          replaces: [{name: vip}]
  - key: free
    rate_limit: {unlimited: true}
";

#[test]
fn envoy_config_loads_with_every_envoy_field() {
    let set = parse(ENVOY);
    assert_eq!(set.domains().collect::<Vec<_>>(), ["api"]);
    assert_eq!(set.rules().count(), 6);
    let rule = set.named("api", "login_ip").expect("named rule");
    assert_eq!(rule.requests_per_unit, 5);
    assert_eq!(rule.unit, Unit::Hour);
    assert!(rule.shadow_mode && rule.detailed_metric);
    assert_eq!(rule.replaces, ["vip"]);
    assert_eq!((rule.file.as_str(), rule.line), ("rules.yaml", 26));
    assert_eq!(rule.id, "api|path=/login|ip");
    // Envoy configs behave as in Envoy: fixed window, exact, regional, open.
    let params = rule.params.as_ref().expect("params");
    assert_eq!(params.algorithm(), Algorithm::FixedWindow);
    assert_eq!(params.period(), Duration::from_secs(3600));
    assert_eq!(params.limit(), 5);
    assert_eq!(
        (rule.fail_mode, rule.scope, rule.accuracy, rule.split),
        (FailMode::Open, Scope::Region, Accuracy::Exact, 1)
    );
    let free = set.resolve("api", &[("free", "x")]).and_then(|r| r.rule);
    let free = free.expect("unlimited rule matches");
    assert!(free.unlimited && free.params.is_none());
}

#[test]
fn exact_value_beats_glob_beats_key_only() {
    let set = parse(ENVOY);
    assert_eq!(
        limit(&set, "api", &[("user", "vip")]),
        Some((100, Unit::Minute))
    );
    assert_eq!(
        limit(&set, "api", &[("user", "bot7")]),
        Some((1, Unit::Second))
    );
    // Two globs match "bot": the first in file order wins.
    assert_eq!(
        limit(&set, "api", &[("user", "bot")]),
        Some((1, Unit::Second))
    );
    assert_eq!(
        limit(&set, "api", &[("user", "bx")]),
        Some((2, Unit::Second))
    );
    assert_eq!(
        limit(&set, "api", &[("user", "alice")]),
        Some((20, Unit::Minute))
    );
}

#[test]
fn path_must_end_at_a_node() {
    let set = parse(ENVOY);
    let login = [("path", "/login"), ("ip", "10.0.0.1")];
    assert_eq!(limit(&set, "api", &login), Some((5, Unit::Hour)));
    // A prefix with a limit does not count for a longer path.
    assert!(
        set.resolve("api", &[("user", "vip"), ("ip", "1")])
            .is_none()
    );
    assert!(set.resolve("api", &[("path", "/other")]).is_none());
    assert!(set.resolve("api", &[("nokey", "x")]).is_none());
    assert!(set.resolve("api", &[]).is_none());
    assert!(set.resolve("other", &[("user", "vip")]).is_none());
}

#[test]
fn node_without_rate_limit_is_an_allow_list() {
    let set = parse(ENVOY);
    let admin = set.resolve("api", &[("user", "admin")]).expect("resolves");
    assert!(admin.rule.is_none());
    assert_eq!(admin.counter_key, "user=admin");
    // The intermediate node /login has no limit of its own.
    let login = set.resolve("api", &[("path", "/login")]).expect("resolves");
    assert!(login.rule.is_none());
}

#[test]
fn globs_match_any_run_including_none() {
    let g = |p: &str| Glob::new(p).expect("has a star");
    assert!(Glob::new("plain").is_none());
    assert!(g("foo*").matches("foo") && g("foo*").matches("foobar"));
    assert!(!g("foo*").matches("fo") && !g("foo*").matches("xfoo"));
    assert!(g("*bar").matches("bar") && g("*bar").matches("xbar") && !g("*bar").matches("barx"));
    assert!(g("bar*b").matches("barb") && g("bar*b").matches("barab"));
    assert!(!g("bar*b").matches("bara") && !g("bar*b").matches("xbarb"));
    // Prefix and suffix may not overlap.
    assert!(!g("ab*ba").matches("aba"));
    assert!(g("foo*bar*baz").matches("foobarbaz") && g("foo*bar*baz").matches("foo1bar2baz"));
    assert!(!g("foo*bar*baz").matches("foobazbar"));
    assert!(g("*").matches("") && g("**").matches("x") && g("a**b").matches("ab"));
}

#[test]
fn meridian_fields_build_params() {
    let set = parse(
        "\
domain: d
descriptors:
  - key: a
    algorithm: token_bucket
    burst: 50
    period: 1500ms
    fail_mode: closed
    scope: global
    partition: available
    fallback: 0.25
    accuracy: approximate
    max_batch: 10
    split: 4
    rate_limit: {requests_per_unit: 10}
  - key: b
    algorithm: sliding_window_counter
    period: 1m
    fail_mode: local
    accuracy: approximate
    sync_interval: 20ms
    rate_limit: {requests_per_unit: 100}
  - key: c
    algorithm: leaky_bucket
    rate_limit: {unit: week, requests_per_unit: 7}
",
    );
    let a = set
        .resolve("d", &[("a", "x")])
        .and_then(|r| r.rule)
        .expect("a");
    let p = a.params.as_ref().expect("params");
    assert_eq!(
        (p.algorithm(), p.limit(), p.burst(), p.period()),
        (Algorithm::TokenBucket, 10, 50, Duration::from_millis(1500))
    );
    assert_eq!(a.unit, Unit::Custom(Duration::from_millis(1500)));
    assert_eq!(
        (a.fail_mode, a.scope, a.partition, a.fallback, a.split),
        (
            FailMode::Closed,
            Scope::Global,
            Partition::Available,
            0.25,
            4
        )
    );
    let default_sync = Duration::from_millis(50);
    assert_eq!(
        a.accuracy,
        Accuracy::Approximate {
            sync_interval: default_sync,
            max_batch: Some(10)
        }
    );
    let b = set
        .resolve("d", &[("b", "x")])
        .and_then(|r| r.rule)
        .expect("b");
    // A period equal to a standard unit is that unit.
    assert_eq!(b.unit, Unit::Minute);
    assert_eq!(b.fail_mode, FailMode::Local);
    assert_eq!(
        b.accuracy,
        Accuracy::Approximate {
            sync_interval: Duration::from_millis(20),
            max_batch: None
        }
    );
    let c = set
        .resolve("d", &[("c", "x")])
        .and_then(|r| r.rule)
        .expect("c");
    let p = c.params.as_ref().expect("params");
    assert_eq!((p.algorithm(), p.burst()), (Algorithm::LeakyBucket, 7));
    assert_eq!(p.period(), Duration::from_secs(7 * 86_400));
}

#[test]
fn units_are_case_insensitive_with_envoy_lengths() {
    for (name, unit, secs) in [
        ("second", Unit::Second, 1),
        ("MINUTE", Unit::Minute, 60),
        ("Hour", Unit::Hour, 3600),
        ("day", Unit::Day, 86_400),
        ("week", Unit::Week, 604_800),
        ("month", Unit::Month, 30 * 86_400),
        ("YEAR", Unit::Year, 365 * 86_400),
    ] {
        let set = parse(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {name}, requests_per_unit: 3}}\n"
        ));
        let rule = set
            .resolve("d", &[("k", "v")])
            .and_then(|r| r.rule)
            .expect(name);
        assert_eq!(rule.unit, unit);
        let period = rule.params.as_ref().map(|p| p.period());
        assert_eq!(period, Some(Duration::from_secs(secs)), "{name}");
    }
}

#[test]
fn rejects_envoy_mistakes_with_line_and_field() {
    let d = "domain: d\ndescriptors:\n";
    rejects("descriptors: []\n", 1, "domain", "missing");
    rejects("domain: ''\n", 1, "domain", "empty");
    rejects("domain: [a]\n", 1, "domain", "single value");
    rejects(&format!("{d}  - value: v\n"), 3, "key", "missing");
    rejects(&format!("{d}  - key: ''\n"), 3, "key", "empty");
    rejects(&format!("{d}  - a\n"), 3, "descriptors", "map");
    rejects("domain: d\ndescriptors: 5\n", 2, "descriptors", "list");
    rejects("domain: d\nextra: 1\n", 2, "extra", "unknown");
    rejects(
        &format!("{d}  - key: k\n    ratelimit: {{unit: day}}\n"),
        4,
        "ratelimit",
        "unknown field",
    );
    rejects(
        &format!("{d}  - key: k\n    rate_limit: {{unit: day, requests_per_unit: 1, per: 2}}\n"),
        4,
        "per",
        "unknown field in rate_limit",
    );
    rejects(
        &format!("{d}  - key: k1\n    value: v\n  - key: k1\n    value: v\n"),
        5,
        "key",
        "duplicate k1",
    );
    rejects(
        &format!("{d}  - key: k1\n  - key: k1\n"),
        4,
        "key",
        "duplicate k1",
    );
    rejects(
        &format!("{d}  - key: k1\n    value: a*\n  - key: k1\n    value: a*\n"),
        5,
        "key",
        "duplicate k1",
    );
    rejects("domain: d\n  bad: [\n", 2, "yaml", "not valid yaml");
    rejects("domain: d\ndomain: e\n", 2, "yaml", "twice");
    rejects(
        &format!("{d}  - key: k\n    value: *v\n"),
        4,
        "yaml",
        "quoted",
    );
    rejects("- a\n", 1, "yaml", "top level");
    rejects(
        "domain: d\n---\ndomain: e\n",
        2,
        "yaml",
        "second YAML document",
    );
    rejects("domain: d\n!!str a: b\n", 2, "yaml", "tags");
    // A leading marker is one document.
    assert_eq!(parse("# c\n---\ndomain: d\n").domains().count(), 1);
}

#[test]
fn rejects_bad_limits_with_line_and_field() {
    let d = "domain: d\ndescriptors:\n  - key: k\n";
    let rl = |extra: &str, rate_limit: &str| format!("{d}{extra}    rate_limit: {rate_limit}\n");
    rejects(
        &rl("", "{unit: fortnight, requests_per_unit: 1}"),
        4,
        "unit",
        "unknown unit",
    );
    rejects(&rl("", "{requests_per_unit: 1}"), 4, "unit", "missing");
    rejects(&rl("", "{unit: day}"), 4, "requests_per_unit", "missing");
    rejects(
        &rl("    scope: global\n", "{unit: day, requests_per_unit: 0}"),
        4,
        "scope",
        "nothing to allocate",
    );
    rejects(
        &rl("", "{unit: day, requests_per_unit: -3}"),
        4,
        "requests_per_unit",
        "0 (deny every request) or more",
    );
    rejects(
        &rl("", "{unit: day, requests_per_unit: ten}"),
        4,
        "requests_per_unit",
        "whole number",
    );
    rejects(
        &rl("", "{unlimited: true, unit: day}"),
        4,
        "unit",
        "unlimited",
    );
    rejects(
        &rl("", "{unlimited: maybe}"),
        4,
        "unlimited",
        "true or false",
    );
    rejects(&rl("", "[1]"), 4, "rate_limit", "map");
    rejects(
        &rl(
            "",
            "{unit: day, requests_per_unit: 1, name: me, replaces: [{name: me}]}",
        ),
        4,
        "replaces",
        "itself",
    );
    rejects(
        &rl(
            "",
            "{unit: day, requests_per_unit: 1, replaces: [{name: }]}",
        ),
        4,
        "replaces",
        "empty",
    );
    rejects(
        &rl("", "{unit: day, requests_per_unit: 1, replaces: x}"),
        4,
        "replaces",
        "list",
    );
    rejects(
        &rl("    algorithm: gcra\n", "{unit: day, requests_per_unit: 1}"),
        4,
        "algorithm",
        "unknown",
    );
    rejects(
        &rl("    burst: 5\n", "{unit: day, requests_per_unit: 1}"),
        4,
        "burst",
        "no burst",
    );
    rejects(
        &rl(
            "    algorithm: token_bucket\n    burst: 0\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        5,
        "burst",
        "at least 1",
    );
    rejects(
        &rl("    period: 5x\n", "{requests_per_unit: 1}"),
        4,
        "period",
        "unknown unit",
    );
    rejects(
        &rl("    period: 1500us\n", "{requests_per_unit: 1}"),
        4,
        "period",
        "unknown unit",
    );
    rejects(
        &rl("    period: 90s\n", "{unit: minute, requests_per_unit: 1}"),
        4,
        "period",
        "disagrees",
    );
    rejects(
        &rl(
            "    algorithm: sliding_window_log\n",
            "{unit: day, requests_per_unit: 1000000}",
        ),
        5,
        "requests_per_unit",
        "at most 100000",
    );
    rejects(
        &rl(
            "    fail_mode: sometimes\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        4,
        "fail_mode",
        "open, closed, local",
    );
    rejects(
        &rl("    scope: planet\n", "{unit: day, requests_per_unit: 1}"),
        4,
        "scope",
        "region, global",
    );
    rejects(
        &rl(
            "    accuracy: roughly\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        4,
        "accuracy",
        "exact, approximate",
    );
    rejects(
        &rl(
            "    algorithm: sliding_window_log\n    accuracy: approximate\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        5,
        "accuracy",
        "only available",
    );
    rejects(
        &rl(
            "    sync_interval: 10ms\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        4,
        "sync_interval",
        "approximate",
    );
    rejects(
        &rl("    max_batch: 5\n", "{unit: day, requests_per_unit: 1}"),
        4,
        "max_batch",
        "approximate",
    );
    rejects(
        &rl(
            "    accuracy: approximate\n    max_batch: 0\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        5,
        "max_batch",
        "at least 1",
    );
    rejects(
        &rl("    split: 0\n", "{unit: day, requests_per_unit: 10}"),
        4,
        "split",
        "1 to 1024",
    );
    rejects(
        &rl("    split: 1025\n", "{unit: day, requests_per_unit: 5000}"),
        4,
        "split",
        "1 to 1024",
    );
    rejects(
        &rl("    split: 20\n", "{unit: day, requests_per_unit: 10}"),
        4,
        "split",
        "less than one",
    );
    rejects(
        &rl(
            "    partition: strict\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        4,
        "partition",
        "scope: global",
    );
    rejects(
        &rl("    fallback: 0.1\n", "{unit: day, requests_per_unit: 1}"),
        4,
        "fallback",
        "scope: global",
    );
    rejects(
        &rl(
            "    scope: global\n    fallback: 1.5\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        5,
        "fallback",
        "0.0 to 1.0",
    );
    rejects(
        &rl(
            "    fallback_hold: 30s\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        4,
        "fallback_hold",
        "scope: global",
    );
    rejects(
        &rl(
            "    scope: global\n    fallback_hold: 8d\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        5,
        "fallback_hold",
        "longer than the most allowed, 7d",
    );
    rejects(
        &rl(
            "    scope: global\n    fallback_hold: soon\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        5,
        "fallback_hold",
        "expected a duration",
    );
    rejects(
        &rl(
            "    shadow_mode: yes please\n",
            "{unit: day, requests_per_unit: 1}",
        ),
        4,
        "shadow_mode",
        "true or false",
    );
    // Meridian's fields need a limit to shape.
    rejects(
        &format!("{d}    algorithm: token_bucket\n"),
        4,
        "algorithm",
        "no rate_limit",
    );
    rejects(
        &rl("    period: 1m\n", "{unlimited: true}"),
        4,
        "period",
        "unlimited",
    );
    let long = "v".repeat(600);
    rejects(
        &format!("{d}    value: {long}\n    rate_limit: {{unit: day, requests_per_unit: 1}}\n"),
        3,
        "descriptors",
        "at most 512",
    );
}

#[test]
fn duplicate_names_are_allowed_and_ambiguous_by_name() {
    let text = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 1, name: n}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 2, name: n}
  - key: c
    rate_limit: {unit: day, requests_per_unit: 3, name: m, replaces: [{name: n}]}
";
    let set = parse(text);
    let e = set.by_name("d", "n").expect_err("ambiguous");
    assert_eq!(e.places, ["rules.yaml:4", "rules.yaml:6"]);
    assert!(e.to_string().contains("by its descriptor"), "{e}");
    assert!(set.named("d", "n").is_none());
    assert_eq!(
        set.by_name("d", "m")
            .expect("unique")
            .map(|r| r.requests_per_unit),
        Some(3)
    );
    assert!(set.by_name("d", "x").expect("unknown").is_none());
    // Each is still reached by its path.
    let b = set
        .resolve("d", &[("b", "1")])
        .and_then(|r| r.rule)
        .expect("b");
    assert_eq!(b.requests_per_unit, 2);
}

#[test]
fn zero_requests_per_unit_denies_all_without_params() {
    let set = parse(
        "domain: d\ndescriptors:\n  - key: ip\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
    );
    let rule = set
        .resolve("d", &[("ip", "50.0.0.5")])
        .and_then(|r| r.rule)
        .expect("rule");
    assert!(rule.denies_all() && rule.params.is_none() && !rule.unlimited);
    assert_eq!(rule.unit, Unit::Second);
}

#[test]
fn share_threshold_globs_share_one_counter_and_others_count_each_value() {
    let set = parse(
        "domain: d
descriptors:
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /img/*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: team
    value: a*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
",
    );
    let key = |entries: &[(&str, &str)]| set.resolve("d", entries).expect("resolved").counter_key;
    assert_eq!(key(&[("path", "/api/a")]), key(&[("path", "/api/b")]));
    assert_eq!(key(&[("path", "/api/a")]), "path=/api/*");
    assert_ne!(key(&[("path", "/img/a")]), key(&[("path", "/img/b")]));
    // Below a shared level, the nested key still counts each of its values.
    assert_eq!(
        key(&[("team", "ab"), ("user", "u")]),
        key(&[("team", "ax"), ("user", "u")])
    );
    assert_ne!(
        key(&[("team", "ab"), ("user", "u")]),
        key(&[("team", "ab"), ("user", "v")])
    );
}

#[test]
fn metric_keys_follow_detailed_metric_and_value_to_metric() {
    let set = parse(
        "domain: d
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
",
    );
    let metric = |entries: &[(&str, &str)]| set.resolve("d", entries).expect("resolved").metric_key;
    assert_eq!(
        metric(&[("key1", "unspecified")]).as_deref(),
        Some("key1_unspecified")
    );
    // No detailed_metric on the exact node: its own name, no value series.
    assert_eq!(metric(&[("key1", "value1")]), None);
    assert_eq!(
        metric(&[("route", "api"), ("method", "GET")]).as_deref(),
        Some("route_api.method_GET")
    );
    assert_eq!(
        metric(&[("route", "api"), ("user", "bob")]).as_deref(),
        Some("route_api.user")
    );
    assert_eq!(metric(&[("plain", "x")]), None);
}

#[test]
fn every_error_in_every_file_is_reported() {
    let bad1 = file(
        "one.yaml",
        "domain: d1\ndescriptors:\n  - key: a\n    ratelimit: 1\n  - value: x\n",
    );
    let bad2 = file(
        "two.yaml",
        "domain: d2\ndescriptors:\n  - key: a\n    rate_limit: {unit: aeon, requests_per_unit: 0}\n",
    );
    let RuleErrors(list) = RuleSet::parse(&[bad1, bad2]).expect_err("invalid");
    let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown
            .iter()
            .map(|s| s.split(": ").next().unwrap_or(""))
            .collect::<Vec<_>>(),
        ["one.yaml:4", "one.yaml:5", "two.yaml:4"],
        "{shown:#?}"
    );
    assert!(
        shown[0].starts_with("one.yaml:4: ratelimit: unknown field"),
        "{}",
        shown[0]
    );
    assert!(
        shown[1].starts_with("one.yaml:5: key: missing"),
        "{}",
        shown[1]
    );
    // Errors nested under an invalid node are still found.
    let nested = "domain: d\ndescriptors:\n  - value: v\n    descriptors:\n      - key: k\n        bogus: 1\n";
    let list = errors(nested);
    assert_eq!(
        list.iter()
            .map(|e| (e.line, e.field.as_str()))
            .collect::<Vec<_>>(),
        [(3, "key"), (6, "bogus")]
    );
}

#[test]
fn a_domain_in_two_files_is_rejected() {
    let a = file("a.yaml", "domain: d\n");
    let b = file("b.yaml", "# other\ndomain: d\n");
    let RuleErrors(list) = RuleSet::parse(&[a.clone(), b]).expect_err("duplicate");
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].file.as_str(), list[0].line), ("b.yaml", 2));
    assert!(list[0].reason.contains("duplicate domain") && list[0].reason.contains("a.yaml:1"));
    let c = file("c.yaml", "domain: e\n");
    let set = RuleSet::parse(&[a, c]).expect("distinct domains");
    assert_eq!(set.domains().collect::<Vec<_>>(), ["d", "e"]);
    assert_eq!(set.file_count(), 2);
}

#[test]
fn rule_ids_are_escaped_and_stable_across_unrelated_edits() {
    let base = "\
domain: a|b
descriptors:
  - key: k=1
    value: v%|*
    rate_limit: {unit: day, requests_per_unit: 1}
";
    let set = parse(base);
    let id = |set: &RuleSet| {
        set.resolve("a|b", &[("k=1", "v%|x")])
            .and_then(|r| r.rule)
            .map(|r| r.id.clone())
    };
    assert_eq!(id(&set).as_deref(), Some("a%7Cb|k%3D1=v%25%7C*"));
    let edited = format!(
        "{}  - key: other\n    rate_limit: {{unit: day, requests_per_unit: 9}}\n",
        base.replace("domain: a|b\n", "# comment\ndomain: a|b\n")
    );
    assert_eq!(id(&parse(&edited)), id(&set));
    let set = parse(&edited);
    assert!(set.rule("a%7Cb|other").is_some());
    let ids: std::collections::HashSet<&str> = set.rules().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), set.rules().count(), "ids are unique");
}

#[test]
fn counter_key_escapes_separators() {
    assert_eq!(counter_key(&[("a", "1"), ("b", "2")]), "a=1|b=2");
    assert_eq!(counter_key(&[("a=1|b", "2")]), "a%3D1%7Cb=2");
    assert_eq!(counter_key(&[("%", "")]), "%25=");
    assert_eq!(counter_key(&[]), "");
}

fn borrow(e: &[(String, String)]) -> Vec<(&str, &str)> {
    e.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
    let part = "[a-c=|%]{0,4}";
    prop::collection::vec((part, part), 0..4)
}

proptest! {
    /// Different entry lists never share a counter.
    #[test]
    fn counter_keys_are_injective(a in entries(), b in entries()) {
        let (ka, kb) = (counter_key(&borrow(&a)), counter_key(&borrow(&b)));
        prop_assert_eq!(ka == kb, a == b, "{:?} {:?} -> {} {}", a, b, ka, kb);
    }

    /// The capacity computed up front is exact, so building the key never reallocates.
    #[test]
    fn counter_key_capacity_is_exact(a in entries()) {
        let e: Vec<(&str, &str)> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let key = counter_key(&e);
        let expected: usize = e.iter().map(|(k, v)| escaped_len(k) + escaped_len(v) + 2).sum();
        prop_assert_eq!(key.len() + usize::from(!e.is_empty()), expected);
    }

    /// Glob matching agrees with a brute-force reference.
    #[test]
    fn glob_matches_like_a_reference(pattern in "[ab*]{1,6}", s in "[ab]{0,6}") {
        fn reference(p: &[u8], s: &[u8]) -> bool {
            match p.split_first() {
                None => s.is_empty(),
                Some((b'*', rest)) => (0..=s.len()).any(|i| reference(rest, &s[i..])),
                Some((c, rest)) => s.first() == Some(c) && reference(rest, &s[1..]),
            }
        }
        let expected = reference(pattern.as_bytes(), s.as_bytes());
        let got = match Glob::new(&pattern) {
            Some(g) => g.matches(&s),
            None => pattern == s,
        };
        prop_assert_eq!(got, expected);
    }
}

#[test]
fn rule_set_can_be_shared_between_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<RuleSet>();
    shared::<Arc<Rule>>();
}

#[test]
fn shadowed_set_counts_apart_and_never_enforces() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: n, unit: minute, requests_per_unit: 1}\n    descriptors:\n      - key: sub\n        value: v*\n        rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let set = RuleSet::parse(&[RuleFile {
        name: "f.yaml".into(),
        text: yaml.into(),
    }])
    .expect("valid");
    let shadow = set.shadowed();
    let top = shadow
        .resolve("d", &[("k", "x")])
        .and_then(|r| r.rule)
        .expect("match");
    assert!(top.shadow_mode);
    assert_eq!(
        top.id,
        format!("shadow/{}", set.named("d", "n").expect("named").id)
    );
    let nested = shadow
        .resolve("d", &[("k", "x"), ("sub", "value")])
        .and_then(|r| r.rule)
        .expect("nested glob match");
    assert!(nested.shadow_mode && nested.id.starts_with("shadow/"));
    assert!(shadow.named("d", "n").is_some_and(|r| r.shadow_mode));
    assert!(shadow.rules().all(|r| r.shadow_mode));
    // The original is untouched.
    assert!(
        set.rules()
            .all(|r| !r.shadow_mode && !r.id.starts_with("shadow/"))
    );
}

/// Scope, partition, fallback and accuracy beside `limits:` apply to every
/// limit; a global rule's limits are allocated each under its own id.
#[test]
fn limits_take_scope_and_accuracy_for_every_limit() {
    let set = parse(
        "domain: d
descriptors:
  - key: customer
    scope: global
    partition: available
    fallback: 0.25
    fallback_hold: 2m
    accuracy: approximate
    max_batch: 3
    limits:
      - {algorithm: token_bucket, burst: 20, rate_limit: {unit: second, requests_per_unit: 10}}
      - {algorithm: sliding_window_counter, rate_limit: {unit: minute, requests_per_unit: 1000}}
",
    );
    let rule = set.rules().next().expect("one rule");
    assert_eq!(rule.scope, Scope::Global);
    assert_eq!(rule.partition, Partition::Available);
    assert_eq!(rule.fallback, 0.25);
    assert_eq!(rule.fallback_hold, std::time::Duration::from_secs(120));
    assert!(matches!(
        rule.accuracy,
        Accuracy::Approximate {
            max_batch: Some(3),
            ..
        }
    ));
    assert_eq!(rule.limit_id(0), "d|customer");
    assert_eq!(rule.limit_id(1), "d|customer%limit2");
    let (found, index) = set.limit_of("d|customer%limit2").expect("limit 2");
    assert_eq!((found.id.as_str(), index), ("d|customer", 1));
    assert!(set.limit_of("d|customer%limit3").is_none());
    assert_eq!(
        crate::rules::split_limit_id("d|k=a%25limit2"),
        ("d|k=a%25limit2", 0)
    );
}

#[test]
fn limits_lists_several_limits_on_one_descriptor() {
    let set = parse(
        "domain: d
descriptors:
  - key: customer
    fail_mode: closed
    limits:
      - {algorithm: token_bucket, burst: 20, rate_limit: {unit: second, requests_per_unit: 10, name: per_customer}}
      - {algorithm: sliding_window_counter, rate_limit: {unit: minute, requests_per_unit: 1000}}
",
    );
    let rule = set
        .resolve("d", &[("customer", "42")])
        .and_then(|r| r.rule)
        .expect("rule");
    let first = rule.params.as_ref().expect("params");
    assert_eq!(
        (first.algorithm(), first.burst()),
        (Algorithm::TokenBucket, 20)
    );
    assert_eq!(rule.also.len(), 1);
    assert_eq!(rule.also[0].0, Unit::Minute);
    assert_eq!(rule.also[0].1.algorithm(), Algorithm::SlidingWindowCounter);
    assert_eq!(
        (rule.unit_of(0), rule.unit_of(1)),
        (Unit::Second, Unit::Minute)
    );
    assert_eq!(rule.fail_mode, FailMode::Closed);
    assert_eq!(rule.name.as_deref(), Some("per_customer"));

    let d = "domain: d\ndescriptors:\n  - key: k\n";
    let two = "    limits:\n      - {rate_limit: {unit: second, requests_per_unit: 1}}\n      - {rate_limit: {unit: minute, requests_per_unit: 5}}\n";
    rejects(
        &format!("{d}    algorithm: token_bucket\n{two}"),
        4,
        "algorithm",
        "belongs in each entry",
    );
    rejects(
        &format!("{d}    split: 2\n{two}"),
        4,
        "split",
        "share one key",
    );
    rejects(
        &format!(
            "{d}    accuracy: approximate\n    limits:\n      - {{rate_limit: {{unit: second, requests_per_unit: 1}}}}\n      - {{algorithm: sliding_window_log, rate_limit: {{unit: minute, requests_per_unit: 5}}}}\n"
        ),
        4,
        "accuracy",
        "not sliding_window_log (limit 2)",
    );
    rejects(
        &format!("{d}    rate_limit: {{unit: second, requests_per_unit: 1}}\n{two}"),
        5,
        "limits",
        "not both",
    );
    rejects(
        &format!(
            "{d}    limits:\n      - {{rate_limit: {{unit: second, requests_per_unit: 1}}}}\n"
        ),
        4,
        "limits",
        "at least two",
    );
    rejects(
        &format!(
            "{d}    limits:\n      - {{rate_limit: {{unit: second, requests_per_unit: 0}}}}\n      - {{rate_limit: {{unit: minute, requests_per_unit: 5}}}}\n"
        ),
        5,
        "rate_limit",
        "1 or more",
    );
}

/// `confirm_ban` (issue 28) sits beside a limited `rate_limit` or a `limits`
/// list and is carried on the rule; the limiter enforces the rule the same
/// either way, so it is refused where there is no limit to confirm.
#[test]
fn confirm_ban_is_read_beside_a_limit_and_refused_elsewhere() {
    let d = "domain: d\ndescriptors:\n  - key: k\n";
    let ban = parse(&format!(
        "{d}    confirm_ban: true\n    rate_limit: {{unit: second, requests_per_unit: 0}}\n"
    ));
    let rule = ban.rules().next().expect("one rule");
    assert!(rule.confirm_ban && rule.denies_all());
    let limits = parse(&format!(
        "{d}    confirm_ban: true\n    limits:\n      - {{rate_limit: {{unit: second, requests_per_unit: 1}}}}\n      - {{rate_limit: {{unit: year, requests_per_unit: 1}}}}\n"
    ));
    assert!(limits.rules().next().is_some_and(|r| r.confirm_ban));
    let plain = parse(&format!(
        "{d}    rate_limit: {{unit: second, requests_per_unit: 0}}\n"
    ));
    assert!(plain.rules().next().is_some_and(|r| !r.confirm_ban));
    rejects(
        &format!("{d}    confirm_ban: true\n    rate_limit: {{unlimited: true}}\n"),
        4,
        "confirm_ban",
        "only allowed beside a rate_limit with a limit",
    );
    rejects(
        &format!("{d}    confirm_ban: true\n"),
        4,
        "confirm_ban",
        "no rate_limit",
    );
    rejects(
        &format!(
            "{d}    confirm_ban: please\n    rate_limit: {{unit: second, requests_per_unit: 0}}\n"
        ),
        4,
        "confirm_ban",
        "true or false",
    );
}
