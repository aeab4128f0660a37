//! `meridian ctl reset …` over `/api/v1/resets`: start a reset, then follow
//! it until every region answered (or `--wait` ran out), one line a region.

use std::time::{Duration, Instant};

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::client::{Client, CtlError};
use super::overrides::Target;
use super::{Output, print, render};

#[derive(Args)]
pub struct ResetArgs {
    /// The key whose counters are cleared: a descriptor, or a rule's name
    /// and a key as checks by rule name give them.
    #[command(flatten)]
    target: Target,
    /// How long to wait for every region's answer; a region that has not
    /// answered by then is shown as pending (it applies the reset when it
    /// reconnects, for 10 minutes).
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = crate::rules::parse_duration)]
    wait: Duration,
}

/// Starts the reset and follows it. Exit 1 when a region failed or did not
/// answer within `--wait`.
pub async fn run(client: &Client, output: Output, args: ResetArgs) -> Result<(), CtlError> {
    let t = &args.target;
    let body = json!({ "domain": t.domain, "descriptor": t.entries, "rule": t.rule,
                       "key": t.key });
    let started = client
        .send(Method::POST, "/api/v1/resets", Some(body))
        .await?;
    let Some(id) = started["reset"].as_u64() else {
        return Err(CtlError::Answer(format!(
            "the coordinator's answer names no reset: {started}"
        )));
    };
    let path = format!("/api/v1/resets/{id}");
    let deadline = Instant::now() + args.wait;
    let answer = loop {
        let answer = client.get(&path, &[]).await?;
        if answer["reset"]["done"].as_bool() == Some(true) || Instant::now() >= deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    print(output, &answer, |a| table(&a["reset"]));
    let all_applied = answer["reset"]["regions"]
        .as_array()
        .is_some_and(|r| r.iter().all(|r| r["state"] == "applied"));
    if all_applied {
        Ok(())
    } else {
        Err(CtlError::Answer(format!(
            "reset {id} is not applied in every region (yet): meridian ctl reset-status {id} \
             shows it again"
        )))
    }
}

/// Shows reset `id` (every region's answer).
pub async fn status(client: &Client, output: Output, id: u64) -> Result<(), CtlError> {
    let answer = client.get(&format!("/api/v1/resets/{id}"), &[]).await?;
    print(output, &answer, |a| table(&a["reset"]));
    Ok(())
}

/// One reset as a table, a row a region.
fn table(reset: &Value) -> String {
    let rows: Vec<Vec<String>> = reset["regions"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|r| {
            vec![
                render::cell(&r["region"]),
                render::cell(&r["state"]),
                render::utc(&r["at_unix_ms"]),
                render::cell(&r["pod"]),
                render::cell(&r["detail"]),
            ]
        })
        .collect();
    let what = match reset["key"].as_str() {
        Some(key) => format!("key {key} of rule {}", render::cell(&reset["rule"])),
        None => reset["descriptor"]
            .as_array()
            .map(|d| d.iter().map(render::cell).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
    };
    format!(
        "reset {} of {} {what} (by {}):\n{}",
        render::cell(&reset["id"]),
        render::cell(&reset["domain"]),
        render::cell(&reset["by"]["credential"]),
        render::table(&["REGION", "STATE", "AT", "POD", "DETAIL"], &rows)
    )
}
