//! What every transport shares: matching a request against the rules and
//! asking the engine, for Envoy's RLS requests and for native checks.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::engine::{Check, Engine, Verdict};
#[cfg(feature = "server")]
use super::global::{Global, GlobalLimit};
use super::rule_source::RuleSource;
use crate::algorithm::{InvalidInput, Params};
use crate::rules::{Rule, RuleSet, Unit};

/// Requests larger than this are refused whole (a runaway client, not traffic).
pub const MAX_DESCRIPTORS: usize = 1_000;
/// Entries one descriptor may hold, at most.
pub const MAX_ENTRIES: usize = 64;
/// Checks one native batch may hold, at most.
pub const MAX_BATCH: usize = 1_000;

/// What every transport (Envoy RLS, native gRPC, HTTP, the library) calls: the
/// engine, the rules it matches against and, in the server, the global-rule
/// state. One per process, shared behind an `Arc`.
pub struct Service {
    /// Decides matched checks (store, cache, breaker, fail mode).
    pub engine: Engine,
    /// The rules descriptors are matched against; replaced by reloads and by the
    /// coordinator's rule feed.
    pub rules: Arc<RuleSource>,
    /// Allocations of global rules (and demand reports) when coordinated.
    /// Only the server has a coordinator: in the library every rule, global
    /// or not, runs at its own limit, as an uncoordinated server's does.
    #[cfg(feature = "server")]
    pub global: Arc<Global>,
}

/// A request-level input error: which field, which value, why.
pub type RequestError = InvalidInput;

/// One descriptor of an RLS request, already decoded from protobuf.
#[derive(Debug, Clone)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    /// Envoy's per-descriptor `limit`: requests per unit.
    pub limit: Option<(u32, Unit)>,
    /// Envoy's per-descriptor `hits_addend` (Some(0) = check only).
    pub hits: Option<u64>,
}

/// The outcome for one descriptor: `None` when no rule applies (OK, unlimited).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub rule: Arc<Rule>,
    pub verdict: Verdict,
}

/// A native check (gRPC `meridian.v1.Check`, or its JSON form).
#[derive(Debug, Clone, Default)]
pub struct NativeCheck {
    pub domain: String,
    pub rule: String,
    pub key: String,
    pub descriptor: Vec<(String, String)>,
    pub cost: u64,
    pub check_only: bool,
}

impl Service {
    /// A limiter that takes no allocations (rules from files, the library).
    pub fn uncoordinated(engine: Engine, rules: Arc<RuleSource>) -> Service {
        Service {
            engine,
            rules,
            #[cfg(feature = "server")]
            global: Arc::new(Global::uncoordinated()),
        }
    }

    /// Decides every descriptor of an Envoy RLS request, in order. `hits` is
    /// the request's `hits_addend` (0 = 1).
    pub async fn rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u32,
    ) -> Result<Vec<Option<Outcome>>, RequestError> {
        let rules = self.rules.current();
        let enforced = self.rate_limit_with(&rules, domain, descriptors, hits);
        match self.rules.shadow() {
            // The shadow set's verdicts only feed logs and metrics.
            Some(shadow) => {
                let shadowed = self.rate_limit_with(&shadow, domain, descriptors, hits);
                futures::join!(enforced, shadowed).0
            }
            None => enforced.await,
        }
    }

    async fn rate_limit_with(
        &self,
        rules: &RuleSet,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u32,
    ) -> Result<Vec<Option<Outcome>>, RequestError> {
        if domain.is_empty() {
            return Err(InvalidInput::new("domain", "\"\"", "must not be empty"));
        }
        if descriptors.is_empty() {
            return Err(InvalidInput::new(
                "descriptors",
                "[]",
                "at least one descriptor is required",
            ));
        }
        if descriptors.len() > MAX_DESCRIPTORS {
            return Err(InvalidInput::new(
                "descriptors",
                format!("{} descriptors", descriptors.len()),
                format!("at most {MAX_DESCRIPTORS} per request"),
            ));
        }
        let default_hits = if hits == 0 { 1 } else { u64::from(hits) };

        // Match first: `replaces` depends on every rule the request matched.
        let mut matched = Vec::with_capacity(descriptors.len());
        for (i, d) in descriptors.iter().enumerate() {
            matched.push(match_descriptor(rules, domain, d, i)?);
        }
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();

        let checks = matched.iter().zip(descriptors).map(|(m, d)| async {
            let Some(m) = m else { return Ok(None) };
            if m.rule
                .name
                .as_deref()
                .is_some_and(|n| replaced.contains(&n))
            {
                return Ok(None);
            }
            let check = Check {
                rule: &m.rule,
                counter_key: &m.counter_key,
                cost: d.hits.unwrap_or(default_hits),
                limit: m.limit.as_ref(),
            };
            let verdict = self.decide(check).await?;
            Ok(Some(Outcome {
                rule: m.rule.clone(),
                verdict,
            }))
        });
        join_all(checks).await.into_iter().collect()
    }

    /// Decides a batch of native checks; one result per check, in order. A
    /// malformed check gets its own error and does not fail the batch.
    pub async fn check_batch(
        &self,
        checks: &[NativeCheck],
    ) -> Result<Vec<Result<Option<Outcome>, InvalidInput>>, RequestError> {
        let rules = self.rules.current();
        let enforced = self.check_batch_with(&rules, checks);
        match self.rules.shadow() {
            Some(shadow) => futures::join!(enforced, self.check_batch_with(&shadow, checks)).0,
            None => enforced.await,
        }
    }

    async fn check_batch_with(
        &self,
        rules: &RuleSet,
        checks: &[NativeCheck],
    ) -> Result<Vec<Result<Option<Outcome>, InvalidInput>>, RequestError> {
        if checks.len() > MAX_BATCH {
            return Err(InvalidInput::new(
                "checks",
                format!("{} checks", checks.len()),
                format!("at most {MAX_BATCH} per batch"),
            ));
        }
        let futures = checks.iter().map(|c| async move {
            let Some((rule, counter_key)) = match_native(rules, c)? else {
                return Ok(None);
            };
            let cost = match (c.check_only, c.cost) {
                (true, _) => 0,
                (false, 0) => 1,
                (false, n) => n,
            };
            let verdict = self
                .decide(Check {
                    rule: &rule,
                    counter_key: &counter_key,
                    cost,
                    limit: None,
                })
                .await?;
            Ok(Some(Outcome { rule, verdict }))
        });
        Ok(join_all(futures).await)
    }
}

impl Service {
    /// One check: a global rule runs against this region's allocation (and
    /// is counted for the demand report); every other rule as is. An Envoy
    /// per-descriptor `limit` override wins over the allocation.
    async fn decide(&self, check: Check<'_>) -> Result<Verdict, InvalidInput> {
        #[cfg(feature = "server")]
        if check.limit.is_none() {
            return self.decide_global(check).await;
        }
        self.engine.check(check).await
    }

    /// The server's path: through this region's allocation when coordinated.
    #[cfg(feature = "server")]
    async fn decide_global(&self, check: Check<'_>) -> Result<Verdict, InvalidInput> {
        let _in_flight = self.global.flight(check.rule);
        let verdict = match self.global.limit(check.rule, check.counter_key)? {
            GlobalLimit::Rule => return self.engine.check(check).await,
            GlobalLimit::Allocated(params) => {
                self.engine
                    .check(Check {
                        limit: Some(&params),
                        ..check
                    })
                    .await?
            }
            GlobalLimit::Nothing => self.engine.unallocated(check.rule),
        };
        let d = &verdict.decision;
        self.global.record(
            check.rule,
            check.counter_key,
            check.cost,
            d.allowed && !verdict.shadow_denied,
            d.limit,
            d.remaining,
        );
        Ok(verdict)
    }
}

/// A descriptor resolved to a rule: the counter to check and its limit.
struct Matched {
    rule: Arc<Rule>,
    counter_key: String,
    /// Params built from the descriptor's `limit` override.
    limit: Option<Params>,
}

fn match_descriptor(
    rules: &RuleSet,
    domain: &str,
    d: &Descriptor,
    index: usize,
) -> Result<Option<Matched>, RequestError> {
    if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
        return Err(InvalidInput::new(
            "descriptors.entries",
            format!("descriptor {index} with {} entries", d.entries.len()),
            format!("each descriptor needs 1 to {MAX_ENTRIES} entries"),
        ));
    }
    let entries: Vec<(&str, &str)> = d
        .entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let Some(resolved) = rules.resolve(domain, &entries) else {
        return Ok(None);
    };
    let Some(rule) = resolved.rule else {
        return Ok(None);
    };
    let limit = match d.limit {
        Some((requests, unit)) => Some(override_params(rule, requests, unit)?),
        None => None,
    };
    Ok(Some(Matched {
        rule: rule.clone(),
        counter_key: resolved.counter_key,
        limit,
    }))
}

/// Envoy's per-descriptor override keeps the rule's algorithm and replaces
/// the rate (and, for buckets, the burst).
fn override_params(rule: &Rule, requests: u32, unit: Unit) -> Result<Params, InvalidInput> {
    let algorithm = rule
        .params
        .as_ref()
        .map_or(crate::algorithm::Algorithm::FixedWindow, Params::algorithm);
    let requests = i64::from(requests);
    Params::new(
        algorithm,
        requests,
        unit_period(unit),
        algorithm.has_burst().then_some(requests),
    )
}

pub fn unit_period(unit: Unit) -> Duration {
    match unit {
        Unit::Second => Duration::from_secs(1),
        Unit::Minute => Duration::from_secs(60),
        Unit::Hour => Duration::from_secs(3600),
        Unit::Day => Duration::from_secs(86_400),
        Unit::Week => Duration::from_secs(7 * 86_400),
        Unit::Month => Duration::from_secs(30 * 86_400),
        Unit::Year => Duration::from_secs(365 * 86_400),
        Unit::Custom(d) => d,
    }
}

/// `rule` + `key`, or a descriptor; `None` when nothing matches.
fn match_native(
    rules: &RuleSet,
    c: &NativeCheck,
) -> Result<Option<(Arc<Rule>, String)>, InvalidInput> {
    if c.domain.is_empty() {
        return Err(InvalidInput::new("domain", "\"\"", "must not be empty"));
    }
    match (c.rule.is_empty(), c.descriptor.is_empty()) {
        (false, true) => Ok(rules
            .named(&c.domain, &c.rule)
            .map(|r| (r.clone(), c.key.clone()))),
        (true, false) => {
            if c.descriptor.len() > MAX_ENTRIES {
                return Err(InvalidInput::new(
                    "descriptor",
                    format!("{} entries", c.descriptor.len()),
                    format!("at most {MAX_ENTRIES}"),
                ));
            }
            let entries: Vec<(&str, &str)> = c
                .descriptor
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            Ok(rules
                .resolve(&c.domain, &entries)
                .and_then(|r| r.rule.map(|rule| (rule.clone(), r.counter_key))))
        }
        (false, false) => Err(InvalidInput::new(
            "rule",
            &c.rule,
            "give either rule + key or a descriptor, not both",
        )),
        (true, true) => Err(InvalidInput::new(
            "rule",
            "\"\"",
            "give either rule + key or a descriptor",
        )),
    }
}
