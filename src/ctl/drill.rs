//! `meridian ctl drill …` over `/api/v1/drills`.

use clap::{Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{Value, json};

use super::client::{Client, CtlError};
use super::{Output, print, render};

#[derive(Subcommand)]
pub enum DrillCommand {
    /// Start a drill on a region (POST /api/v1/drills).
    ///
    /// Refused when the region is already in a drill, or when it would
    /// leave a global rule with no region to serve it (unless --force).
    Start {
        /// The region to take out.
        #[arg(long)]
        region: String,
        /// drain: its share moves to the others at once; fail: treated as
        /// dead (reports ignored, lease not renewed); partition: its
        /// limiters are cut off from every coordinator.
        #[arg(long, value_enum)]
        mode: Mode,
        /// Stop by itself after this long (e.g. 30s, 5m); default: until
        /// `ctl drill stop`.
        #[arg(long, value_name = "DURATION")]
        duration: Option<String>,
        /// A note kept with the drill (at most 1 KiB).
        #[arg(long, value_name = "TEXT", default_value = "")]
        note: String,
        /// Start even if no other region would serve the global rules.
        #[arg(long)]
        force: bool,
    },
    /// Stop a drill: the region returns to normal operation.
    Stop { id: u64 },
    /// Every drill kept, newest first.
    List,
    /// A drill's report: timeline and figures, as markdown (the default)
    /// or, with --output json, as the coordinator's JSON.
    Report { id: u64 },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Mode {
    Drain,
    Fail,
    Partition,
}

pub async fn run(client: &Client, output: Output, command: DrillCommand) -> Result<(), CtlError> {
    match command {
        DrillCommand::Start {
            region,
            mode,
            duration,
            note,
            force,
        } => {
            let mode = match mode {
                Mode::Drain => "drain",
                Mode::Fail => "fail",
                Mode::Partition => "partition",
            };
            let body = json!({ "region": region, "mode": mode, "duration": duration,
                               "note": note, "force": force });
            let answer = client
                .send(Method::POST, "/api/v1/drills", Some(body))
                .await?;
            print(output, &answer, |a| {
                format!(
                    "drill {} started: {mode} {region} (report: meridian ctl drill report {})\n",
                    render::cell(&a["drill"]),
                    render::cell(&a["drill"])
                )
            });
        }
        DrillCommand::Stop { id } => {
            let answer = client
                .send(
                    Method::POST,
                    &format!("/api/v1/drills/{id}/stop"),
                    Some(json!({})),
                )
                .await?;
            print(output, &answer, |_| {
                format!("drill {id} stopped (report: meridian ctl drill report {id})\n")
            });
        }
        DrillCommand::List => {
            let body = client.get("/api/v1/drills", &[]).await?;
            print(output, &body, list);
        }
        DrillCommand::Report { id } => {
            let body = client.get(&format!("/api/v1/drills/{id}"), &[]).await?;
            if output == Output::Json {
                println!("{}", render::json(&body["report"]));
            } else {
                print!("{}", body["markdown"].as_str().unwrap_or_default());
            }
        }
    }
    Ok(())
}

/// The drill list as a table.
fn list(body: &Value) -> String {
    let rows: Vec<Vec<String>> = body["drills"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|d| {
            let state = if d["active"].as_bool().unwrap_or(false) {
                "active"
            } else if d["finished"].as_bool().unwrap_or(false) {
                "finished"
            } else {
                "recovering"
            };
            let by = |a: &Value| {
                let op = a["operator"]
                    .as_str()
                    .map(|o| format!(" ({o})"))
                    .unwrap_or_default();
                format!("{}{op}", render::cell(&a["credential"]))
            };
            vec![
                render::cell(&d["id"]),
                render::cell(&d["region"]),
                render::cell(&d["mode"]),
                state.to_string(),
                render::utc(&d["started_at_unix_ms"]),
                by(&d["started_by"]),
                render::utc(&d["stopped"]["at_unix_ms"]),
                render::cell(&d["note"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no drills yet: meridian ctl drill start --region R --mode drain\n".into();
    }
    render::table(
        &[
            "ID", "REGION", "MODE", "STATE", "STARTED", "BY", "STOPPED", "NOTE",
        ],
        &rows,
    )
}
