//! What the leader sees of a drill, turned into timeline events.
//!
//! Pure: [`observe`] takes the drill record (what earlier observations,
//! perhaps by an earlier leader, already recorded), the applied allocations,
//! the hits, window use and ledger periods this leader has counted, and
//! the time, and returns the events to commit. Everything it decides from
//! the record and the allocations is replicated, so a new leader neither
//! repeats nor skips an event; only hits, window use and the ledger's
//! periods are the leader's own (counted from the reports that reach it),
//! and a new leader notes itself with [`What::LeaderChanged`] so the report
//! says where counting restarted.

use std::collections::BTreeMap;

use super::{Drill, Event, Grants, Mode, What};
use crate::allocation::ledger::final_wait_ms;
use crate::allocation::{Allocations, Millis};

/// The other regions' allocation "covers" the shifted demand at this
/// fraction of it.
pub const COVERED_AT: f64 = 0.95;

/// The region has "recovered" once it holds this fraction of its target.
pub const RECOVERED_AT: f64 = 0.95;

/// After a stop, observation ends at the latest this long later (recovered
/// or not).
pub const RECOVERY_WAIT_MS: i64 = 120_000;

/// Hits are committed at most this often per drill.
pub const HITS_EVERY_MS: i64 = 5_000;

/// The hits counted before the start are taken only this soon after it
/// (later, this leader's counts include the drill's own).
pub const BEFORE_WITHIN_MS: i64 = 2_000;

/// `(asked, allowed)` per rule and region.
pub type HitCounts = BTreeMap<String, BTreeMap<String, (u64, u64)>>;

/// What one region reported admitting in a counted rule's window (the
/// busiest key), per rule and window start, and whether it was heard after
/// the window ended (then its figure is final: the first report after a
/// window carries the count it ended with).
pub type WindowCounts = BTreeMap<(String, Millis), BTreeMap<String, Heard>>;

/// A region's figure for one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Heard {
    /// The most any key was admitted, as reported.
    pub count: u64,
    /// Reported after the window ended.
    pub last: bool,
    /// The most any pod enforced for the rule in the window, as reported
    /// (0: none reported): what a region cut off in the window could still
    /// admit, since nothing raises it once cut off.
    pub cap: u64,
}

/// One clock-aligned period of a global rule as the leader's ledger
/// measured it (`allocation::ledger::PeriodFigure`, for drills).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerPeriod {
    /// The busiest key's admitted hits per region.
    pub admitted: BTreeMap<String, u64>,
    /// `L` then.
    pub limit: u64,
    /// The stated bound then (`Terms::bound`).
    pub bound: u64,
    /// Pods whose counts are in it.
    pub pods: u32,
    /// Every pod counted was heard after the period ended.
    pub complete: bool,
}

/// What the ledger holds of one rule: its period, its bound in words and
/// its finished periods by start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerRule {
    /// The rule's period (its baseline has none: it is not counted).
    pub period_ms: u64,
    /// The bound in words (`Terms::bound_is`).
    pub bound_is: String,
    /// Finished periods by start.
    pub periods: BTreeMap<Millis, LedgerPeriod>,
}

/// The ledger's finished periods per global rule (the rules drills need).
pub type LedgerFigures = BTreeMap<String, LedgerRule>;

/// The leader's own memory of a drill: lost with the leader, which is fine
/// (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Memory {
    /// This leader noted itself in the timeline.
    pub noted: bool,
    /// Cumulative hits when the last [`What::Hits`] was committed.
    pub hits_base: Option<HitCounts>,
    pub hits_at_ms: Millis,
}

/// What the leader sees now.
pub struct Seen<'a> {
    pub now: Millis,
    /// This node's id.
    pub node: u64,
    pub allocations: &'a Allocations,
    /// Hits counted since this node became leader, cumulative.
    pub hits: &'a HitCounts,
    /// Counted rules' window use, per window, from the reports.
    pub windows: &'a WindowCounts,
    /// Every other global rule's periods, from the leader's ledger.
    pub ledger: &'a LedgerFigures,
}

/// The events to commit for `drill`, given what it already holds.
pub fn observe(drill: &Drill, seen: &Seen<'_>, memory: &mut Memory) -> Vec<Event> {
    let now = seen.now;
    let at = |what| Event {
        at_unix_ms: now,
        what,
    };
    let mut out = Vec::new();
    if drill.finished {
        return out;
    }
    let recorded = |f: &dyn Fn(&What) -> bool| drill.events.iter().any(|e| f(&e.what));
    if !memory.noted {
        memory.noted = true;
        let someone_else = drill.events.iter().rev().find_map(|e| match e.what {
            What::LeaderChanged { node } => Some(node),
            _ => None,
        });
        if someone_else != Some(seen.node) {
            out.push(at(What::LeaderChanged { node: seen.node }));
        }
    }
    let a = seen.allocations;
    let region = &drill.region;

    // Epochs whose grants moved.
    let grants = grants_of(drill, a);
    let last_grants = drill.events.iter().rev().find_map(|e| match &e.what {
        What::Epoch { rules, .. } => Some(rules),
        _ => None,
    });
    // Epoch-borne events carry the time the leader computed the epoch
    // (`at_ms`), not this look's: a look comes up to `OBSERVE_EVERY` later.
    let at_epoch = |what| Event {
        at_unix_ms: if a.at_ms > 0 { a.at_ms.min(now) } else { now },
        what,
    };
    // Until the region recovered: later epochs are ordinary operation.
    let recovered = recorded(&|w| matches!(w, What::Recovered { .. }));
    if a.epoch > drill.start_epoch && last_grants != Some(&grants) && !recovered {
        out.push(at_epoch(What::Epoch {
            epoch: a.epoch,
            rules: grants.clone(),
        }));
    }

    // A drain takes effect in the first epoch that moves the region's share
    // away (its target below what it held): a round already under way when
    // the drill began may publish one more epoch without it.
    let mut drained = drill.events.iter().find_map(|e| match e.what {
        What::Drained { epoch } => Some(epoch),
        _ => None,
    });
    if drill.mode == Mode::Drain
        && drill.active()
        && drained.is_none()
        && a.epoch > drill.start_epoch
    {
        let mut held = drill
            .baseline
            .iter()
            .filter(|b| b.granted.get(region).is_some_and(|g| *g > 0))
            .peekable();
        let moving = held.peek().is_some()
            && held.all(|b| {
                a.rules
                    .get(&b.rule)
                    .and_then(|r| r.split.get(region))
                    .is_none_or(|s| s.target < b.granted.get(region).copied().unwrap_or(0))
            });
        if moving {
            drained = Some(a.epoch);
            out.push(at_epoch(What::Drained { epoch: a.epoch }));
        }
    }
    // From when the drill acts on the allocations: a drain's first epoch
    // that moves the share; a failed or cut-off region's start.
    let effective = match drill.mode {
        Mode::Drain => drained,
        Mode::Fail | Mode::Partition => Some(drill.start_epoch),
    };

    let lease = a.regions.get(region).copied().unwrap_or_default();
    let stopped_at = drill.stopped.as_ref().map(|s| s.at_unix_ms);
    // The first acknowledgement of an epoch published during the drill,
    // and the first after the stop.
    let acks_after = |t: Millis| {
        drill
            .events
            .iter()
            .any(|e| e.at_unix_ms >= t && matches!(e.what, What::Acknowledged { .. }))
    };
    // An acknowledgement is taken when the region's pods were last heard
    // as of the epoch that records it: the acknowledging report itself, as
    // the leader runs a round on it at once.
    let acked = |what| Event {
        at_unix_ms: if lease.last_heard_ms > 0 {
            lease.last_heard_ms.min(now)
        } else {
            now
        },
        what,
    };
    match stopped_at {
        None => {
            if effective.is_some_and(|e| lease.acked > drill.start_epoch && lease.acked >= e)
                && !acks_after(drill.started_at_unix_ms)
            {
                out.push(acked(What::Acknowledged { epoch: lease.acked }));
            }
        }
        Some(stop) => {
            if !acks_after(stop) && epoch_at_or_after(drill, stop).is_some_and(|e| lease.acked >= e)
            {
                out.push(acked(What::Acknowledged { epoch: lease.acked }));
            }
        }
    }

    if drill.active()
        && lease.valid_until_ms > 0
        && now > lease.valid_until_ms
        && !recorded(&|w| matches!(w, What::LeaseLapsed { .. }))
    {
        let fallback = a
            .rules
            .iter()
            .map(|(rule, r)| (rule.clone(), r.fallback.get(region).copied().unwrap_or(0)))
            .collect();
        out.push(Event {
            at_unix_ms: lease.valid_until_ms,
            what: What::LeaseLapsed {
                valid_until_ms: lease.valid_until_ms,
                fallback,
            },
        });
    }

    // Only epochs computed since the start say what the drill did.
    if drill.active() && a.epoch > drill.start_epoch && effective.is_some() {
        let grew = grants.iter().any(|g| {
            drill
                .baseline
                .iter()
                .find(|b| b.rule == g.rule)
                .is_some_and(|b| g.others > others(&b.granted, region))
        });
        if grew && !recorded(&|w| matches!(w, What::Regranted { .. })) {
            out.push(at_epoch(What::Regranted { epoch: a.epoch }));
        }
        if covered(drill, a) && !recorded(&|w| matches!(w, What::Covered { .. })) {
            out.push(at_epoch(What::Covered { epoch: a.epoch }));
        }
    }

    // The leader that saw the start notes the hits before it, once.
    if memory.hits_base.is_none()
        && now - drill.started_at_unix_ms <= BEFORE_WITHIN_MS
        && !recorded(&|w| matches!(w, What::Before { .. }))
    {
        out.push(at(What::Before {
            rules: seen.hits.clone(),
        }));
    }
    // Hits since the last commit of them.
    if now - memory.hits_at_ms >= HITS_EVERY_MS {
        let base = memory.hits_base.get_or_insert_with(|| seen.hits.clone());
        let delta = hits_delta(base, seen.hits);
        if !delta.is_empty() {
            out.push(at(What::Hits { rules: delta }));
        }
        memory.hits_base = Some(seen.hits.clone());
        memory.hits_at_ms = now;
    }

    // Counted windows that ended during the drill (and its recovery).
    for b in drill.baseline.iter().filter(|b| b.period_ms > 0) {
        let p = b.period_ms as Millis;
        let mut start = drill.started_at_unix_ms.div_euclid(p) * p;
        // A window is written once it ended and one more report interval
        // passed (reports are seconds apart; a period's use is final then).
        while start + p + report_margin(p) <= now {
            let done = drill.events.iter().any(|e| {
                matches!(&e.what, What::Window { rule, start_ms, .. }
                    if *rule == b.rule && *start_ms == start)
            });
            let in_scope = stopped_at.is_none_or(|s| start <= s);
            if !done && in_scope {
                out.push(at(window(drill, b, start, seen)));
            }
            start += p;
        }
    }

    // Every other global rule's periods, as the ledger finished them.
    let written: std::collections::BTreeSet<(&str, Millis)> = drill
        .events
        .iter()
        .filter_map(|e| match &e.what {
            What::Period { rule, start_ms, .. } => Some((rule.as_str(), *start_ms)),
            _ => None,
        })
        .collect();
    for b in drill.baseline.iter().filter(|b| b.period_ms == 0) {
        let Some(ledger) = seen.ledger.get(&b.rule) else {
            continue;
        };
        let p = ledger.period_ms as Millis;
        if p <= 0 {
            continue;
        }
        let first = drill.started_at_unix_ms.div_euclid(p) * p;
        for (start, period) in ledger.periods.range(first..) {
            let in_scope = stopped_at.is_none_or(|s| *start <= s);
            if in_scope && !written.contains(&(b.rule.as_str(), *start)) {
                out.push(at(What::Period {
                    rule: b.rule.clone(),
                    start_ms: *start,
                    period_ms: ledger.period_ms,
                    admitted: period.admitted.clone(),
                    limit: period.limit,
                    bound: period.bound,
                    bound_is: ledger.bound_is.clone(),
                    pods: period.pods,
                    complete: period.complete,
                }));
            }
        }
    }

    // Recovery: after the stop, the region holds its share again (its
    // lease valid, its grant near its target in every rule) and has
    // acknowledged an epoch published after the stop.
    if let Some(stop) = stopped_at
        && !recorded(&|w| matches!(w, What::Recovered { .. }))
    {
        let fresh = epoch_at_or_after(drill, stop);
        let acked = fresh.is_some_and(|e| lease.acked >= e);
        let holds = a.rules.values().all(|r| {
            r.split
                .get(region)
                .is_none_or(|s| s.granted as f64 >= RECOVERED_AT * s.target as f64)
        });
        if acked && holds && lease.valid_until_ms > now {
            out.push(at_epoch(What::Recovered { epoch: a.epoch }));
        }
    }
    // Observation ends once the region recovered and every window the drill
    // touched is written, or when waiting for them ran out.
    if let Some(stop) = stopped_at {
        let recovered = recorded(&|w| matches!(w, What::Recovered { .. }))
            || out.iter().any(|e| matches!(e.what, What::Recovered { .. }));
        let windows_pending = drill.baseline.iter().any(|b| {
            let p = b.period_ms as Millis;
            p > 0 && stop.div_euclid(p) * p + p + report_margin(p) > now
        }) || drill.baseline.iter().filter(|b| b.period_ms == 0).any(|b| {
            // The ledger finishes a period a final wait after it ends, and
            // the leader advances it every second.
            let p = seen.ledger.get(&b.rule).map_or(0, |l| l.period_ms);
            let p = p as Millis;
            p > 0 && stop.div_euclid(p) * p + p + final_wait_ms(p as u64) + 1_000 > now
        });
        if recovered && !windows_pending {
            out.push(at(What::Finished { recovered: true }));
        } else if now - stop > RECOVERY_WAIT_MS {
            out.push(at(What::Finished { recovered }));
        }
    }
    out
}

/// Counted windows are final this long after they end (reports arrive
/// every second by default; a short window waits less).
fn report_margin(period_ms: Millis) -> Millis {
    period_ms.clamp(500, 2_000)
}

/// The first epoch published at or after `t`, from the timeline.
fn epoch_at_or_after(drill: &Drill, t: Millis) -> Option<u64> {
    drill.events.iter().find_map(|e| match e.what {
        What::Epoch { epoch, .. } if e.at_unix_ms >= t => Some(epoch),
        _ => None,
    })
}

fn others(granted: &BTreeMap<String, u64>, region: &str) -> u64 {
    granted
        .iter()
        .filter(|(r, _)| *r != region)
        .map(|(_, g)| g)
        .sum()
}

/// Per global rule, the drilled region's grant and the others' sum.
pub fn grants_of(drill: &Drill, a: &Allocations) -> Vec<Grants> {
    a.rules
        .iter()
        .map(|(rule, r)| {
            let granted: BTreeMap<String, u64> = r
                .split
                .iter()
                .map(|(n, s)| (n.clone(), s.granted))
                .collect();
            Grants {
                rule: rule.clone(),
                drilled: granted.get(&drill.region).copied().unwrap_or(0),
                others: others(&granted, &drill.region),
            }
        })
        .collect()
}

/// What the other regions must hold for the drill's shifted demand in
/// `rule`: all demand at the start, up to what the limit leaves beside
/// what the drilled region keeps once the drill has taken effect (its
/// target when drained — its floor —, its fallback when failed or cut off).
/// `None`: the drilled region had no demand to shift.
pub fn shifted_need(drill: &Drill, rule: &str, a: &Allocations) -> Option<f64> {
    let b = drill.baseline.iter().find(|b| b.rule == rule)?;
    let demand: f64 = b.demand.values().sum();
    let drilled_demand = b.demand.get(&drill.region).copied().unwrap_or(0.0);
    if drilled_demand <= 0.0 {
        return None;
    }
    let r = a.rules.get(rule)?;
    let keeps = match drill.mode {
        Mode::Drain => r.split.get(&drill.region).map_or(0, |s| s.target),
        Mode::Fail | Mode::Partition => r.fallback.get(&drill.region).copied().unwrap_or(0),
    };
    Some(demand.min(b.limit.saturating_sub(keeps) as f64))
}

/// Whether the other regions hold [`COVERED_AT`] of the shifted demand in
/// every rule that has some.
fn covered(drill: &Drill, a: &Allocations) -> bool {
    let mut any = false;
    for g in grants_of(drill, a) {
        let Some(need) = shifted_need(drill, &g.rule, a) else {
            continue;
        };
        any = true;
        if (g.others as f64) < COVERED_AT * need {
            return false;
        }
    }
    any
}

fn hits_delta(base: &HitCounts, now: &HitCounts) -> HitCounts {
    let mut out = HitCounts::new();
    for (rule, regions) in now {
        for (region, &(asked, allowed)) in regions {
            let (a0, l0) = base
                .get(rule)
                .and_then(|r| r.get(region))
                .copied()
                .unwrap_or((0, 0));
            let d = (asked.saturating_sub(a0), allowed.saturating_sub(l0));
            if d != (0, 0) {
                out.entry(rule.clone())
                    .or_default()
                    .insert(region.clone(), d);
            }
        }
    }
    out
}

/// One counted window: each region's reported admissions, and for a region
/// that reported none (cut off, or silent) what it could have enforced.
fn window(drill: &Drill, b: &super::RuleBaseline, start: Millis, seen: &Seen<'_>) -> What {
    let reported = seen
        .windows
        .get(&(b.rule.clone(), start))
        .cloned()
        .unwrap_or_default();
    let mut admitted = BTreeMap::new();
    let mut estimated = Vec::new();
    let lapsed_by = drill.events.iter().find_map(|e| match e.what {
        What::LeaseLapsed { valid_until_ms, .. } => Some(valid_until_ms),
        _ => None,
    });
    let rule = seen.allocations.rules.get(&b.rule);
    for region in b.granted.keys() {
        match reported.get(region) {
            Some(h) if h.last => {
                admitted.insert(region.clone(), h.count);
            }
            heard => {
                let grant = rule
                    .and_then(|r| r.split.get(region))
                    .map_or(0, |s| s.bound.max(s.granted))
                    .max(b.granted.get(region).copied().unwrap_or(0));
                let fallback = b.fallback.get(region).copied().unwrap_or(0);
                let could = match lapsed_by {
                    Some(t) if region == &drill.region && start >= t => fallback.min(grant),
                    _ => grant,
                };
                // Heard only before the window ended (cut off in it): at
                // most what it was enforcing then, at least what it had
                // admitted. Never heard in it: what it could enforce.
                let estimate = match heard {
                    Some(h) if h.cap > 0 => h.count.max(h.cap),
                    Some(h) => h.count.max(could),
                    None => could,
                };
                admitted.insert(region.clone(), estimate);
                estimated.push(region.clone());
            }
        }
    }
    What::Window {
        rule: b.rule.clone(),
        start_ms: start,
        admitted,
        estimated,
    }
}
