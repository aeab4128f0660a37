//! envoyproxy/ratelimit's HTTP endpoint, `POST /json`: a `RateLimitRequest`
//! in proto3 JSON in, a `RateLimitResponse` in proto3 JSON out.
//!
//! Pure: bytes to the prost request, the prost response to JSON. proto3 JSON
//! rules as protojson applies them: field names in lowerCamelCase or as
//! written in the proto, enums by name or number, 64-bit integers as numbers
//! or strings, `null` for a default, unknown fields refused; on output,
//! default values are left out and a `Duration` is a string (`"59.5s"`).
//! Every refusal names the field's path (`descriptors[0].entries[1].key`).

use serde_json::{Map, Value, json};

use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::envoy::r#type::v3::RateLimitUnit;

/// A body that is not a `RateLimitRequest`: the field's path and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct JsonError {
    /// `domain`, `descriptors[2].limit.unit`, … or `body` for the document.
    pub field: String,
    pub reason: String,
}

fn error(field: &str, reason: impl Into<String>) -> JsonError {
    JsonError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// Parses a `RateLimitRequest` from proto3 JSON.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| error("body", format!("invalid JSON: {e}")))?;
    let mut request = RateLimitRequest::default();
    for (name, v) in object(&value, "body")? {
        match name.as_str() {
            "domain" => request.domain = string(v, "domain")?,
            "descriptors" => {
                request.descriptors = list(v, "descriptors")?
                    .iter()
                    .enumerate()
                    .map(|(i, d)| descriptor(d, &format!("descriptors[{i}]")))
                    .collect::<Result<_, _>>()?;
            }
            "hitsAddend" | "hits_addend" => request.hits_addend = uint32(v, "hits_addend")?,
            other => {
                return Err(unknown(
                    other,
                    "body",
                    &["domain", "descriptors", "hitsAddend"],
                ));
            }
        }
    }
    Ok(request)
}

fn descriptor(value: &Value, at: &str) -> Result<RateLimitDescriptor, JsonError> {
    let mut d = RateLimitDescriptor::default();
    for (name, v) in object(value, at)? {
        match name.as_str() {
            "entries" => {
                let field = format!("{at}.entries");
                d.entries = list(v, &field)?
                    .iter()
                    .enumerate()
                    .map(|(i, e)| entry(e, &format!("{field}[{i}]")))
                    .collect::<Result<_, _>>()?;
            }
            "limit" => {
                let field = format!("{at}.limit");
                d.limit = (!v.is_null()).then(|| limit(v, &field)).transpose()?;
            }
            "hitsAddend" | "hits_addend" => {
                // A wrapper type: `null` is "not set", unlike an explicit 0.
                let field = format!("{at}.hits_addend");
                d.hits_addend = (!v.is_null()).then(|| uint64(v, &field)).transpose()?;
            }
            other => return Err(unknown(other, at, &["entries", "limit", "hitsAddend"])),
        }
    }
    Ok(d)
}

fn entry(value: &Value, at: &str) -> Result<Entry, JsonError> {
    let mut e = Entry::default();
    for (name, v) in object(value, at)? {
        match name.as_str() {
            "key" => e.key = string(v, &format!("{at}.key"))?,
            "value" => e.value = string(v, &format!("{at}.value"))?,
            other => return Err(unknown(other, at, &["key", "value"])),
        }
    }
    Ok(e)
}

fn limit(value: &Value, at: &str) -> Result<RateLimitOverride, JsonError> {
    let mut o = RateLimitOverride::default();
    for (name, v) in object(value, at)? {
        match name.as_str() {
            "requestsPerUnit" | "requests_per_unit" => {
                o.requests_per_unit = uint32(v, &format!("{at}.requests_per_unit"))?;
            }
            "unit" => o.unit = unit(v, &format!("{at}.unit"))?,
            other => return Err(unknown(other, at, &["requestsPerUnit", "unit"])),
        }
    }
    Ok(o)
}

fn unit(value: &Value, at: &str) -> Result<i32, JsonError> {
    let unit = match value {
        Value::Null => Some(RateLimitUnit::Unknown),
        Value::String(name) => RateLimitUnit::from_str_name(name),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .and_then(|n| RateLimitUnit::try_from(n).ok()),
        _ => None,
    };
    unit.map(|u| u as i32).ok_or_else(|| {
        error(
            at,
            format!(
                "unknown unit {value}; expected one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR"
            ),
        )
    })
}

fn object<'v>(value: &'v Value, at: &str) -> Result<&'v Map<String, Value>, JsonError> {
    value
        .as_object()
        .ok_or_else(|| error(at, format!("expected an object, found {}", kind(value))))
}

fn list<'v>(value: &'v Value, at: &str) -> Result<&'v [Value], JsonError> {
    match value {
        Value::Null => Ok(&[]),
        Value::Array(items) => Ok(items),
        other => Err(error(at, format!("expected a list, found {}", kind(other)))),
    }
}

fn string(value: &Value, at: &str) -> Result<String, JsonError> {
    match value {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        other => Err(error(
            at,
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

fn uint64(value: &Value, at: &str) -> Result<u64, JsonError> {
    let parsed = match value {
        Value::Null => Some(0),
        Value::Number(n) => n.as_u64().or_else(|| {
            // protojson takes 5.0 for 5, never 5.5.
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        error(
            at,
            format!("expected an unsigned integer, found {}", shown(value)),
        )
    })
}

fn uint32(value: &Value, at: &str) -> Result<u32, JsonError> {
    let n = uint64(value, at)?;
    u32::try_from(n).map_err(|_| error(at, format!("{n} does not fit in 32 bits")))
}

fn unknown(name: &str, at: &str, expected: &[&str]) -> JsonError {
    let field = if at == "body" {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    };
    error(
        &field,
        format!("unknown field; expected one of {}", expected.join(", ")),
    )
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The value as shown in an error: long strings cut, so a refusal never
/// echoes a whole body back.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// The response in proto3 JSON (defaults left out, as protojson writes it).
pub fn response_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if let Ok(code) = Code::try_from(response.overall_code)
        && code != Code::Unknown
    {
        out.insert("overallCode".into(), json!(code.as_str_name()));
    }
    if !response.statuses.is_empty() {
        let statuses: Vec<Value> = response.statuses.iter().map(status_json).collect();
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(header_json)
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}

fn status_json(status: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    if let Ok(code) = Code::try_from(status.code)
        && code != Code::Unknown
    {
        out.insert("code".into(), json!(code.as_str_name()));
    }
    if let Some(limit) = &status.current_limit {
        out.insert("currentLimit".into(), limit_json(limit));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(d) = &status.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(duration(d)));
    }
    Value::Object(out)
}

fn limit_json(limit: &RateLimit) -> Value {
    let mut out = Map::new();
    if !limit.name.is_empty() {
        out.insert("name".into(), json!(limit.name));
    }
    if limit.requests_per_unit != 0 {
        out.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
    }
    if let Ok(unit) = Unit::try_from(limit.unit)
        && unit != Unit::Unknown
    {
        out.insert("unit".into(), json!(unit.as_str_name()));
    }
    Value::Object(out)
}

fn header_json(h: &HeaderValue) -> Value {
    json!({ "key": h.key, "value": h.value })
}

/// protojson's Duration: seconds with 0, 3, 6 or 9 fraction digits, then `s`.
fn duration(d: &prost_types::Duration) -> String {
    let nanos = d.nanos.unsigned_abs();
    let fraction = if nanos == 0 {
        String::new()
    } else if nanos.is_multiple_of(1_000_000) {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    };
    let sign = if d.seconds == 0 && d.nanos < 0 {
        "-"
    } else {
        ""
    };
    format!("{sign}{}{fraction}s", d.seconds)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn camel_and_proto_names_enums_by_name_and_number_and_string_integers() {
        let r = parse_request(
            br#"{"domain":"api","hits_addend":"2","descriptors":[
                {"entries":[{"key":"customer","value":"a"}],
                 "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":0},
                {"entries":[{"key":"k","value":"v"}],"limit":{"requests_per_unit":"7","unit":3}}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "api");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].hits_addend, Some(0));
        assert_eq!(r.descriptors[1].hits_addend, None);
        let limit = r.descriptors[0].limit.unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (5, RateLimitUnit::Minute as i32)
        );
        let limit = r.descriptors[1].limit.unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (7, RateLimitUnit::Hour as i32)
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases: [(&[u8], &str); 7] = [
            (br#"{"domain":1}"#, "domain"),
            (br#"{"domain":"a","colour":"red"}"#, "colour"),
            (
                br#"{"domain":"a","descriptors":[{"entries":[{"key":"k","value":2}]}]}"#,
                "descriptors[0].entries[0].value",
            ),
            (
                br#"{"domain":"a","descriptors":[{},{"limit":{"unit":"FORTNIGHT"}}]}"#,
                "descriptors[1].limit.unit",
            ),
            (br#"{"domain":"a","hitsAddend":-1}"#, "hits_addend"),
            (br#"{"domain":"a","hitsAddend":4294967296}"#, "hits_addend"),
            (br#"{"domain":"a","#, "body"),
        ];
        for (body, field) in cases {
            let e = parse_request(body).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }

    #[test]
    fn responses_leave_defaults_out_and_write_durations_as_strings() {
        let response = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(RateLimit {
                        name: String::new(),
                        requests_per_unit: 3,
                        unit: Unit::Minute as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(prost_types::Duration {
                        seconds: 59,
                        nanos: 500_000_000,
                    }),
                    quota: None,
                },
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            response_json(&response),
            json!({"overallCode": "OVER_LIMIT", "statuses": [
                {"code": "OVER_LIMIT", "currentLimit": {"requestsPerUnit": 3, "unit": "MINUTE"},
                 "durationUntilReset": "59.500s"},
                {"code": "OK"}]})
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_request(&body);
        }
    }
}
