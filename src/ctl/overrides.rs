//! `meridian ctl overrides …` over `/api/v1/overrides`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{Value, json};

use super::client::{Client, CtlError, Payload};
use super::{Output, print, render};

/// The key an override (or a reset) is for: a domain and a descriptor's
/// entries, or a rule's name and a key.
#[derive(Args)]
pub struct Target {
    /// The descriptor's domain.
    #[arg(long)]
    pub(super) domain: String,
    /// The descriptor's entries as KEY=VALUE, outermost first (e.g.
    /// customer=42), as Envoy and descriptor checks send them.
    #[arg(value_name = "KEY=VALUE", required_unless_present = "key")]
    pub(super) entries: Vec<String>,
    /// The rule the descriptor must resolve to (default: whichever it
    /// resolves to); with --key, the rule's name as checks by rule name give it.
    #[arg(long)]
    pub(super) rule: Option<String>,
    /// Instead of a descriptor: the key as checks by rule name (`rule` +
    /// `key`) give it; needs --rule. Such checks count the key apart from
    /// descriptor checks of the same rule, so each form has its own override.
    #[arg(long, requires = "rule", conflicts_with = "entries")]
    pub(super) key: Option<String>,
}

impl Target {
    fn query(&self) -> Vec<(&str, String)> {
        let mut q = vec![("domain", self.domain.clone())];
        if !self.entries.is_empty() {
            q.push(("descriptor", self.entries.join(";")));
        }
        if let Some(rule) = &self.rule {
            q.push(("rule", rule.clone()));
        }
        if let Some(key) = &self.key {
            q.push(("key", key.clone()));
        }
        q
    }

    /// How the override is named in messages.
    fn shown(&self) -> String {
        match &self.key {
            Some(key) => format!("key {key} of rule {}", self.rule.as_deref().unwrap_or("")),
            None => self.entries.join(" "),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Csv,
    Json,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Json => "json",
        }
    }
}

#[derive(Subcommand)]
pub enum OverridesCommand {
    /// Set one key's limit (PUT /api/v1/overrides): committed through Raft
    /// and enforced by every region's limiters within a second.
    ///
    /// The override keeps its rule's algorithm and period; on a `scope:
    /// global` rule it is the key's world-wide limit. It is refused (with
    /// the field named) for a descriptor that matches no rule, a rule that
    /// counts the value with others (a shared glob) or has several limits,
    /// a limit under --shared-rule-floor, or a ttl in the past.
    Set {
        #[command(flatten)]
        target: Target,
        /// Requests per the rule's period.
        #[arg(long)]
        limit: u64,
        /// A token or leaky bucket's burst (default: the limit).
        #[arg(long)]
        burst: Option<u64>,
        /// It lapses by itself after this long (e.g. 30d, 12h); default: never.
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
        /// Why, for the next operator (at most 256 bytes).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Show the override of one descriptor (exit 3 when there is none).
    Get {
        #[command(flatten)]
        target: Target,
    },
    /// Every override held, optionally of one domain or rule.
    List {
        #[arg(long)]
        domain: Option<String>,
        #[arg(long)]
        rule: Option<String>,
        /// Include overrides that expired but were not dropped yet.
        #[arg(long)]
        expired: bool,
    },
    /// Remove the override of one descriptor: the rule's limit applies again.
    Rm {
        #[command(flatten)]
        target: Target,
    },
    /// Set many overrides in one commit, all or none (POST /api/v1/overrides/import).
    ///
    /// CSV: a header line naming the columns (domain, descriptor, limit,
    /// and optionally rule, burst, ttl, expires_at_unix_ms, reason), entries
    /// of a descriptor separated by `;`. JSON: an array of objects with the
    /// same fields (descriptor as a list of KEY=VALUE). The first bad row is
    /// reported by number and nothing changes.
    Import {
        /// The file to import (`-`: standard input).
        file: PathBuf,
        /// Default: from the file's extension (.csv or .json).
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// Replace every override held by the file's (default: add to them).
        #[arg(long)]
        replace: bool,
    },
    /// Every override, in a form `import` reads back (to standard output).
    Export {
        #[arg(long, value_enum, default_value_t = Format::Csv)]
        format: Format,
    },
}

pub async fn run(
    client: &Client,
    output: Output,
    command: OverridesCommand,
) -> Result<(), CtlError> {
    match command {
        OverridesCommand::Set {
            target,
            limit,
            burst,
            ttl,
            reason,
        } => {
            let body = json!({
                "domain": target.domain,
                "descriptor": target.entries,
                "rule": target.rule,
                "key": target.key,
                "limit": limit,
                "burst": burst,
                "ttl": ttl,
                "reason": reason,
            });
            let answer = client
                .send(Method::PUT, "/api/v1/overrides", Some(body))
                .await?;
            print(output, &answer, |a| {
                let o = &a["override"];
                format!(
                    "override set (overrides version {}): {} {} of rule {}: {} per {}{}\n",
                    render::cell(&a["version"]),
                    render::cell(&o["domain"]),
                    render::cell(&o["key"]),
                    render::cell(&o["rule"]),
                    render::cell(&o["limit"]),
                    a["period"].as_str().unwrap_or("period"),
                    match o["expires_at_unix_ms"].as_i64() {
                        Some(_) => format!(", until {}", render::utc(&o["expires_at_unix_ms"])),
                        None => String::new(),
                    }
                )
            });
        }
        OverridesCommand::Get { target } => {
            let q = target.query();
            let q: Vec<(&str, &str)> = q.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let body = client.get("/api/v1/overrides", &q).await?;
            if body["count"].as_u64() == Some(0) {
                return Err(CtlError::Refused {
                    status: 404,
                    url: "/api/v1/overrides".into(),
                    body: json!({ "error": format!(
                        "no override for {} in domain {}",
                        target.shown(),
                        target.domain
                    ) }),
                });
            }
            print(output, &body, list);
        }
        OverridesCommand::List {
            domain,
            rule,
            expired,
        } => {
            let mut q: Vec<(&str, &str)> = Vec::new();
            if let Some(d) = &domain {
                q.push(("domain", d));
            }
            if let Some(r) = &rule {
                q.push(("rule", r));
            }
            if expired {
                q.push(("expired", "true"));
            }
            let body = client.get("/api/v1/overrides", &q).await?;
            print(output, &body, list);
        }
        OverridesCommand::Rm { target } => {
            let q = target.query();
            let q: Vec<(&str, &str)> = q.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let answer = client
                .send_with(Method::DELETE, "/api/v1/overrides", &q, Payload::None)
                .await?;
            print(output, &answer, |a| {
                format!(
                    "removed {} override(s) (overrides version {})\n",
                    render::cell(&a["removed"]),
                    render::cell(&a["version"])
                )
            });
        }
        OverridesCommand::Import {
            file,
            format,
            replace,
        } => {
            let bytes = if file.as_os_str() == "-" {
                let mut buf = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                    .map_err(|e| CtlError::Input(format!("reading standard input: {e}")))?;
                buf
            } else {
                std::fs::read(&file)
                    .map_err(|e| CtlError::Input(format!("{}: {e}", file.display())))?
            };
            let format = match format {
                Some(f) => f,
                None => match file.extension().and_then(|e| e.to_str()) {
                    Some("json") => Format::Json,
                    Some("csv") => Format::Csv,
                    _ => {
                        return Err(CtlError::Input(format!(
                            "{}: say --format csv or --format json (the extension does not)",
                            file.display()
                        )));
                    }
                },
            };
            let content_type = match format {
                Format::Csv => "text/csv",
                Format::Json => "application/json",
            };
            let replace = if replace { "true" } else { "false" };
            let answer = client
                .send_with(
                    Method::POST,
                    "/api/v1/overrides/import",
                    &[("format", format.name()), ("replace", replace)],
                    Payload::Raw {
                        bytes,
                        content_type,
                    },
                )
                .await?;
            print(output, &answer, |a| {
                format!(
                    "imported {} override(s){} in one commit (overrides version {})\n",
                    render::cell(&a["imported"]),
                    if a["replaced"].as_bool() == Some(true) {
                        ", replacing every other"
                    } else {
                        ""
                    },
                    render::cell(&a["version"])
                )
            });
        }
        OverridesCommand::Export { format } => match format {
            Format::Csv => {
                let text = client
                    .get_text(
                        "/api/v1/overrides",
                        &[("format", "csv"), ("expired", "true")],
                    )
                    .await?;
                print!("{text}");
            }
            Format::Json => {
                let body = client
                    .get("/api/v1/overrides", &[("expired", "true")])
                    .await?;
                let rows: Vec<Value> = body["overrides"]
                    .as_array()
                    .map(|a| a.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|o| {
                        json!({
                            "domain": o["domain"], "descriptor": o["descriptor"],
                            "rule": o["rule"], "limit": o["limit"], "burst": o["burst"],
                            "expires_at_unix_ms": o["expires_at_unix_ms"], "reason": o["reason"],
                        })
                    })
                    .collect();
                println!("{}", render::json(&Value::Array(rows)));
            }
        },
    }
    Ok(())
}

/// Overrides as a table.
fn list(body: &Value) -> String {
    let rows: Vec<Vec<String>> = body["overrides"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|o| {
            let expires = if o["expires_at_unix_ms"].is_null() {
                "never".to_string()
            } else if o["expired"].as_bool() == Some(true) {
                format!("{} (expired)", render::utc(&o["expires_at_unix_ms"]))
            } else {
                render::utc(&o["expires_at_unix_ms"])
            };
            vec![
                render::cell(&o["domain"]),
                render::cell(&o["key"]),
                render::cell(&o["rule"]),
                render::cell(&o["limit"]),
                expires,
                render::cell(&o["set_by"]),
                render::cell(&o["reason"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no overrides: meridian ctl overrides set --domain D KEY=VALUE --limit N\n".into();
    }
    render::table(
        &[
            "DOMAIN", "KEY", "RULE", "LIMIT", "EXPIRES", "SET BY", "REASON",
        ],
        &rows,
    )
}
