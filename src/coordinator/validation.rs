//! The one place the coordinator validates rule files before proposing them:
//! the limiter's own parser (`RuleSet::parse`), so a version the coordinator
//! accepts is one every limiter can load.

use serde::Serialize;

use crate::rules::{RuleFile, RuleSet};

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
/// low limit would).
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
            let shared = set.rules().filter(|r| r.counts_all_callers_together());
            // Every limit of a `limits:` rule: any one of them can throttle all.
            for (rule, params) in shared.flat_map(|r| r.limits().map(move |p| (r, p))) {
                let floor = shared_floor_per_minute;
                let below = |what: String| {
                    format!(
                        "rule {}: {what}, below the floor of {floor} per minute \
                         (--shared-rule-floor) for a rule whose one counter every caller shares \
                         (no key-only or wildcard level)",
                        rule.id
                    )
                };
                let per_minute = params.limit() as f64 * 60.0 / params.period().as_secs_f64();
                if per_minute < floor {
                    issues.push(ValidationIssue {
                        file: rule.file.clone(),
                        line: rule.line,
                        field: "requests_per_unit".into(),
                        reason: below(format!("allows {per_minute:.2} per minute")),
                    });
                }
                let burst = params.burst();
                if params.algorithm().has_burst() && (burst as f64) * 60.0 < floor {
                    issues.push(ValidationIssue {
                        file: rule.file.clone(),
                        line: rule.line,
                        field: "burst".into(),
                        reason: below(format!(
                            "a {} with burst {burst} admits {} per minute to callers arriving \
                             together; raise burst to at least {}",
                            params.algorithm(),
                            burst * 60,
                            (floor / 60.0).ceil()
                        )),
                    });
                }
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

    #[test]
    fn rejects_empty_domain_and_empty_set() {
        assert!(validate(&file("domain: ''\n"), 0.0).is_err());
        assert!(validate(&[], 0.0).is_err());
        assert!(validate(&file("  \n"), 0.0).is_err());
    }
}
