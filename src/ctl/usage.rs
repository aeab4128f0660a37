//! `meridian ctl usage …` over `/api/v1/usage` and `/api/v1/usage/top`:
//! how much of its limit a key used, per region and world-wide, and the
//! keys closest to or over their limit. The tables are rendered here
//! (pure: [`usage_table`], [`top_table`]).

use clap::{Args, Subcommand};
use serde_json::Value;

use super::client::{Client, CtlError};
use super::{Output, print, render};

/// `meridian ctl usage`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct UsageArgs {
    #[command(subcommand)]
    command: Option<UsageCommand>,
    /// The descriptor's domain.
    #[arg(long)]
    domain: Option<String>,
    /// The descriptor's entries as KEY=VALUE, outermost first (e.g.
    /// customer=42), resolved to its rule as a check's descriptor is.
    #[arg(
        value_name = "KEY=VALUE",
        requires = "domain",
        conflicts_with = "key",
        required_unless_present = "key"
    )]
    entries: Vec<String>,
    /// With --key: a rule id (as `rules get` shows it) or, with --domain,
    /// its rate_limit.name; for keys checked by rule name and key.
    #[arg(long, requires = "key")]
    rule: Option<String>,
    /// With --rule: the key as a check by rule name gives it.
    #[arg(long, requires = "rule")]
    key: Option<String>,
}

#[derive(Subcommand)]
enum UsageCommand {
    /// Per global rule, the keys closest to or over their limit world-wide
    /// in the current period and the one before (admitted / the key's
    /// limit, the override's where one is set), from what regions report.
    Top {
        /// One global rule (its id).
        #[arg(long)]
        rule: Option<String>,
        /// Keys per rule (at most 100).
        #[arg(short = 'n', long = "keys", default_value_t = 10)]
        n: usize,
    },
}

pub async fn run(client: &Client, output: Output, args: UsageArgs) -> Result<(), CtlError> {
    match args.command {
        Some(UsageCommand::Top { rule, n }) => {
            let n = n.to_string();
            let mut q: Vec<(&str, &str)> = vec![("n", &n)];
            if let Some(r) = &rule {
                q.push(("rule", r));
            }
            let body = client.get("/api/v1/usage/top", &q).await?;
            print(output, &body, top_table);
        }
        None => {
            let descriptor = args.entries.join(";");
            let mut q: Vec<(&str, &str)> = Vec::new();
            if let Some(d) = &args.domain {
                q.push(("domain", d));
            }
            if !args.entries.is_empty() {
                q.push(("descriptor", &descriptor));
            }
            if let Some(r) = &args.rule {
                q.push(("rule", r));
            }
            if let Some(k) = &args.key {
                q.push(("key", k));
            }
            let body = client.get("/api/v1/usage", &q).await?;
            print(output, &body, usage_table);
        }
    }
    Ok(())
}

/// Milliseconds as seconds with a tenth: how old a figure is.
fn age(ms: &Value) -> String {
    ms.as_i64()
        .map_or_else(|| "-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0))
}

fn percent(ratio: &Value) -> String {
    ratio
        .as_f64()
        .map_or_else(String::new, |r| format!(" ({:.1} %)", r * 100.0))
}

fn override_cell(o: &Value) -> String {
    if o.is_null() {
        return "-".into();
    }
    let mut text = render::cell(&o["limit"]);
    if o["expired"].as_bool() == Some(true) {
        text.push_str(" (expired)");
    } else if !o["expires_at_unix_ms"].is_null() {
        text.push_str(&format!(" until {}", render::utc(&o["expires_at_unix_ms"])));
    }
    text
}

/// `GET /api/v1/usage` as a table: a row per region and a world row per
/// global limit, a row per region-scope limit; what is not known is said
/// under it.
pub fn usage_table(body: &Value) -> String {
    let limits = body["limits"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for l in limits {
        let id = render::cell(&l["limit_id"]);
        let o = override_cell(&l["override"]);
        let key_limit = render::cell(&l["key_limit"]);
        if l["scope"] != "global" {
            rows.push(vec![
                id.clone(),
                "(each region)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                render::cell(&l["limit"]),
                o,
                "-".into(),
            ]);
            notes.push(format!("{id}: {}", render::cell(&l["note"])));
            continue;
        }
        for r in l["regions"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let used = match r["figure"].as_str() {
                Some("counted") => render::cell(&r["used"]),
                // Some pods of the region did not report the key.
                Some("partial") => format!("{}+", render::cell(&r["used"])),
                Some("not_tracked") => "not tracked".into(),
                Some("not_reported") => "not reported".into(),
                _ => "-".into(),
            };
            rows.push(vec![
                id.clone(),
                render::cell(&r["region"]),
                used,
                render::cell(&r["reserved"]),
                render::cell(&r["settled"]),
                render::cell(&r["allocation"]),
                key_limit.clone(),
                o.clone(),
                age(&r["age_ms"]),
            ]);
        }
        let w = &l["world"];
        let used = match w["used"].as_u64() {
            Some(_) => format!("{}{}", render::cell(&w["used"]), percent(&w["ratio"])),
            None => "not tracked".into(),
        };
        rows.push(vec![
            id.clone(),
            "world".into(),
            used,
            render::cell(&w["reserved"]),
            render::cell(&w["settled"]),
            render::cell(&w["allocation"]),
            key_limit,
            o,
            "-".into(),
        ]);
        match l["status"].as_str() {
            Some("not_tracked") => notes.push(format!(
                "{id}: the key is not among the leader's tracked keys this period (the busiest \
                 only): its count is unknown, not 0"
            )),
            Some("no_reports") => notes.push(format!(
                "{id}: no pod has reported the period that began {} yet",
                render::utc(&l["period"]["start_unix_ms"])
            )),
            Some("tracked")
                if l["regions"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|r| r["figure"] != "counted")) =>
            {
                notes.push(format!(
                    "{id}: N+: some pods of the region did not report the key; not reported: \
                     none did (no hits, or not among a pod's 16 busiest keys); -: the region \
                     did not report the period"
                ))
            }
            Some("not_in_ledger") => notes.push(format!(
                "{id}: not in the leader's ledger (a new leader counts from the reports that reach it)"
            )),
            _ => {}
        }
        if let Some(p) = l["previous_period"].as_object()
            && !p["used"].is_null()
        {
            notes.push(format!(
                "{id}: the period before used {}{}",
                render::cell(&p["used"]),
                percent(&p["ratio"])
            ));
        }
    }
    let mut out = format!(
        "key {} of rule {} (domain {}), the current period; figures from the leader's ledger, \
         pods report every {}\n",
        render::cell(&body["key"]),
        render::cell(&body["rule"]),
        render::cell(&body["domain"]),
        age(&body["report_interval_ms"]),
    );
    out.push_str(&render::table(
        &[
            "RULE",
            "REGION",
            "USED",
            "RESERVED",
            "SETTLED",
            "ALLOCATION",
            "LIMIT",
            "OVERRIDE",
            "AGE",
        ],
        &rows,
    ));
    if limits
        .iter()
        .any(|l| l["world"]["reserved"].as_u64() > Some(0))
    {
        notes.push(
            "RESERVED: estimates of reservations open now (counted in USED at their estimate); \
             SETTLED: USED less them"
                .into(),
        );
    }
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// `GET /api/v1/usage/top` as a table: per rule its keys, closest to or
/// over their limit first.
pub fn top_table(body: &Value) -> String {
    let mut rows = Vec::new();
    let empty = serde_json::Map::new();
    for (id, r) in body["rules"].as_object().unwrap_or(&empty) {
        for k in r["keys"].as_array().map(Vec::as_slice).unwrap_or_default() {
            rows.push(vec![
                id.clone(),
                render::cell(&k["key"]),
                render::cell(&k["used"]),
                render::cell(&k["key_limit"]),
                k["ratio"]
                    .as_f64()
                    .map_or_else(|| "-".into(), |r| format!("{:.1}%", r * 100.0)),
                if k["over"].as_bool() == Some(true) {
                    "over"
                } else {
                    ""
                }
                .into(),
                override_cell(&k["override"]),
                if k["worst_period_start_unix_ms"] == r["current_start_unix_ms"] {
                    "current".into()
                } else {
                    render::utc(&k["worst_period_start_unix_ms"])
                },
            ]);
        }
    }
    if rows.is_empty() {
        return "no tracked keys: no pod reported a key of a global rule in the current or the \
                last period\n"
            .into();
    }
    render::table(
        &[
            "RULE", "KEY", "USED", "LIMIT", "USE", "OVER", "OVERRIDE", "PERIOD",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_usage_table_has_a_row_per_region_and_the_world_and_says_what_is_unknown() {
        let body = json!({
            "key": "customer=42", "rule": "api|customer", "domain": "api", "report_interval_ms": 1000,
            "limits": [
                { "limit_id": "api|customer", "scope": "global", "limit": 1000, "key_limit": 5000,
                  "override": { "limit": 5000, "expired": false, "expires_at_unix_ms": null },
                  "status": "tracked", "period": { "start_unix_ms": 0 },
                  "regions": [
                    { "region": "east", "used": 2000, "reserved": 300, "settled": 1700, "allocation": 3500, "age_ms": 800, "figure": "counted" },
                    { "region": "west", "used": null, "allocation": 1500, "age_ms": 1200, "figure": "not_tracked" },
                    { "region": "north", "used": null, "allocation": null, "age_ms": null, "figure": "no_reports" }
                  ],
                  "world": { "used": 3000, "reserved": 300, "settled": 2700, "ratio": 0.6, "allocation": 5000 },
                  "previous_period": null },
                { "limit_id": "api|ip", "scope": "region", "limit": 10, "key_limit": 10, "override": null,
                  "note": "no figure here" }
            ]
        });
        let text = usage_table(&body);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("customer=42") && lines[0].contains("1.0s"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("RULE") && lines[1].contains("AGE"),
            "{text}"
        );
        let east = lines.iter().find(|l| l.contains("east")).expect("east row");
        for cell in ["2000", "300", "1700", "3500", "5000", "0.8s"] {
            assert!(east.contains(cell), "{cell} in {east}");
        }
        let west = lines.iter().find(|l| l.contains("west")).expect("west row");
        assert!(west.contains("not tracked"), "{west}");
        let world = lines
            .iter()
            .find(|l| l.contains("world"))
            .expect("world row");
        assert!(world.contains("3000 (60.0 %)"), "{world}");
        assert!(world.contains("2700"), "settled world-wide: {world}");
        assert!(text.contains("RESERVED: estimates"), "{text}");
        let local = lines
            .iter()
            .find(|l| l.contains("(each region)"))
            .expect("local row");
        assert!(local.contains("api|ip"), "{local}");
        assert!(text.contains("api|ip: no figure here"), "{text}");
    }

    #[test]
    fn the_top_table_lists_keys_in_the_answers_order_with_their_use() {
        let body = json!({ "rules": { "api|fw": {
            "current_start_unix_ms": 60000,
            "keys": [
                { "key": "acme", "used": 240, "key_limit": 200, "ratio": 1.2, "over": true,
                  "override": null, "worst_period_start_unix_ms": 60000 },
                { "key": "bolt", "used": 50, "key_limit": 200, "ratio": 0.25, "over": false,
                  "override": null, "worst_period_start_unix_ms": 0 }
            ] } } });
        let text = top_table(&body);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("RULE"), "{text}");
        assert!(
            lines[1].contains("acme")
                && lines[1].contains("120.0%")
                && lines[1].contains("over")
                && lines[1].contains("current"),
            "{text}"
        );
        assert!(
            lines[2].contains("bolt") && lines[2].contains("25.0%"),
            "{text}"
        );
        assert!(top_table(&json!({ "rules": {} })).starts_with("no tracked keys"));
    }
}
