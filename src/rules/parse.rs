//! Walks one rule file's YAML (with line numbers, via marked-yaml) into a
//! domain tree, collecting every error instead of stopping at the first.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{LoadError, LoaderOptions, Node};

use super::depth::{MAX_DEPTH, check_depth};
use super::duration::parse_duration;
use super::{
    Accuracy, Domain, FailMode, Glob, KeyNodes, Level, Map, Partition, Rule, RuleError, RuleFile,
    Scope, TreeNode, Unit, escape_into,
};
use crate::algorithm::{Algorithm, Params};
use crate::store::key::MAX_KEY_LEN;

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
];

const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "quota_mode",
];

const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(50);
/// The longest `fallback_hold`: a week of a dead region's share held back
/// is already more than any operator means.
const MAX_FALLBACK_HOLD: Duration = Duration::from_secs(7 * 24 * 3_600);
/// Limits one descriptor's `limits:` may hold: each is a few Lua lines per
/// check, and 8 covers a burst, a rate and quotas by minute, hour, day,
/// week and month.
const MAX_LIMITS: usize = 8;
const MAX_SPLIT: u32 = 1024;

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

fn line(node: &Node) -> usize {
    node.span().start().map_or(1, |m| m.line())
}

fn scalar_line(node: &MarkedScalarNode) -> usize {
    node.span().start().map_or(1, |m| m.line())
}

/// A plain empty value (`field:`), `~` or `null`: YAML's null.
fn is_null(node: &Node) -> bool {
    matches!(node, Node::Scalar(s) if s.may_coerce() && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

fn kind(node: &Node) -> &'static str {
    match node {
        Node::Scalar(_) => "a single value",
        Node::Mapping(_) => "a map",
        Node::Sequence(_) => "a list",
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

/// The `rate_limit` map, checked field by field.
struct RateLimitSpec {
    line: usize,
    /// `unit` / `requests_per_unit` were written (even if invalid), so
    /// "missing" would be wrong.
    unit_given: bool,
    requests_given: bool,
    unit: Option<(Unit, usize)>,
    requests_per_unit: Option<(i64, usize)>,
    unlimited: bool,
    name: Option<String>,
    replaces: Vec<String>,
}

impl Cx<'_> {
    fn err(&mut self, line: usize, field: impl Into<String>, reason: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.to_owned(),
            line,
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// Reports every field of `map` not in `allowed`.
    /// `allowed`: the accepted field lists, in the order the message names them.
    fn check_fields(&mut self, map: &MarkedMappingNode, allowed: &[&[&str]], place: &str) {
        for (k, _) in map.iter() {
            if !allowed.iter().any(|list| list.contains(&k.as_str())) {
                // An empty key (`: x`) is still named, so the error says where.
                let field = if k.as_str().is_empty() {
                    "\"\"".to_owned()
                } else {
                    k.as_str().to_owned()
                };
                self.err(
                    scalar_line(k),
                    field,
                    format!(
                        "unknown field in {place}; expected one of: {}",
                        allowed.concat().join(", ")
                    ),
                );
            }
        }
    }

    /// A single value (numbers and booleans are read as their text).
    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match node {
            Node::Scalar(s) => Some(s.as_str().to_owned()),
            other => {
                self.err(
                    line(other),
                    field,
                    format!("expected a single value, found {}", kind(other)),
                );
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        let value = node.as_scalar().and_then(MarkedScalarNode::as_bool);
        if value.is_none() && !is_null(node) {
            self.err(line(node), field, "expected true or false");
        }
        value
    }

    fn integer(&mut self, node: &Node, field: &str) -> Option<i64> {
        let text = self.string(node, field)?;
        match text.trim().parse::<i64>() {
            Ok(n) => Some(n),
            Err(_) => {
                self.err(
                    line(node),
                    field,
                    format!("expected a whole number, found {text:?}"),
                );
                None
            }
        }
    }

    fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
        let text = self.string(node, field)?;
        parse_duration(&text)
            .map_err(|reason| self.err(line(node), field, reason))
            .ok()
    }

    /// One of `choices` (exact, lowercase).
    fn choice<T: Copy>(&mut self, node: &Node, field: &str, choices: &[(&str, T)]) -> Option<T> {
        let text = self.string(node, field)?;
        let found = choices.iter().find(|(name, _)| *name == text);
        if found.is_none() {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            self.err(
                line(node),
                field,
                format!(
                    "unknown value {text:?}; expected one of: {}",
                    names.join(", ")
                ),
            );
        }
        found.map(|(_, v)| *v)
    }

    /// A `descriptors` list into `level`. `inherited`: a node above set
    /// `value_to_metric`, which the rules below carry.
    fn descriptors(
        &mut self,
        node: Option<&Node>,
        domain: &str,
        parent_id: &str,
        inherited: bool,
        level: &mut Level,
    ) {
        let Some(node) = node.filter(|n| !is_null(n)) else {
            return;
        };
        let Some(items) = node.as_sequence() else {
            self.err(
                line(node),
                "descriptors",
                format!("must be a list of maps, found {}", kind(node)),
            );
            return;
        };
        for item in items.iter() {
            match item.as_mapping() {
                Some(map) => self.descriptor(map, domain, parent_id, inherited, level),
                None => self.err(
                    line(item),
                    "descriptors",
                    format!(
                        "each list item must be a map with `key` (and optionally `value`, \
                         `rate_limit`, `descriptors`), found {}",
                        kind(item)
                    ),
                ),
            }
        }
    }

    fn descriptor(
        &mut self,
        map: &MarkedMappingNode,
        domain: &str,
        parent_id: &str,
        inherited: bool,
        level: &mut Level,
    ) {
        let at = map.span().start().map_or(1, |m| m.line());
        self.check_fields(map, &[DESCRIPTOR_FIELDS, LIMIT_FIELDS], "a descriptor");
        let get = |f: &str| map.get_node(f);

        let key = match get("key") {
            None => {
                self.err(at, "key", "missing: every descriptor needs a non-empty key");
                None
            }
            Some(node) => match self.string(node, "key") {
                Some(k) if k.is_empty() => {
                    self.err(line(node), "key", "must not be empty");
                    None
                }
                other => other,
            },
        };
        // An empty value is no value, as in envoyproxy/ratelimit.
        let value = get("value")
            .filter(|n| !is_null(n))
            .and_then(|n| self.string(n, "value"))
            .filter(|v| !v.is_empty());

        // `quota_mode` (envoyproxy/ratelimit's quota mode) and `metadata`
        // are accepted and validated, and change nothing here (docs/rules.md,
        // "Differences from envoyproxy/ratelimit").
        let mut flags = NodeFlags::default();
        for field in [
            "shadow_mode",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
            "quota_mode",
        ] {
            if let Some(b) = get(field).and_then(|n| self.boolean(n, field)) {
                match field {
                    "shadow_mode" => flags.shadow_mode = b,
                    "detailed_metric" => flags.detailed_metric = b,
                    "value_to_metric" => flags.value_to_metric = b,
                    "share_threshold" => flags.share_threshold = b,
                    _ => {}
                }
            }
        }
        flags.inherited_value_to_metric = inherited || flags.value_to_metric;

        let mut id = String::with_capacity(parent_id.len() + 32);
        id.push_str(parent_id);
        id.push('|');
        escape_into(key.as_deref().unwrap_or(""), &mut id);
        if let Some(v) = &value {
            id.push('=');
            escape_into(v, &mut id);
        }

        let before = self.errors.len();
        let spec = get("rate_limit")
            .filter(|n| !is_null(n))
            .and_then(|n| self.rate_limit(n, key_line(map, "rate_limit").unwrap_or(at)));
        let limits = get("limits").filter(|n| !is_null(n));
        if let (Some(_), Some(n)) = (&spec, limits) {
            self.err(
                key_line(map, "limits").unwrap_or(line(n)),
                "limits",
                "give either rate_limit (one limit) or limits (several), not both",
            );
        }
        let rule = match (&spec, limits) {
            (None, Some(n)) => self.limits(map, n, domain, &id, &flags),
            (Some(_), Some(_)) => None,
            (spec, None) => match spec {
                // A broken rate_limit was reported; building on it would only add noise.
                Some(_) if self.errors.len() != before => None,
                Some(spec) => self.rule(map, spec, domain, &id, &flags),
                None => {
                    self.reject_limit_fields(map, "this descriptor has no rate_limit");
                    None
                }
            },
        };
        // The id is part of every storage key of the rule; one the store would
        // refuse must fail here, at load, not on every check.
        let rule = rule.filter(|r| {
            let fits = r.id.len() <= MAX_KEY_LEN;
            if !fits {
                self.err(
                    at,
                    "descriptors",
                    format!(
                        "rule id (domain plus the key/value path) is {} bytes; storage keys \
                         allow at most {MAX_KEY_LEN}: shorten the keys or values",
                        r.id.len()
                    ),
                );
            }
            fits
        });
        let rule = rule.map(Arc::new);
        if let Some(rule) = &rule {
            self.rules.push(rule.clone());
            if let Some(name) = &rule.name {
                self.named
                    .entry(name.clone())
                    .or_default()
                    .push(rule.clone());
            }
        }

        let mut node = TreeNode {
            line: at,
            rule,
            children: Level::default(),
            share_threshold: flags.share_threshold,
            value_to_metric: flags.value_to_metric,
            exact_value: value.clone().filter(|v| !v.contains('*')),
        };
        let inherited = flags.inherited_value_to_metric;
        self.descriptors(
            get("descriptors"),
            domain,
            &id,
            inherited,
            &mut node.children,
        );

        let Some(key) = key else { return };
        let group = level.by_key.entry(key.clone()).or_default();
        if let Some(first) = group.line_of(value.as_deref()) {
            let shown = match &value {
                Some(v) => format!("{key}={v}"),
                None => key.clone(),
            };
            self.err(
                at,
                "key",
                format!(
                    "duplicate {key}: {shown} is already defined at line {first} under the \
                     same parent"
                ),
            );
            return;
        }
        match value {
            None => group.any = Some(Box::new(node)),
            Some(v) => match Glob::new(&v) {
                Some(glob) => group.globs.push((glob, node)),
                None => {
                    group.exact.insert(v, node);
                }
            },
        }
    }

    /// `at`: the line of the `rate_limit` key, which the rule reports as its own.
    fn rate_limit(&mut self, node: &Node, at: usize) -> Option<RateLimitSpec> {
        let Some(map) = node.as_mapping() else {
            self.err(
                line(node),
                "rate_limit",
                format!(
                    "must be a map with unit and requests_per_unit, found {}",
                    kind(node)
                ),
            );
            return None;
        };
        self.check_fields(map, &[RATE_LIMIT_FIELDS], "rate_limit");
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        let mut spec = RateLimitSpec {
            line: at,
            unit_given: get("unit").is_some(),
            requests_given: get("requests_per_unit").is_some(),
            unit: None,
            requests_per_unit: None,
            unlimited: false,
            name: None,
            replaces: Vec::new(),
        };
        if let Some(n) = get("unit")
            && let Some(text) = self.string(n, "unit")
        {
            match Unit::from_name(&text) {
                Some(u) => spec.unit = Some((u, line(n))),
                None => self.err(
                    line(n),
                    "unit",
                    format!(
                        "unknown unit {text:?}; expected one of: second, minute, hour, day, \
                             week, month, year (or a Meridian `period:` beside rate_limit)"
                    ),
                ),
            }
        }
        if let Some(n) = get("unlimited") {
            spec.unlimited = self.boolean(n, "unlimited").unwrap_or(false);
        }
        if let Some(n) = get("requests_per_unit") {
            spec.requests_per_unit = match self.integer(n, "requests_per_unit") {
                // envoyproxy/ratelimit accepts (and ignores) any count when unlimited.
                Some(v) if spec.unlimited => Some((v, line(n))),
                // 0 is envoyproxy/ratelimit's ban: every request over limit.
                Some(v) if v < 0 => {
                    self.err(
                        line(n),
                        "requests_per_unit",
                        format!("must be 0 (deny every request) or more, found {v}"),
                    );
                    None
                }
                other => other.map(|v| (v, line(n))),
            };
        }
        if let Some(n) = get("quota_mode") {
            self.boolean(n, "quota_mode");
        }
        if let Some(n) = get("name") {
            spec.name = self.string(n, "name").filter(|s| !s.is_empty());
        }
        if let Some(n) = get("replaces") {
            self.replaces(n, &mut spec);
        }
        Some(spec)
    }

    fn replaces(&mut self, node: &Node, spec: &mut RateLimitSpec) {
        let Some(items) = node.as_sequence() else {
            self.err(
                line(node),
                "replaces",
                format!("must be a list of {{name: ...}} maps, found {}", kind(node)),
            );
            return;
        };
        for item in items.iter() {
            let Some(map) = item.as_mapping() else {
                self.err(
                    line(item),
                    "replaces",
                    format!(
                        "each entry must be a map {{name: ...}}, found {}",
                        kind(item)
                    ),
                );
                continue;
            };
            self.check_fields(map, &[&["name"]], "a replaces entry");
            let name = map
                .get_node("name")
                .filter(|n| !is_null(n))
                .and_then(|n| self.string(n, "replaces"))
                .filter(|s| !s.is_empty());
            match name {
                None => self.err(
                    line(item),
                    "replaces",
                    "empty entry: each replaces entry needs the name of the rule it replaces",
                ),
                Some(name) if spec.name.as_ref() == Some(&name) => self.err(
                    line(item),
                    "replaces",
                    format!("a rule may not replace itself (name {name:?})"),
                ),
                Some(name) => spec.replaces.push(name),
            }
        }
    }

    /// A descriptor's `limits:` list: several limits on one counter key, each
    /// entry with `algorithm`, `burst`, `period` and `rate_limit` as a
    /// single rule has them. Beside the list, the descriptor may carry
    /// `fail_mode`, `scope` (with `partition` and `fallback`) and `accuracy`
    /// (with `sync_interval` and `max_batch`), which apply to every limit;
    /// the first entry's `rate_limit.name` names the rule.
    fn limits(
        &mut self,
        map: &MarkedMappingNode,
        node: &Node,
        domain: &str,
        id: &str,
        flags: &NodeFlags,
    ) -> Option<Rule> {
        const ENTRY_FIELDS: &[&str] = &["algorithm", "burst", "period", "rate_limit"];
        let before = self.errors.len();
        let at = key_line(map, "limits").unwrap_or(line(node));
        let Some(items) = node.as_sequence().filter(|items| items.len() >= 2) else {
            let found = match node.as_sequence() {
                Some(items) => format!("{} entry", items.len()),
                None => kind(node).to_owned(),
            };
            self.err(
                at,
                "limits",
                format!(
                    "must be a list of at least two limits, found {found} (one limit is a \
                     rate_limit)"
                ),
            );
            return None;
        };
        if items.len() > MAX_LIMITS {
            self.err(
                at,
                "limits",
                format!(
                    "at most {MAX_LIMITS} limits on one descriptor, found {}",
                    items.len()
                ),
            );
            return None;
        }
        for (k, _) in map.iter() {
            let why = match k.as_str() {
                "algorithm" | "burst" | "period" => {
                    "belongs in each entry of limits (each limit has its own)"
                }
                "split" => {
                    "not supported beside limits: the limits' counters share one key so one \
                     script decides them all, and a split key is K counters"
                }
                _ => continue,
            };
            self.err(scalar_line(k), k.as_str(), why);
        }
        let mut rules = Vec::with_capacity(items.len());
        for item in items.iter() {
            let Some(entry) = item.as_mapping() else {
                self.err(
                    line(item),
                    "limits",
                    format!(
                        "each entry must be a map with rate_limit, found {}",
                        kind(item)
                    ),
                );
                continue;
            };
            self.check_fields(entry, &[ENTRY_FIELDS], "a limits entry");
            let at = line(item);
            let Some(spec) = entry
                .get_node("rate_limit")
                .filter(|n| !is_null(n))
                .and_then(|n| self.rate_limit(n, key_line(entry, "rate_limit").unwrap_or(at)))
            else {
                self.err(
                    at,
                    "rate_limit",
                    "missing: each limits entry needs a rate_limit",
                );
                continue;
            };
            if spec.unlimited || spec.requests_per_unit.is_some_and(|(n, _)| n == 0) {
                self.err(
                    spec.line,
                    "rate_limit",
                    "an entry of limits needs requests_per_unit of 1 or more (a ban or \
                     unlimited is a rate_limit of its own)",
                );
                continue;
            }
            if let Some(rule) = self.rule(entry, &spec, domain, id, flags) {
                rules.push(rule);
            }
        }
        if self.errors.len() != before {
            return None;
        }
        let mut rest = rules.split_off(1);
        let mut rule = rules.pop()?;
        self.fail_mode(map, &mut rule);
        self.confirm_ban(map, &mut rule);
        // Scope, partition and fallback apply to every limit (a global
        // rule allocates each on its own); so does accuracy, which each
        // entry's algorithm must support.
        self.placement(map, &mut rule);
        let algorithms: Vec<Algorithm> = std::iter::once(&rule)
            .chain(&rest)
            .filter_map(|r| r.params.as_ref().map(|p| p.algorithm()))
            .collect();
        self.accuracy(map, &mut rule, algorithms.first().copied());
        if let Some(n) = map.get_node("accuracy")
            && matches!(rule.accuracy, Accuracy::Approximate { .. })
        {
            for (i, a) in algorithms.iter().enumerate().skip(1) {
                if !a.has_approximate_path() {
                    self.err(
                        line(n),
                        "accuracy",
                        format!(
                            "approximate is only available for fixed_window, \
                             sliding_window_counter and token_bucket, not {a} (limit {})",
                            i + 1
                        ),
                    );
                }
            }
        }
        rule.also = rest
            .drain(..)
            .filter_map(|r| r.params.map(|p| (r.unit, p)))
            .collect();
        (self.errors.len() == before).then_some(rule)
    }

    /// Errors for Meridian's limit fields on a node without a limit.
    fn reject_limit_fields(&mut self, map: &MarkedMappingNode, why: &str) {
        for (k, _) in map.iter() {
            if LIMIT_FIELDS.contains(&k.as_str()) {
                self.err(
                    scalar_line(k),
                    k.as_str(),
                    format!("only allowed beside a rate_limit with a limit; {why}"),
                );
            }
        }
    }

    /// Builds the rule of a node with `rate_limit`, from the spec and
    /// Meridian's sibling fields. `None` when anything is invalid.
    fn rule(
        &mut self,
        map: &MarkedMappingNode,
        spec: &RateLimitSpec,
        domain: &str,
        id: &str,
        flags: &NodeFlags,
    ) -> Option<Rule> {
        let before = self.errors.len();
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        let mut rule = Rule {
            id: id.to_owned(),
            domain: domain.to_owned(),
            name: spec.name.clone(),
            unlimited: spec.unlimited,
            requests_per_unit: 0,
            unit: Unit::Second,
            params: None,
            also: Vec::new(),
            shadow_mode: flags.shadow_mode,
            detailed_metric: flags.detailed_metric,
            value_to_metric: flags.inherited_value_to_metric,
            replaces: spec.replaces.clone(),
            fail_mode: FailMode::default(),
            scope: Scope::default(),
            accuracy: Accuracy::default(),
            split: 1,
            partition: Partition::default(),
            fallback: 0.5,
            fallback_hold: super::model::DEFAULT_FALLBACK_HOLD,
            confirm_ban: false,
            file: self.file.to_owned(),
            line: spec.line,
        };

        if spec.unlimited {
            if let Some((_, at)) = spec.unit {
                self.err(
                    at,
                    "unit",
                    "not allowed with unlimited: true (an unlimited rule has no unit and counts \
                     nothing)",
                );
            }
            // envoyproxy/ratelimit accepts (and ignores) requests_per_unit here.
            self.reject_limit_fields(map, "this rule is unlimited");
            return (self.errors.len() == before).then_some(rule);
        }

        let period = get("period").and_then(|n| self.duration(n, "period").map(|d| (d, line(n))));
        rule.unit = match (spec.unit, period) {
            (Some((unit, _)), None) => unit,
            (None, Some((d, _))) => Unit::from_period(d),
            (Some((unit, _)), Some((d, at))) => {
                if unit.duration() != d {
                    self.err(
                        at,
                        "period",
                        format!(
                            "disagrees with unit {}; give either unit or period",
                            unit.name().to_lowercase()
                        ),
                    );
                }
                unit
            }
            (None, None) => {
                if map.get_node("period").is_none() && !spec.unit_given {
                    self.err(
                        spec.line,
                        "unit",
                        "missing: give unit (second, minute, hour, day, week, month, year), a \
                         Meridian period, or unlimited: true",
                    );
                }
                Unit::Second
            }
        };
        match spec.requests_per_unit {
            None if spec.requests_given => {}
            None => self.err(
                spec.line,
                "requests_per_unit",
                "missing: how many requests per unit",
            ),
            Some((n, _)) => rule.requests_per_unit = n as u64,
        }

        let algorithm = match get("algorithm") {
            None => Some(Algorithm::FixedWindow),
            Some(n) => self.string(n, "algorithm").and_then(|text| {
                Algorithm::from_str(&text)
                    .map_err(|e| {
                        self.err(
                            line(n),
                            "algorithm",
                            format!("unknown algorithm {text:?}; {}", e.reason),
                        )
                    })
                    .ok()
            }),
        };
        let burst = get("burst").and_then(|n| self.integer(n, "burst").map(|b| (b, line(n))));

        self.fail_mode(map, &mut rule);
        self.placement(map, &mut rule);
        self.accuracy(map, &mut rule, algorithm);
        self.confirm_ban(map, &mut rule);
        if let Some(n) = get("split") {
            match self.integer(n, "split") {
                Some(k) if (1..=i64::from(MAX_SPLIT)).contains(&k) => {
                    rule.split = k as u32;
                    if rule.requests_per_unit > 0 && (k as u64) > rule.requests_per_unit {
                        self.err(
                            line(n),
                            "split",
                            format!(
                                "{k} sub-counters for a limit of {}: each would hold less than \
                                 one request",
                                rule.requests_per_unit
                            ),
                        );
                    }
                }
                Some(k) => self.err(
                    line(n),
                    "split",
                    format!("must be 1 to {MAX_SPLIT}, found {k}"),
                ),
                None => {}
            }
        }

        // An invalid requests_per_unit was reported while reading rate_limit.
        if self.errors.len() != before || spec.requests_per_unit.is_none() {
            return None;
        }
        let algorithm = algorithm?;
        let period = rule.unit.duration();
        if rule.requests_per_unit == 0 {
            // Denied without a counter, so no algorithm runs; a global one
            // would have nothing to divide.
            if rule.scope == Scope::Global {
                let at = key_line(map, "scope").unwrap_or(spec.line);
                self.err(
                    at,
                    "scope",
                    "requests_per_unit: 0 denies every request in every region; scope: global \
                     has nothing to allocate (remove scope)",
                );
                return None;
            }
            return Some(rule);
        }
        match Params::new(
            algorithm,
            rule.requests_per_unit as i64,
            period,
            burst.map(|(b, _)| b),
        ) {
            Ok(params) => rule.params = Some(params),
            Err(e) => {
                let (field, at) = match e.field {
                    "limit" => (
                        "requests_per_unit",
                        spec.requests_per_unit.map_or(spec.line, |r| r.1),
                    ),
                    "burst" => ("burst", burst.map_or(spec.line, |b| b.1)),
                    "period" => match period_line(map) {
                        Some(at) => ("period", at),
                        None => ("unit", spec.unit.map_or(spec.line, |u| u.1)),
                    },
                    other => (other, spec.line),
                };
                self.err(at, field, format!("{} (value {})", e.reason, e.value));
                return None;
            }
        }
        Some(rule)
    }

    /// `fail_mode` of a descriptor.
    fn fail_mode(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        if let Some(n) = map.get_node("fail_mode").filter(|n| !is_null(n)) {
            let choices = [
                ("open", FailMode::Open),
                ("closed", FailMode::Closed),
                ("local", FailMode::Local),
            ];
            rule.fail_mode = self.choice(n, "fail_mode", &choices).unwrap_or_default();
        }
    }

    /// `confirm_ban` of a descriptor (beside `rate_limit` or `limits`).
    fn confirm_ban(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        if let Some(n) = map.get_node("confirm_ban").filter(|n| !is_null(n)) {
            rule.confirm_ban = self.boolean(n, "confirm_ban").unwrap_or(false);
        }
    }

    /// Where a limit is enforced: `scope`, and a global rule's `partition`
    /// and `fallback`.
    fn placement(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        if let Some(n) = get("scope") {
            let choices = [("region", Scope::Region), ("global", Scope::Global)];
            rule.scope = self.choice(n, "scope", &choices).unwrap_or_default();
        }
        for field in ["partition", "fallback", "fallback_hold"] {
            if let Some(n) = get(field)
                && rule.scope != Scope::Global
            {
                self.err(line(n), field, "only allowed with scope: global");
            }
        }
        if let Some(n) = get("partition") {
            let choices = [
                ("strict", Partition::Strict),
                ("available", Partition::Available),
            ];
            rule.partition = self.choice(n, "partition", &choices).unwrap_or_default();
        }
        if let Some(n) = get("fallback")
            && let Some(text) = self.string(n, "fallback")
        {
            match text.trim().parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => rule.fallback = f,
                _ => self.err(
                    line(n),
                    "fallback",
                    format!("must be a number from 0.0 to 1.0, found {text:?}"),
                ),
            }
        }
        if let Some(n) = get("fallback_hold")
            && let Some(hold) = self.duration(n, "fallback_hold")
        {
            if hold > MAX_FALLBACK_HOLD {
                self.err(
                    line(n),
                    "fallback_hold",
                    format!(
                        "{hold:?} is longer than the most allowed, 7d (a longer hold strands \
                         a dead region's share for that long)"
                    ),
                );
            } else {
                rule.fallback_hold = hold;
            }
        }
    }

    fn accuracy(&mut self, map: &MarkedMappingNode, rule: &mut Rule, algorithm: Option<Algorithm>) {
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        let approximate = match get("accuracy") {
            None => false,
            Some(n) => {
                let choices = [("exact", false), ("approximate", true)];
                let approximate = self.choice(n, "accuracy", &choices).unwrap_or(false);
                if let Some(a) = algorithm.filter(|_| approximate)
                    && !a.has_approximate_path()
                {
                    self.err(
                        line(n),
                        "accuracy",
                        format!(
                            "approximate is only available for fixed_window, \
                                 sliding_window_counter and token_bucket, not {a}"
                        ),
                    );
                }
                approximate
            }
        };
        if !approximate {
            for field in ["sync_interval", "max_batch"] {
                if let Some(n) = get(field) {
                    self.err(line(n), field, "only allowed with accuracy: approximate");
                }
            }
            return;
        }
        let sync_interval = get("sync_interval")
            .and_then(|n| self.duration(n, "sync_interval"))
            .unwrap_or(DEFAULT_SYNC_INTERVAL);
        let max_batch = get("max_batch").and_then(|n| match self.integer(n, "max_batch") {
            Some(b) if b >= 1 => Some(b as u64),
            Some(b) => {
                self.err(
                    line(n),
                    "max_batch",
                    format!("must be at least 1, found {b}"),
                );
                None
            }
            None => None,
        });
        rule.accuracy = Accuracy::Approximate {
            sync_interval,
            max_batch,
        };
    }
}

fn period_line(map: &MarkedMappingNode) -> Option<usize> {
    map.get_node("period").map(line)
}

/// The line of `field`'s key in `map`.
fn key_line(map: &MarkedMappingNode, field: &str) -> Option<usize> {
    map.iter()
        .find(|(k, _)| k.as_str() == field)
        .map(|(k, _)| scalar_line(k))
}

impl KeyNodes {
    /// The line of the sibling with this value pattern (`None` = key only), if any.
    fn line_of(&self, value: Option<&str>) -> Option<usize> {
        match value {
            None => self.any.as_ref().map(|n| n.line),
            Some(v) if v.contains('*') => self
                .globs
                .iter()
                .find(|(g, _)| g.pattern() == v)
                .map(|(_, n)| n.line),
            Some(v) => self.exact.get(v).map(|n| n.line),
        }
    }
}
