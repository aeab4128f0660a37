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
pub fn validate(files: &[RuleFile]) -> Result<(), Vec<ValidationIssue>> {
    let mut issues = Vec::new();
    if files.is_empty() {
        issues.push(ValidationIssue {
            file: String::new(),
            line: 0,
            field: "files".into(),
            reason: "a rule set needs at least one file".into(),
        });
    }
    if let Err(errors) = RuleSet::parse(files) {
        issues.extend(errors.0.into_iter().map(|e| ValidationIssue {
            file: e.file,
            line: e.line,
            field: e.field,
            reason: e.reason,
        }));
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
        assert_eq!(validate(&file(text)), Ok(()));
    }

    #[test]
    fn reports_yaml_errors_with_line() {
        let issues = validate(&file("domain: api\ndescriptors: [\n")).unwrap_err();
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].file, "a.yaml");
        assert!(issues[0].line >= 2, "{issues:?}");
        assert!(issues[0].reason.starts_with("not valid YAML"));
    }

    #[test]
    fn reports_missing_domain_and_unknown_fields() {
        let issues = validate(&file("descriptors: []\ndomian: api\n")).unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.field == "domian" && i.line == 2 && i.reason.contains("unknown"))
        );
        assert!(issues.iter().any(|i| i.field == "domain"));
    }

    #[test]
    fn rejects_empty_domain_and_empty_set() {
        assert!(validate(&file("domain: ''\n")).is_err());
        assert!(validate(&[]).is_err());
        assert!(validate(&file("  \n")).is_err());
    }
}
