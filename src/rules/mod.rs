//! Rule files: the model, YAML parsing (envoyproxy/ratelimit's format plus
//! Meridian's fields), validation, and matching descriptors to rules.
//!
//! Pure: no I/O beyond what the caller hands in (file names and texts).
//!
//! PUBLIC CONTRACT (the limiter engine and the coordinator build on exactly
//! these names; keep them):
//! - `RuleFile { name, text }` — one YAML document and the name errors cite.
//! - `RuleSet::parse(&[RuleFile]) -> Result<RuleSet, RuleErrors>` — validates
//!   everything, returns every error found (file, line, field, reason).
//! - `RuleSet::resolve(&self, domain, &[(&str, &str)]) -> Option<Resolved<'_>>`
//!   — Envoy semantics: the entries are a path through the tree; `None` when
//!   the domain or the path matches nothing.
//! - `RuleSet::named(&self, domain, name) -> Option<&Arc<Rule>>` — a rule by
//!   its `rate_limit.name`, for the native API's rule + key checks.
//! - `Rule`, `Resolved { rule, counter_key }` and the enums in `model.rs`.

mod model;

pub use model::{Accuracy, FailMode, Partition, Resolved, Rule, RuleFile, Scope, Unit};

mod set_stub;
pub use set_stub::{RuleError, RuleErrors, RuleSet, parse_duration};
