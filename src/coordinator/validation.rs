//! The one place the coordinator validates rule files before proposing them:
//! the limiter's own parser (`RuleSet::parse`), so a version the coordinator
//! accepts is one every limiter can load; then the floor
//! (`--shared-rule-floor`), which holds back a rule that would throttle, ban
//! or near-ban a whole key space unless the file confirms it.

use serde::Serialize;

use crate::algorithm::Params;
use crate::rules::{Rule, RuleFile, RuleSet, Unit, format_duration};

/// `--shared-rule-floor`'s default, per minute: one request a second. On by
/// default because what it catches (a ban, a shared counter throttling
/// every caller, a typo'd unit) is an operator's slip that takes effect in
/// every region within seconds of a push; a rule meant that way passes with
/// `confirm_ban: true`. One a second is below what any shared counter in
/// front of a real endpoint needs; every cluster test runs at it.
pub const DEFAULT_SHARED_FLOOR_PER_MINUTE: f64 = 60.0;

/// The least a rule that counts each value apart (a key-only or glob level)
/// may allow each value, per day, while the floor is on. Not the shared
/// floor: per-value limits far below any shared floor are ordinary (OTP 5 an
/// hour per user), but under one request a day every value the rule matches
/// is as good as banned (the audit's key-only `path` rule at 1 a year).
pub const PER_VALUE_FLOOR_PER_DAY: f64 = 1.0;

/// The field a rule file sets, beside `rate_limit` (or `limits`), to confirm
/// a rule the floor would refuse.
pub const CONFIRM_FIELD: &str = "confirm_ban";

/// One problem in one rule file, as the admin API reports it (HTTP 422).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidationIssue {
    pub file: String,
    /// 1-based; 0 when the problem has no position (an empty set).
    pub line: usize,
    /// The offending field, `""` when the problem is the document itself.
    pub field: String,
    pub reason: String,
}

/// Validates a rule set given as files; returns every issue found.
///
/// `shared_floor_per_minute` (0 = off) is the least a rule whose one counter is
/// shared by every caller may allow, normalised to a minute. A token bucket or
/// leaky bucket must also admit the floor's per-second share at once: its
/// burst × 60 must reach the floor (a burst of 1 lets a crowd of callers
/// through one at a time whatever the rate, so it throttles all traffic as a
/// low limit would). While the floor is on, two more kinds of rule ban a
/// whole key space and are refused too: a limit of 0 on any rule (a ban is
/// below every floor; such a rule has no params, so the rate check alone
/// never saw it), and a rule counting each value apart that allows each less
/// than [`PER_VALUE_FLOOR_PER_DAY`]. Every one of these passes when the rule
/// carries `confirm_ban: true`: the confirmation sits on the rule it
/// confirms, so it is reviewed beside the limit, travels with the rule's
/// versions (a rollback is judged by the same file), and cannot cover a
/// sibling rule or a later rule the way a list of ids kept elsewhere in the
/// file could go stale.
pub fn validate(
    files: &[RuleFile],
    shared_floor_per_minute: f64,
) -> Result<(), Vec<ValidationIssue>> {
    let mut issues = Vec::new();
    if files.is_empty() {
        issues.push(ValidationIssue {
            file: String::new(),
            line: 0,
            field: "files".into(),
            reason: "a rule set needs at least one file".into(),
        });
    }
    match RuleSet::parse(files) {
        Err(errors) => issues.extend(errors.0.into_iter().map(|e| ValidationIssue {
            file: e.file,
            line: e.line,
            field: e.field,
            reason: e.reason,
        })),
        Ok(set) if shared_floor_per_minute > 0.0 => {
            for rule in set.rules().filter(|r| !r.unlimited && !r.confirm_ban) {
                floor_issues(rule, shared_floor_per_minute, &mut issues);
            }
        }
        Ok(_) => {}
    }
    if issues.is_empty() {
        Ok(())
    } else {
        Err(issues)
    }
}

/// What the floor finds in one unconfirmed, limited rule.
fn floor_issues(rule: &Rule, floor: f64, issues: &mut Vec<ValidationIssue>) {
    let shared = rule.counts_all_callers_together();
    let whom = if shared {
        "every caller it matches (its one counter is shared: no key-only or wildcard level)"
            .to_owned()
    } else {
        format!("every value of {}", varying_keys(rule))
    };
    let confirm =
        format!("if that is meant, add `{CONFIRM_FIELD}: true` beside its rate_limit (or limits)");
    let mut push = |field: &str, reason: String| {
        issues.push(ValidationIssue {
            file: rule.file.clone(),
            line: rule.line,
            field: field.into(),
            reason: format!("rule {}: {reason}", rule.id),
        });
    };
    if rule.denies_all() {
        push(
            "requests_per_unit",
            format!(
                "requests_per_unit: 0 denies {whom}: a ban, which is below every floor \
                 (--shared-rule-floor {floor} per minute is on); give it a limit, or {confirm}"
            ),
        );
        return;
    }
    // Every limit of a `limits:` rule: any one of them can throttle all.
    for (index, params) in rule.limits().enumerate() {
        let per = per_unit(rule.unit_of(index), params);
        if shared {
            shared_floor(params, &per, &whom, floor, &confirm, &mut push);
            continue;
        }
        let per_day = params.limit() as f64 * 86_400.0 / params.period().as_secs_f64();
        if per_day < PER_VALUE_FLOOR_PER_DAY {
            push(
                "requests_per_unit",
                format!(
                    "allows {} per {per} ({per_day:.4} a day) to {whom}: a near-ban of that \
                     key space; while --shared-rule-floor is on ({floor} per minute), a rule \
                     that counts each value apart must allow each at least \
                     {PER_VALUE_FLOOR_PER_DAY} a day. Raise the limit (and check the unit: \
                     `year` written for `second` is a ban), or {confirm}",
                    params.limit()
                ),
            );
        }
    }
}

/// A shared counter's rate and, for a bucket, its burst against the floor.
fn shared_floor(
    params: &Params,
    per: &str,
    whom: &str,
    floor: f64,
    confirm: &str,
    push: &mut impl FnMut(&str, String),
) {
    let below = |what: String| {
        format!(
            "{what}, below the floor of {floor} per minute (--shared-rule-floor) for a rule \
             that throttles {whom}; raise it, or {confirm}"
        )
    };
    let per_minute = params.limit() as f64 * 60.0 / params.period().as_secs_f64();
    if per_minute < floor {
        push(
            "requests_per_unit",
            below(format!(
                "allows {} per {per}, {per_minute:.2} per minute",
                params.limit()
            )),
        );
    }
    let burst = params.burst();
    if params.algorithm().has_burst() && (burst as f64) * 60.0 < floor {
        push(
            "burst",
            below(format!(
                "a {} with burst {burst} admits {} per minute to callers arriving together; \
                 raise burst to at least {}",
                params.algorithm(),
                burst * 60,
                (floor / 60.0).ceil()
            )),
        );
    }
}

/// The period of a limit as the file wrote it: `minute`, `year`, or a
/// `period:` such as `90s`.
fn per_unit(unit: Unit, params: &Params) -> String {
    match unit {
        Unit::Custom(_) => format_duration(params.period()),
        standard => standard.name().to_lowercase(),
    }
}

/// The levels of a per-value rule whose values are counted apart, from its
/// id (`domain|key[=value]|…`, see [`Rule::counts_all_callers_together`]):
/// `customer`, or `path matching /api/*`, joined with "and".
fn varying_keys(rule: &Rule) -> String {
    let levels: Vec<String> = rule
        .id
        .split('|')
        .skip(1)
        .filter_map(|level| match level.split_once('=') {
            None => Some(level.to_owned()),
            Some((key, value)) if value.contains('*') => Some(format!("{key} matching {value}")),
            Some(_) => None,
        })
        .collect();
    levels.join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Vec<RuleFile> {
        vec![RuleFile {
            name: "a.yaml".into(),
            text: text.into(),
        }]
    }

    #[test]
    fn accepts_envoy_style_file() {
        let text = "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
        assert_eq!(validate(&file(text), 0.0), Ok(()));
    }

    #[test]
    fn reports_yaml_errors_with_line() {
        let issues = validate(&file("domain: api\ndescriptors: [\n"), 0.0).unwrap_err();
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].file, "a.yaml");
        assert!(issues[0].line >= 2, "{issues:?}");
        assert!(issues[0].reason.starts_with("not valid YAML"));
    }

    #[test]
    fn reports_missing_domain_and_unknown_fields() {
        let issues = validate(&file("descriptors: []\ndomian: api\n"), 0.0).unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.field == "domian" && i.line == 2 && i.reason.contains("unknown"))
        );
        assert!(issues.iter().any(|i| i.field == "domain"));
    }

    #[test]
    fn shared_counters_below_the_floor_are_refused() {
        let text = "domain: api\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        let issues = validate(&file(text), 10.0).unwrap_err();
        assert_eq!(
            issues.len(),
            1,
            "only the shared /login counter: {issues:?}"
        );
        assert_eq!(
            (issues[0].line, issues[0].field.as_str()),
            (5, "requests_per_unit")
        );
        assert!(issues[0].reason.contains("floor"));
        assert_eq!(validate(&file(text), 5.0), Ok(()));
        assert_eq!(validate(&file(text), 0.0), Ok(()));
    }

    #[test]
    fn a_shared_bucket_needs_a_burst_of_the_floors_per_second_share() {
        let bucket = |burst: u64| {
            format!(
                "domain: api\ndescriptors:\n  - key: path\n    value: /login\n    \
                 rate_limit: {{unit: minute, requests_per_unit: 6000}}\n    \
                 algorithm: token_bucket\n    burst: {burst}\n"
            )
        };
        // A floor of 600 per minute is 10 per second.
        let issues = validate(&file(&bucket(1)), 600.0).unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!((issues[0].line, issues[0].field.as_str()), (5, "burst"));
        for words in [
            "api|path=/login",
            "burst 1",
            "at least 10",
            "600 per minute",
        ] {
            assert!(issues[0].reason.contains(words), "{words}: {issues:?}");
        }
        assert_eq!(validate(&file(&bucket(10)), 600.0), Ok(()));
        let gcra = bucket(9).replace("token_bucket", "leaky_bucket");
        assert_eq!(validate(&file(&gcra), 600.0).unwrap_err()[0].field, "burst");
        // Windowed algorithms have no burst: the rate alone decides.
        let window = bucket(1).replace("    algorithm: token_bucket\n    burst: 1\n", "");
        assert_eq!(validate(&file(&window), 600.0), Ok(()));
    }

    /// A `limits:` rule's second limit is held to the floor as its first is.
    #[test]
    fn every_limit_of_a_shared_limits_rule_is_held_to_the_floor() {
        let text = "domain: api\ndescriptors:\n  - key: path\n    value: /login\n    limits:\n      - {rate_limit: {unit: minute, requests_per_unit: 50}}\n      - {rate_limit: {unit: hour, requests_per_unit: 60}}\n";
        let issues = validate(&file(text), 10.0).unwrap_err();
        assert_eq!(issues.len(), 1, "the hourly limit alone: {issues:?}");
        assert!(issues[0].reason.contains("1.00 per minute"), "{issues:?}");
    }

    /// The audit's three cases (issue 28), as rule files: a ban of the
    /// shared `/login` counter, a ban of every customer, and every path
    /// allowed once a year. `extra` goes beside each rule's `rate_limit`.
    fn audit_cases(extra: &str) -> [(&'static str, String); 3] {
        [
            (
                "shared /login at 0",
                format!(
                    "domain: api\ndescriptors:\n  - key: path\n    value: /login\n{extra}    \
                     rate_limit: {{unit: minute, requests_per_unit: 0}}\n"
                ),
            ),
            (
                "every customer at 0",
                format!(
                    "domain: api\ndescriptors:\n  - key: customer\n{extra}    \
                     rate_limit: {{unit: minute, requests_per_unit: 0}}\n"
                ),
            ),
            (
                "every path once a year",
                format!(
                    "domain: api\ndescriptors:\n  - key: path\n{extra}    \
                     rate_limit: {{unit: year, requests_per_unit: 1}}\n"
                ),
            ),
        ]
    }

    /// A limit of 0 has no params, so the floor's rate check never saw it;
    /// and a key-only rule was never held to anything: each of the audit's
    /// cases passed a floor of 600 a minute.
    #[test]
    fn bans_and_near_bans_of_a_key_space_are_refused_naming_the_field() {
        for (case, text) in audit_cases("") {
            let issues = validate(&file(&text), 600.0).expect_err(case);
            assert_eq!(issues.len(), 1, "{case}: {issues:?}");
            let issue = &issues[0];
            let line = text
                .lines()
                .position(|l| l.contains("rate_limit"))
                .map(|i| i + 1);
            assert_eq!(
                (Some(issue.line), issue.field.as_str()),
                (line, "requests_per_unit"),
                "{case}: {issue:?}"
            );
            for words in ["rule api|", "confirm_ban: true", "--shared-rule-floor"] {
                assert!(issue.reason.contains(words), "{case}: {words:?}: {issue:?}");
            }
            // A limit of 0 is below every floor, however low.
            assert!(validate(&file(&text), 0.001).is_err(), "{case}");
            // Floor 0 turns every check off.
            assert_eq!(validate(&file(&text), 0.0), Ok(()), "{case}");
        }
        let ban = &audit_cases("")[1].1;
        let reason = &validate(&file(ban), 600.0).unwrap_err()[0].reason;
        assert!(reason.contains("every value of customer"), "{reason}");
        let yearly = &audit_cases("")[2].1;
        let reason = &validate(&file(yearly), 600.0).unwrap_err()[0].reason;
        assert!(
            reason.contains("allows 1 per year") && reason.contains("at least 1 a day"),
            "{reason}"
        );
    }

    #[test]
    fn confirm_ban_beside_the_rule_lets_each_through() {
        for (case, text) in audit_cases("    confirm_ban: true\n") {
            assert_eq!(validate(&file(&text), 600.0), Ok(()), "{case}");
        }
        // It also confirms a shared counter throttled below the floor, rate
        // and burst alike.
        let slow = "domain: api\ndescriptors:\n  - key: path\n    value: /export\n    \
                    confirm_ban: true\n    algorithm: token_bucket\n    burst: 1\n    \
                    rate_limit: {unit: minute, requests_per_unit: 5}\n";
        assert_eq!(validate(&file(slow), 600.0), Ok(()));
        assert_eq!(
            validate(&file(&slow.replace("    confirm_ban: true\n", "")), 600.0)
                .unwrap_err()
                .len(),
            2,
            "rate and burst"
        );
        // It is one rule's: the unconfirmed sibling is still refused.
        let two = format!(
            "{}  - key: user\n    rate_limit: {{unit: second, requests_per_unit: 0}}\n",
            audit_cases("    confirm_ban: true\n")[1].1
        );
        let issues = validate(&file(&two), 600.0).unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(issues[0].reason.contains("rule api|user"), "{issues:?}");
    }

    /// Per-value rules stricter than the shared floor are ordinary (OTP 5 an
    /// hour per user); from one a day per value down they near-ban the key.
    #[test]
    fn per_value_limits_are_held_to_one_a_day_not_to_the_shared_floor() {
        let rule = |key: &str, rate: &str| {
            format!("domain: api\ndescriptors:\n  - key: {key}\n    rate_limit: {rate}\n")
        };
        for ok in [
            "{unit: hour, requests_per_unit: 5}",
            "{unit: day, requests_per_unit: 1}",
            "{unit: week, requests_per_unit: 7}",
        ] {
            assert_eq!(validate(&file(&rule("user", ok)), 600.0), Ok(()), "{ok}");
        }
        for near_ban in [
            "{unit: week, requests_per_unit: 6}",
            "{unit: month, requests_per_unit: 1}",
        ] {
            let issues = validate(&file(&rule("user", near_ban)), 600.0).unwrap_err();
            assert_eq!(issues[0].field, "requests_per_unit", "{near_ban}");
        }
        // A glob's values are a key space too.
        let glob = "domain: api\ndescriptors:\n  - key: path\n    value: /api/*\n    \
                    rate_limit: {unit: second, requests_per_unit: 0}\n";
        assert!(validate(&file(glob), 600.0).is_err());
        // Every limit of a `limits:` rule counts, and one confirmation
        // beside the list covers them.
        let limits = "domain: api\ndescriptors:\n  - key: user\n    limits:\n      \
                      - {rate_limit: {unit: minute, requests_per_unit: 50}}\n      \
                      - {rate_limit: {unit: year, requests_per_unit: 2}}\n";
        let issues = validate(&file(limits), 600.0).unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        let confirmed = limits.replace("    limits:", "    confirm_ban: true\n    limits:");
        assert_eq!(validate(&file(&confirmed), 600.0), Ok(()));
    }

    #[test]
    fn rejects_empty_domain_and_empty_set() {
        assert!(validate(&file("domain: ''\n"), 0.0).is_err());
        assert!(validate(&[], 0.0).is_err());
        assert!(validate(&file("  \n"), 0.0).is_err());
    }
}
