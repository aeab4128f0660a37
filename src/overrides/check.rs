//! Whether a proposed override can be held: its descriptor resolves to one
//! rule that counts that key on its own, and its limit is one the rule's
//! algorithm takes and the shared floor allows. Called by the admin API
//! before it proposes a change, against the enforced rule set.

use std::time::Duration;

use super::{MAX_REASON_BYTES, MAX_SET_BY_BYTES, Override};
use crate::algorithm::{InvalidInput, Params};
use crate::rules::{RuleSet, counter_key};

/// Most entries in an override's descriptor (as in a check).
const MAX_ENTRIES: usize = 16;

/// An override as an operator or a billing system asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposed {
    /// The descriptor's domain.
    pub domain: String,
    /// The descriptor, outermost entry first.
    pub entries: Vec<(String, String)>,
    /// The rule it must resolve to (`None`: whichever it resolves to); with
    /// `key` and no entries, the rule's `name` as native checks address it.
    pub rule: Option<String>,
    /// The key as a native check by rule name gives it (`rule` + `key`,
    /// which counts under the key as given), instead of `entries`.
    pub key: Option<String>,
    /// Requests per the rule's period.
    pub limit: u64,
    /// A bucket's burst.
    pub burst: Option<u64>,
    /// When it lapses.
    pub expires_at_unix_ms: Option<i64>,
    /// Why.
    pub reason: String,
}

/// The override `proposed` is in `rules`, set by `set_by` at `now`, or why
/// it cannot be: the field at fault, its value and the reason.
/// `floor_per_minute` is `--shared-rule-floor` (0 = off).
pub fn resolve(
    rules: &RuleSet,
    proposed: &Proposed,
    floor_per_minute: f64,
    set_by: &str,
    now_unix_ms: i64,
) -> Result<Override, InvalidInput> {
    let p = proposed;
    if p.entries.is_empty()
        && let Some(key) = &p.key
    {
        return resolve_named(rules, p, key, floor_per_minute, set_by, now_unix_ms);
    }
    if p.key.is_some() {
        return Err(InvalidInput::new(
            "key",
            p.key.as_deref().unwrap_or_default(),
            "give a descriptor, or a rule name and a key, not both",
        ));
    }
    if p.entries.is_empty() || p.entries.len() > MAX_ENTRIES {
        return Err(InvalidInput::new(
            "descriptor",
            format!("{} entries", p.entries.len()),
            format!("an override's descriptor needs 1 to {MAX_ENTRIES} KEY=VALUE entries"),
        ));
    }
    let entries: Vec<(&str, &str)> = p
        .entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let shown = || {
        entries
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !rules.domains().any(|d| d == p.domain) {
        return Err(InvalidInput::new(
            "domain",
            &p.domain,
            "no rule of the enforced rule set has this domain",
        ));
    }
    let Some(resolved) = rules.resolve(&p.domain, &entries) else {
        return Err(InvalidInput::new(
            "descriptor",
            shown(),
            format!("matches no rule of domain {}", p.domain),
        ));
    };
    let Some(rule) = resolved.rule else {
        return Err(InvalidInput::new(
            "descriptor",
            shown(),
            "resolves to an allow-list entry (no rate_limit): nothing to override",
        ));
    };
    if let Some(named) = &p.rule
        && *named != rule.id
    {
        return Err(InvalidInput::new(
            "rule",
            named,
            format!("the descriptor resolves to rule {}, not this one", rule.id),
        ));
    }
    let Some(params) = rule.params.as_ref().filter(|_| !rule.unlimited) else {
        return Err(InvalidInput::new(
            "descriptor",
            shown(),
            format!("resolves to rule {}, which is unlimited", rule.id),
        ));
    };
    if !rule.also.is_empty() {
        return Err(InvalidInput::new(
            "rule",
            &rule.id,
            "has several limits (`limits:`); an override replaces one limit, so it applies \
             to rules with one rate_limit",
        ));
    }
    if resolved.counter_key != counter_key(&entries) {
        return Err(InvalidInput::new(
            "descriptor",
            shown(),
            format!(
                "rule {} counts every value its share_threshold glob matches in one counter \
                 ({}): an override of one value cannot apply",
                rule.id, resolved.counter_key
            ),
        ));
    }
    finish(
        p,
        rule,
        params,
        resolved.counter_key,
        floor_per_minute,
        set_by,
        now_unix_ms,
    )
}

/// The override of `key` of the rule named `p.rule`, addressed as a native
/// check by rule name addresses it.
fn resolve_named(
    rules: &RuleSet,
    p: &Proposed,
    key: &str,
    floor_per_minute: f64,
    set_by: &str,
    now_unix_ms: i64,
) -> Result<Override, InvalidInput> {
    let Some(name) = &p.rule else {
        return Err(InvalidInput::new(
            "rule",
            "",
            "a key without a descriptor needs the rule's name (as checks by rule name give it)",
        ));
    };
    if !rules.domains().any(|d| d == p.domain) {
        return Err(InvalidInput::new(
            "domain",
            &p.domain,
            "no rule of the enforced rule set has this domain",
        ));
    }
    // Its name as checks give it, or its id (as exports write it).
    let by_id = rules.rules().find(|r| r.id == *name);
    let rule = match (rules.by_name(&p.domain, name), by_id) {
        (Ok(Some(rule)), _) | (Ok(None), Some(rule)) => rule,
        (Ok(None), None) => {
            return Err(InvalidInput::new(
                "rule",
                name,
                format!("no rule of domain {} has this name", p.domain),
            ));
        }
        (Err(e), _) => return Err(InvalidInput::new("rule", name, e.to_string())),
    };
    crate::store::key::check(&rule.id, key)?;
    let Some(params) = rule.params.as_ref().filter(|_| !rule.unlimited) else {
        return Err(InvalidInput::new("rule", name, "is unlimited"));
    };
    if !rule.also.is_empty() {
        return Err(InvalidInput::new(
            "rule",
            name,
            "has several limits (`limits:`); an override replaces one limit, so it applies \
             to rules with one rate_limit",
        ));
    }
    finish(
        p,
        rule,
        params,
        key.to_owned(),
        floor_per_minute,
        set_by,
        now_unix_ms,
    )
}

/// The checks every override passes once its rule and key are known.
fn finish(
    p: &Proposed,
    rule: &crate::rules::Rule,
    params: &Params,
    key: String,
    floor_per_minute: f64,
    set_by: &str,
    now_unix_ms: i64,
) -> Result<Override, InvalidInput> {
    // The rule's algorithm must take the numbers.
    params_for(params, p.limit, p.burst)?;
    let per_minute = p.limit as f64 * 60.0 / params.period().as_secs_f64();
    if floor_per_minute > 0.0 && per_minute < floor_per_minute {
        return Err(InvalidInput::new(
            "limit",
            p.limit,
            format!(
                "{per_minute:.2} per minute is below the floor of {floor_per_minute} per minute \
                 (--shared-rule-floor)"
            ),
        ));
    }
    if let Some(at) = p.expires_at_unix_ms
        && at <= now_unix_ms
    {
        // Named as the request names it: a body's or a CSV column's field.
        return Err(InvalidInput::new(
            "expires_at_unix_ms",
            crate::clock::utc_text(at),
            "is not in the future",
        ));
    }
    if p.reason.len() > MAX_REASON_BYTES || p.reason.chars().any(char::is_control) {
        return Err(InvalidInput::new(
            "reason",
            format!("{} bytes", p.reason.len()),
            format!("at most {MAX_REASON_BYTES} bytes, no control characters"),
        ));
    }
    Ok(Override {
        domain: p.domain.clone(),
        entries: p.entries.clone(),
        rule: rule.id.clone(),
        rule_name: rule.name.clone(),
        key,
        limit: p.limit,
        burst: p.burst,
        expires_at_unix_ms: p.expires_at_unix_ms,
        reason: p.reason.clone(),
        set_by: set_by.chars().take(MAX_SET_BY_BYTES).collect(),
        set_at_unix_ms: now_unix_ms,
    })
}

/// The params an override of `limit` (and `burst`) gives a rule of
/// `rule`'s params: its algorithm and period, the override's numbers.
pub fn params_for(rule: &Params, limit: u64, burst: Option<u64>) -> Result<Params, InvalidInput> {
    let algorithm = rule.algorithm();
    if burst.is_some() && !algorithm.has_burst() {
        return Err(InvalidInput::new(
            "burst",
            burst.unwrap_or_default(),
            format!(
                "applies to token_bucket and leaky_bucket rules; this rule is {}",
                algorithm.name()
            ),
        ));
    }
    let Ok(limit_i64) = i64::try_from(limit) else {
        return Err(InvalidInput::new("limit", limit, "too large"));
    };
    if limit == 0 {
        return Err(InvalidInput::new(
            "limit",
            0,
            "must be at least 1 (a ban belongs in the rule file, with confirm_ban)",
        ));
    }
    let burst = match burst {
        Some(b) => Some(i64::try_from(b).map_err(|_| InvalidInput::new("burst", b, "too large"))?),
        None => algorithm.has_burst().then_some(limit_i64),
    };
    let period: Duration = rule.period();
    Params::new(algorithm, limit_i64, period, burst)
}
