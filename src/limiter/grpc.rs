//! gRPC transports: Envoy's `RateLimitService/ShouldRateLimit` (wire
//! compatible with Envoy, Istio, Gloo…) and Meridian's `Limiter/Check`.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::service::{Descriptor, DescriptorResult, NativeCheck, Outcome, Service};
use crate::algorithm::InvalidInput;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::proto::meridian::v1 as native;
use crate::rules::Unit;
use rls::rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as RlsUnit};

/// Envoy's RLS v3 on top of the shared [`Service`].
pub struct RlsService {
    pub limiter: Arc<Service>,
    /// Add RateLimit-Limit/-Remaining/-Reset to `response_headers_to_add`.
    pub response_headers: bool,
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        if !crate::traces::enabled() {
            return self.decide(request.into_inner()).await;
        }
        // A span per check only while traces are exported; it continues the
        // gateway's trace (W3C `traceparent` in the call's metadata).
        let span = tracing::info_span!(
            target: crate::traces::TARGET,
            "ratelimit.ShouldRateLimit",
            domain = %request.get_ref().domain,
            descriptors = request.get_ref().descriptors.len(),
            overall_code = tracing::field::Empty,
        );
        crate::traces::continue_trace(&span, request.metadata());
        let answer =
            tracing::Instrument::instrument(self.decide(request.into_inner()), span.clone()).await;
        let code = match &answer {
            Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => "OVER_LIMIT",
            Ok(_) => "OK",
            Err(_) => "ERROR",
        };
        span.record("overall_code", code);
        answer
    }
}

impl RlsService {
    async fn decide(
        &self,
        req: rls::RateLimitRequest,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        respond(&self.limiter, self.response_headers, req)
            .await
            .map(Response::new)
            .map_err(invalid_argument)
    }
}

/// Decides an Envoy `RateLimitRequest`: the gRPC service and the HTTP
/// `POST /json` endpoint both answer with this. `response_headers` adds
/// RateLimit-Limit/-Remaining/-Reset to `response_headers_to_add`.
pub async fn respond(
    limiter: &Service,
    response_headers: bool,
    req: rls::RateLimitRequest,
) -> Result<rls::RateLimitResponse, InvalidInput> {
    // The request is ours: its strings move into the descriptors, not copied.
    let descriptors = req
        .descriptors
        .into_iter()
        .map(|d| Descriptor {
            entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
            limit: d.limit.and_then(|l| {
                let unit = RateLimitUnit::try_from(l.unit)
                    .ok()
                    .and_then(unit_from_envoy)?;
                Some((l.requests_per_unit, unit))
            }),
            hits: d.hits_addend,
        })
        .collect::<Vec<_>>();
    let outcomes = limiter
        .rate_limit(&req.domain, &descriptors, req.hits_addend)
        .await?;

    // An override's limit is reported in its own unit, not the rule's.
    let statuses: Vec<DescriptorStatus> = outcomes
        .iter()
        .zip(&descriptors)
        .map(|(o, d)| status(o, d.limit.map(|(_, unit)| unit)))
        .collect();
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    let response_headers_to_add = if response_headers {
        headers(&outcomes)
    } else {
        Vec::new()
    };
    Ok(rls::RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add,
        ..Default::default()
    })
}

/// A refused descriptor (malformed, or a key over the length limit) is
/// OVER_LIMIT: a key that cannot be counted cannot be let through as if it
/// had been, and the request's other descriptors are decided as usual.
fn status(outcome: &DescriptorResult, overridden: Option<Unit>) -> DescriptorStatus {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(_) => {
            return DescriptorStatus {
                code: Code::OverLimit as i32,
                ..Default::default()
            };
        }
    };
    let Some(Outcome { rule, verdict }) = outcome else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
    };
    if rule.unlimited {
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
    }
    let d = &verdict.decision;
    DescriptorStatus {
        code: if d.allowed { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: Some(RateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(d.limit).unwrap_or(u32::MAX),
            unit: unit_to_envoy(overridden.unwrap_or(rule.unit_of(verdict.limit_index))) as i32,
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(prost_types::Duration {
            seconds: (d.reset_after_us / 1_000_000) as i64,
            nanos: ((d.reset_after_us % 1_000_000) * 1_000) as i32,
        }),
        quota: None,
    }
}

/// RateLimit-* headers (IETF draft, as envoyproxy/ratelimit sends them) for the
/// most restrictive limited descriptor.
fn headers(outcomes: &[DescriptorResult]) -> Vec<HeaderValue> {
    let tightest = outcomes
        .iter()
        .flatten()
        .flatten()
        .filter(|o| !o.rule.unlimited)
        .min_by_key(|o| (o.verdict.decision.allowed, o.verdict.decision.remaining));
    let Some(o) = tightest else {
        return Vec::new();
    };
    let d = &o.verdict.decision;
    let header = |key: &str, value: u64| HeaderValue {
        key: key.into(),
        value: value.to_string(),
        raw_value: Vec::new(),
    };
    vec![
        header("RateLimit-Limit", d.limit),
        header("RateLimit-Remaining", d.remaining),
        header("RateLimit-Reset", d.reset_after_us.div_ceil(1_000_000)),
    ]
}

fn unit_from_envoy(unit: RateLimitUnit) -> Option<Unit> {
    Some(match unit {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Week => Unit::Week,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
    })
}

/// Envoy has no unit for a custom period; it is reported as UNKNOWN (the
/// requests-per-unit and duration-until-reset are still exact).
fn unit_to_envoy(unit: Unit) -> RlsUnit {
    match unit {
        Unit::Second => RlsUnit::Second,
        Unit::Minute => RlsUnit::Minute,
        Unit::Hour => RlsUnit::Hour,
        Unit::Day => RlsUnit::Day,
        Unit::Week => RlsUnit::Week,
        Unit::Month => RlsUnit::Month,
        Unit::Year => RlsUnit::Year,
        Unit::Custom(_) => RlsUnit::Unknown,
    }
}

pub fn invalid_argument(e: InvalidInput) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Meridian's native batch API.
pub struct NativeService {
    pub limiter: Arc<Service>,
}

#[tonic::async_trait]
impl native::limiter_server::Limiter for NativeService {
    async fn check(
        &self,
        request: Request<native::CheckRequest>,
    ) -> Result<Response<native::CheckResponse>, Status> {
        let checks: Vec<NativeCheck> = request
            .into_inner()
            .checks
            .into_iter()
            .map(|c| NativeCheck {
                domain: c.domain,
                rule: c.rule,
                key: c.key,
                descriptor: c.descriptor.into_iter().map(|e| (e.key, e.value)).collect(),
                cost: c.cost,
                check_only: c.check_only,
            })
            .collect();
        let results = self
            .limiter
            .check_batch(&checks)
            .await
            .map_err(invalid_argument)?;
        Ok(Response::new(native::CheckResponse {
            decisions: results.iter().map(native_decision).collect(),
        }))
    }

    async fn reserve(
        &self,
        request: Request<native::ReserveRequest>,
    ) -> Result<Response<native::ReserveResponse>, Status> {
        let request = reservations::request(request.into_inner());
        match self.limiter.reserve(&request).await {
            Ok(answer) => Ok(Response::new(reservations::reserved(&answer))),
            Err(e) => Err(reservations::status(e)),
        }
    }

    async fn commit(
        &self,
        request: Request<native::CommitRequest>,
    ) -> Result<Response<native::SettleResponse>, Status> {
        let request = request.into_inner();
        match self.limiter.commit(&request.id, request.actual).await {
            Ok(answer) => Ok(Response::new(reservations::settled(&answer))),
            Err(e) => Err(reservations::status(e)),
        }
    }

    async fn release(
        &self,
        request: Request<native::ReleaseRequest>,
    ) -> Result<Response<native::SettleResponse>, Status> {
        match self.limiter.release(&request.into_inner().id).await {
            Ok(answer) => Ok(Response::new(reservations::settled(&answer))),
            Err(e) => Err(reservations::status(e)),
        }
    }
}

/// Reservations' answers and errors on the wire, shared by the gRPC service
/// and the HTTP API's JSON.
pub mod reservations {
    use std::time::Duration;

    use tonic::{Code, Status};

    use crate::limiter::reserve::{ReserveAnswer, ReserveRequest, SettleAnswer};
    use crate::proto::meridian::v1 as native;
    use crate::store::reservation::{ReservationError, Settle};

    /// The service's request from the wire's.
    pub fn request(r: native::ReserveRequest) -> ReserveRequest {
        ReserveRequest {
            domain: r.domain,
            rule: r.rule,
            key: r.key,
            descriptor: r.descriptor.into_iter().map(|e| (e.key, e.value)).collect(),
            estimate: r.estimate,
            ttl: Duration::from_millis(r.ttl_ms),
        }
    }

    /// The wire's answer to a reserve.
    pub fn reserved(a: &ReserveAnswer) -> native::ReserveResponse {
        native::ReserveResponse {
            admitted: a.admitted,
            matched: a.matched,
            id: a.id.clone(),
            retry_after_us: a.retry_after_us(),
            limits: a
                .limits
                .iter()
                .map(|d| native::LimitState {
                    limit: d.limit,
                    remaining: d.remaining,
                    reset_after_us: d.reset_after_us,
                    refunded: 0,
                    charged: 0,
                })
                .collect(),
            rule: a.rule.clone(),
            reason: a.reason().to_owned(),
        }
    }

    /// The wire's answer to a commit or release.
    pub fn settled(a: &SettleAnswer) -> native::SettleResponse {
        let first = a.first();
        native::SettleResponse {
            replayed: a.settled.replayed,
            estimate: a.settled.estimate,
            actual: a.actual(),
            refunded: first.refunded,
            charged: first.charged,
            uncharged: a.uncharged(),
            limits: a
                .settled
                .limits
                .iter()
                .map(|l| native::LimitState {
                    limit: l.limit,
                    remaining: l.remaining,
                    reset_after_us: 0,
                    refunded: l.refunded,
                    charged: l.charged,
                })
                .collect(),
            released: a.settled.settled == Settle::Release,
        }
    }

    /// The gRPC code of a reservation error (the HTTP API maps the same
    /// classes to 400, 404, 409, 429 and 503).
    pub fn code(e: &ReservationError) -> Code {
        match e {
            ReservationError::Invalid(_) => Code::InvalidArgument,
            ReservationError::Unknown
            | ReservationError::OtherRegion { .. }
            | ReservationError::Expired { .. } => Code::NotFound,
            ReservationError::AlreadySettled { .. } => Code::FailedPrecondition,
            ReservationError::TooManyOpen { .. } => Code::ResourceExhausted,
            ReservationError::Store(s) if s.is_transient() => Code::Unavailable,
            ReservationError::Store(_) => Code::Internal,
        }
    }

    /// The error as a gRPC status.
    pub fn status(e: ReservationError) -> Status {
        Status::new(code(&e), e.to_string())
    }
}

/// The native decision shape, shared with the HTTP API's JSON.
pub fn native_decision(result: &Result<Option<Outcome>, InvalidInput>) -> native::Decision {
    match result {
        Err(e) => native::Decision {
            allowed: false,
            error: e.to_string(),
            ..Default::default()
        },
        Ok(None) => native::Decision {
            allowed: true,
            matched: false,
            ..Default::default()
        },
        Ok(Some(Outcome { rule, verdict })) => {
            let d = &verdict.decision;
            native::Decision {
                allowed: d.allowed,
                matched: true,
                limit: d.limit,
                remaining: d.remaining,
                reset_after_us: d.reset_after_us,
                retry_after_us: d.retry_after_us,
                delay_us: d.delay_us,
                rule: rule.name.clone().unwrap_or_else(|| rule.id.clone()),
                shadow_denied: verdict.shadow_denied,
                reason: verdict.reason().into(),
                error: String::new(),
            }
        }
    }
}
