//! `meridian ctl`: the operator's command line over the coordinator's admin
//! HTTP API. This file holds the arguments and the dispatch; `client.rs`
//! talks HTTP (falling through to the next coordinator when one cannot be
//! reached), `render.rs` turns answers into tables (pure), `top.rs` is the
//! live view.
//!
//! Exit codes: 0 done, 1 failure (no coordinator reachable, unreadable
//! file), 2 usage (clap's), 3 the server refused (its reason is printed).

mod client;
mod drill;
mod overrides;
mod render;
mod reset;
mod top;
mod usage;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{Value, json};

use self::client::{Client, CtlError};

/// Options shared by every `ctl` subcommand.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 done, 1 failure (e.g. no coordinator reachable), \
                        2 usage error, 3 refused by the coordinator (its reason is printed)."
)]
pub struct CtlArgs {
    /// A coordinator's admin API, e.g. http://127.0.0.1:7080 or https://…;
    /// repeat it to name several: when one cannot be reached the next is
    /// tried. Default: env MERIDIAN_COORDINATOR (comma-separated).
    #[arg(long = "coordinator", value_name = "URL", global = true)]
    coordinators: Vec<String>,
    /// File holding the admin token (keep it 0600); default: env
    /// MERIDIAN_ADMIN_TOKEN. Writes need it; reads need it (or the read
    /// token) when the coordinator runs with --read-token-file. The token
    /// is never taken from the command line.
    #[arg(long, value_name = "FILE", global = true)]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the coordinators' certificates, for
    /// https:// coordinators (the demo's is `<its dir>/pki/ca.pem`).
    #[arg(long, value_name = "FILE", global = true)]
    ca: Option<PathBuf>,
    /// `table` for people, `json` for scripts (the coordinator's answer),
    /// `markdown` for drill reports (other answers print as tables).
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// How long one request may take before it fails.
    #[arg(long, value_name = "DURATION", default_value = "10s", global = true,
          value_parser = crate::rules::parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: CtlCommand,
}

/// How answers are printed.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    /// Drill reports as markdown; anything else as `table`.
    Markdown,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// The replicated rule set: apply files, show, compare, stage and roll back versions.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Regions: their weight in the static split and their state.
    Regions {
        #[command(subcommand)]
        command: RegionsCommand,
    },
    /// How each global rule's limit is split between regions now.
    ///
    /// Without --rule: every global rule's split per region. With --rule:
    /// that rule's split, its keys with an entry of their own and the epochs
    /// that changed it. With --rule and --key: the allocation serving that key.
    Allocations(AllocationsArgs),
    /// Every region's lease: until when it may enforce its allocation without
    /// hearing from the coordinator, the epoch it acknowledged, its pods.
    Leases,
    /// The Raft cluster: status, adding and removing nodes.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Region failover drills: take a region out on purpose and get a report.
    ///
    /// drain moves the region's share to the others at once; fail makes the
    /// coordinators treat it as dead (its lease lapses, it falls back);
    /// partition cuts its limiters off every coordinator. Drills are
    /// records in Raft: they survive a leader change, and each records who
    /// started and stopped it.
    Drill {
        #[command(subcommand)]
        command: drill::DrillCommand,
    },
    /// Per-key overrides: one customer's limit, set at runtime, world-wide.
    ///
    /// An override replaces its rule's limit for one key (e.g. customer=42
    /// of rule api|customer); it lives in the coordinators' replicated
    /// state beside the rules (a rules rollback keeps it) and reaches every
    /// region's limiters within a second. Import and export move thousands
    /// at once.
    Overrides {
        #[command(subcommand)]
        command: overrides::OverridesCommand,
    },
    /// Clear one key's counters in every region's store, then wait for each
    /// region's answer.
    ///
    /// Every algorithm's counters of the key are cleared (split
    /// sub-counters and the approximate path's pending hits included), in
    /// every registered region; each region answers whether it was done. A
    /// region cut off applies it when it reconnects, for 10 minutes. Who
    /// asked is recorded with the reset.
    Reset(reset::ResetArgs),
    /// Show a reset and every region's answer.
    ResetStatus { id: u64 },
    /// How much of its limit a key used, per region and world-wide.
    ///
    /// `usage --domain api customer=42`: for each limit of the rule the
    /// descriptor resolves to, per region the hits admitted in the current
    /// period (from the leader's world ledger, which tracks the busiest
    /// keys: a quiet key is "not tracked"), the region's allocation for the
    /// key, the limit, the override if any and how old the figure is.
    /// `usage top [--rule R] [-n 10]`: the keys closest to or over their
    /// limit world-wide.
    Usage(usage::UsageArgs),
    /// A live view of allocations and rejections per region, redrawn in place.
    ///
    /// Reads the leader (consistent reads), which counts the hits the
    /// regions' pods report, asked and allowed, from when it began leading;
    /// rates are the growth of those counts over --window. Ctrl-C stops it.
    Top(TopArgs),
    /// Print a shell completion script for the whole `meridian` command.
    ///
    /// bash: `meridian ctl completions bash > /etc/bash_completion.d/meridian`;
    /// zsh: into a directory on $fpath as `_meridian`; fish:
    /// `~/.config/fish/completions/meridian.fish`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Validate and commit rule files as the next version (PUT /api/v1/rules).
    ///
    /// The files form one rule set, each named by its file name. The
    /// coordinator validates them together and answers every issue at once.
    Apply {
        /// Rule files (YAML, envoy ratelimit format plus Meridian's fields).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[command(flatten)]
        stage: StageArgs,
    },
    /// Show the current rule set (or --version N) with its files.
    Get {
        /// A kept version instead of the current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Compare two rule sets line by line, file by file.
    ///
    /// Each side is a version number, `current`, `stable` (what regions
    /// outside a shadow or canary stage enforce) or a local rule file, e.g. `diff current
    /// rules.yaml` before an apply.
    Diff {
        /// The old side.
        a: String,
        /// The new side.
        b: String,
    },
    /// List the kept versions, their stage and where they came from.
    Versions,
    /// Move a version to another stage: shadow (decide, never deny), canary
    /// (enforced in --canary-region regions only) or all.
    Rollout {
        /// The version to move; default: the newest.
        #[arg(long)]
        version: Option<u64>,
        #[command(flatten)]
        stage: StageArgs,
    },
    /// Make an earlier version current again, as a new version.
    Rollback {
        /// The version to return to; default: the last one enforced everywhere
        /// before the current one.
        #[arg(long)]
        to: Option<u64>,
    },
}

#[derive(Args)]
struct StageArgs {
    /// shadow: counted but never denied; canary: enforced only in the
    /// --canary-region regions; all: enforced everywhere.
    #[arg(long, value_enum, default_value_t = Stage::All)]
    stage: Stage,
    /// A region the canary stage enforces in (repeatable; with --stage canary).
    #[arg(long = "canary-region", value_name = "REGION")]
    canary_regions: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Stage {
    Shadow,
    Canary,
    All,
}

impl StageArgs {
    fn json(&self) -> (&'static str, &[String]) {
        let stage = match self.stage {
            Stage::Shadow => "shadow",
            Stage::Canary => "canary",
            Stage::All => "all",
        };
        (stage, &self.canary_regions)
    }
}

#[derive(Subcommand)]
enum RegionsCommand {
    /// List the regions with their weight and state.
    List,
    /// Create a region or change its weight or state (PUT /api/v1/regions/NAME).
    ///
    /// What is not given is kept from the region as registered (a new region:
    /// weight 1, active).
    Set {
        name: String,
        /// Relative share of the static split (> 0).
        #[arg(long)]
        weight: Option<f64>,
        /// active, draining (its share is moved away) or failed.
        #[arg(long, value_enum)]
        state: Option<RegionStateArg>,
    },
    /// Mark a region draining: the rebalancer moves its share to the others
    /// while its weight is kept. Undo with `regions set NAME --state active`.
    Drain { name: String },
    /// Remove a region from the registry (DELETE /api/v1/regions/NAME).
    Delete { name: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum RegionStateArg {
    Active,
    Draining,
    Failed,
}

impl RegionStateArg {
    fn as_str(self) -> &'static str {
        match self {
            RegionStateArg::Active => "active",
            RegionStateArg::Draining => "draining",
            RegionStateArg::Failed => "failed",
        }
    }
}

#[derive(Args)]
struct AllocationsArgs {
    /// One global rule (its id, as `rules get` shows it).
    #[arg(long)]
    rule: Option<String>,
    /// One key of --rule (the value the rule counts, e.g. a customer id).
    #[arg(long, requires = "rule")]
    key: Option<String>,
    /// With --rule: how many of the epochs that changed it to list.
    #[arg(long, default_value_t = 5, requires = "rule")]
    history: usize,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// The cluster id, leader, term, log indexes and every member's role,
    /// replication progress and last contact.
    Status,
    /// Add a node: it joins as a learner and is promoted to voter once it
    /// caught up. Start it first (`meridian coordinator --id N …`).
    Add {
        /// The new node's Raft id (never reuse a removed node's).
        #[arg(long)]
        id: u64,
        /// Where peers reach its Raft gRPC (host:port).
        #[arg(long, value_name = "HOST:PORT")]
        raft_addr: String,
        /// Where clients reach its admin API (host:port).
        #[arg(long, value_name = "HOST:PORT")]
        http_addr: String,
    },
    /// Remove a node from the membership (then stop its process).
    Remove { id: u64 },
}

#[derive(Args)]
struct TopArgs {
    /// Time between frames.
    #[arg(long, value_name = "DURATION", default_value = "2s",
          value_parser = crate::rules::parse_duration)]
    interval: Duration,
    /// Rates are averaged over this long: pods report every few seconds
    /// (10 s by default), so a shorter window jumps.
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = crate::rules::parse_duration)]
    window: Duration,
    /// Print one frame (totals, no rates) and exit: for scripts and tests.
    #[arg(long)]
    once: bool,
}

/// Runs `meridian ctl`; `root` builds the whole CLI for completions.
pub fn run(args: CtlArgs, root: impl FnOnce() -> clap::Command) -> ExitCode {
    if let CtlCommand::Completions { shell } = args.command {
        let mut command = root();
        clap_complete::generate(shell, &mut command, "meridian", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn dispatch(args: CtlArgs) -> Result<(), CtlError> {
    let client = Client::new(
        coordinators(&args.coordinators),
        args.token_file.as_deref(),
        args.ca.as_deref(),
        args.timeout,
    )?;
    let output = args.output;
    match args.command {
        CtlCommand::Rules { command } => rules(&client, output, command).await,
        CtlCommand::Regions { command } => regions(&client, output, command).await,
        CtlCommand::Allocations(a) => {
            let mut query = Vec::new();
            if let Some(rule) = &a.rule {
                query.push(("rule", rule.as_str()));
            }
            if let Some(key) = &a.key {
                query.push(("key", key.as_str()));
            }
            let history = a.history.to_string();
            if a.rule.is_some() {
                query.push(("history", history.as_str()));
            }
            let body = client.get("/api/v1/allocations", &query).await?;
            print(output, &body, render::allocations);
            Ok(())
        }
        CtlCommand::Leases => {
            let body = client.get("/api/v1/leases", &[]).await?;
            print(output, &body, render::leases);
            Ok(())
        }
        CtlCommand::Cluster { command } => cluster(&client, output, command).await,
        CtlCommand::Drill { command } => drill::run(&client, output, command).await,
        CtlCommand::Overrides { command } => overrides::run(&client, output, command).await,
        CtlCommand::Reset(args) => reset::run(&client, output, args).await,
        CtlCommand::ResetStatus { id } => reset::status(&client, output, id).await,
        CtlCommand::Usage(u) => usage::run(&client, output, u).await,
        CtlCommand::Top(t) => top::run(&client, output, t.interval, t.window, t.once).await,
        CtlCommand::Completions { .. } => Ok(()),
    }
}

/// `--coordinator` values, else MERIDIAN_COORDINATOR split at commas.
fn coordinators(flags: &[String]) -> Vec<String> {
    if !flags.is_empty() {
        return flags.to_vec();
    }
    std::env::var("MERIDIAN_COORDINATOR")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Prints `body` as pretty JSON or through its table renderer.
fn print(output: Output, body: &Value, table: impl FnOnce(&Value) -> String) {
    match output {
        Output::Json => println!("{}", render::json(body)),
        Output::Table | Output::Markdown => print!("{}", table(body)),
    }
}

async fn rules(client: &Client, output: Output, command: RulesCommand) -> Result<(), CtlError> {
    match command {
        RulesCommand::Apply { files, stage } => {
            let mut texts = BTreeMap::new();
            for path in &files {
                let name = file_name(path)?;
                let text = read_text(path)?;
                if texts.insert(name.clone(), text).is_some() {
                    return Err(CtlError::Input(format!(
                        "two files are named {name:?}: a rule set names each file by its \
                         file name, so rename one"
                    )));
                }
            }
            let (stage, canary_regions) = stage.json();
            let body = json!({ "files": texts, "stage": stage, "canary_regions": canary_regions });
            let answer = client
                .send(Method::PUT, "/api/v1/rules", Some(body))
                .await?;
            print(output, &answer, |a| {
                render::committed("rule set version", a)
            });
        }
        RulesCommand::Get { version } => {
            let body = match version {
                Some(n) => {
                    client
                        .get(&format!("/api/v1/rules/versions/{n}"), &[])
                        .await?
                }
                None => client.get("/api/v1/rules", &[]).await?,
            };
            print(output, &body, render::rules);
        }
        RulesCommand::Diff { a, b } => {
            let (old, new) = (side(client, &a).await?, side(client, &b).await?);
            // A version's files are headed `3/name`, a local file by its name.
            let prefix = |label: &str| {
                let version = label == "current"
                    || label == "stable"
                    || label.bytes().all(|b| b.is_ascii_digit());
                if version {
                    format!("{label}/")
                } else {
                    String::new()
                }
            };
            let (pa, pb) = (prefix(&a), prefix(&b));
            match output {
                Output::Json => {
                    let body = json!({ "a": { "label": a, "files": old },
                                       "b": { "label": b, "files": new },
                                       "diff": crate::rules::diff::diff(&pa, &old, &pb, &new) });
                    println!("{}", render::json(&body));
                }
                Output::Table | Output::Markdown => {
                    print!("{}", crate::rules::diff::diff(&pa, &old, &pb, &new))
                }
            }
        }
        RulesCommand::Versions => {
            let body = client.get("/api/v1/rules/versions", &[]).await?;
            print(output, &body, render::versions);
        }
        RulesCommand::Rollout { version, stage } => {
            let (stage, canary_regions) = stage.json();
            let body =
                json!({ "version": version, "stage": stage, "canary_regions": canary_regions });
            let answer = client
                .send(Method::POST, "/api/v1/rules/rollout", Some(body))
                .await?;
            print(output, &answer, |a| {
                render::committed("rolled out: rule set version", a)
            });
        }
        RulesCommand::Rollback { to } => {
            let body = json!({ "to": to });
            let answer = client
                .send(Method::POST, "/api/v1/rules/rollback", Some(body))
                .await?;
            print(output, &answer, |a| {
                render::committed("rolled back: new rule set version", a)
            });
        }
    }
    Ok(())
}

/// One side of `rules diff`: file name → text.
async fn side(client: &Client, label: &str) -> Result<BTreeMap<String, String>, CtlError> {
    let body = match label {
        "current" => client.get("/api/v1/rules", &[]).await?["current"].take(),
        "stable" => {
            let mut rules = client.get("/api/v1/rules", &[]).await?;
            if !rules["stable"].is_null() {
                rules["stable"].take()
            } else if rules["current"]["stage"] == "all" {
                // The current version is enforced everywhere: it is the stable one.
                rules["current"].take()
            } else {
                return Err(CtlError::Input(
                    "no version has reached stage all yet, so there is no stable one".into(),
                ));
            }
        }
        n if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            client
                .get(&format!("/api/v1/rules/versions/{n}"), &[])
                .await?
        }
        path => {
            let path = Path::new(path);
            if !path.exists() {
                return Err(CtlError::Input(format!(
                    "{label:?} is neither a version number, `current`, `stable` nor an existing file"
                )));
            }
            return Ok(BTreeMap::from([(file_name(path)?, read_text(path)?)]));
        }
    };
    serde_json::from_value(body["files"].clone()).map_err(|e| {
        CtlError::Answer(format!(
            "the coordinator's version has no readable files: {e}"
        ))
    })
}

fn file_name(path: &Path) -> Result<String, CtlError> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(String::from)
        .ok_or_else(|| CtlError::Input(format!("{}: not a file name", path.display())))
}

fn read_text(path: &Path) -> Result<String, CtlError> {
    std::fs::read_to_string(path).map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))
}

async fn regions(client: &Client, output: Output, command: RegionsCommand) -> Result<(), CtlError> {
    match command {
        RegionsCommand::List => {
            let body = client.get("/api/v1/regions", &[]).await?;
            print(output, &body, render::regions);
        }
        RegionsCommand::Set {
            name,
            weight,
            state,
        } => {
            let current = registered(client, &name).await?;
            let weight = weight.map_or_else(|| current["weight"].clone(), |w| json!(w));
            let state = state.map_or_else(|| current["state"].clone(), |s| json!(s.as_str()));
            let body = json!({
                "weight": if weight.is_null() { json!(1.0) } else { weight },
                "state": if state.is_null() { json!("active") } else { state },
            });
            let answer = client
                .send(
                    Method::PUT,
                    &format!("/api/v1/regions/{}", path_segment(&name)?),
                    Some(body),
                )
                .await?;
            print(output, &answer, |a| {
                render::committed(&format!("region {name} set:"), a)
            });
        }
        RegionsCommand::Drain { name } => {
            let current = registered(client, &name).await?;
            if current.is_null() {
                return Err(CtlError::Input(format!(
                    "region {name:?} is not registered (`meridian ctl regions list` shows them)"
                )));
            }
            let body = json!({ "weight": current["weight"], "state": "draining" });
            let answer = client
                .send(
                    Method::PUT,
                    &format!("/api/v1/regions/{}", path_segment(&name)?),
                    Some(body),
                )
                .await?;
            print(output, &answer, |a| {
                render::committed(&format!("region {name} draining:"), a)
            });
        }
        RegionsCommand::Delete { name } => {
            let answer = client
                .send(
                    Method::DELETE,
                    &format!("/api/v1/regions/{}", path_segment(&name)?),
                    None,
                )
                .await?;
            print(output, &answer, |a| {
                render::committed(&format!("region {name} deleted:"), a)
            });
        }
    }
    Ok(())
}

/// The region as registered, or `null` when it is not.
async fn registered(client: &Client, name: &str) -> Result<Value, CtlError> {
    match client.get("/api/v1/regions", &[]).await?["regions"].as_array() {
        Some(regions) => Ok(regions
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)),
        None => Err(CtlError::Answer(
            "the region list has no `regions` array".into(),
        )),
    }
}

/// `name` as one URL path segment; region names are `[a-z0-9_-]`, so
/// anything else is refused here rather than sent half-escaped.
fn path_segment(name: &str) -> Result<&str, CtlError> {
    if !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Ok(name)
    } else {
        Err(CtlError::Input(format!(
            "region name {name:?}: use 1–64 characters of a-z, 0-9, '-' or '_'"
        )))
    }
}

async fn cluster(client: &Client, output: Output, command: ClusterCommand) -> Result<(), CtlError> {
    match command {
        ClusterCommand::Status => {
            let body = client.get("/api/v1/cluster", &[]).await?;
            print(output, &body, render::cluster);
        }
        ClusterCommand::Add {
            id,
            raft_addr,
            http_addr,
        } => {
            let body = json!({ "id": id, "raft_addr": raft_addr, "http_addr": http_addr });
            let answer = client
                .send(Method::POST, "/api/v1/cluster/nodes", Some(body))
                .await?;
            print(output, &answer, |a| {
                render::committed(&format!("node {id} added:"), a)
            });
        }
        ClusterCommand::Remove { id } => {
            let answer = client
                .send(Method::DELETE, &format!("/api/v1/cluster/nodes/{id}"), None)
                .await?;
            print(output, &answer, |a| {
                render::committed(&format!("node {id} removed:"), a)
            });
        }
    }
    Ok(())
}
