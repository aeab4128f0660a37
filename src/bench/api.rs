//! One request to each API the bench drives, and how its answer counts:
//! Envoy RLS v3 `ShouldRateLimit`, native `meridian.v1.Limiter/Check`, and
//! HTTP `POST /v1/check`. Interpreting answers is pure and tested here.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};

use super::template::DescriptorTemplate;
use crate::proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use crate::proto::envoy::service::ratelimit::v3::{
    RateLimitRequest, rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient,
};
use crate::proto::meridian::v1::{Check, CheckRequest, Entry, limiter_client::LimiterClient};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// Envoy RLS v3 `ShouldRateLimit`: one descriptor per request.
    Rls,
    /// Meridian's native `meridian.v1.Limiter/Check`.
    Grpc,
    /// Meridian's HTTP JSON `POST /v1/check`.
    Http,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Rls => "rls",
            Api::Grpc => "grpc",
            Api::Http => "http",
        }
    }

    pub fn default_target(self) -> &'static str {
        match self {
            Api::Rls | Api::Grpc => "127.0.0.1:8081",
            Api::Http => "http://127.0.0.1:8080",
        }
    }
}

/// How a check names its limit.
#[derive(Debug, Clone)]
pub enum Addressing {
    /// A rule's name plus the drawn key (native and HTTP APIs).
    Rule(String),
    /// Descriptor entries with the drawn key filled in.
    Descriptor(DescriptorTemplate),
}

/// What every check carries apart from its key.
#[derive(Debug, Clone)]
pub struct CheckShape {
    pub domain: String,
    pub addressing: Addressing,
    pub cost: u64,
}

/// How the checks of one answered request came out.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub allowed: u64,
    pub denied: u64,
    /// Checks the server answered with an error of their own.
    pub errors: u64,
    /// Allowed because no rule matched.
    pub unmatched: u64,
    /// The first per-check error message, if any.
    pub error: Option<String>,
    /// Checks per non-empty `reason` of their decision (`over_limit`,
    /// `fail_open`, `cached_over_limit`, …): shows checks the store never saw.
    pub reasons: BTreeMap<String, u64>,
}

impl Tally {
    fn add_decision(&mut self, allowed: bool, matched: bool, error: &str, reason: &str) {
        if !reason.is_empty() {
            match self.reasons.get_mut(reason) {
                Some(n) => *n += 1,
                None => {
                    self.reasons.insert(reason.to_owned(), 1);
                }
            }
        }
        if !error.is_empty() {
            self.errors += 1;
            self.error.get_or_insert_with(|| error.to_owned());
        } else if allowed {
            self.allowed += 1;
            self.unmatched += u64::from(!matched);
        } else {
            self.denied += 1;
        }
    }
}

/// The gRPC URI for `--target` (`host:port` gets `http://`).
pub fn grpc_uri(target: &str) -> String {
    if target.contains("://") {
        target.to_owned()
    } else {
        format!("http://{target}")
    }
}

/// The check URL for `--target`: adds `http://` to a bare `host:port` and
/// `/v1/check` to a URL without a path.
pub fn http_url(target: &str) -> String {
    let url = grpc_uri(target);
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        None => format!("{url}/v1/check"),
        Some(i) if after_scheme + i == url.len() - 1 => format!("{url}v1/check"),
        Some(_) => url,
    }
}

/// An error with its causes, since transport errors hide the useful part there.
fn with_causes(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// RLS answers for the whole request: one check per request.
fn tally_rls(overall_code: i32) -> Result<Tally, String> {
    let mut tally = Tally::default();
    match Code::try_from(overall_code) {
        Ok(Code::Ok) => tally.allowed = 1,
        Ok(Code::OverLimit) => tally.denied = 1,
        _ => {
            return Err(format!(
                "RLS overall_code {overall_code} is neither OK nor OVER_LIMIT"
            ));
        }
    }
    Ok(tally)
}

#[derive(Serialize)]
struct JsonEntry<'a> {
    key: &'a str,
    value: &'a str,
}

#[derive(Serialize)]
struct JsonCheck<'a> {
    domain: &'a str,
    rule: &'a str,
    key: &'a str,
    descriptor: Vec<JsonEntry<'a>>,
    cost: u64,
    check_only: bool,
}

#[derive(Serialize)]
struct JsonBatch<'a> {
    checks: Vec<JsonCheck<'a>>,
}

#[derive(Deserialize)]
struct JsonDecision {
    #[serde(default)]
    allowed: bool,
    /// Servers that do not say are taken to have matched.
    #[serde(default = "matched_by_default")]
    matched: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

fn matched_by_default() -> bool {
    true
}

#[derive(Deserialize)]
struct JsonDecisions {
    decisions: Vec<JsonDecision>,
}

#[derive(Deserialize)]
struct JsonError {
    error: String,
}

/// The HTTP body for `checks` (one object, or `{"checks": [...]}` for several).
fn http_body(shape: &CheckShape, keys: &[String]) -> Result<Vec<u8>, serde_json::Error> {
    let expanded: Vec<Vec<(String, String)>> = keys
        .iter()
        .map(|key| match &shape.addressing {
            Addressing::Rule(_) => Vec::new(),
            Addressing::Descriptor(t) => t.expand(key),
        })
        .collect();
    let mut checks: Vec<JsonCheck> = keys
        .iter()
        .zip(&expanded)
        .map(|(key, entries)| {
            let (rule, key) = match &shape.addressing {
                Addressing::Rule(rule) => (rule.as_str(), key.as_str()),
                Addressing::Descriptor(_) => ("", ""),
            };
            JsonCheck {
                domain: &shape.domain,
                rule,
                key,
                descriptor: entries
                    .iter()
                    .map(|(key, value)| JsonEntry { key, value })
                    .collect(),
                cost: shape.cost,
                check_only: false,
            }
        })
        .collect();
    if checks.len() == 1 {
        serde_json::to_vec(&checks.remove(0))
    } else {
        serde_json::to_vec(&JsonBatch { checks })
    }
}

/// Counts an HTTP answer to `checks` checks (a batch when more than one).
fn tally_http(status: u16, body: &[u8], checks: usize) -> Result<Tally, String> {
    let snippet = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    if status != 200 && status != 429 {
        let reason =
            serde_json::from_slice::<JsonError>(body).map_or_else(|_| snippet(), |e| e.error);
        return Err(format!("HTTP {status}: {reason}"));
    }
    let decisions = if checks == 1 {
        serde_json::from_slice::<JsonDecision>(body).map(|d| vec![d])
    } else {
        serde_json::from_slice::<JsonDecisions>(body).map(|d| d.decisions)
    }
    .map_err(|e| format!("HTTP {status}: unreadable decision ({e}): {}", snippet()))?;
    if decisions.len() != checks {
        return Err(format!(
            "HTTP {status}: {} decisions for {checks} checks",
            decisions.len()
        ));
    }
    let mut tally = Tally::default();
    for d in decisions {
        tally.add_decision(
            d.allowed,
            d.matched,
            d.error.as_deref().unwrap_or(""),
            d.reason.as_deref().unwrap_or(""),
        );
    }
    Ok(tally)
}

/// One connection to the server under test; cloning shares it.
#[derive(Clone)]
pub enum Connection {
    Rls(RateLimitServiceClient<Channel>),
    Grpc(LimiterClient<Channel>),
    Http {
        /// Each client keeps its own pool of HTTP/1.1 connections.
        client: reqwest::Client,
        url: Arc<str>,
    },
}

impl Connection {
    /// Opens one gRPC channel (connecting now, so a wrong target fails fast)
    /// or one HTTP client. `timeout` bounds every request.
    pub async fn open(api: Api, target: &str, timeout: Duration) -> Result<Connection, String> {
        if api == Api::Http {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .tcp_nodelay(true)
                .build()
                .map_err(|e| with_causes(&e))?;
            return Ok(Connection::Http {
                client,
                url: http_url(target).into(),
            });
        }
        let channel = Endpoint::from_shared(grpc_uri(target))
            .map_err(|e| with_causes(&e))?
            .timeout(timeout)
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| with_causes(&e))?;
        Ok(match api {
            Api::Rls => Connection::Rls(RateLimitServiceClient::new(channel)),
            _ => Connection::Grpc(LimiterClient::new(channel)),
        })
    }

    /// Sends one request holding one check per key. `Err` means the request
    /// as a whole failed (transport, status, unreadable answer).
    pub async fn send(&mut self, shape: &CheckShape, keys: &[String]) -> Result<Tally, String> {
        match self {
            Connection::Rls(client) => {
                let entries = match &shape.addressing {
                    Addressing::Descriptor(t) => t.expand(&keys[0]),
                    Addressing::Rule(_) => return Err("RLS needs --descriptor, not --rule".into()),
                };
                let request = RateLimitRequest {
                    domain: shape.domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: entries
                            .into_iter()
                            .map(|(key, value)| rate_limit_descriptor::Entry { key, value })
                            .collect(),
                        limit: None,
                        hits_addend: None,
                    }],
                    // The plan checks that the cost fits RLS's uint32.
                    hits_addend: shape.cost as u32,
                };
                let response = client
                    .should_rate_limit(request)
                    .await
                    .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))?;
                tally_rls(response.into_inner().overall_code)
            }
            Connection::Grpc(client) => {
                let checks = keys.iter().map(|key| native_check(shape, key)).collect();
                let response = client
                    .check(CheckRequest { checks })
                    .await
                    .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))?
                    .into_inner();
                if response.decisions.len() != keys.len() {
                    return Err(format!(
                        "{} decisions for {} checks",
                        response.decisions.len(),
                        keys.len()
                    ));
                }
                let mut tally = Tally::default();
                for d in &response.decisions {
                    tally.add_decision(d.allowed, d.matched, &d.error, &d.reason);
                }
                Ok(tally)
            }
            Connection::Http { client, url } => {
                let body = http_body(shape, keys).map_err(|e| e.to_string())?;
                let response = client
                    .post(&**url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| with_causes(&e))?;
                let status = response.status().as_u16();
                let body = response.bytes().await.map_err(|e| with_causes(&e))?;
                tally_http(status, &body, keys.len())
            }
        }
    }
}

fn native_check(shape: &CheckShape, key: &str) -> Check {
    let (rule, key, descriptor) = match &shape.addressing {
        Addressing::Rule(rule) => (rule.clone(), key.to_owned(), Vec::new()),
        Addressing::Descriptor(t) => (
            String::new(),
            String::new(),
            t.expand(key)
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
        ),
    };
    Check {
        domain: shape.domain.clone(),
        rule,
        key,
        descriptor,
        cost: shape.cost,
        check_only: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(addressing: Addressing) -> CheckShape {
        CheckShape {
            domain: "bench".into(),
            addressing,
            cost: 3,
        }
    }

    fn descriptor() -> Addressing {
        Addressing::Descriptor(
            DescriptorTemplate::new(vec!["customer={key}".parse().unwrap()]).unwrap(),
        )
    }

    fn keys(list: &[&str]) -> Vec<String> {
        list.iter().map(|k| k.to_string()).collect()
    }

    fn json(bytes: Vec<u8>) -> serde_json::Value {
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn targets_get_a_scheme_and_the_check_path() {
        assert_eq!(grpc_uri("127.0.0.1:8081"), "http://127.0.0.1:8081");
        assert_eq!(grpc_uri("http://[::1]:8081"), "http://[::1]:8081");
        assert_eq!(http_url("127.0.0.1:8080"), "http://127.0.0.1:8080/v1/check");
        assert_eq!(http_url("http://h:8080"), "http://h:8080/v1/check");
        assert_eq!(http_url("http://h:8080/"), "http://h:8080/v1/check");
        assert_eq!(
            http_url("http://h:8080/other/check"),
            "http://h:8080/other/check"
        );
    }

    #[test]
    fn one_check_is_sent_as_an_object() {
        let body = json(
            http_body(
                &shape(Addressing::Rule("per-customer".into())),
                &keys(&["7"]),
            )
            .unwrap(),
        );
        assert_eq!(
            body,
            serde_json::json!({"domain": "bench", "rule": "per-customer", "key": "7",
                               "descriptor": [], "cost": 3, "check_only": false})
        );
    }

    #[test]
    fn several_checks_are_sent_as_a_batch_of_descriptors() {
        let body = json(http_body(&shape(descriptor()), &keys(&["1", "2"])).unwrap());
        let checks = body["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 2);
        assert_eq!(
            checks[1]["descriptor"],
            serde_json::json!([{"key": "customer", "value": "2"}])
        );
        assert_eq!(checks[1]["rule"], "");
    }

    #[test]
    fn native_checks_carry_rule_and_key_or_the_descriptor() {
        let c = native_check(&shape(Addressing::Rule("r".into())), "9");
        assert_eq!((c.rule.as_str(), c.key.as_str(), c.cost), ("r", "9", 3));
        assert!(c.descriptor.is_empty());
        let c = native_check(&shape(descriptor()), "9");
        assert_eq!(
            c.descriptor,
            vec![Entry {
                key: "customer".into(),
                value: "9".into()
            }]
        );
        assert!(c.rule.is_empty() && c.key.is_empty());
    }

    #[test]
    fn http_single_decisions_count_by_their_allowed_field() {
        let allowed = tally_http(200, br#"{"allowed":true,"matched":true,"limit":5}"#, 1).unwrap();
        assert_eq!((allowed.allowed, allowed.denied), (1, 0));
        let denied = tally_http(
            429,
            br#"{"allowed":false,"matched":true,"reason":"over_limit"}"#,
            1,
        )
        .unwrap();
        assert_eq!((denied.allowed, denied.denied), (0, 1));
        let unmatched = tally_http(200, br#"{"allowed":true,"matched":false}"#, 1).unwrap();
        assert_eq!((unmatched.allowed, unmatched.unmatched), (1, 1));
    }

    #[test]
    fn http_batches_count_each_decision_and_keep_the_first_error() {
        let body = br#"{"decisions":[{"allowed":true,"matched":true,"reason":"fail_open"},
                       {"allowed":false,"matched":true,"reason":"over_limit"},
                       {"allowed":false,"error":"empty domain"},{"allowed":true,"error":""},
                       {"allowed":false,"reason":"over_limit"}]}"#;
        let t = tally_http(429, body, 5).unwrap();
        assert_eq!((t.allowed, t.denied, t.errors), (2, 2, 1));
        assert_eq!(t.error.as_deref(), Some("empty domain"));
        let reasons: Vec<(&str, u64)> = t.reasons.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        assert_eq!(reasons, [("fail_open", 1), ("over_limit", 2)]);
        assert!(
            tally_http(200, br#"{"decisions":[]}"#, 2)
                .unwrap_err()
                .contains("0 decisions for 2")
        );
    }

    #[test]
    fn http_failures_are_request_errors_with_the_reason() {
        assert_eq!(
            tally_http(400, br#"{"error":"missing domain"}"#, 1).unwrap_err(),
            "HTTP 400: missing domain"
        );
        assert_eq!(
            tally_http(503, b"upstream down", 1).unwrap_err(),
            "HTTP 503: upstream down"
        );
        assert!(
            tally_http(200, b"<html>", 1)
                .unwrap_err()
                .contains("unreadable decision")
        );
    }

    #[test]
    fn rls_overall_code_decides() {
        assert_eq!(tally_rls(1).unwrap().allowed, 1);
        assert_eq!(tally_rls(2).unwrap().denied, 1);
        assert!(tally_rls(0).is_err());
        assert!(tally_rls(9).is_err());
    }
}
