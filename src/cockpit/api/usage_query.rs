//! What `GET /api/v1/usage` asks about: its query, and the rule and
//! counter key it names in the enforced rules (a descriptor resolved as a
//! check's is, or a rule and a key as a check by rule name gives them), or
//! the field at fault.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::Deserialize;
use serde_json::json;

use super::super::Api;
use super::super::errors::ApiError;
use crate::overrides::split_entries;
use crate::rules::{Rule, RuleSet};

pub(in super::super) fn unprocessable(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message).with("field", json!(field))
}

/// The query of `GET /api/v1/usage`, checked before anything is relayed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in super::super) struct UsageQuery {
    pub(in super::super) domain: Option<String>,
    /// `K=V;K2=V2`, outermost entry first.
    pub(in super::super) descriptor: Option<String>,
    /// With `key`: a rule id, or a `rate_limit.name` of `domain`.
    pub(in super::super) rule: Option<String>,
    /// With `rule`: the counter key as a check by rule name gives it.
    pub(in super::super) key: Option<String>,
    #[expect(dead_code, reason = "read by the Read extractor, not from here")]
    pub(in super::super) consistent: Option<bool>,
}

impl FromRequestParts<Api> for UsageQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        match Query::<UsageQuery>::from_request_parts(parts, api).await {
            Ok(Query(query)) => Ok(query),
            Err(e) => Err(
                ApiError::new(StatusCode::BAD_REQUEST, format!("query: {e}")).with(
                    "allowed",
                    json!(["domain", "descriptor", "rule", "key", "consistent"]),
                ),
            ),
        }
    }
}

/// The rule and counter a query names.
#[derive(Debug, Clone)]
pub(in super::super) struct Target {
    /// The domain asked about (the rule's).
    pub domain: String,
    /// The descriptor as asked (`K=V` each), empty for rule + key.
    pub descriptor: Vec<String>,
    pub rule: Arc<Rule>,
    /// The counter key: what the limiters, the ledger, allocations and
    /// overrides name the key by.
    pub key: String,
}

/// The rule and counter key `q` names in `rules`, or why not (422 naming
/// the field).
pub(in super::super) fn target(rules: &RuleSet, q: &UsageQuery) -> Result<Target, ApiError> {
    let domain_known = |d: &str| rules.domains().any(|known| known == d);
    if let Some(d) = &q.domain
        && !domain_known(d)
    {
        return Err(unprocessable(
            "domain",
            format!("no rule of the enforced rule set has domain {d:?}"),
        )
        .with("domains", json!(rules.domains().collect::<Vec<_>>())));
    }
    match (&q.descriptor, &q.rule, &q.key) {
        (Some(text), None, None) => {
            let Some(domain) = &q.domain else {
                return Err(unprocessable("domain", "a descriptor needs its domain"));
            };
            let parts: Vec<String> = text
                .split(';')
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect();
            let entries =
                split_entries(&parts).map_err(|e| unprocessable("descriptor", e.to_string()))?;
            if entries.is_empty() {
                return Err(unprocessable(
                    "descriptor",
                    "give at least one KEY=VALUE entry",
                ));
            }
            let borrowed: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let Some(resolved) = rules.resolve(domain, &borrowed) else {
                return Err(unprocessable(
                    "descriptor",
                    format!("{text} matches no rule of domain {domain}"),
                ));
            };
            let Some(rule) = resolved.rule else {
                return Err(unprocessable(
                    "descriptor",
                    format!(
                        "{text} resolves to an allow-list entry (no rate_limit): nothing is counted"
                    ),
                ));
            };
            counted(Target {
                domain: domain.clone(),
                descriptor: parts,
                rule: Arc::clone(rule),
                key: resolved.counter_key,
            })
        }
        (None, Some(rule), Some(key)) => {
            let by_id = rules.rule(rule);
            let by_name = || {
                q.domain
                    .as_deref()
                    .and_then(|d| rules.by_name(d, rule).transpose())
            };
            let found = match (by_id, by_name()) {
                (Some(r), _) => r,
                (None, Some(Ok(r))) => r,
                (None, Some(Err(e))) => return Err(unprocessable("rule", e.to_string())),
                (None, None) => {
                    return Err(unprocessable(
                        "rule",
                        format!(
                            "{rule:?} is neither a rule id of the enforced rule set nor a \
                             rate_limit.name of the domain given"
                        ),
                    ));
                }
            };
            if q.domain.as_ref().is_some_and(|d| *d != found.domain) {
                return Err(unprocessable(
                    "rule",
                    format!("rule {} is of domain {}", found.id, found.domain),
                ));
            }
            counted(Target {
                domain: found.domain.clone(),
                descriptor: Vec::new(),
                rule: Arc::clone(found),
                key: key.clone(),
            })
        }
        (None, None, None) => Err(unprocessable(
            "descriptor",
            "give domain= and descriptor=KEY=VALUE;…, or rule= and key=",
        )),
        (Some(_), _, _) => Err(unprocessable(
            if q.rule.is_some() { "rule" } else { "key" },
            "give a descriptor, or rule= and key=, not both",
        )),
        (None, Some(_), None) => Err(unprocessable("key", "rule= needs key=")),
        (None, None, Some(_)) => Err(unprocessable("rule", "key= needs rule=")),
    }
}

/// `t`, unless its rule counts nothing.
fn counted(t: Target) -> Result<Target, ApiError> {
    if t.rule.limits().next().is_none() {
        let field = if t.descriptor.is_empty() {
            "rule"
        } else {
            "descriptor"
        };
        return Err(unprocessable(
            field,
            format!(
                "resolves to rule {}, which counts nothing (unlimited, or a limit of 0 that \
                 denies every request)",
                t.rule.id
            ),
        ));
    }
    Ok(t)
}
