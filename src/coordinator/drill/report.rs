//! A drill's report, computed from its record alone (so every node answers
//! the same), as JSON for tools and markdown for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::observe::COVERED_AT;
use super::{Drill, Mode, StopReason, What};
use crate::allocation::Millis;
use crate::clock::utc_text;

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub at_unix_ms: Millis,
    /// Milliseconds since the drill started.
    pub offset_ms: i64,
    pub what: String,
}

/// How a window's figure was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measured {
    /// A counted rule (fixed window, exact): per region the most any key
    /// was admitted in the window, from the pods' window-use reports.
    WindowUse,
    /// Any other global rule: the busiest key's world-wide admitted hits in
    /// the clock-aligned rule period, summed over every pod's own count
    /// (the leader's ledger).
    Ledger,
}

/// One window (clock-aligned rule period) of one rule, world-wide.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowFigure {
    pub rule: String,
    pub start_ms: Millis,
    /// Per region, as reported (or estimated, see `estimated`).
    pub admitted: BTreeMap<String, u64>,
    pub total: u64,
    pub limit: u64,
    /// What the rule's stated bound lets the world admit in the window:
    /// for counted rules `L` (+ the drilled region's grant with
    /// `partition: available`), otherwise `bound_is` says.
    pub bound: u64,
    /// Regions not heard in the window, counted at what they could enforce.
    pub estimated: Vec<String>,
    pub measured: Measured,
    /// The rule's period (ledger figures; a counted rule's is its window).
    pub period_ms: Option<u64>,
    /// The bound in words (ledger figures).
    pub bound_is: Option<String>,
    /// Ledger figures: some pod's count was not final (not heard after the
    /// period ended), so `total` is a lower bound.
    pub partial: bool,
}

/// A figure with how it was measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure<T> {
    pub value: Option<T>,
    pub how: String,
}

/// Rejections during the drill.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejections {
    pub asked: u64,
    pub allowed: u64,
    pub rejected: u64,
    /// The share of checks rejected before the drill (`None`: not seen).
    pub rejected_before: Option<f64>,
    /// `rejected − asked × rejected_before`, at least 0.
    pub because_of_drill: u64,
}

/// The largest overshoot of a window over its bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overshoot {
    pub rule: String,
    pub start_ms: Millis,
    pub total: u64,
    pub limit: u64,
    pub bound: u64,
    /// `total − limit` (may be negative: under the limit).
    pub over_limit: i64,
    /// `total − bound` (≤ 0: within the stated bound).
    pub over_bound: i64,
}

/// The report's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// From the drained region's first acknowledgement (drain) or the start
    /// (fail, partition) until the other regions' allocation covered the
    /// shifted demand.
    pub covered_after_ms: Figure<i64>,
    pub windows: Vec<WindowFigure>,
    /// The largest overshoot among windows every region was heard in.
    pub worst_window: Figure<Overshoot>,
    /// The largest upper bound among windows with a region not heard after
    /// it ended (cut off): at most this many were admitted.
    pub worst_estimated_window: Figure<Overshoot>,
    pub rejections: Figure<Rejections>,
    /// From the stop until the region held its share again.
    pub recovered_after_ms: Figure<i64>,
}

/// A drill's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub id: u64,
    pub region: String,
    pub mode: Mode,
    pub note: String,
    pub started_at_unix_ms: Millis,
    pub started_by: super::Actor,
    pub stopped: Option<super::Stop>,
    pub forced: bool,
    /// Observation ended: the report will not change any more.
    pub complete: bool,
    /// Coordinator nodes that observed the drill, in order.
    pub observed_by: Vec<u64>,
    pub dropped_events: u64,
    pub timeline: Vec<Line>,
    pub figures: Figures,
}

/// The report of `drill`.
pub fn report(drill: &Drill) -> Report {
    let start = drill.started_at_unix_ms;
    let mut timeline: Vec<Line> = drill
        .events
        .iter()
        .filter_map(|e| {
            describe(drill, &e.what).map(|what| Line {
                at_unix_ms: e.at_unix_ms,
                offset_ms: e.at_unix_ms - start,
                what,
            })
        })
        .collect();
    // Events carry when they happened (an epoch's computation, a lease's
    // end), which may precede the look that recorded them.
    timeline.sort_by_key(|l| l.at_unix_ms);
    let observed_by = drill
        .events
        .iter()
        .filter_map(|e| match e.what {
            What::LeaderChanged { node } => Some(node),
            _ => None,
        })
        .collect();
    let windows = windows(drill);
    Report {
        id: drill.id,
        region: drill.region.clone(),
        mode: drill.mode,
        note: drill.note.clone(),
        started_at_unix_ms: start,
        started_by: drill.started_by.clone(),
        stopped: drill.stopped.clone(),
        forced: drill.forced,
        complete: drill.finished,
        observed_by,
        dropped_events: drill.dropped,
        timeline,
        figures: Figures {
            covered_after_ms: covered_after(drill),
            worst_window: worst(&windows, false),
            worst_estimated_window: worst(&windows, true),
            windows,
            rejections: rejections(drill),
            recovered_after_ms: recovered_after(drill),
        },
    }
}

fn first<T>(drill: &Drill, f: impl Fn(&What) -> Option<T>) -> Option<(Millis, T)> {
    drill
        .events
        .iter()
        .find_map(|e| f(&e.what).map(|t| (e.at_unix_ms, t)))
}

fn covered_after(drill: &Drill) -> Figure<i64> {
    let covered = first(drill, |w| matches!(w, What::Covered { .. }).then_some(()));
    let (from, from_what) = match drill.mode {
        Mode::Drain => (
            first(drill, |w| {
                matches!(w, What::Acknowledged { .. }).then_some(())
            })
            .map(|(t, ())| t),
            "the drained region's first acknowledgement of the epoch that moved its share away",
        ),
        Mode::Fail | Mode::Partition => (Some(drill.started_at_unix_ms), "the start"),
    };
    let how = format!(
        "from {from_what} until the first epoch in which the other regions' grants in every \
         global rule's split reached {:.0} % of the demand to shift (all regions' smoothed \
         demand at the start, at most the limit less what the drilled region may still \
         enforce); seen by the leader, which checks the applied epoch every 250 ms",
        COVERED_AT * 100.0
    );
    Figure {
        value: match (from, covered) {
            (Some(f), Some((c, ()))) => Some((c - f).max(0)),
            _ => None,
        },
        how,
    }
}

fn recovered_after(drill: &Drill) -> Figure<i64> {
    let how = "from the stop until the drilled region held a valid lease, had acknowledged an \
               epoch published after the stop and was granted at least 95 % of its target in \
               every global rule"
        .to_string();
    let recovered = first(drill, |w| matches!(w, What::Recovered { .. }).then_some(()));
    Figure {
        value: match (&drill.stopped, recovered) {
            (Some(s), Some((t, ()))) => Some((t - s.at_unix_ms).max(0)),
            _ => None,
        },
        how,
    }
}

fn windows(drill: &Drill) -> Vec<WindowFigure> {
    drill
        .events
        .iter()
        .filter_map(|e| match &e.what {
            What::Window {
                rule,
                start_ms,
                admitted,
                estimated,
            } => {
                let b = drill.baseline.iter().find(|b| &b.rule == rule)?;
                // partition: available lets the centre re-grant a silent
                // region's share before its lease ends: the world may
                // admit that share twice, for at most one lease.
                let extra = match (drill.mode, b.strict) {
                    (Mode::Drain, _) | (_, true) => 0,
                    (_, false) => b.granted.get(&drill.region).copied().unwrap_or(0),
                };
                Some(WindowFigure {
                    rule: rule.clone(),
                    start_ms: *start_ms,
                    total: admitted.values().sum(),
                    admitted: admitted.clone(),
                    limit: b.limit,
                    bound: b.limit + extra,
                    estimated: estimated.clone(),
                    measured: Measured::WindowUse,
                    period_ms: (b.period_ms > 0).then_some(b.period_ms),
                    bound_is: None,
                    partial: false,
                })
            }
            What::Period {
                rule,
                start_ms,
                period_ms,
                admitted,
                limit,
                bound,
                bound_is,
                complete,
                ..
            } => Some(WindowFigure {
                rule: rule.clone(),
                start_ms: *start_ms,
                total: admitted.values().sum(),
                admitted: admitted.clone(),
                limit: *limit,
                bound: *bound,
                estimated: Vec::new(),
                measured: Measured::Ledger,
                period_ms: Some(*period_ms),
                bound_is: Some(bound_is.clone()),
                partial: !complete,
            }),
            _ => None,
        })
        .collect()
}

/// How the per-window figures of every algorithm are measured.
pub const WINDOWS_HOW: &str = "per global rule and window the drill touched (from the one it \
     started in to the one it stopped in). Counted rules (fixed window, exact; `measured: \
     window_use`): the sum over regions of the most any key was admitted in the window, as the \
     regions' pods reported it (each pod reports the window that just ended with its final \
     count); a region not heard after a window ended counts at the most it was enforcing when \
     last heard in it, or, not heard in it at all, at its grant (its fallback once its lease \
     lapsed); the bound is the limit, plus the drilled region's grant at the start for \
     `partition: available`. Every other rule (sliding window log or counter, token bucket, \
     GCRA, approximate; `measured: ledger`): the busiest key's world-wide admitted hits in each \
     clock-aligned rule period — not a rolling window — the sum of every pod's own count of \
     what it admitted in that period, the latest each pod reported to the leader (its ledger); \
     the bound is the rule's stated bound for one period (L for windows, burst + L for buckets, \
     + pods × max_batch on the approximate path; `bound_is` says which), and a period some pod \
     was not heard after is `partial` (a lower bound)";

fn worst(windows: &[WindowFigure], estimated: bool) -> Figure<Overshoot> {
    let how = WINDOWS_HOW.to_string();
    let how = if estimated {
        format!(
            "{how}; only windows with a region not heard after they ended: the total is an \
             upper bound"
        )
    } else {
        format!("{how}; only windows every region reported in full (and no partial period)")
    };
    let value = windows
        .iter()
        .filter(|w| !w.partial && w.estimated.is_empty() != estimated)
        .max_by_key(|w| w.total as i64 - w.bound as i64)
        .map(|w| Overshoot {
            rule: w.rule.clone(),
            start_ms: w.start_ms,
            total: w.total,
            limit: w.limit,
            bound: w.bound,
            over_limit: w.total as i64 - w.limit as i64,
            over_bound: w.total as i64 - w.bound as i64,
        });
    Figure { value, how }
}

fn rejections(drill: &Drill) -> Figure<Rejections> {
    let mut asked = 0;
    let mut allowed = 0;
    let mut seen = false;
    for e in &drill.events {
        if let What::Hits { rules } = &e.what {
            seen = true;
            for (a, l) in rules.values().flat_map(|r| r.values()) {
                asked += a;
                allowed += l;
            }
        }
    }
    let before = first(drill, |w| match w {
        What::Before { rules } => Some(
            rules
                .values()
                .flat_map(|r| r.values())
                .fold((0u64, 0u64), |(a, l), (x, y)| (a + x, l + y)),
        ),
        _ => None,
    })
    .and_then(|(_, (a, l))| (a > 0).then(|| a.saturating_sub(l) as f64 / a as f64));
    let rejected = asked.saturating_sub(allowed);
    let expected = (asked as f64 * before.unwrap_or(0.0)).round() as u64;
    Figure {
        value: seen.then_some(Rejections {
            asked,
            allowed,
            rejected,
            rejected_before: before,
            because_of_drill: rejected.saturating_sub(expected),
        }),
        how: "checks of global rules asked and allowed in every region from the start until \
              observation ended, as the regions' reports to the leader counted them (a report \
              refused in a partition is not counted); rejected because of the drill = rejected \
              less the checks the rejection rate before the drill would have rejected"
            .to_string(),
    }
}

fn describe(drill: &Drill, what: &What) -> Option<String> {
    let region = &drill.region;
    Some(match what {
        What::Started => format!(
            "drill {} started: {} {region}{}",
            drill.id,
            drill.mode.as_str(),
            drill
                .duration_ms
                .map(|d| format!(" for {} s", d / 1000))
                .unwrap_or_default()
        ),
        What::Epoch { epoch, rules } => {
            let grants: Vec<String> = rules
                .iter()
                .map(|g| format!("{}: {region} {}, others {}", g.rule, g.drilled, g.others))
                .collect();
            format!("epoch {epoch} published ({})", grants.join("; "))
        }
        What::Drained { epoch } => {
            format!("epoch {epoch}: the drain takes effect ({region}'s share moves away)")
        }
        What::Acknowledged { epoch } => format!("{region} acknowledged epoch {epoch}"),
        What::LeaseLapsed { fallback, .. } => {
            let f: Vec<String> = fallback.iter().map(|(r, v)| format!("{r} {v}")).collect();
            format!("{region}'s lease lapsed: it falls back to {}", f.join(", "))
        }
        What::Regranted { epoch } => {
            format!("epoch {epoch}: the other regions granted capacity {region} held")
        }
        What::Covered { epoch } => {
            format!("epoch {epoch}: the other regions' allocation covers the shifted demand")
        }
        What::Stopped => match &drill.stopped {
            Some(s) if s.reason == StopReason::DurationElapsed => {
                "drill stopped: its duration ran out".to_string()
            }
            _ => "drill stopped".to_string(),
        },
        What::Recovered { epoch } => format!("epoch {epoch}: {region} recovered its share"),
        What::Finished { recovered: true } => "observation ended".to_string(),
        What::Finished { recovered: false } => format!(
            "observation ended: {region} had not recovered (or its windows were not all \
             reported) {} s after the stop",
            super::observe::RECOVERY_WAIT_MS / 1000
        ),
        What::LeaderChanged { node } => format!("coordinator {node} observes the drill"),
        What::Hits { .. } | What::Window { .. } | What::Before { .. } | What::Period { .. } => {
            return None;
        }
    })
}

/// The report as markdown.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Drill {}: {} {}{}",
        r.id,
        r.mode.as_str(),
        r.region,
        if r.complete { "" } else { " (in progress)" }
    );
    let _ = writeln!(s);
    if !r.note.is_empty() {
        let _ = writeln!(s, "> {}\n", r.note.replace('\n', " "));
    }
    let by = |a: &super::Actor| {
        format!(
            "{} from {}{}",
            a.credential,
            a.from,
            a.operator
                .as_ref()
                .map(|o| format!(" (operator {o})"))
                .unwrap_or_default()
        )
    };
    let _ = writeln!(
        s,
        "- started at {} by {}{}",
        utc_text(r.started_at_unix_ms),
        by(&r.started_by),
        if r.forced { ", forced" } else { "" }
    );
    match &r.stopped {
        Some(stop) => {
            let _ = writeln!(
                s,
                "- stopped at {} (+{:.1} s) by {}",
                utc_text(stop.at_unix_ms),
                (stop.at_unix_ms - r.started_at_unix_ms) as f64 / 1000.0,
                by(&stop.by)
            );
        }
        None => {
            let _ = writeln!(s, "- running");
        }
    }
    let _ = writeln!(s, "\n## Figures\n");
    let ms = |v: Option<i64>| v.map_or("not reached".to_string(), |v| format!("{v} ms"));
    let f = &r.figures;
    let _ = writeln!(
        s,
        "- **time until the other regions covered the shifted demand**: {}  \n  _{}_",
        ms(f.covered_after_ms.value),
        f.covered_after_ms.how
    );
    match &f.worst_window.value {
        Some(w) => {
            let _ = writeln!(
                s,
                "- **largest window**: {} admitted world-wide in {}'s window at {} against \
                 L = {} (bound {}): {:+} over L, {:+} over the bound  \n  _{}_",
                w.total,
                w.rule,
                utc_text(w.start_ms),
                w.limit,
                w.bound,
                w.over_limit,
                w.over_bound,
                f.worst_window.how
            );
        }
        None => {
            let _ = writeln!(
                s,
                "- **largest window**: no window the drill touched was reported in full \
                 by every region  \n  _{}_",
                f.worst_window.how
            );
        }
    }
    if let Some(w) = &f.worst_estimated_window.value {
        let _ = writeln!(
            s,
            "- **largest window with a region cut off**: at most {} admitted world-wide in {}'s \
             window at {} (L = {}, bound {})",
            w.total,
            w.rule,
            utc_text(w.start_ms),
            w.limit,
            w.bound
        );
    }
    match &f.rejections.value {
        Some(x) => {
            let _ = writeln!(
                s,
                "- **rejected because of the drill**: {} (rejected {} of {} asked; {} before the \
                 drill)  \n  _{}_",
                x.because_of_drill,
                x.rejected,
                x.asked,
                x.rejected_before.map_or("no rate seen".into(), |p| format!(
                    "{:.1} % rejected",
                    p * 100.0
                )),
                f.rejections.how
            );
        }
        None => {
            let _ = writeln!(s, "- **rejected because of the drill**: no reports counted");
        }
    }
    let _ = writeln!(
        s,
        "- **time to recover**: {}  \n  _{}_",
        ms(f.recovered_after_ms.value),
        f.recovered_after_ms.how
    );
    if !f.windows.is_empty() {
        let _ = writeln!(s, "\n## Windows\n");
        let _ = writeln!(
            s,
            "| rule | window start | admitted | L | bound | per region | measured |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---|---|");
        for w in &f.windows {
            let per: Vec<String> = w
                .admitted
                .iter()
                .map(|(r, n)| {
                    let est = if w.estimated.contains(r) {
                        " (est.)"
                    } else {
                        ""
                    };
                    format!("{r} {n}{est}")
                })
                .collect();
            let measured = match (w.measured, w.partial) {
                (Measured::WindowUse, _) => "window use",
                (Measured::Ledger, false) => "ledger",
                (Measured::Ledger, true) => "ledger (partial: a lower bound)",
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {measured} |",
                w.rule.replace('|', "\\|"),
                utc_text(w.start_ms),
                w.total,
                w.limit,
                w.bound,
                per.join(", ")
            );
        }
    }
    let _ = writeln!(s, "\n## Timeline\n");
    for l in &r.timeline {
        let _ = writeln!(s, "- +{:.3} s — {}", l.offset_ms as f64 / 1000.0, l.what);
    }
    if r.dropped_events > 0 {
        let _ = writeln!(
            s,
            "\n{} events beyond the record's bound were dropped.",
            r.dropped_events
        );
    }
    s
}
