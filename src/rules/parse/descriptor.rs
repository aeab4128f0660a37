//! The descriptor tree: each `descriptors` list into a [`Level`], each
//! descriptor's key, value and flags, the rule it carries (see `rule`), and
//! the checks that need the tree (duplicate siblings, the rule id's length).

use std::sync::Arc;

use marked_yaml::Node;
use marked_yaml::types::MarkedMappingNode;

use super::values::{is_null, key_line, kind, line};
use super::{Cx, DESCRIPTOR_FIELDS, LIMIT_FIELDS, NodeFlags};
use crate::rules::{Glob, KeyNodes, Level, TreeNode, escape_into};
use crate::store::key::MAX_KEY_LEN;

impl Cx<'_> {
    /// A `descriptors` list into `level`. `inherited`: a node above set
    /// `value_to_metric`, which the rules below carry.
    pub(super) fn descriptors(
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
