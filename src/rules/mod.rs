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
//!   its `rate_limit.name`, for the native API's rule + key checks; names
//!   may repeat, as in envoyproxy/ratelimit: `RuleSet::by_name` tells an
//!   ambiguous name apart from an unknown one.
//! - `Rule`, `Resolved { rule, counter_key }` and the enums in `model.rs`.

#[cfg(feature = "server")]
pub(crate) mod cli;
mod depth;
#[cfg(feature = "server")]
pub(crate) mod diff;
mod duration;
mod model;
mod parse;

use std::fmt;
use std::sync::Arc;

pub use depth::{MAX_DEPTH, TooDeep, check_depth};
pub use duration::{format_duration, parse_duration};
pub use model::{
    Accuracy, DEFAULT_FALLBACK_HOLD, FailMode, LIMIT_ID_MARK, Partition, Resolved, Rule, RuleFile,
    Scope, SettleMode, Unit, split_limit_id,
};

/// String-keyed maps on the hot path: foldhash, not SipHash. Rule files are
/// written by operators, not clients, so HashDoS resistance buys nothing here.
type Map<V> = std::collections::HashMap<String, V, foldhash::fast::RandomState>;

/// One problem in a rule file. Displayed as `file:line: field: reason`, the
/// form editors and CI logs link to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// The [`RuleFile::name`] of the file, as the caller passed it (usually its path).
    pub file: String,
    /// 1-based line of the offending field (or of its parent when it is missing).
    pub line: usize,
    /// The field at fault as written in the file (`unit`, `requests_per_unit`,
    /// `key`, …), or `yaml` when the file is not valid YAML.
    pub field: String,
    /// What is wrong and, where it helps, what is accepted instead.
    pub reason: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.file, self.line, self.field, self.reason
        )
    }
}

impl std::error::Error for RuleError {}

/// Every error found in every file, in file order (parsing never stops at the
/// first, so an operator fixes a file in one pass).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleErrors(pub Vec<RuleError>);

impl fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleErrors {}

/// A validated set of rule files: one descriptor tree per domain.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    /// In file order; `index` finds one by name.
    domains: Vec<Domain>,
    index: Map<usize>,
    /// Every rule (limited and unlimited) in file order, for the coordinator
    /// and metrics, which iterate; lookups go through the trees.
    rules: Vec<Arc<Rule>>,
    files: usize,
}

/// One domain's descriptor tree and its named rules.
#[derive(Debug, Clone)]
struct Domain {
    name: String,
    file: String,
    line: usize,
    root: Level,
    /// `rate_limit.name` → every rule with that name, in file order. More
    /// than one: the name is ambiguous for the native API (which then needs
    /// the descriptor path), while `replaces` still means all of them.
    named: Map<Vec<Arc<Rule>>>,
    /// `stop_increment_when_over_limit:` at the top of the file; `None`
    /// leaves it to the server's flag.
    stop_increment: Option<bool>,
}

/// A `rate_limit.name` that more than one rule of a domain carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rule name {name:?} is ambiguous in domain {domain:?}: used by {} rules ({}); \
     address the rule by its descriptor instead",
    places.len(),
    places.join(", ")
)]
pub struct AmbiguousName {
    /// The domain the name was looked up in.
    pub domain: String,
    /// The name asked for.
    pub name: String,
    /// `file:line` of each rule with the name.
    pub places: Vec<String>,
}

/// The descriptor nodes under one parent, grouped by key so that resolving an
/// entry is two hash lookups (key, then exact value) before any glob is tried.
#[derive(Debug, Clone, Default)]
struct Level {
    by_key: Map<KeyNodes>,
}

/// The sibling nodes sharing one key, in Envoy's precedence order.
#[derive(Debug, Clone, Default)]
struct KeyNodes {
    exact: Map<TreeNode>,
    /// In file order: the first glob that matches wins, as in envoyproxy/ratelimit.
    globs: Vec<(Glob, TreeNode)>,
    /// The node with a key and no value: matches any value.
    any: Option<Box<TreeNode>>,
}

#[derive(Debug, Clone)]
struct TreeNode {
    /// Where the node starts (its list item), for duplicate reports.
    line: usize,
    /// `None`: no `rate_limit`, so a path ending here is allow-listed.
    rule: Option<Arc<Rule>>,
    children: Level,
    /// `share_threshold: true` on a glob value: every value the glob
    /// matches counts in one counter (keyed by the pattern).
    share_threshold: bool,
    /// `value_to_metric: true`: this level is named by the request's value
    /// in per-value metrics.
    value_to_metric: bool,
    /// The exact `value:` written, for metric names (`None` for a key-only
    /// node or a glob, whose pattern the glob holds).
    exact_value: Option<String>,
}

impl RuleSet {
    /// Parses and validates rule files. Each file holds one domain; a domain
    /// in two files is an error. Returns every error in every file.
    pub fn parse(files: &[RuleFile]) -> Result<RuleSet, RuleErrors> {
        let mut errors = Vec::new();
        let mut set = RuleSet {
            files: files.len(),
            ..RuleSet::default()
        };
        for file in files {
            let Some(parsed) = parse::parse_file(file, &mut errors) else {
                continue;
            };
            if let Some(&i) = set.index.get(&parsed.domain.name) {
                let first = &set.domains[i];
                errors.push(RuleError {
                    file: file.name.clone(),
                    line: parsed.domain.line,
                    field: "domain".to_owned(),
                    reason: format!(
                        "duplicate domain {:?}: already defined at {}:{}; each domain \
                         lives in one file",
                        first.name, first.file, first.line
                    ),
                });
                continue;
            }
            set.index
                .insert(parsed.domain.name.clone(), set.domains.len());
            set.domains.push(parsed.domain);
            set.rules.extend(parsed.rules);
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(RuleErrors(errors))
        }
    }

    /// The rule a descriptor resolves to, with Envoy's semantics: the entries
    /// are a path through the domain's tree, and the limit is the one on the
    /// node the whole path ends at. At each level an exact value beats a glob
    /// value (first in file order), which beats the key-only node.
    ///
    /// `None` when the domain is unknown, there are no entries, or the path
    /// leaves the tree. Allocates only the counter key.
    pub fn resolve<'s>(&'s self, domain: &str, entries: &[(&str, &str)]) -> Option<Resolved<'s>> {
        let domain = &self.domains[*self.index.get(domain)?].root;
        let (mut level, mut node, mut shared) = (domain, None, false);
        for &(key, value) in entries {
            let (n, glob) = level.by_key.get(key)?.find(value)?;
            shared |= n.share_threshold && glob.is_some();
            level = &n.children;
            node = Some(n);
        }
        let rule = node?.rule.as_ref();
        // The common case allocates the counter key only; a shared glob or a
        // per-value metric walks the path a second time.
        let path = || walk(domain, entries);
        let counter_key = if shared {
            let entries: Vec<(&str, &str)> = path()
                .map(|(key, value, n, glob)| match glob {
                    Some(g) if n.share_threshold => (key, g.pattern()),
                    _ => (key, value),
                })
                .collect();
            counter_key(&entries)
        } else {
            counter_key(entries)
        };
        let metric_key = rule
            .filter(|r| r.counts_values())
            .map(|r| metric_key(path(), r.detailed_metric));
        Some(Resolved {
            rule,
            counter_key,
            metric_key,
        })
    }

    /// A rule by its `rate_limit.name`; `None` when no rule or more than one
    /// carries it (see [`RuleSet::by_name`]).
    pub fn named(&self, domain: &str, name: &str) -> Option<&Arc<Rule>> {
        self.by_name(domain, name).ok().flatten()
    }

    /// A rule by its `rate_limit.name`: `Ok(None)` when no rule carries it,
    /// an error naming every place when several do.
    pub fn by_name(&self, domain: &str, name: &str) -> Result<Option<&Arc<Rule>>, AmbiguousName> {
        let Some(&i) = self.index.get(domain) else {
            return Ok(None);
        };
        match self.domains[i].named.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([rule]) => Ok(Some(rule)),
            Some(rules) => Err(AmbiguousName {
                domain: domain.to_owned(),
                name: name.to_owned(),
                places: rules
                    .iter()
                    .map(|r| format!("{}:{}", r.file, r.line))
                    .collect(),
            }),
        }
    }

    /// The domain's `stop_increment_when_over_limit`, if its file sets it.
    pub fn stop_increment(&self, domain: &str) -> Option<bool> {
        self.domains[*self.index.get(domain)?].stop_increment
    }

    /// A rule by its id.
    pub fn rule(&self, id: &str) -> Option<&Arc<Rule>> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// The rule and limit index behind an id of [`Rule::limit_id`] (a
    /// rule's own id is its first limit).
    pub fn limit_of(&self, id: &str) -> Option<(&Arc<Rule>, usize)> {
        let (rule_id, index) = split_limit_id(id);
        let rule = self.rule(rule_id)?;
        (index <= rule.also.len()).then_some((rule, index))
    }

    /// Every rule (limited or `unlimited`), in file order.
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.rules.iter()
    }

    /// The domains, in file order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.iter().map(|d| d.name.as_str())
    }

    /// How many files the set was parsed from.
    pub fn file_count(&self) -> usize {
        self.files
    }

    /// The same rules in shadow mode, counted under their own ids
    /// (`shadow/<id>`): a rule-set version in its shadow rollout stage is
    /// decided and counted beside the enforced rules without touching their
    /// counters or their answers.
    pub fn shadowed(&self) -> RuleSet {
        let mut by_id: Map<Arc<Rule>> = Map::default();
        for rule in &self.rules {
            let mut shadow = Rule::clone(rule);
            shadow.id = format!("shadow/{}", rule.id);
            shadow.shadow_mode = true;
            by_id.insert(rule.id.clone(), Arc::new(shadow));
        }
        let swap = |r: &Arc<Rule>| by_id.get(&r.id).cloned().unwrap_or_else(|| r.clone());
        let mut set = self.clone();
        set.rules = self.rules.iter().map(swap).collect();
        for domain in &mut set.domains {
            domain
                .named
                .values_mut()
                .flatten()
                .for_each(|r| *r = swap(r));
            domain.root.map_rules(&swap);
        }
        set
    }
}

impl Level {
    fn map_rules(&mut self, f: &impl Fn(&Arc<Rule>) -> Arc<Rule>) {
        for nodes in self.by_key.values_mut() {
            let exact = nodes.exact.values_mut();
            let globs = nodes.globs.iter_mut().map(|(_, n)| n);
            let any = nodes.any.as_deref_mut();
            for node in exact.chain(globs).chain(any) {
                node.rule = node.rule.as_ref().map(f);
                node.children.map_rules(f);
            }
        }
    }
}

impl KeyNodes {
    /// The node `value` matches, and the glob when it matched through one.
    fn find(&self, value: &str) -> Option<(&TreeNode, Option<&Glob>)> {
        self.exact
            .get(value)
            .map(|n| (n, None))
            .or_else(|| {
                self.globs
                    .iter()
                    .find(|(g, _)| g.matches(value))
                    .map(|(g, n)| (n, Some(g)))
            })
            .or(self.any.as_deref().map(|n| (n, None)))
    }
}

/// The nodes a descriptor's path goes through, with each entry and the glob
/// it matched by, if any; the caller has resolved the whole path already.
fn walk<'s, 'e>(
    root: &'s Level,
    entries: &'e [(&'e str, &'e str)],
) -> impl Iterator<Item = (&'e str, &'e str, &'s TreeNode, Option<&'s Glob>)> {
    let mut level = Some(root);
    entries.iter().map_while(move |&(key, value)| {
        let (node, glob) = level?.by_key.get(key)?.find(value)?;
        level = Some(&node.children);
        Some((key, value, node, glob))
    })
}

/// envoyproxy/ratelimit's metric key of a path: `key` for a level matched
/// by its key alone, `key_value` where a value was configured (the pattern,
/// for a glob) or where the request's value is shown (`value_to_metric` on
/// that level, or `detailed_metric` on the rule for every level), joined
/// by `.`.
fn metric_key<'a>(
    path: impl Iterator<Item = (&'a str, &'a str, &'a TreeNode, Option<&'a Glob>)>,
    detailed: bool,
) -> String {
    let mut out = String::new();
    for (i, (key, value, node, glob)) in path.enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(key);
        let configured = match glob {
            Some(g) => Some(g.pattern()),
            None => node.exact_value.as_deref(),
        };
        let shown = if detailed || node.value_to_metric {
            Some(value)
        } else {
            configured
        };
        if let Some(v) = shown {
            out.push('_');
            out.push_str(v);
        }
    }
    out
}

/// A descriptor value with `*` wildcards: `*` matches any run of characters,
/// including none. Stored split at the stars.
#[derive(Debug, Clone)]
struct Glob {
    pattern: String,
    /// At least two parts (there is at least one `*`); empty parts are fine.
    parts: Vec<String>,
}

impl Glob {
    /// `None` when `pattern` has no `*` (an exact value).
    fn new(pattern: &str) -> Option<Glob> {
        pattern.contains('*').then(|| Glob {
            pattern: pattern.to_owned(),
            parts: pattern.split('*').map(str::to_owned).collect(),
        })
    }

    fn pattern(&self) -> &str {
        &self.pattern
    }

    fn matches(&self, s: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(x) => x,
            None => return false,
        };
        let (last, middle) = match rest.split_last() {
            Some(x) => x,
            None => return s == first,
        };
        if s.len() < first.len() + last.len() || !s.starts_with(first.as_str()) {
            return false;
        }
        if !s.ends_with(last.as_str()) {
            return false;
        }
        // Leftmost-first placement of each middle part is optimal for `*`-only
        // patterns: any later placement leaves less room for the rest.
        let mut inner = &s[first.len()..s.len() - last.len()];
        for part in middle {
            match inner.find(part.as_str()) {
                Some(at) => inner = &inner[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The characters that structure counter keys and rule ids.
const RESERVED: [char; 3] = ['%', '|', '='];

/// Appends `s` with `%`, `|` and `=` percent-escaped: after escaping, `|` and
/// `=` only ever separate, so the encoding is injective.
fn escape_into(s: &str, out: &mut String) {
    if !s.contains(RESERVED) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

fn escaped_len(s: &str) -> usize {
    s.len() + 2 * s.chars().filter(|c| RESERVED.contains(c)).count()
}

/// The counter key of a descriptor: `k=v|k=v…`, escaped (see [`escape_into`]),
/// so two different entry lists never share a counter. One allocation.
pub fn counter_key(entries: &[(&str, &str)]) -> String {
    let len = entries
        .iter()
        .map(|(k, v)| escaped_len(k) + escaped_len(v) + 2)
        .sum();
    let mut out = String::with_capacity(len);
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        escape_into(k, &mut out);
        out.push('=');
        escape_into(v, &mut out);
    }
    out
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fuzz;
