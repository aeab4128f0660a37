//! `ctl top`: allocations and rejections per rule and region, redrawn in
//! place. Each frame reads the leader's allocations (with the hits its
//! regions reported) and leases; rates are the growth of those counts over
//! the last `--window`, since pods report only every few seconds.
//! [`rows`] and [`frame`] are pure; [`run`] is the loop around them.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Output;
use super::client::{Client, CtlError};
use super::render::{cell, table, utc};

/// Frames kept for the rate window, at most (with `--interval 100ms`, a
/// 100 s window); older ones are dropped first.
const MAX_SAMPLES: usize = 1000;

/// One line of the view: a region's share of a global rule.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub rule: String,
    pub region: String,
    /// The region's state (active, draining, failed) from the leases.
    pub state: String,
    /// The region's allocation of the rule's limit now.
    pub granted: Option<f64>,
    /// Smoothed demand, hits per rule period.
    pub demand: Option<f64>,
    /// Hits reported since the leader began leading.
    pub asked: u64,
    pub rejected: u64,
    /// Over the window; `None` for the first frame or after a leader change.
    pub asked_per_s: Option<f64>,
    pub rejected_per_s: Option<f64>,
}

/// The rows of one frame from `/api/v1/allocations` and `/api/v1/leases`,
/// with rates against `earlier` (an allocations answer `secs` ago).
pub fn rows(allocations: &Value, leases: &Value, earlier: Option<(&Value, f64)>) -> Vec<Row> {
    let mut out = Vec::new();
    let states: std::collections::BTreeMap<&str, String> = leases["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r["region"].as_str()?, cell(&r["state"]))))
        .collect();
    for (rule, r) in allocations["rules"].as_object().into_iter().flatten() {
        let mut regions: Vec<&String> = r["split"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
            .collect();
        for (k, _) in r["hits"].as_object().into_iter().flatten() {
            if !regions.contains(&k) {
                regions.push(k);
            }
        }
        regions.sort();
        for region in regions {
            let hits = |body: &Value| {
                let h = &body["rules"][rule]["hits"][region];
                let asked = h["asked"].as_u64().unwrap_or(0);
                (
                    asked,
                    asked.saturating_sub(h["allowed"].as_u64().unwrap_or(0)),
                )
            };
            let (asked, rejected) = hits(allocations);
            let rates = earlier.and_then(|(before, secs)| {
                let (asked0, rejected0) = hits(before);
                // Counts restart with a new leader: no rate across that.
                (secs > 0.0 && asked >= asked0 && rejected >= rejected0).then(|| {
                    (
                        (asked - asked0) as f64 / secs,
                        (rejected - rejected0) as f64 / secs,
                    )
                })
            });
            out.push(Row {
                rule: rule.clone(),
                region: region.clone(),
                state: states
                    .get(region.as_str())
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
                granted: r["split"][region]["granted"].as_f64(),
                demand: r["demand"][region].as_f64(),
                asked,
                rejected,
                asked_per_s: rates.map(|r| r.0),
                rejected_per_s: rates.map(|r| r.1),
            });
        }
    }
    out
}

/// One frame as text: a title line, then the table.
pub fn frame(allocations: &Value, rows: &[Row], window: Duration) -> String {
    let mut out = format!(
        "meridian top · epoch {} at {} · rates over {}s · Ctrl-C quits\n",
        cell(&allocations["epoch"]),
        utc(&allocations["at_unix_ms"]),
        window.as_secs()
    );
    if rows.is_empty() {
        out.push_str("no global rule has an allocation yet\n");
        return out;
    }
    let num = |v: Option<f64>| v.map_or_else(|| "-".into(), |x| format!("{x:.1}"));
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            // Over the window when there is one, else over the totals.
            let share = match (r.asked_per_s, r.rejected_per_s) {
                (Some(a), Some(j)) if a > 0.0 => Some(100.0 * j / a),
                (Some(_), Some(_)) => None,
                _ if r.asked > 0 => Some(100.0 * r.rejected as f64 / r.asked as f64),
                _ => None,
            };
            vec![
                r.rule.clone(),
                r.region.clone(),
                r.state.clone(),
                r.granted.map_or_else(|| "-".into(), |g| format!("{g:.0}")),
                r.demand.map_or_else(|| "-".into(), |d| format!("{d:.0}")),
                num(r.asked_per_s),
                num(r.rejected_per_s),
                share.map_or_else(|| "-".into(), |s| format!("{s:.1}%")),
                r.asked.to_string(),
                r.rejected.to_string(),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "RULE",
            "REGION",
            "STATE",
            "GRANTED",
            "DEMAND",
            "ASKED/S",
            "REJECTED/S",
            "REJECTED",
            "ASKED TOTAL",
            "REJECTED TOTAL",
        ],
        &table_rows,
    ));
    if allocations["hits_counted_here"] == false {
        let _ = writeln!(
            out,
            "(the node that answered does not lead: hits are the leader's)"
        );
    }
    out
}

/// Draws a frame every `interval` until Ctrl-C (or once). Rates use the
/// frames of the last `window`.
pub async fn run(
    client: &Client,
    output: Output,
    interval: Duration,
    window: Duration,
    once: bool,
) -> Result<(), CtlError> {
    let mut samples: VecDeque<(Instant, Value)> = VecDeque::new();
    let consistent = [("consistent", "true")];
    loop {
        let read = async {
            let allocations = client.get("/api/v1/allocations", &consistent).await?;
            let leases = client.get("/api/v1/leases", &consistent).await?;
            Ok::<_, CtlError>((allocations, leases))
        };
        let now = Instant::now();
        let mut text = String::new();
        match read.await {
            Ok((allocations, leases)) => {
                while samples.len() >= MAX_SAMPLES
                    || samples
                        .front()
                        .is_some_and(|(t, _)| now.duration_since(*t) > window)
                {
                    samples.pop_front();
                }
                let earlier = samples
                    .front()
                    .map(|(t, v)| (v, now.duration_since(*t).as_secs_f64()));
                let rows = rows(&allocations, &leases, earlier);
                match output {
                    Output::Json => {
                        let body = json!({
                            "epoch": allocations["epoch"],
                            "at_unix_ms": allocations["at_unix_ms"],
                            "rows": rows,
                        });
                        let _ = writeln!(text, "{body}");
                    }
                    Output::Table | Output::Markdown => text = frame(&allocations, &rows, window),
                }
                samples.push_back((now, allocations));
            }
            Err(e) if once => return Err(e),
            // A live view rides out a leader change or a restart.
            Err(e) => text = format!("meridian top · no answer, retrying: {e}\n"),
        }
        let mut stdout = std::io::stdout().lock();
        if !once && output != Output::Json {
            // Home the cursor and clear the screen, then redraw.
            let _ = write!(stdout, "\x1b[H\x1b[2J");
        }
        let _ = write!(stdout, "{text}");
        let _ = stdout.flush();
        drop(stdout);
        if once {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocations(asked: u64, allowed: u64) -> Value {
        json!({
            "epoch": 7,
            "at_unix_ms": 0,
            "hits_counted_here": true,
            "rules": { "per_customer": {
                "limit": 1000,
                "split": { "mumbai": { "granted": 600 }, "hyderabad": { "granted": 400 } },
                "demand": { "mumbai": 650.0, "hyderabad": 300.0 },
                "hits": { "mumbai": { "asked": asked, "allowed": allowed } },
            }},
        })
    }

    #[test]
    fn rates_are_the_growth_over_the_window_and_stop_at_a_leader_change() {
        let leases = json!({ "regions": [{ "region": "mumbai", "state": "active" }] });
        let first = rows(&allocations(100, 90), &leases, None);
        assert_eq!(first.len(), 2);
        let mumbai = &first[1];
        assert_eq!(
            (mumbai.region.as_str(), mumbai.asked, mumbai.rejected),
            ("mumbai", 100, 10)
        );
        assert_eq!(mumbai.asked_per_s, None);
        let before = allocations(100, 90);
        let later = rows(&allocations(300, 250), &leases, Some((&before, 10.0)));
        assert_eq!(later[1].asked_per_s, Some(20.0));
        assert_eq!(later[1].rejected_per_s, Some(4.0));
        assert_eq!(later[0].state, "-");
        let restarted = rows(&allocations(5, 5), &leases, Some((&before, 10.0)));
        assert_eq!(restarted[1].asked_per_s, None);
        let text = frame(&allocations(300, 250), &later, Duration::from_secs(30));
        assert!(text.contains("20.0%"), "{text}");
    }
}
