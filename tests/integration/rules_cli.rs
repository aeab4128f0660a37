//! `meridian rules check|explain` as an operator runs them: the built binary
//! on rule files this test writes into its own temp dir.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tempfile::TempDir;

const API: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: user
    value: vip*
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100, name: vip}
  - key: user
    value: admin
  - key: path
    value: /login
    descriptors:
      - key: ip
        algorithm: token_bucket
        burst: 10
        period: 90s
        rate_limit:
          requests_per_unit: 5
          name: login_ip
  - key: free
    rate_limit: {unlimited: true}
";

const BILLING: &str = "\
domain: billing
descriptors:
  - key: customer
    rate_limit: {unit: day, requests_per_unit: 1000}
";

struct Dir(TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().expect("temp dir"))
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).expect("write rule file");
        path
    }
}

fn meridian(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(args)
        .output()
        .expect("run meridian")
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn explain_json(files: &[&Path], domain: &str, entries: &[&str]) -> Value {
    let mut args = vec!["rules", "explain"];
    args.extend(files.iter().map(|f| p(f)));
    args.extend(["--domain", domain, "--json"]);
    args.extend(entries);
    let out = meridian(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "exactly one JSON line: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn check_valid_files_prints_a_summary_and_exits_0() {
    let dir = Dir::new();
    let api = dir.write("api.yaml", API);
    let billing = dir.write("billing.yaml", BILLING);
    let out = meridian(&["rules", "check", p(&api), p(&billing)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ok: 2 files, 2 domains, 5 rules");
}

#[test]
fn check_prints_every_error_with_file_and_line_and_exits_2() {
    let dir = Dir::new();
    let bad = dir.write(
        "bad.yaml",
        "domain: api\ndescriptors:\n  - key: user\n    ratelimit: {unit: day}\n  - value: x\n    rate_limit: {unit: fortnight, requests_per_unit: -1}\n",
    );
    let also_bad = dir.write("also_bad.yaml", "descriptors: []\n");
    let out = meridian(&["rules", "check", p(&bad), p(&also_bad)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    let expected = [
        format!("{}:4: ratelimit: unknown field", p(&bad)),
        format!("{}:5: key: missing", p(&bad)),
        format!("{}:6: unit: unknown unit \"fortnight\"", p(&bad)),
        format!(
            "{}:6: requests_per_unit: must be 0 (deny every request) or more",
            p(&bad)
        ),
        format!("{}:1: domain: missing", p(&also_bad)),
    ];
    assert_eq!(lines.len(), expected.len(), "{err}");
    for (line, want) in lines.iter().zip(&expected) {
        assert!(
            line.starts_with(want.as_str()),
            "{line:?} should start with {want:?}"
        );
    }
    assert!(stdout(&out).is_empty());
}

#[test]
fn check_rejects_a_domain_defined_in_two_files() {
    let dir = Dir::new();
    let one = dir.write("one.yaml", BILLING);
    let two = dir.write("two.yaml", BILLING);
    let out = meridian(&["rules", "check", p(&one), p(&two)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("{}:1: domain: duplicate domain", p(&two))),
        "{err}"
    );
}

#[test]
fn check_rejects_bad_yaml_and_unreadable_files() {
    let dir = Dir::new();
    let broken = dir.write("broken.yaml", "domain: api\ndescriptors: [\n");
    let out = meridian(&["rules", "check", p(&broken)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(": yaml: not valid YAML"),
        "{}",
        stderr(&out)
    );

    let missing = dir.0.path().join("missing.yaml");
    let out = meridian(&["rules", "check", p(&missing)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot read"), "{}", stderr(&out));
}

#[test]
fn explain_json_reports_the_matched_rule() {
    let dir = Dir::new();
    let api = dir.write("api.yaml", API);
    let v = explain_json(&[&api], "api", &["user=vip-7"]);
    assert_eq!(v["matched"], true);
    assert_eq!(v["unlimited"], false);
    assert_eq!(v["requests_per_unit"], 100);
    assert_eq!(v["unit"], "MINUTE");
    assert_eq!(v["period_ms"], 60_000);
    assert_eq!(v["name"], "vip");
    assert_eq!(v["shadow_mode"], true);
    assert_eq!(v["algorithm"], "fixed_window");
    assert_eq!(v["rule_id"], "api|user=vip*");
    assert_eq!(v["counter_key"], "user=vip-7");
    assert_eq!(v["file"], p(&api));
    assert_eq!(v["line"], 8);

    let v = explain_json(&[&api], "api", &["path=/login", "ip=10.0.0.1"]);
    assert_eq!(
        (&v["requests_per_unit"], &v["unit"], &v["period_ms"]),
        (
            &Value::from(5),
            &Value::from("CUSTOM"),
            &Value::from(90_000)
        )
    );
    assert_eq!(
        (&v["algorithm"], &v["burst"]),
        (&Value::from("token_bucket"), &Value::from(10))
    );
    assert_eq!(v["shadow_mode"], false);
    assert_eq!(v["name"], "login_ip");

    let v = explain_json(&[&api], "api", &["free=anything"]);
    assert_eq!(
        (&v["matched"], &v["unlimited"]),
        (&Value::Bool(true), &Value::Bool(true))
    );
}

#[test]
fn explain_json_distinguishes_allow_list_from_no_match() {
    let dir = Dir::new();
    let api = dir.write("api.yaml", API);
    let billing = dir.write("billing.yaml", BILLING);
    let v = explain_json(&[&api, &billing], "api", &["user=admin"]);
    assert_eq!(
        (&v["matched"], &v["allow_listed"]),
        (&Value::Bool(false), &Value::Bool(true))
    );
    // A path longer than the tree matches nothing.
    let v = explain_json(&[&api, &billing], "api", &["user=bob", "extra=1"]);
    assert_eq!(
        (&v["matched"], &v["allow_listed"]),
        (&Value::Bool(false), &Value::Bool(false))
    );
    let v = explain_json(&[&api, &billing], "nope", &["user=bob"]);
    assert_eq!(
        (&v["matched"], &v["domain_found"]),
        (&Value::Bool(false), &Value::Bool(false))
    );
    let v = explain_json(&[&api, &billing], "billing", &["customer=c=1"]);
    assert_eq!(v["requests_per_unit"], 1000);
    assert_eq!(v["counter_key"], "customer=c%3D1");
}

#[test]
fn explain_without_json_is_readable() {
    let dir = Dir::new();
    let api = dir.write("api.yaml", API);
    let out = meridian(&["rules", "explain", p(&api), "--domain", "api", "user=vip1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("100 per 1m (fixed_window"), "{text}");
    assert!(text.contains("SHADOW MODE"), "{text}");
    assert!(text.contains(&format!("({}:8)", p(&api))), "{text}");
    let out = meridian(&["rules", "explain", p(&api), "--domain", "api", "user=admin"]);
    assert!(stdout(&out).contains("allow-listed"), "{}", stdout(&out));
}

#[test]
fn explain_on_invalid_files_prints_errors_and_exits_2() {
    let dir = Dir::new();
    let bad = dir.write(
        "bad.yaml",
        "domain: api\ndescriptors:\n  - key: a\n    unknown_thing: 1\n",
    );
    let out = meridian(&[
        "rules",
        "explain",
        p(&bad),
        "--domain",
        "api",
        "--json",
        "a=1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
    assert!(
        stderr(&out).starts_with(&format!("{}:4: unknown_thing: unknown field", p(&bad))),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_explains_both_commands() {
    let out = meridian(&["rules", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("check") && text.contains("explain"), "{text}");
    let out = meridian(&["rules", "explain", "--help"]);
    let text = stdout(&out);
    assert!(
        text.contains("KEY=VALUE") && text.contains("--json"),
        "{text}"
    );
}

#[test]
fn check_refuses_deep_nesting_with_exit_2_not_a_crash() {
    let dir = Dir::new();
    for (style, text) in [
        (
            "block",
            format!("domain: api\ndescriptors:\n{}x\n", "- ".repeat(50_000)),
        ),
        (
            "flow list",
            format!("domain: api\ndescriptors: {}\n", "[".repeat(100_000)),
        ),
        (
            "flow map",
            format!("domain: api\ndescriptors: {}\n", "{a: ".repeat(25_000)),
        ),
    ] {
        let file = dir.write("deep.yaml", &text);
        let out = meridian(&["rules", "check", p(&file)]);
        assert_eq!(out.status.code(), Some(2), "{style}: {}", stderr(&out));
        let err = stderr(&out);
        let line = if style == "block" { 3 } else { 2 };
        assert!(
            err.starts_with(&format!(
                "{}:{line}: yaml: nested 65 levels deep here; at most 64",
                p(&file)
            )),
            "{style}: {err}"
        );
    }
}

/// Keys that start with a tag or an anchor, aliases and flow collections as
/// keys, and indented `---` text: 10,000 levels of each, every line two
/// deeper than the last. Before the pre-scan counted a key's map at its
/// first token, each of these overflowed the parser's stack (exit 134,
/// "has overflowed its stack"; issue 28) instead of a clear refusal.
#[test]
fn check_refuses_deep_tagged_anchored_and_flow_keys_not_a_crash() {
    let dir = Dir::new();
    let nested = |head: &str, line: &dyn Fn(usize) -> String| {
        let mut text = format!("domain: api\n{head}descriptors:\n");
        for i in 0..10_000 {
            text.push_str(&" ".repeat(2 * i + 2));
            text.push_str(&line(i));
            text.push('\n');
        }
        text
    };
    for (construct, text) in [
        ("tagged key", nested("", &|_| "!a k:".into())),
        ("anchored key", nested("", &|i| format!("&a{i} k:"))),
        ("tagged quoted key", nested("", &|_| "!a \"k\":".into())),
        ("alias key", nested("anchor: &a x\n", &|_| "*a :".into())),
        ("flow list key", nested("", &|_| "[a]:".into())),
        ("flow map key", nested("", &|_| "{a: b}:".into())),
        ("indented ---", nested("", &|_| "--- k:".into())),
    ] {
        let file = dir.write("deep.yaml", &text);
        let out = meridian(&["rules", "check", p(&file)]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{construct}: {err}");
        assert!(
            err.starts_with(&format!("{}:", p(&file)))
                && err.contains(": yaml: nested 65 levels deep here; at most 64"),
            "{construct}: {err}"
        );
    }
}
