//! A limit's rule: the `rate_limit` map (unit, requests, name, replaces),
//! a rule built from it and Meridian's sibling fields (algorithm, burst,
//! period, split), and a `limits:` list of several limits on one key.

use std::str::FromStr;

use marked_yaml::Node;
use marked_yaml::types::MarkedMappingNode;

use super::values::{is_null, key_line, kind, line, scalar_line};
use super::{Cx, LIMIT_FIELDS, NodeFlags, RATE_LIMIT_FIELDS};
use crate::algorithm::{Algorithm, Params};
use crate::rules::{Accuracy, FailMode, Partition, Rule, Scope, SettleMode, Unit};

/// Limits one descriptor's `limits:` may hold: each is a few Lua lines per
/// check, and 8 covers a burst, a rate and quotas by minute, hour, day,
/// week and month.
const MAX_LIMITS: usize = 8;
const MAX_SPLIT: u32 = 1024;

/// The `rate_limit` map, checked field by field.
pub(super) struct RateLimitSpec {
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
    /// `at`: the line of the `rate_limit` key, which the rule reports as its own.
    pub(super) fn rate_limit(&mut self, node: &Node, at: usize) -> Option<RateLimitSpec> {
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
    pub(super) fn limits(
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
        self.cost_quota(map, &mut rule);
        (self.errors.len() == before).then_some(rule)
    }

    /// Errors for Meridian's limit fields on a node without a limit.
    pub(super) fn reject_limit_fields(&mut self, map: &MarkedMappingNode, why: &str) {
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
    pub(super) fn rule(
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
            fallback_hold: crate::rules::model::DEFAULT_FALLBACK_HOLD,
            confirm_ban: false,
            max_cost: None,
            max_overdraft: None,
            settle: SettleMode::default(),
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
            Ok(params) => {
                rule.params = Some(params);
                self.cost_quota(map, &mut rule);
                if self.errors.len() != before {
                    return None;
                }
            }
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
}

fn period_line(map: &MarkedMappingNode) -> Option<usize> {
    map.get_node("period").map(line)
}
