//! Region failover drills: an operator takes a region out on purpose, the
//! other regions absorb its share, and a record in the replicated state
//! keeps what happened so a report can prove the limits held.
//!
//! Pure: the types here live in the [`Registry`](super::state::Registry) and
//! change only through its commands ([`Drills::start`], [`Drills::stop`],
//! [`Drills::observed`]). The leader decides what it saw
//! ([`observe`]) and the report is computed from the record alone
//! ([`report`]), so any node answers the same report, and a drill survives a
//! leader change: the next leader reads the record and goes on observing.
//! The loop that does this on the leader, through Raft and on a timer, is
//! [`runner`]: the one part of drills that is not pure.
//!
//! The three modes act where a real outage would:
//! - [`Mode::Drain`] — the rebalancer treats the region as draining (its
//!   floor only), in a round run at once;
//! - [`Mode::Fail`] — the leader ignores the region's reports, so it falls
//!   silent to the rebalancer and its lease is not renewed;
//! - [`Mode::Partition`] — every coordinator refuses the region's watch
//!   streams and reports and ends those open, so its limiters run on what
//!   they hold, then on their fallback.

pub mod observe;
pub mod report;
pub mod runner;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::allocation::{Allocations, Epoch, Millis};

/// Drills kept in the replicated state; starting one more drops the oldest
/// finished one (an active or unfinished drill is never dropped).
pub const MAX_DRILLS: usize = 100;

/// Events kept per drill; later ones are counted in [`Drill::dropped`].
/// An hour's drill with a 4 s counted window (900 windows) and hits every
/// 5 s (720) stays within it; a record is then about 150 kB.
pub const MAX_EVENTS: usize = 2_000;

/// Longest note an operator may attach, in bytes.
pub const MAX_NOTE_BYTES: usize = 1_024;

/// Longest drill: a drill is an exercise, not a way to keep a region out.
pub const MAX_DURATION_MS: i64 = 24 * 3_600_000;

/// How the region is taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A planned evacuation: the region keeps only its floor.
    Drain,
    /// The coordinators treat the region as dead.
    Fail,
    /// The region's limiters are cut off from every coordinator.
    Partition,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Drain => "drain",
            Mode::Fail => "fail",
            Mode::Partition => "partition",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "drain" => Ok(Mode::Drain),
            "fail" => Ok(Mode::Fail),
            "partition" => Ok(Mode::Partition),
            other => Err(format!(
                "mode {other:?} is not one of drain, fail, partition"
            )),
        }
    }
}

/// Who did something to a drill: the credential that authorised it (a
/// fingerprint, never the secret), where the request came from, and the
/// name the caller gave, which nothing verifies.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Actor {
    /// e.g. `admin token sha256:1f2e3d4c`, or `coordinator` for the
    /// leader ending a drill whose duration ran out.
    pub credential: String,
    /// The client's address as the node that took the request saw it.
    pub from: String,
    /// `X-Meridian-Operator` (ctl sends `$USER`), as given.
    pub operator: Option<String>,
}

/// Why a drill stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An operator stopped it.
    Stopped,
    /// Its duration ran out; the leader stopped it.
    DurationElapsed,
}

/// How a drill ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    pub at_unix_ms: Millis,
    pub by: Actor,
    pub reason: StopReason,
}

/// What the region held when the drill started, per global rule: the
/// report's reference for "shifted demand" and "recovered".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleBaseline {
    pub rule: String,
    /// The world-wide limit.
    pub limit: u64,
    /// Each region's grant in the rule's split.
    pub granted: BTreeMap<String, u64>,
    /// Each region's smoothed demand, hits per period (all keys).
    pub demand: BTreeMap<String, f64>,
    /// What each region falls to when its lease lapses.
    pub fallback: BTreeMap<String, u64>,
    /// The rule's period, for per-window figures (0: not known).
    pub period_ms: u64,
    /// `partition: strict` (true) or `available`.
    pub strict: bool,
}

/// One thing that happened during a drill, in the order it was seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at_unix_ms: Millis,
    pub what: What,
}

/// The kinds of [`Event`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum What {
    /// The drill record was committed.
    Started,
    /// An allocation epoch was published during the drill: per global rule,
    /// the drilled region's grant and the others' sum.
    Epoch { epoch: Epoch, rules: Vec<Grants> },
    /// The drilled region acknowledged an epoch published during the drill.
    Acknowledged { epoch: Epoch },
    /// The drilled region's lease ran out: its limiters now enforce their
    /// fallback (per rule).
    LeaseLapsed {
        valid_until_ms: Millis,
        fallback: BTreeMap<String, u64>,
    },
    /// The other regions were granted more than they held at the start.
    Regranted { epoch: Epoch },
    /// The other regions' allocation covered the demand that moved to them.
    Covered { epoch: Epoch },
    /// Hits the regions reported since the last such event, per rule and
    /// region: `(asked, allowed)`.
    Hits {
        rules: BTreeMap<String, BTreeMap<String, (u64, u64)>>,
    },
    /// A counted rule's window: what each region reported admitting in it
    /// (the busiest key), and which regions were not heard in it.
    Window {
        rule: String,
        start_ms: Millis,
        admitted: BTreeMap<String, u64>,
        /// Regions not heard for the window: their figure is what they
        /// could enforce (grant, or fallback once their lease lapsed).
        estimated: Vec<String>,
    },
    /// The drill stopped (see [`Drill::stopped`]).
    Stopped,
    /// After the stop, the region held its share again and acknowledged it.
    Recovered { epoch: Epoch },
    /// Observation ended: recovered, or gave up waiting.
    Finished { recovered: bool },
    /// A new leader took over observing (its counts of hits start afresh).
    LeaderChanged { node: u64 },
    /// Hits the leader had counted before the drill began, per rule and
    /// region `(asked, allowed)`: the rejection rate the drill is compared
    /// with. Recorded only by the leader that saw the start.
    Before {
        rules: BTreeMap<String, BTreeMap<String, (u64, u64)>>,
    },
    /// A drain took effect: the first epoch that moves the region's share
    /// away. (Variants are appended: bincode tags them by position.)
    Drained { epoch: Epoch },
    /// A clock-aligned period of a global rule that is not counted in
    /// fixed windows (sliding log or counter, token bucket, GCRA,
    /// approximate), as the leader's ledger measured it
    /// (`allocation::ledger`): the busiest key's admitted hits per region,
    /// each the sum of its pods' own counts for the period.
    Period {
        rule: String,
        start_ms: Millis,
        period_ms: u64,
        admitted: BTreeMap<String, u64>,
        limit: u64,
        /// The rule's stated bound for the period (`Terms::bound`).
        bound: u64,
        /// The bound in words (`Terms::bound_is`).
        bound_is: String,
        /// Pods whose counts are in it.
        pods: u32,
        /// Every pod counted was heard after the period ended; otherwise
        /// the figure is a lower bound.
        complete: bool,
    },
}

/// A rule's grants in one epoch, as [`What::Epoch`] records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    pub rule: String,
    /// The drilled region's grant in the split.
    pub drilled: u64,
    /// The other regions' grants in the split, summed.
    pub others: u64,
}

/// One drill's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drill {
    /// 1, 2, …, never reused.
    pub id: u64,
    pub region: String,
    pub mode: Mode,
    pub note: String,
    /// The leader's clock when the start was proposed.
    pub started_at_unix_ms: Millis,
    /// Stops by itself this long after the start.
    pub duration_ms: Option<i64>,
    pub started_by: Actor,
    /// Started although it left a global rule with no region to serve it.
    pub forced: bool,
    /// The allocation epoch in force at the start.
    pub start_epoch: Epoch,
    /// Per global rule, what regions held at the start.
    pub baseline: Vec<RuleBaseline>,
    pub stopped: Option<Stop>,
    /// Observation has ended (see [`What::Finished`]).
    pub finished: bool,
    pub events: Vec<Event>,
    /// Events refused past [`MAX_EVENTS`].
    pub dropped: u64,
}

impl Drill {
    /// Whether the drill acts on its region now (started, not stopped).
    pub fn active(&self) -> bool {
        self.stopped.is_none()
    }

    /// When its duration runs out, if it has one.
    pub fn ends_at(&self) -> Option<Millis> {
        self.duration_ms
            .map(|d| self.started_at_unix_ms.saturating_add(d))
    }

    fn push(&mut self, event: Event) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(event);
        } else {
            self.dropped += 1;
        }
    }
}

/// What an operator asks for when starting a drill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartDrill {
    pub region: String,
    pub mode: Mode,
    pub duration_ms: Option<i64>,
    pub note: String,
    pub force: bool,
    pub by: Actor,
    pub at_unix_ms: Millis,
}

/// Why a stop was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    NotFound(String),
    Rejected(String),
}

/// Every drill, by id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Drills {
    /// Shared with every clone of the applied state: an observation copies
    /// only the drill it touches.
    pub by_id: BTreeMap<u64, Arc<Drill>>,
    /// The last id given (ids are never reused, even after a drop).
    pub last_id: u64,
}

impl Drills {
    /// The active drill on `region`, if any.
    pub fn active_on(&self, region: &str) -> Option<&Drill> {
        self.by_id
            .values()
            .find(|d| d.active() && d.region == region)
            .map(|d| d.as_ref())
    }

    /// The mode an active drill holds `region` in.
    pub fn mode_of(&self, region: &str) -> Option<Mode> {
        self.active_on(region).map(|d| d.mode)
    }

    /// Drills not finished yet: the leader observes these.
    pub fn unfinished(&self) -> impl Iterator<Item = &Arc<Drill>> {
        self.by_id.values().filter(|d| !d.finished)
    }

    /// Checks a start against the state it meets: `serving` are the regions
    /// that serve global rules now (registered, active, not in a drill),
    /// `global_rules` the enforced global rules. The id the drill would get,
    /// or why not.
    pub fn check_start(
        &self,
        start: &StartDrill,
        registered: bool,
        serving: &[String],
        global_rules: usize,
    ) -> Result<u64, String> {
        if !registered {
            return Err(format!("region {:?} is not registered", start.region));
        }
        if let Some(d) = self.active_on(&start.region) {
            return Err(format!(
                "region {:?} is already in drill {} ({}); stop it first",
                start.region,
                d.id,
                d.mode.as_str()
            ));
        }
        if let Some(ms) = start.duration_ms
            && !(1..=MAX_DURATION_MS).contains(&ms)
        {
            return Err(format!(
                "duration must be between 1 ms and 24 h, got {ms} ms"
            ));
        }
        if start.note.len() > MAX_NOTE_BYTES {
            return Err(format!(
                "note is {} bytes; at most {MAX_NOTE_BYTES}",
                start.note.len()
            ));
        }
        let left = serving.iter().filter(|r| **r != start.region).count();
        if left == 0 && global_rules > 0 && !start.force {
            return Err(format!(
                "a {} drill of {:?} would leave {global_rules} global rule(s) with no region \
                 to serve them (no other region is active and out of drills); pass \"force\": \
                 true (ctl drill start --force) to start it anyway",
                start.mode.as_str(),
                start.region
            ));
        }
        Ok(self.last_id + 1)
    }

    /// Records a started drill (after [`Drills::check_start`]).
    pub fn start(
        &mut self,
        start: StartDrill,
        allocations: &Allocations,
        periods: &[(String, u64, bool)],
    ) -> u64 {
        let id = self.last_id + 1;
        self.last_id = id;
        let baseline = allocations
            .rules
            .iter()
            .map(|(rule, a)| {
                let (period_ms, strict) = periods
                    .iter()
                    .find(|(r, _, _)| r == rule)
                    .map_or((0, true), |(_, p, s)| (*p, *s));
                RuleBaseline {
                    rule: rule.clone(),
                    limit: a.limit,
                    granted: a
                        .split
                        .iter()
                        .map(|(r, s)| (r.clone(), s.granted))
                        .collect(),
                    demand: a.demand.clone(),
                    fallback: a.fallback.clone(),
                    period_ms,
                    strict,
                }
            })
            .collect();
        let mut drill = Drill {
            id,
            region: start.region,
            mode: start.mode,
            note: start.note,
            started_at_unix_ms: start.at_unix_ms,
            duration_ms: start.duration_ms,
            started_by: start.by,
            forced: start.force,
            start_epoch: allocations.epoch,
            baseline,
            stopped: None,
            finished: false,
            events: Vec::new(),
            dropped: 0,
        };
        drill.push(Event {
            at_unix_ms: start.at_unix_ms,
            what: What::Started,
        });
        self.by_id.insert(id, Arc::new(drill));
        while self.by_id.len() > MAX_DRILLS {
            let Some(oldest) = self.by_id.values().find(|d| d.finished).map(|d| d.id) else {
                break;
            };
            self.by_id.remove(&oldest);
        }
        id
    }

    /// Stops drill `id`: refused when it does not exist or already stopped.
    pub fn stop(&mut self, id: u64, stop: Stop) -> Result<(), Refused> {
        let Some(drill) = self.by_id.get_mut(&id) else {
            return Err(Refused::NotFound(format!("drill {id} does not exist")));
        };
        let drill = Arc::make_mut(drill);
        if let Some(s) = &drill.stopped {
            return Err(Refused::Rejected(format!(
                "drill {id} already stopped at {} ms",
                s.at_unix_ms
            )));
        }
        let at = stop.at_unix_ms;
        drill.stopped = Some(stop);
        drill.push(Event {
            at_unix_ms: at,
            what: What::Stopped,
        });
        Ok(())
    }

    /// Appends what the leader observed of drill `id`; a [`What::Finished`]
    /// among them ends observation. Refused for a finished or unknown drill
    /// (a deposed leader's late observation).
    pub fn observed(&mut self, id: u64, events: Vec<Event>) -> Result<(), String> {
        let Some(drill) = self.by_id.get_mut(&id) else {
            return Err(format!("drill {id} does not exist"));
        };
        let drill = Arc::make_mut(drill);
        if drill.finished {
            return Err(format!("drill {id} is finished"));
        }
        for event in events {
            if matches!(event.what, What::Finished { .. }) {
                drill.finished = true;
            }
            drill.push(event);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
