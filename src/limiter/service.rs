//! What every transport shares: matching a request against the rules and
//! asking the engine, for Envoy's RLS requests and for native checks.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use metrics::{counter, gauge};

use super::engine::{Check, Engine};
#[cfg(feature = "server")]
use super::global::{Counted, Global, GlobalLimit, GlobalLimits};
use super::overrides::HeldOverrides;
use super::rule_source::RuleSource;
use super::verdict::{Source, Verdict};
use crate::algorithm::{DenyReason, InvalidInput, Params};
use crate::rules::{Rule, RuleSet, SettleMode, Unit};
use crate::store::key;

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
    /// envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT for
    /// domains whose file does not say (`stop_increment_when_over_limit:`):
    /// a request one descriptor denies charges none of the others. Off by
    /// default, as there.
    pub stop_increment: bool,
    /// Per-key overrides from the coordinators (none in the library).
    pub overrides: Arc<HeldOverrides>,
    /// This region's name (`--region`; `local` in the library): every
    /// reservation id carries it, and only this region's store holds the
    /// reservation.
    pub region: String,
}

/// A request-level input error: which field, which value, why.
pub type RequestError = InvalidInput;

/// One descriptor's answer: `Ok(None)` when no rule applies (OK, unlimited),
/// `Err` when the descriptor itself is malformed (it alone is refused).
pub type DescriptorResult = Result<Option<Outcome>, InvalidInput>;

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
    /// Publishes the state gauges (called when /metrics is scraped): the
    /// engine's, each rule's limit (`meridian_rule_limit{rule, scope}`, hits
    /// per `meridian_rule_period_seconds{rule}`), and with a coordinator each
    /// global rule's allocation in this region. One series per rule loaded:
    /// rules are the operator's.
    pub fn report_gauges(&self) {
        self.engine.report_gauges();
        gauge!("meridian_overrides").set(self.overrides.len() as f64);
        let rules = self.rules.current();
        for rule in rules.rules() {
            let Some(params) = rule.params.as_ref().filter(|_| !rule.unlimited) else {
                continue;
            };
            let scope = match rule.scope {
                crate::rules::Scope::Region => "region",
                crate::rules::Scope::Global => "global",
            };
            gauge!("meridian_rule_limit", "rule" => rule.id.clone(), "scope" => scope)
                .set(params.limit() as f64);
            gauge!("meridian_rule_period_seconds", "rule" => rule.id.clone())
                .set(params.period().as_secs_f64());
        }
        #[cfg(feature = "server")]
        self.global.report_gauges();
    }

    /// A limiter that takes no allocations (rules from files, the library).
    pub fn uncoordinated(engine: Engine, rules: Arc<RuleSource>) -> Service {
        Service {
            engine,
            rules,
            #[cfg(feature = "server")]
            global: Arc::new(Global::uncoordinated()),
            stop_increment: false,
            overrides: Arc::default(),
            region: "local".to_owned(),
        }
    }

    /// Decides every descriptor of an Envoy RLS request, in order. `hits` is
    /// the request's `hits_addend` (0 = 1).
    ///
    /// Only a malformed request (no domain, no descriptors, too many) is an
    /// error for the whole request. A bad descriptor (too many entries, an
    /// over-long key, a bad override) is that descriptor's own error: the
    /// others are still decided and charged, so one crafted header cannot
    /// turn a request into an error that a gateway's fail-open lets through
    /// uncounted.
    pub async fn rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u32,
    ) -> Result<Vec<DescriptorResult>, RequestError> {
        let rules = self.rules.current();
        let enforced = self.rate_limit_with(&rules, domain, descriptors, hits);
        let results = match self.rules.shadow() {
            // The shadow set's verdicts only feed logs and metrics.
            Some(shadow) => {
                let shadowed = self.rate_limit_with(&shadow, domain, descriptors, hits);
                futures::join!(enforced, shadowed).0
            }
            None => enforced.await,
        }?;
        for (i, result) in results.iter().enumerate() {
            if let Err(e) = result {
                counter!("meridian_invalid_descriptors_total", "field" => e.field).increment(1);
                tracing::debug!(domain, descriptor = i, error = %e, "descriptor refused");
            }
        }
        Ok(results)
    }

    async fn rate_limit_with(
        &self,
        rules: &RuleSet,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u32,
    ) -> Result<Vec<DescriptorResult>, RequestError> {
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
        let matched: Vec<Result<Option<Matched>, InvalidInput>> = descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| match_descriptor(rules, &self.overrides, domain, d, i))
            .collect();
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();

        let live: Vec<Result<Option<&Matched>, InvalidInput>> = matched
            .iter()
            .map(|m| match m {
                Ok(Some(m))
                    if !m
                        .rule
                        .name
                        .as_deref()
                        .is_some_and(|n| replaced.contains(&n)) =>
                {
                    Ok(Some(m))
                }
                Ok(_) => Ok(None),
                Err(e) => Err(e.clone()),
            })
            .collect();
        // A `settle: on_stream_done` rule reads an unset hits_addend as 0
        // (the request-time check), not 1; see `limiter::stream_done`.
        let costs: Vec<u64> = descriptors
            .iter()
            .zip(&live)
            .map(|(d, m)| match m {
                Ok(Some(m)) if m.rule.settle == SettleMode::OnStreamDone => {
                    d.hits.unwrap_or(u64::from(hits))
                }
                _ => d.hits.unwrap_or(default_hits),
            })
            .collect();
        // Stream-done settlements: never denied, so no other descriptor's
        // denial holds them back (Envoy would not send them again).
        let settles: Vec<bool> = live
            .iter()
            .zip(&costs)
            .map(|(m, &cost)| {
                matches!(m, Ok(Some(m)) if m.rule.settle == SettleMode::OnStreamDone && cost > 0)
            })
            .collect();
        let stop_increment = rules.stop_increment(domain).unwrap_or(self.stop_increment);
        if stop_increment && live.iter().flatten().flatten().count() > 1 {
            // Ask first without charging; charge only when none would deny.
            // The two rounds are not atomic: a check racing between them can
            // still see a charge, as in envoyproxy/ratelimit, whose pre-check
            // reads the cache the same way. Settlements are made in the
            // first round, once.
            let mut peeked = self
                .decide_all(&live, |i| if settles[i] { costs[i] } else { 0 })
                .await;
            let denies = peeked.iter().enumerate().any(|(i, p)| match p {
                Ok(Some(o)) => !settles[i] && would_deny(&o.verdict, costs[i]),
                _ => false,
            });
            if !denies {
                let rest: Vec<_> = live
                    .iter()
                    .zip(&settles)
                    .map(|(m, &settled)| if settled { Ok(None) } else { m.clone() })
                    .collect();
                let mut decided = self.decide_all(&rest, |i| costs[i]).await;
                for (i, settled) in settles.iter().enumerate() {
                    if *settled {
                        std::mem::swap(&mut decided[i], &mut peeked[i]);
                    }
                }
                return Ok(decided);
            }
            return Ok(peeked
                .into_iter()
                .zip(&costs)
                .zip(&settles)
                .map(|((p, &cost), &settled)| {
                    p.map(|o| {
                        o.map(|mut o| {
                            if !settled && would_deny(&o.verdict, cost) {
                                o.verdict.decision.allowed = false;
                                o.verdict
                                    .decision
                                    .reason
                                    .get_or_insert(DenyReason::OverLimit);
                            }
                            o
                        })
                    })
                })
                .collect());
        }
        Ok(self.decide_all(&live, |i| costs[i]).await)
    }

    /// Decides every matched descriptor at `cost(i)`, concurrently, in order.
    async fn decide_all(
        &self,
        live: &[Result<Option<&Matched>, InvalidInput>],
        cost: impl Fn(usize) -> u64,
    ) -> Vec<DescriptorResult> {
        let checks = live.iter().enumerate().map(|(i, m)| {
            let cost = cost(i);
            async move {
                let m = match m {
                    Ok(Some(m)) => m,
                    Ok(None) => return Ok(None),
                    Err(e) => return Err(e.clone()),
                };
                let verdict = if m.rule.settle == SettleMode::OnStreamDone {
                    let metric_key = m.metric_key.as_deref();
                    self.stream_done_step(&m.rule, &m.counter_key, metric_key, cost)
                        .await?
                } else {
                    self.decide(Check {
                        rule: &m.rule,
                        counter_key: &m.counter_key,
                        cost,
                        limit: m.limit.as_ref(),
                        metric_key: m.metric_key.as_deref(),
                    })
                    .await?
                };
                Ok(Some(Outcome {
                    rule: m.rule.clone(),
                    verdict,
                }))
            }
        });
        join_all(checks).await
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
            let Some(NativeMatch {
                rule,
                counter_key,
                metric_key,
            }) = match_native(rules, c)?
            else {
                return Ok(None);
            };
            let cost = match (c.check_only, c.cost) {
                (true, _) => 0,
                (false, 0) => 1,
                (false, n) => n,
            };
            if rule.settle == SettleMode::OnStreamDone {
                // check_only is the call's admission, a cost its settlement.
                let metric_key = metric_key.as_deref();
                let verdict = self
                    .stream_done_step(&rule, &counter_key, metric_key, cost)
                    .await?;
                return Ok(Some(Outcome { rule, verdict }));
            }
            let overridden = self.overrides.params(&rule, &counter_key);
            let verdict = self
                .decide(Check {
                    rule: &rule,
                    counter_key: &counter_key,
                    cost,
                    limit: overridden.as_ref(),
                    metric_key: metric_key.as_deref(),
                })
                .await?;
            Ok(Some(Outcome { rule, verdict }))
        });
        Ok(join_all(futures).await)
    }
}

impl Service {
    /// One check: a global rule runs against this region's allocation (and
    /// is counted for the demand report); every other rule as is.
    pub(crate) async fn decide(&self, check: Check<'_>) -> Result<Verdict, InvalidInput> {
        // Before anything is stored under the key: the over-limit cache, the
        // demand counts and the fail-mode store all keep it.
        key::check(&check.rule.id, check.counter_key)?;
        #[cfg(feature = "server")]
        return self.decide_global(check).await;
        #[cfg(not(feature = "server"))]
        self.engine.check(check).await
    }

    /// The server's path: through this region's allocation when coordinated.
    /// An Envoy per-descriptor `limit` on a global rule is the key's
    /// world-wide limit: this region enforces its share of it, in the
    /// proportion its allocation holds of the rule's limit, and the hits are
    /// demand like any other (an override never bypasses the global bound).
    #[cfg(feature = "server")]
    async fn decide_global(&self, check: Check<'_>) -> Result<Verdict, InvalidInput> {
        let _in_flight = self.global.flight(check.rule);
        if !check.rule.also.is_empty() && check.limit.is_none() {
            return self.decide_global_limits(check).await;
        }
        let verdict = match self
            .global
            .limit(check.rule, check.counter_key, check.limit)?
        {
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
            Counted {
                cost: check.cost,
                allowed: d.allowed && !verdict.shadow_denied,
                limit: d.limit,
                remaining: d.remaining,
                reset_after_us: d.reset_after_us,
                // An override's count is against its own limit, not the
                // rule's window cap the coordinator compares window use with.
                window_use: check.limit.is_none(),
            },
        );
        Ok(verdict)
    }

    /// A `limits:` rule through this region's allocation of each limit:
    /// one store call over all of them, and each limit's hits counted as
    /// demand under its own id, with its own decision's window use.
    #[cfg(feature = "server")]
    async fn decide_global_limits(&self, check: Check<'_>) -> Result<Verdict, InvalidInput> {
        let rule = check.rule;
        let allocated = match self.global.limits(rule, check.counter_key)? {
            GlobalLimits::Rule => return self.engine.check(check).await,
            GlobalLimits::Allocated(limits) => limits,
            GlobalLimits::Nothing => Vec::new(),
        };
        let (verdict, decisions) = if allocated.is_empty() {
            (self.engine.unallocated(rule), Vec::new())
        } else {
            let limits: Vec<&Params> = allocated.iter().collect();
            self.engine.check_limits(check, &limits).await?
        };
        let allowed = verdict.decision.allowed && !verdict.shadow_denied;
        for index in 0..=rule.also.len() {
            // A denial before any counter was read answers one decision:
            // the verdict's, which then stands for every limit.
            let d = decisions.get(index).unwrap_or(&verdict.decision);
            self.global.record_limit(
                rule,
                index,
                check.counter_key,
                Counted {
                    cost: check.cost,
                    allowed,
                    limit: d.limit,
                    remaining: d.remaining,
                    reset_after_us: d.reset_after_us,
                    window_use: decisions.len() > index,
                },
            );
        }
        Ok(verdict)
    }
}

/// Whether a check-only verdict says `cost` hits would be denied. A shadow
/// rule never denies, and an unlimited one never counts.
fn would_deny(verdict: &Verdict, cost: u64) -> bool {
    let d = &verdict.decision;
    !verdict.shadow_denied
        && verdict.source != Source::Unlimited
        && (!d.allowed || d.remaining < cost)
}

/// A descriptor resolved to a rule: the counter to check and its limit.
struct Matched {
    rule: Arc<Rule>,
    counter_key: String,
    /// Params of the key's override, or built from the descriptor's `limit`.
    limit: Option<Params>,
    /// `Resolved::metric_key`: the per-value metric name, if the rule counts values.
    metric_key: Option<String>,
}

fn match_descriptor(
    rules: &RuleSet,
    overrides: &HeldOverrides,
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
    // An operator's override of the key comes first: it is set for this
    // customer, the gateway's limit for every key of a route. A ban
    // (`requests_per_unit: 0`) stays a ban whatever the gateway asks.
    let limit = match overrides.params(rule, &resolved.counter_key) {
        Some(params) => Some(params),
        None => match d.limit.filter(|_| !rule.denies_all()) {
            Some((requests, unit)) => Some(override_params(rule, requests, unit)?),
            None => None,
        },
    };
    Ok(Some(Matched {
        rule: rule.clone(),
        counter_key: resolved.counter_key,
        limit,
        metric_key: resolved.metric_key,
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

/// A native check resolved to a rule.
pub(super) struct NativeMatch {
    pub(super) rule: Arc<Rule>,
    pub(super) counter_key: String,
    /// The per-value metric name, if the rule counts values.
    pub(super) metric_key: Option<String>,
}

/// `rule` + `key`, or a descriptor; `None` when nothing matches. A rule
/// name that several rules carry is refused: the descriptor says which.
pub(super) fn match_native(
    rules: &RuleSet,
    c: &NativeCheck,
) -> Result<Option<NativeMatch>, InvalidInput> {
    if c.domain.is_empty() {
        return Err(InvalidInput::new("domain", "\"\"", "must not be empty"));
    }
    match (c.rule.is_empty(), c.descriptor.is_empty()) {
        (false, true) => match rules.by_name(&c.domain, &c.rule) {
            // Addressed by name, a rule's counter is the key as given: its
            // per-value metric is the key too.
            Ok(found) => Ok(found.map(|r| NativeMatch {
                rule: r.clone(),
                counter_key: c.key.clone(),
                metric_key: r.counts_values().then(|| c.key.clone()),
            })),
            Err(e) => Err(InvalidInput::new("rule", &c.rule, e.to_string())),
        },
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
            Ok(rules.resolve(&c.domain, &entries).and_then(|r| {
                r.rule.map(|rule| NativeMatch {
                    rule: rule.clone(),
                    counter_key: r.counter_key,
                    metric_key: r.metric_key,
                })
            }))
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
