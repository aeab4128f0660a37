//! The error answer every admin endpoint gives: a status and
//! `{"error": message, ...details}`, so clients branch on the status and show
//! the message, and a relayed leader error reaches the client unchanged.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::coordinator::node::WriteError;

/// An error answer: the status and the JSON body sent with it.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    /// Always an object with an `"error"` string; [`ApiError::with`] adds
    /// the details (offending field, issues, log index) beside it.
    body: Value,
    /// Sent as `Retry-After` (seconds) when set.
    retry_after_s: Option<u32>,
}

/// What a handler that may fail returns.
pub(super) type ApiResult = Result<Response, ApiError>;

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: json!({ "error": message.into() }),
            retry_after_s: None,
        }
    }

    /// Tells the client when to try again (`Retry-After`).
    pub(super) fn retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after_s = Some(seconds);
        self
    }

    /// Adds `key: value` beside the message.
    pub(super) fn with(mut self, key: &str, value: Value) -> ApiError {
        if let Some(map) = self.body.as_object_mut() {
            map.insert(key.to_string(), value);
        }
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> ApiError {
        let status = match &e {
            WriteError::NoLeader(_) | WriteError::NotLeader => StatusCode::SERVICE_UNAVAILABLE,
            // The follower forwarded the write: the client gets the leader's
            // answer, not one wrapped in ours.
            WriteError::Leader { status, body } => {
                return ApiError {
                    status: StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
                    body: body.clone(),
                    retry_after_s: None,
                };
            }
            WriteError::InFlight(_) => StatusCode::BAD_GATEWAY,
            WriteError::Membership(_) => StatusCode::CONFLICT,
            WriteError::UnknownNode(_) => StatusCode::NOT_FOUND,
            WriteError::Fatal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}
