// TEMPORARY stand-in for the rules branch's RuleSet (replaced at merge).
use std::sync::Arc;

use super::{Resolved, Rule, RuleFile};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.file, self.line, self.field, self.reason
        )
    }
}

#[derive(Debug, Clone)]
pub struct RuleErrors(pub Vec<RuleError>);

impl std::fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for e in &self.0 {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub struct RuleSet {
    rules: Vec<Arc<Rule>>,
}

impl RuleSet {
    pub fn parse(_files: &[RuleFile]) -> Result<RuleSet, RuleErrors> {
        Ok(RuleSet::default())
    }
    pub fn resolve(&self, _domain: &str, _entries: &[(&str, &str)]) -> Option<Resolved<'_>> {
        self.rules.first().map(|r| Resolved {
            rule: Some(r),
            counter_key: String::new(),
        })
    }
    pub fn named(&self, _domain: &str, _name: &str) -> Option<&Arc<Rule>> {
        self.rules.first()
    }
    pub fn has_domain(&self, _domain: &str) -> bool {
        true
    }
}

pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    s.strip_suffix("ms")
        .and_then(|n| n.parse().ok())
        .map(std::time::Duration::from_millis)
        .or_else(|| {
            s.strip_suffix('s')
                .and_then(|n| n.parse().ok())
                .map(std::time::Duration::from_secs)
        })
        .ok_or_else(|| format!("bad duration {s}"))
}
