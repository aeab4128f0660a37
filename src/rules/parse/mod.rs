//! Walks one rule file's YAML (with line numbers, via marked-yaml) into a
//! domain tree, collecting every error instead of stopping at the first.
//!
//! Here: the file (its depth, its one document, its top-level fields and
//! domain) and the parsing state ([`Cx`], [`NodeFlags`]). The rest by
//! concern: reading a node as a typed value (`values`), the descriptor tree
//! (`descriptor`), a limit's rule from `rate_limit` or `limits` (`rule`),
//! and the options that apply to a whole rule: fail mode, placement,
//! accuracy (`options`).

mod descriptor;
mod options;
mod rule;
mod values;

use std::sync::Arc;

use marked_yaml::{LoadError, LoaderOptions};

use self::values::{is_null, line};
use super::depth::{MAX_DEPTH, check_depth};
use super::{Domain, Level, Map, Rule, RuleError, RuleFile, escape_into};

pub(super) struct ParsedFile {
    pub domain: Domain,
    pub rules: Vec<Arc<Rule>>,
}

/// `stop_increment_when_over_limit` is Meridian's: envoyproxy/ratelimit
/// sets the same behaviour for the whole server only.
const TOP_FIELDS: &[&str] = &["domain", "descriptors", "stop_increment_when_over_limit"];

/// Envoy's descriptor fields; Meridian's (`LIMIT_FIELDS`) are their siblings.
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "limits",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
];

/// Meridian's fields: they shape a limit, so they need a limited `rate_limit`.
const LIMIT_FIELDS: &[&str] = &[
    "algorithm",
    "burst",
    "period",
    "fail_mode",
    "scope",
    "accuracy",
    "sync_interval",
    "max_batch",
    "split",
    "partition",
    "fallback",
    "fallback_hold",
    "confirm_ban",
    "max_cost",
    "max_overdraft",
    "settle",
];

const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "quota_mode",
];

/// Parses one file. `None` when it has no usable domain (the errors say why);
/// otherwise the domain, even if other errors were found, so that a domain
/// defined twice is still reported.
pub(super) fn parse_file(file: &RuleFile, errors: &mut Vec<RuleError>) -> Option<ParsedFile> {
    let mut cx = Cx {
        file: &file.name,
        errors,
        rules: Vec::new(),
        named: Map::default(),
    };
    // Before any parser: marked-yaml recurses per level and would overflow the stack.
    if let Err(deep) = check_depth(&file.text, MAX_DEPTH) {
        cx.err(deep.line, "yaml", deep.to_string());
        return None;
    }
    if let Some(at) = second_document(&file.text) {
        cx.err(
            at,
            "yaml",
            "a second YAML document (---): one file holds one domain; put it in its own file",
        );
        return None;
    }
    let options = LoaderOptions::default().error_on_duplicate_keys(true);
    let root = match marked_yaml::parse_yaml_with_options(0, &file.text, options) {
        Ok(root) => root,
        Err(e) => {
            let (line, reason) = load_error(&e);
            cx.err(line, "yaml", reason);
            return None;
        }
    };
    let Some(top) = root.as_mapping() else {
        cx.err(line(&root), "yaml", "the top level must be a map");
        return None;
    };
    cx.check_fields(top, &[TOP_FIELDS], "the top level");
    let domain = match top.get_node("domain") {
        None => {
            cx.err(
                1,
                "domain",
                "missing: every rule file needs a non-empty domain",
            );
            None
        }
        Some(node) => match cx.string(node, "domain") {
            Some(d) if d.is_empty() => {
                cx.err(line(node), "domain", "must not be empty");
                None
            }
            other => other.map(|d| (d, line(node))),
        },
    };
    let stop_increment = top
        .get_node("stop_increment_when_over_limit")
        .filter(|n| !is_null(n))
        .and_then(|n| cx.boolean(n, "stop_increment_when_over_limit"));
    let mut root_level = Level::default();
    let name = domain.as_ref().map_or("", |(d, _)| d.as_str());
    let mut id = String::new();
    escape_into(name, &mut id);
    cx.descriptors(
        top.get_node("descriptors"),
        name,
        &id,
        false,
        &mut root_level,
    );
    let (name, line) = domain?;
    Some(ParsedFile {
        domain: Domain {
            name,
            file: file.name.clone(),
            line,
            root: root_level,
            named: cx.named,
            stop_increment,
        },
        rules: cx.rules,
    })
}

/// The line of a `---` marker after content: the loader reads only the first
/// document, so a second one would be dropped silently. A marker at column 0
/// cannot occur inside a valid scalar here (the top level is a map, so block
/// scalars are indented, and quoted scalars may not contain one).
fn second_document(text: &str) -> Option<usize> {
    let mut content = false;
    for (i, l) in text.lines().enumerate() {
        let marker = l == "---" || l.starts_with("--- ") || l.starts_with("---\t");
        if marker && content {
            return Some(i + 1);
        }
        let t = l.trim();
        content |= !marker && !t.is_empty() && !t.starts_with('#') && !t.starts_with('%');
    }
    None
}

fn load_error(e: &LoadError) -> (usize, String) {
    match e {
        LoadError::ScanError(m, se) => {
            let hint = if se.info().contains("anchor") {
                " (a value starting with * must be quoted: value: \"*foo\")"
            } else {
                ""
            };
            (m.line(), format!("not valid YAML: {}{hint}", se.info()))
        }
        LoadError::DuplicateKey(inner) => (
            inner.key.span().start().map_or(1, |m| m.line()),
            format!("field {:?} appears twice in one map", inner.key.as_str()),
        ),
        LoadError::TopLevelMustBeMapping(m) => (m.line(), "the top level must be a map".into()),
        LoadError::TopLevelMustBeSequence(m) => (m.line(), "the top level must be a list".into()),
        LoadError::UnexpectedAnchor(m) => (
            m.line(),
            "anchors and aliases (&name, *name) are not supported; a value starting with * \
             must be quoted"
                .into(),
        ),
        LoadError::MappingKeyMustBeScalar(m) => (m.line(), "map keys must be plain strings".into()),
        LoadError::UnexpectedTag(m) => (m.line(), "YAML tags (!tag) are not supported".into()),
    }
}

/// Parsing state for one file.
struct Cx<'a> {
    file: &'a str,
    errors: &'a mut Vec<RuleError>,
    rules: Vec<Arc<Rule>>,
    /// `rate_limit.name` → every rule with it, in file order (a name may
    /// repeat, as in envoyproxy/ratelimit).
    named: Map<Vec<Arc<Rule>>>,
}

/// A descriptor node's boolean fields.
#[derive(Debug, Default)]
struct NodeFlags {
    shadow_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
    /// `value_to_metric` here or on a node above.
    inherited_value_to_metric: bool,
}
