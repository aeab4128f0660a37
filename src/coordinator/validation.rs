//! The one place the coordinator validates rule files before proposing them.
//!
//! Interim body: until the rules parser (`RuleSet::parse`) merges, this checks
//! that each file is a YAML mapping with a non-empty `domain` and no top-level
//! fields other than `domain` and `descriptors`. At merge, the body becomes a
//! call to `RuleSet::parse` whose `RuleErrors` map onto [`ValidationIssue`].

use marked_yaml::LoadError;
use marked_yaml::types::Marker;
use serde::Serialize;

use crate::rules::RuleFile;

/// Top-level keys of an envoyproxy/ratelimit config file.
const TOP_LEVEL_FIELDS: [&str; 2] = ["domain", "descriptors"];

/// One problem in one rule file, as the admin API reports it (HTTP 422).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidationIssue {
    pub file: String,
    /// 1-based; 0 when the problem has no position (an empty file).
    pub line: usize,
    /// The offending field, `""` when the problem is the document itself.
    pub field: String,
    pub reason: String,
}

fn issue(file: &RuleFile, line: usize, field: &str, reason: impl Into<String>) -> ValidationIssue {
    ValidationIssue {
        file: file.name.clone(),
        line,
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn line_of(marker: Option<&Marker>) -> usize {
    marker.map_or(0, Marker::line)
}

fn load_error_line(e: &LoadError) -> usize {
    match e {
        LoadError::TopLevelMustBeMapping(m)
        | LoadError::TopLevelMustBeSequence(m)
        | LoadError::UnexpectedAnchor(m)
        | LoadError::MappingKeyMustBeScalar(m)
        | LoadError::UnexpectedTag(m)
        | LoadError::ScanError(m, _) => m.line(),
        LoadError::DuplicateKey(inner) => line_of(inner.key.span().start()),
    }
}

fn validate_file(file: &RuleFile, issues: &mut Vec<ValidationIssue>) {
    if file.text.trim().is_empty() {
        issues.push(issue(file, 0, "", "the file is empty"));
        return;
    }
    let options = marked_yaml::LoaderOptions::default().error_on_duplicate_keys(true);
    let root = match marked_yaml::parse_yaml_with_options(0, &file.text, options) {
        Ok(root) => root,
        Err(e) => {
            issues.push(issue(
                file,
                load_error_line(&e),
                "",
                format!("not valid YAML: {e}"),
            ));
            return;
        }
    };
    let Some(mapping) = root.as_mapping() else {
        issues.push(issue(file, 1, "", "the top level must be a mapping"));
        return;
    };
    for key in mapping.keys() {
        if !TOP_LEVEL_FIELDS.contains(&key.as_str()) {
            issues.push(issue(
                file,
                line_of(key.span().start()),
                key.as_str(),
                format!(
                    "unknown field; expected one of: {}",
                    TOP_LEVEL_FIELDS.join(", ")
                ),
            ));
        }
    }
    match mapping.get_node("domain") {
        None => issues.push(issue(
            file,
            1,
            "domain",
            "missing; every file needs a domain",
        )),
        Some(node) => match node.as_scalar() {
            Some(s) if !s.as_str().trim().is_empty() => {}
            _ => issues.push(issue(
                file,
                line_of(node.span().start()),
                "domain",
                "must be a non-empty string",
            )),
        },
    }
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
    for file in files {
        validate_file(file, &mut issues);
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
