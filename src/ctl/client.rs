//! The admin API client: one request at a time to the first coordinator
//! that can be reached, falling through the list in order. Only a failure to
//! connect falls through (and, for reads, a timeout): a write that reached a
//! node is never sent to another, since it may have been committed.

use std::path::Path;
use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::{Value, json};

use super::render;

/// Why a `ctl` command failed; [`CtlError::exit_code`] maps it to the
/// process's exit code.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// A flag, file or environment variable is wrong; the message names it.
    #[error("{0}")]
    Input(String),
    /// No coordinator could be reached: each URL tried with its error.
    #[error("{}", render::unreachable(.0))]
    Unreachable(Vec<(String, String)>),
    /// The coordinator answered with an error status and this body.
    #[error("{}", render::refusal(*.status, .url, .body))]
    Refused {
        status: u16,
        url: String,
        body: Value,
    },
    /// The answer could not be read, or a write's fate is unknown.
    #[error("{0}")]
    Answer(String),
}

impl CtlError {
    /// 3 when the server refused, 1 for every other failure (2, usage, is clap's).
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Refused { .. } => 3,
            _ => 1,
        }
    }
}

/// A configured client: the coordinators in the order to try, the token.
pub struct Client {
    http: reqwest::Client,
    coordinators: Vec<Url>,
    /// Sent as `Authorization: Bearer` with every request; never printed.
    token: Option<String>,
}

impl Client {
    /// `coordinators` are admin API base URLs; the token comes from
    /// `token_file`, else env MERIDIAN_ADMIN_TOKEN; `ca` is trusted for https.
    pub fn new(
        coordinators: Vec<String>,
        token_file: Option<&Path>,
        ca: Option<&Path>,
        timeout: Duration,
    ) -> Result<Client, CtlError> {
        if coordinators.is_empty() {
            return Err(CtlError::Input(
                "no coordinator given: pass --coordinator URL (repeatable) or set \
                 MERIDIAN_COORDINATOR=http://host:port[,http://host2:port]"
                    .into(),
            ));
        }
        let mut urls = Vec::with_capacity(coordinators.len());
        for text in &coordinators {
            let url = Url::parse(text).map_err(|e| {
                CtlError::Input(format!(
                    "--coordinator {text:?}: not a URL ({e}); expected e.g. http://127.0.0.1:7080"
                ))
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(CtlError::Input(format!(
                    "--coordinator {text:?}: the scheme must be http or https"
                )));
            }
            urls.push(url);
        }
        let token = crate::secret::credential("token", token_file, "MERIDIAN_ADMIN_TOKEN", None)
            .map_err(CtlError::Input)?;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(3)));
        let https = urls.iter().any(|u| u.scheme() == "https");
        match ca {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| CtlError::Input(format!("--ca {}: {e}", path.display())))?;
                let config = crate::tls::trusting(&pem)
                    .map_err(|e| CtlError::Input(format!("--ca {}: {e}", path.display())))?;
                builder = builder.use_preconfigured_tls(config);
            }
            None if https => {
                return Err(CtlError::Input(
                    "an https:// coordinator needs --ca FILE: the CA certificate (PEM) that \
                     signed the coordinators' certificates (the demo prints its path)"
                        .into(),
                ));
            }
            None => {}
        }
        let http = builder
            .build()
            .map_err(|e| CtlError::Input(format!("building the HTTP client: {e}")))?;
        Ok(Client {
            http,
            coordinators: urls,
            token,
        })
    }

    /// GET `path` with `query` pairs.
    pub async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, CtlError> {
        let bytes = self
            .request(Method::GET, path, query, Payload::None)
            .await?;
        json_answer(path, &bytes)
    }

    /// GET `path` with `query` pairs, answered as text (e.g. CSV).
    pub async fn get_text(&self, path: &str, query: &[(&str, &str)]) -> Result<String, CtlError> {
        let bytes = self
            .request(Method::GET, path, query, Payload::None)
            .await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A write: `method` on `path` with an optional JSON body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CtlError> {
        self.send_with(method, path, &[], body.map_or(Payload::None, Payload::Json))
            .await
    }

    /// A write with `query` pairs and a body of any kind, answered as JSON.
    pub async fn send_with(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Payload,
    ) -> Result<Value, CtlError> {
        let bytes = self.request(method, path, query, body).await?;
        json_answer(path, &bytes)
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Payload,
    ) -> Result<Vec<u8>, CtlError> {
        let mut failures = Vec::new();
        for base in &self.coordinators {
            let mut url = base.clone();
            let joined = format!("{}{path}", base.path().trim_end_matches('/'));
            url.set_path(&joined);
            if !query.is_empty() {
                url.query_pairs_mut().extend_pairs(query);
            }
            let mut request = self.http.request(method.clone(), url.clone());
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            // Recorded beside the token's fingerprint in drill and override records.
            if let Some(user) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
                request = request.header("x-meridian-operator", user);
            }
            match &body {
                Payload::None => {}
                Payload::Json(body) => request = request.json(body),
                Payload::Raw {
                    bytes,
                    content_type,
                } => {
                    request = request
                        .header(reqwest::header::CONTENT_TYPE, *content_type)
                        .body(bytes.clone());
                }
            }
            match request.send().await {
                Ok(response) => return answer(url, response).await,
                Err(e) if e.is_connect() || (method == Method::GET && e.is_timeout()) => {
                    failures.push((base.to_string(), causes(&e)));
                }
                Err(e) if method == Method::GET => {
                    return Err(CtlError::Unreachable(vec![(base.to_string(), causes(&e))]));
                }
                Err(e) => {
                    return Err(CtlError::Answer(format!(
                        "{url}: {}; the write may or may not have been applied: check with \
                         a read before sending it again",
                        causes(&e)
                    )));
                }
            }
        }
        Err(CtlError::Unreachable(failures))
    }
}

/// A request's body.
pub enum Payload {
    None,
    Json(Value),
    /// A file sent as is (a bulk import).
    Raw {
        bytes: Vec<u8>,
        content_type: &'static str,
    },
}

/// A 2xx answer's bytes as JSON.
fn json_answer(path: &str, bytes: &[u8]) -> Result<Value, CtlError> {
    serde_json::from_slice::<Value>(bytes).map_err(|e| {
        CtlError::Answer(format!(
            "{path}: the answer is not JSON ({e}); is this a Meridian coordinator's admin API?"
        ))
    })
}

/// A response's bytes for a 2xx, else the refusal.
async fn answer(url: Url, response: reqwest::Response) -> Result<Vec<u8>, CtlError> {
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| CtlError::Answer(format!("{url}: reading the answer: {}", causes(&e))))?;
    if status.is_success() {
        return Ok(bytes.to_vec());
    }
    let parsed = serde_json::from_slice::<Value>(&bytes);
    let body = parsed.unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(&bytes);
        json!({ "error": text.chars().take(500).collect::<String>() })
    });
    Err(CtlError::Refused {
        status: status.as_u16(),
        url: url.to_string(),
        body,
    })
}

/// An error with its sources, which reqwest keeps out of its own message
/// (the refused connection, the certificate problem).
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}
