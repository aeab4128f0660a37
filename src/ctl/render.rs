//! How `ctl` prints the coordinator's answers: pure functions from the
//! JSON the admin API returns to text (aligned tables, a line diff, error
//! messages that say what to do next). No I/O here.

use std::fmt::Write as _;

use serde_json::Value;

/// The answer as the coordinator sent it, indented.
pub fn json(body: &Value) -> String {
    serde_json::to_string_pretty(body).unwrap_or_else(|_| body.to_string())
}

/// Columns padded to their widest cell, two spaces apart; numbers align
/// right, text left.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let numeric: Vec<bool> = (0..headers.len())
        .map(|i| {
            rows.iter().any(|r| r.get(i).is_some_and(|c| c != "-"))
                && rows.iter().all(|r| {
                    r.get(i)
                        .is_none_or(|c| c == "-" || c.trim_end_matches('%').parse::<f64>().is_ok())
                })
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = (usize, &str)>| {
        let mut text = String::new();
        for (i, cell) in cells {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if numeric[i] {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut out, &mut headers.iter().copied().enumerate());
    for row in rows {
        line(
            &mut out,
            &mut row
                .iter()
                .take(headers.len())
                .map(String::as_str)
                .enumerate(),
        );
    }
    out
}

/// A JSON value as a table cell: strings bare, whole numbers without a
/// fraction, others to one decimal, null as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            // Demand is smoothed: a fraction of a hit says nothing above 100.
            (None, Some(f)) if f.abs() >= 100.0 || f.fract() == 0.0 => format!("{f:.0}"),
            (None, Some(f)) => format!("{f:.1}"),
            _ => n.to_string(),
        },
        Value::Bool(b) => b.to_string(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k} {}", cell(v)))
            .collect::<Vec<_>>()
            .join(" · "),
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC); `-` when absent.
pub fn utc(ms: &Value) -> String {
    ms.as_i64()
        .map_or_else(|| "-".into(), crate::clock::utc_text)
}

/// Milliseconds as a short signed duration: `42s`, `-3s`, `1m05s`.
pub fn millis(ms: &Value) -> String {
    let Some(ms) = ms.as_i64() else {
        return "-".into();
    };
    let sign = if ms < 0 { "-" } else { "" };
    let s = ms.unsigned_abs() / 1000;
    if s < 60 {
        format!("{sign}{s}s")
    } else if s < 3600 {
        format!("{sign}{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{sign}{}h{:02}m", s / 3600, s / 60 % 60)
    }
}

/// A write's answer: what was committed, its version and log index.
pub fn committed(what: &str, answer: &Value) -> String {
    match answer.get("version").filter(|v| !v.is_null()) {
        Some(v) => format!(
            "{what} {} (log index {})\n",
            cell(v),
            cell(&answer["log_index"])
        ),
        None => format!("{what} done (log index {})\n", cell(&answer["log_index"])),
    }
}

/// `GET /api/v1/rules` (current and stable) or one version.
pub fn rules(body: &Value) -> String {
    let (version, stable) = if body.get("current").is_some() {
        (&body["current"], Some(&body["stable"]))
    } else {
        (body, None)
    };
    let mut out = version_line(version);
    if let Some(stable) = stable {
        match stable.get("number") {
            Some(n) => {
                let _ = writeln!(
                    out,
                    "outside this stage regions enforce version {} (stable)",
                    cell(n)
                );
            }
            None if version["stage"] == "all" => {}
            None => out.push_str(
                "no earlier version reached stage all: outside this stage no rules apply\n",
            ),
        }
    }
    if let Some(files) = version["files"].as_object() {
        for (name, text) in files {
            let _ = writeln!(out, "--- {name}");
            let text = text.as_str().unwrap_or_default();
            out.push_str(text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    out
}

fn version_line(v: &Value) -> String {
    let mut stage = cell(&v["stage"]);
    if let Some(regions) = v["canary_regions"].as_array().filter(|r| !r.is_empty()) {
        let _ = write!(stage, " ({})", cell(&Value::Array(regions.clone())));
    }
    format!(
        "version {} · stage {} · {} · created {}\n",
        cell(&v["number"]),
        stage,
        origin(&v["origin"]),
        utc(&v["created_at_unix_ms"])
    )
}

fn origin(o: &Value) -> String {
    match o["kind"].as_str() {
        Some("rollback") => format!("rollback to {}", cell(&o["of"])),
        Some(kind) => kind.to_string(),
        None => "-".into(),
    }
}

/// `GET /api/v1/rules/versions`.
pub fn versions(body: &Value) -> String {
    let rows: Vec<Vec<String>> = array(&body["versions"])
        .iter()
        .map(|v| {
            vec![
                cell(&v["number"]),
                cell(&v["stage"]),
                cell(&v["canary_regions"]),
                origin(&v["origin"]),
                utc(&v["created_at_unix_ms"]),
                cell(&v["file_names"]),
            ]
        })
        .collect();
    table(
        &["VERSION", "STAGE", "CANARY", "ORIGIN", "CREATED", "FILES"],
        &rows,
    )
}

fn array(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// `GET /api/v1/regions`.
pub fn regions(body: &Value) -> String {
    let rows: Vec<Vec<String>> = array(&body["regions"])
        .iter()
        .map(|r| {
            vec![
                cell(&r["name"]),
                cell(&r["weight"]),
                cell(&r["state"]),
                utc(&r["updated_at_unix_ms"]),
            ]
        })
        .collect();
    table(&["REGION", "WEIGHT", "STATE", "UPDATED"], &rows)
}

/// `GET /api/v1/leases`.
pub fn leases(body: &Value) -> String {
    let rows: Vec<Vec<String>> = array(&body["regions"])
        .iter()
        .map(|r| {
            vec![
                cell(&r["region"]),
                cell(&r["state"]),
                cell(&r["weight"]),
                cell(&r["lease"]),
                millis(&r["expires_in_ms"]),
                cell(&r["acked_epoch"]),
                array(&r["pods"]).len().to_string(),
            ]
        })
        .collect();
    let mut out = format!("epoch {}\n", cell(&body["epoch"]));
    out.push_str(&table(
        &[
            "REGION",
            "STATE",
            "WEIGHT",
            "LEASE",
            "EXPIRES IN",
            "ACKED EPOCH",
            "PODS",
        ],
        &rows,
    ));
    if body["pods_known_here"] == false {
        out.push_str("(pods are known to the leader only: ask it for PODS)\n");
    }
    out
}

/// `GET /api/v1/allocations` in its three shapes: all rules, one rule, one key.
pub fn allocations(body: &Value) -> String {
    let mut out = format!(
        "epoch {} at {}\n",
        cell(&body["epoch"]),
        utc(&body["at_unix_ms"])
    );
    let share_rows =
        |rows: &mut Vec<Vec<String>>, first: &[String], shares: &Value, demand: &Value| {
            for (region, s) in shares.as_object().into_iter().flatten() {
                let mut row = first.to_vec();
                row.extend([
                    region.clone(),
                    cell(&s["granted"]),
                    cell(&s["bound"]),
                    cell(&s["target"]),
                    cell(&demand[region]),
                ]);
                rows.push(row);
            }
        };
    if let Some(rules) = body.get("rules").and_then(Value::as_object) {
        let mut rows = Vec::new();
        for (id, r) in rules {
            share_rows(
                &mut rows,
                &[id.clone(), cell(&r["limit"])],
                &r["split"],
                &r["demand"],
            );
        }
        if rows.is_empty() {
            out.push_str("no global rule has an allocation yet\n");
            return out;
        }
        out.push_str(&table(
            &[
                "RULE", "LIMIT", "REGION", "GRANTED", "BOUND", "TARGET", "DEMAND",
            ],
            &rows,
        ));
        return out;
    }
    let _ = writeln!(
        out,
        "rule {} · limit {} · fallback {}",
        cell(&body["rule"]),
        cell(&body["limit"]),
        cell(&body["fallback"])
    );
    let mut rows = Vec::new();
    if body.get("key").is_some() {
        let _ = writeln!(
            out,
            "key {} · served by {}",
            cell(&body["key"]),
            cell(&body["source"])
        );
        share_rows(&mut rows, &[], &body["shares"], &body["demand"]);
        out.push_str(&table(
            &["REGION", "GRANTED", "BOUND", "TARGET", "DEMAND"],
            &rows,
        ));
    } else {
        share_rows(
            &mut rows,
            &["(split)".into()],
            &body["split"],
            &body["demand"],
        );
        for entry in array(&body["key_entries"]) {
            share_rows(
                &mut rows,
                &[cell(&entry["key"])],
                &entry["shares"],
                &entry["demand"],
            );
        }
        out.push_str(&table(
            &["KEY", "REGION", "GRANTED", "BOUND", "TARGET", "DEMAND"],
            &rows,
        ));
        let _ = writeln!(
            out,
            "keys tracked by the leader: {}",
            cell(&body["tracked_keys"])
        );
    }
    let history = array(&body["history"]);
    if !history.is_empty() {
        out.push_str("recent epochs that changed it:\n");
        for record in history {
            let changes: Vec<String> = array(&record["changes"])
                .iter()
                .map(|c| format!("{} {}", cell(&c["region"]), cell(&c["granted"])))
                .collect();
            let _ = writeln!(
                out,
                "  epoch {} at {}: {}",
                cell(&record["epoch"]),
                utc(&record["at_unix_ms"]),
                changes.join(" · ")
            );
        }
    }
    out
}

/// `GET /api/v1/cluster`.
pub fn cluster(body: &Value) -> String {
    let mut out = format!(
        "cluster {} · node {} answering ({}) · leader {} · term {}\n\
         log: last {} · committed {} · applied {} · snapshot {}\n",
        cell(&body["cluster_id"]),
        cell(&body["node_id"]),
        cell(&body["state"]),
        cell(&body["leader"]),
        cell(&body["term"]),
        cell(&body["last_log_index"]),
        cell(&body["commit_index"]),
        cell(&body["applied_index"]),
        cell(&body["snapshot_index"]),
    );
    let rows: Vec<Vec<String>> = array(&body["nodes"])
        .iter()
        .map(|n| {
            let contact = n["last_contact_ms"]
                .as_u64()
                .map_or_else(|| "-".into(), |ms| format!("{ms}ms"));
            vec![
                cell(&n["id"]),
                cell(&n["role"]),
                cell(&n["http_addr"]),
                cell(&n["raft_addr"]),
                cell(&n["match_index"]),
                contact,
            ]
        })
        .collect();
    out.push_str(&table(
        &["ID", "ROLE", "HTTP", "RAFT", "MATCH INDEX", "LAST CONTACT"],
        &rows,
    ));
    out
}

/// Why nothing answered, and what to check.
pub fn unreachable(failures: &[(String, String)]) -> String {
    let mut out = String::from("no coordinator could be reached");
    for (url, e) in failures {
        let _ = write!(out, "\n  {url}: {e}");
    }
    let tls = failures
        .iter()
        .any(|(_, e)| e.contains("certificate") || e.contains("tls") || e.contains("TLS"));
    out.push_str(if tls {
        "\nthe TLS handshake failed: pass --ca with the CA that signed the coordinators' certificates"
    } else {
        "\ncheck that the nodes run and that --coordinator / MERIDIAN_COORDINATOR name their \
         admin API (--http-addr)"
    });
    out
}

/// The server's refusal: its status and reason, the details it sent
/// (offending field, validation issues), and what to do next.
pub fn refusal(status: u16, url: &str, body: &Value) -> String {
    let reason = body["error"]
        .as_str()
        .map_or_else(|| body.to_string(), String::from);
    let mut out = format!("{url}: {status}: {reason}");
    if let Some(field) = body["field"].as_str() {
        let _ = write!(out, " (field {field})");
    }
    for issue in array(&body["issues"]) {
        let _ = write!(
            out,
            "\n  {}",
            issue
                .as_str()
                .map_or_else(|| issue.to_string(), String::from)
        );
    }
    if let Some(known) = body["global_rules"].as_array() {
        let _ = write!(
            out,
            "\n  global rules with an allocation: {}",
            cell(&Value::Array(known.clone()))
        );
    }
    let hint = match status {
        401 => Some(
            "set MERIDIAN_ADMIN_TOKEN or pass --token-file with the coordinator's admin token \
             (reads take the read token too)",
        ),
        503 => Some("the cluster has no leader it can reach yet: retry in a few seconds"),
        _ => None,
    };
    if let Some(hint) = hint {
        let _ = write!(out, "\n{hint}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_table_aligns_text_left_and_numbers_right() {
        let rows = vec![
            vec!["mumbai".to_string(), "700".to_string()],
            vec!["hyderabad".to_string(), "5".to_string()],
        ];
        assert_eq!(
            table(&["REGION", "GRANTED"], &rows),
            "REGION     GRANTED\nmumbai         700\nhyderabad        5\n"
        );
    }

    #[test]
    fn times_are_utc_and_durations_short() {
        assert_eq!(utc(&json!(0)), "1970-01-01 00:00:00Z");
        assert_eq!(utc(&json!(1_796_329_845_000i64)), "2026-12-03 20:30:45Z");
        assert_eq!(millis(&json!(65_000)), "1m05s");
        assert_eq!(millis(&json!(-3_400)), "-3s");
    }

    #[test]
    fn a_401_says_where_the_token_comes_from() {
        let text = refusal(
            401,
            "http://x/api/v1/rules",
            &json!({"error": "wrong admin token"}),
        );
        assert!(text.contains("wrong admin token"), "{text}");
        assert!(text.contains("MERIDIAN_ADMIN_TOKEN"), "{text}");
    }
}
