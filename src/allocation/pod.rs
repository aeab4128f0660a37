//! A limiter pod's account of the global rules: what it counted since its
//! last report and what it holds of each rule's current windows and periods,
//! and the [`PodReport`] it makes of that.
//!
//! The limiter keeps one behind a mutex and sends its reports over gRPC; the
//! simulator keeps one per simulated pod and hands its reports to the
//! leader. Both therefore report the same numbers for the same decisions:
//! - **demand** per rule and key since the last demand report, asked and
//!   allowed, at most [`MAX_TRACKED_KEYS`] keys (the rest summed per rule),
//!   cut to the top keys when reported;
//! - **top-ups**: a key that used [`TOP_UP_AT`](super::TOP_UP_AT) of its
//!   allocation asks for more, at most every [`TOP_UP_EVERY_MS`];
//! - **window use** of exactly counted fixed windows, the current window and
//!   the one just ended (the in-window re-grant and drills read it);
//! - **admitted per period** of every global rule, whatever its algorithm:
//!   the whole rule and its busiest keys in the current clock-aligned period
//!   and the one just ended, counted since the period began (the ledger's
//!   input: a repeated report replaces, never adds).
//!
//! Pure: the time of each decision and of each report is an argument.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::demand::{KeyDemand, MAX_REPORT_TOP_UPS, REPORT_TOP_KEYS, bound_report};
use super::leader::{PodReport, RuleDemand, RuleUse, TopUp};
use super::ledger::PeriodAdmitted;
use super::reserved::OpenReservations;
use super::{Epoch, Millis, WindowUse};

/// Distinct keys counted between two reports, over all global rules;
/// further keys only add to their rule's remainder, so a flood of random
/// keys cannot grow memory. Keys are at most `store::key::MAX_KEY_LEN` (512)
/// bytes, checked before they get here: at most ~60 MB, and ~10 MB for keys
/// of 40 bytes.
pub const MAX_TRACKED_KEYS: usize = 100_000;
/// Keys whose last top-up request is remembered (to ask at most every
/// [`TOP_UP_EVERY_MS`]); a key beyond it does not ask until older ones expire.
pub const MAX_TOP_UP_KEYS: usize = 10_000;
/// A key asks for a top-up at most this often.
pub const TOP_UP_EVERY_MS: Millis = 1_000;
/// A top-up's pace is measured over at least this long since the last
/// report: a shorter span makes one burst look like a flood.
pub const TOP_UP_MIN_SPAN_MS: Millis = 200;
/// Keys per rule and period whose admitted count a report carries, the
/// busiest first (the whole rule is one more entry). The coordinator
/// refuses more (`coordinator::report_bounds::MAX_ADMITTED_KEYS`).
pub const ADMITTED_TOP_KEYS: usize = 16;
/// Keys whose per-period admitted count is kept, over every rule and both
/// periods held. A key first admitted once this many are held counts in
/// its rule's total only: the busiest keys are admitted early in a period,
/// so they hold their place; a flood of random keys cannot grow memory
/// (~6 MB at 512-byte keys).
pub const MAX_PERIOD_KEYS: usize = 10_000;

/// Keys whose refunds wait to come off their demand (see
/// [`PodAccount::settled`]), over every rule; a refund of another key while
/// this many wait is not carried (its key's demand reads high, once).
pub const MAX_OWED_KEYS: usize = 10_000;
/// Demand reports a refund waits through for demand of its key to come off;
/// then it is dropped (the key's traffic stopped: its demand decays anyway).
pub const OWED_REPORTS: u8 = 10;

/// Maps keyed by rule ids and clients' keys, touched on every decision:
/// foldhash (seeded per process, as the over-limit cache and the memory
/// store use for the same keys), not SipHash.
type Map<K, V> = HashMap<K, V, RandomState>;

/// A decided check of one global limit, as the pod counts it.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'a> {
    /// The limit's id (`Rule::limit_id`).
    pub rule: &'a str,
    /// The key as the rule counts it.
    pub key: &'a str,
    /// The rule's period: its clock-aligned periods are the ledger's.
    pub period_ms: u64,
    /// Hits asked (0 = check only: not demand).
    pub cost: u64,
    /// Admitted (a shadow denial counts as denied: it is demand unserved).
    pub allowed: bool,
    /// The decision's limit.
    pub limit: u64,
    /// What the decision left of `limit`.
    pub remaining: u64,
    /// The decision's time to its reset: for a fixed window, when the
    /// window it was counted in ends.
    pub reset_after_us: u64,
    /// `limit − remaining` is the key's count against the rule's allocation
    /// (false for an override, whose count is against its own limit and
    /// whose window may be another one).
    pub window_use: bool,
    /// What the reset time tells of the window that decided it.
    pub reset_tells: ResetTells,
    /// Counted exactly in fixed windows: its window use is reported
    /// (`GlobalRule::counted`).
    pub counted: bool,
    /// The rule's algorithm has windows (not a bucket): its peak use per
    /// window is kept for the limiter's gauge.
    pub windowed: bool,
}

/// A reservation of one global limit settled (committed or released): what
/// the store gave back of its estimate and what excess it charged, so the
/// pod's counts become the settled cost. The estimate itself was counted
/// when the reservation was admitted, as a check of that cost.
#[derive(Debug, Clone, Copy)]
pub struct Settlement<'a> {
    /// The limit's id (`Rule::limit_id`).
    pub rule: &'a str,
    /// The key as the rule counts it.
    pub key: &'a str,
    /// The rule's period.
    pub period_ms: u64,
    /// Hits given back into the window the estimate was charged in.
    pub refunded: u64,
    /// Excess hits charged now (past the estimate).
    pub charged: u64,
    /// How long before the settlement the estimate was charged: the refund
    /// leaves the period the estimate was counted in.
    pub charged_age_ms: u64,
    /// For a counted rule (exact fixed window, no override): the key's use
    /// of its limit after the settlement, as the store answered it. An
    /// excess raises the count without a decision, and the in-window
    /// re-grant must not read the window as emptier than it is.
    pub used: Option<u64>,
}

/// What a decision's reset time tells of the clock-aligned window it was
/// counted in. The answer's clock alone cannot place it: an answer can
/// arrive after the boundary of the window that decided it, and counting it
/// in the next one reads that period as over `L` in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTells {
    /// Fixed window: the reset is when that window ends.
    WindowEnd,
    /// Sliding window counter: an admitted hit's window is read as the
    /// previous one through the window after, so its reset is when that
    /// one ends (a denial's may be either: the clock places it).
    NextWindowEnd,
    /// Nothing (sliding log, buckets): the answer's clock places it.
    Nothing,
}

impl ResetTells {
    /// What `algorithm`'s reset time tells.
    pub fn of(algorithm: crate::algorithm::Algorithm) -> ResetTells {
        use crate::algorithm::Algorithm;
        match algorithm {
            Algorithm::FixedWindow => ResetTells::WindowEnd,
            Algorithm::SlidingWindowCounter => ResetTells::NextWindowEnd,
            _ => ResetTells::Nothing,
        }
    }
}

/// One counted rule as the pod enforces it when it reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CountedRule {
    /// The limit's id.
    pub rule: String,
    /// Its window.
    pub period_ms: u64,
    /// The largest value the pod enforces for it in the current window.
    pub cap: u64,
}

/// What the pod holds when it reports: the epoch (its acknowledgement) and
/// its counted rules' caps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Holding {
    /// The allocation epoch the pod holds.
    pub epoch: Epoch,
    /// The counted rules it enforces, whose window use it reports.
    pub counted: Vec<CountedRule>,
}

/// What the pod holds of one rule: one map lookup per decision reaches all
/// of it.
#[derive(Debug, Default)]
struct RuleAccount {
    /// Key → (asked, allowed) since the last demand report.
    keys: Map<String, (u64, u64)>,
    /// Keys beyond [`MAX_TRACKED_KEYS`], summed, since the last demand report.
    rest: (u64, u64),
    /// Counted rules: (window start, the most any key was admitted in it),
    /// as this pod's checks saw the count.
    seen: Option<(Millis, u64)>,
    /// Counted rules: the window before `seen`'s and its final count, so the
    /// first report after a window ends still carries what it reached.
    ended: Option<(Millis, u64)>,
    /// Windowed rules: (window start, window end, the most any key had used
    /// of its limit in it): for the limiter's gauge, never reported.
    peak: Option<(Millis, Millis, u64)>,
    /// Admitted per clock-aligned period.
    periods: Option<RulePeriods>,
    /// Key → (refunded hits not yet taken off its demand, demand reports
    /// since): a refund of an estimate an earlier report carried comes off
    /// the key's next reports. At most [`MAX_OWED_KEYS`] over every rule.
    owed: Map<String, (u64, u8)>,
}

impl RuleAccount {
    /// Whether a decision was counted since the last demand report (every
    /// decision counted asks at least one hit).
    fn has_demand(&self) -> bool {
        !self.keys.is_empty() || self.rest.0 > 0
    }
}

/// Admitted hits in one clock-aligned period of a rule.
#[derive(Debug)]
struct PeriodCount {
    start_ms: Millis,
    /// The whole rule.
    total: u64,
    /// Per key, as many as [`MAX_PERIOD_KEYS`] lets in.
    keys: Map<String, u64>,
}

impl PeriodCount {
    fn new(start_ms: Millis) -> PeriodCount {
        PeriodCount {
            start_ms,
            total: 0,
            keys: Map::default(),
        }
    }
}

/// A rule's admitted counts: the newest period a decision fell in and the
/// one before it.
#[derive(Debug)]
struct RulePeriods {
    period_ms: Millis,
    current: PeriodCount,
    ended: Option<PeriodCount>,
}

/// One pod's account of the global rules (see the module docs).
#[derive(Debug)]
pub struct PodAccount {
    /// This pod's region and name, as its reports give them.
    region: String,
    pod: String,
    /// Keys per rule a demand report lists; the rest is its remainder.
    top_keys: usize,
    /// Rule → what the pod holds of it. One entry per global rule the pod
    /// counted (the operator's rules, never a client's keys).
    rules: Map<String, RuleAccount>,
    /// Keys with demand since the last demand report, over every rule: at
    /// most [`MAX_TRACKED_KEYS`].
    tracked: usize,
    /// Keys with an admitted count, over every rule and period: at most
    /// [`MAX_PERIOD_KEYS`].
    period_keys: usize,
    /// When the span the next demand report covers began: the last demand
    /// report, or the first hit counted after none.
    since: Option<Millis>,
    /// When this account first counted or reported: a window that began
    /// before it is not reported as used. Under the same pod name, an
    /// earlier process (killed, restarted) may have admitted in it, and
    /// its count would be taken for the region's while missing those —
    /// an in-window grant could then put the window over L.
    started_ms: Option<Millis>,
    /// Keys with refunds owed, over every rule: at most [`MAX_OWED_KEYS`].
    owed_keys: usize,
    /// Net open reservations per key, for the reports (`reserved.rs`).
    open: OpenReservations,
    /// Top-up requests waiting for the next report.
    top_ups: Vec<TopUp>,
    /// Each (rule, key)'s last top-up request, so a key asks at most every
    /// [`TOP_UP_EVERY_MS`]; pruned when it grows large.
    last_top_up: Map<(String, String), Millis>,
}

impl PodAccount {
    /// An empty account for `pod` of `region`.
    pub fn new(region: &str, pod: &str) -> PodAccount {
        PodAccount {
            region: region.to_string(),
            pod: pod.to_string(),
            top_keys: REPORT_TOP_KEYS,
            rules: Map::default(),
            tracked: 0,
            period_keys: 0,
            since: None,
            started_ms: None,
            top_ups: Vec::new(),
            last_top_up: Map::default(),
            owed_keys: 0,
            open: OpenReservations::default(),
        }
    }

    /// The same account for a process that started at `started_ms`: no
    /// window that began before it is reported as used (see
    /// `started_ms`). Without it, the first count or report sets it.
    pub fn started_at(mut self, started_ms: Millis) -> PodAccount {
        self.started_ms = Some(started_ms);
        self
    }

    /// The same account listing `top_keys` keys per rule in a demand report
    /// (at most [`REPORT_TOP_KEYS`], which the coordinator takes).
    pub fn with_top_keys(mut self, top_keys: usize) -> PodAccount {
        self.top_keys = top_keys.clamp(1, REPORT_TOP_KEYS);
        self
    }

    /// Counts a decided check at `now`. True when it queued a top-up
    /// request: the caller sends a report soon instead of at the next tick.
    pub fn record(&mut self, d: &Decided<'_>, now: Millis) -> bool {
        if d.cost == 0 {
            return false;
        }
        self.since.get_or_insert(now);
        self.started_ms.get_or_insert(now);
        // Looked up by reference: a known rule or key costs no allocation.
        if !self.rules.contains_key(d.rule) {
            self.rules.insert(d.rule.to_owned(), RuleAccount::default());
        }
        let Some(rule) = self.rules.get_mut(d.rule) else {
            return false;
        };
        let asked = count_demand(rule, &mut self.tracked, d);
        let used = d.limit.saturating_sub(d.remaining);
        let period = (d.period_ms as Millis).max(1);
        // The reset time says which window decided it where it can (an
        // answer can arrive after the boundary); otherwise the clock. An
        // override's reset is of its own limit's window, not the rule's.
        let now_start = now.div_euclid(period) * period;
        let window_end_us = match d.reset_tells {
            _ if !d.window_use => None,
            ResetTells::WindowEnd => Some(d.reset_after_us),
            ResetTells::NextWindowEnd if d.allowed => {
                d.reset_after_us.checked_sub(period as u64 * 1_000)
            }
            ResetTells::NextWindowEnd | ResetTells::Nothing => None,
        };
        let start = window_end_us.map_or(now_start, |us| decided_window(now, us, period));
        let admitted = if d.allowed { d.cost } else { 0 };
        count_admitted(rule, &mut self.period_keys, d.key, admitted, period, start);
        if d.allowed && d.window_use && d.counted {
            count_window(rule, start, used);
        }
        if d.allowed && d.window_use && d.windowed {
            match rule.peak.as_mut() {
                Some(peak) if peak.0 == now_start => peak.2 = peak.2.max(used),
                Some(peak) if peak.0 > now_start => {}
                _ => rule.peak = Some((now_start, now_start + period, used)),
            }
        }
        TopUp::wanted(used, d.limit) && self.ask_top_up(d, asked, now)
    }

    /// Counts a settled reservation at `now`: its refund comes off the
    /// demand and the admitted count of the period the estimate was counted
    /// in, its excess is added to both (the current period), so the leader
    /// sees settled cost, not estimates.
    ///
    /// A report carries no negative demand, so a refund of an estimate an
    /// earlier report carried comes off the key's demand counted since, and
    /// what that cannot hold is owed: taken off the key's next reports, for
    /// up to [`OWED_REPORTS`] of them (a key whose traffic stopped keeps
    /// its last reports slightly high; its demand decays anyway). The
    /// admitted counts are cumulative per period, so there the refund is
    /// exact while the period is held.
    pub fn settled(&mut self, s: &Settlement<'_>, now: Millis) {
        if s.refunded == 0 && s.charged == 0 {
            return;
        }
        self.since.get_or_insert(now);
        self.started_ms.get_or_insert(now);
        if !self.rules.contains_key(s.rule) {
            self.rules.insert(s.rule.to_owned(), RuleAccount::default());
        }
        let Some(rule) = self.rules.get_mut(s.rule) else {
            return;
        };
        let hits = if rule.keys.contains_key(s.key) {
            rule.keys.get_mut(s.key)
        } else if s.charged > 0 && self.tracked < MAX_TRACKED_KEYS {
            self.tracked += 1;
            Some(rule.keys.entry(s.key.to_string()).or_default())
        } else {
            None
        };
        let hits = hits.unwrap_or(&mut rule.rest);
        // allowed ≤ asked: what comes off both leaves them in order.
        let taken = s.refunded.min(hits.1 + s.charged);
        hits.0 = hits.0 + s.charged - taken;
        hits.1 = hits.1 + s.charged - taken;
        let left = s.refunded - taken;
        if left > 0 {
            if let Some(owed) = rule.owed.get_mut(s.key) {
                owed.0 += left;
            } else if self.owed_keys < MAX_OWED_KEYS {
                rule.owed.insert(s.key.to_string(), (left, 0));
                self.owed_keys += 1;
            }
        }
        let period = (s.period_ms as Millis).max(1);
        let charged_at = now - s.charged_age_ms.min(now.max(0) as u64) as Millis;
        uncount_admitted(
            rule,
            s.key,
            s.refunded,
            charged_at.div_euclid(period) * period,
        );
        if s.charged > 0 {
            let start = now.div_euclid(period) * period;
            count_admitted(rule, &mut self.period_keys, s.key, s.charged, period, start);
            if let Some(used) = s.used {
                count_window(rule, start, used);
            }
        }
    }

    /// Adds `delta` to the reservations open on `key` of `rule` until
    /// `expires_ms`: an estimate opened here, or (negative) one settled here.
    pub fn open_reservation(&mut self, rule: &str, key: &str, delta: i64, expires_ms: Millis) {
        self.open.add(rule, key, delta, expires_ms);
    }

    /// Queues a top-up for the decision's key unless it asked within
    /// [`TOP_UP_EVERY_MS`] or a bound is reached; true if queued.
    fn ask_top_up(&mut self, d: &Decided<'_>, asked: (u64, u64), now: Millis) -> bool {
        let id = (d.rule.to_owned(), d.key.to_string());
        let due = self
            .last_top_up
            .get(&id)
            .is_none_or(|t| now - t >= TOP_UP_EVERY_MS);
        // A report carries at most MAX_REPORT_TOP_UPS (the coordinator
        // refuses more), and the keys asking within a second are bounded
        // the same way.
        if !due
            || self.top_ups.len() >= MAX_REPORT_TOP_UPS
            || self.last_top_up.len() >= MAX_TOP_UP_KEYS && !self.last_top_up.contains_key(&id)
        {
            return false;
        }
        // The key's pace here since the last report, per period.
        let Some(since) = self.since.map(|t| now - t) else {
            return false;
        };
        if since < TOP_UP_MIN_SPAN_MS {
            return false;
        }
        self.top_ups.push(TopUp::measured(
            d.rule,
            d.key,
            asked.0,
            since as u64,
            d.period_ms,
        ));
        self.last_top_up.insert(id, now);
        if self.last_top_up.len() >= MAX_TOP_UP_KEYS / 2 {
            self.last_top_up.retain(|_, t| now - *t < TOP_UP_EVERY_MS);
        }
        true
    }

    /// Whether top-up requests wait for a report.
    pub fn has_top_ups(&self) -> bool {
        !self.top_ups.is_empty()
    }

    /// The report to send at `now`: the epoch held, pending top-ups, window
    /// use and admitted counts, and — `with_demand` — the demand since the
    /// last demand report (which it then starts over). Without demand it is
    /// an acknowledgement.
    pub fn report(&mut self, holding: &Holding, with_demand: bool, now: Millis) -> PodReport {
        self.started_ms.get_or_insert(now);
        let mut report = PodReport {
            region: self.region.clone(),
            pod: self.pod.clone(),
            epoch: holding.epoch,
            top_ups: std::mem::take(&mut self.top_ups),
            used: self.window_use(&holding.counted, now),
            admitted: self.admitted(now),
            reserved: self.open.report(now),
            ..PodReport::default()
        };
        if !with_demand {
            return report;
        }
        report.interval_ms = self
            .since
            .replace(now)
            .map_or(0, |t| (now - t).max(1) as u64);
        self.tracked = 0;
        for (id, rule) in &mut self.rules {
            if !rule.owed.is_empty() {
                pay_owed(rule, &mut self.owed_keys);
            }
            if !rule.has_demand() {
                continue;
            }
            let keys = rule
                .keys
                .drain()
                .filter(|(_, (asked, _))| *asked > 0)
                .map(|(key, (asked, allowed))| KeyDemand {
                    key,
                    asked,
                    allowed,
                })
                .collect();
            let (keys, rest_asked, rest_allowed) = bound_report(keys, self.top_keys);
            let rest = std::mem::take(&mut rule.rest);
            report.rules.push(RuleDemand {
                rule: id.clone(),
                keys,
                remainder_asked: rest_asked + rest.0,
                remainder_allowed: rest_allowed + rest.1,
            });
        }
        report.rules.sort_by(|a, b| a.rule.cmp(&b.rule));
        report
    }

    /// What this pod saw of each counted rule's current window at `now`
    /// (0 if nothing) and of the one just ended (its final count, when it
    /// saw any), with the largest value it enforces for it.
    fn window_use(&self, counted: &[CountedRule], now: Millis) -> Vec<RuleUse> {
        let mut used = Vec::with_capacity(2 * counted.len());
        let started = self.started_ms.unwrap_or(now);
        for c in counted {
            let p = (c.period_ms as Millis).max(1);
            let start = now.div_euclid(p) * p;
            let rule = self.rules.get(&c.rule);
            let seen = rule.and_then(|r| r.seen);
            let last = match (seen, rule.and_then(|r| r.ended)) {
                (Some((s, n)), _) if s == start - p => Some(n),
                (_, Some((s, n))) if s == start - p => Some(n),
                _ => None,
            };
            // The ended window first: it is older than the current one, so
            // the centre's in-window view keeps the current one.
            if let Some(count) = last.filter(|_| start - p >= started) {
                used.push(RuleUse {
                    rule: c.rule.clone(),
                    window_start_ms: start - p,
                    used: WindowUse { count, cap: c.cap },
                });
            }
            if start < started {
                continue;
            }
            let count = match seen {
                Some((s, n)) if s == start => n,
                _ => 0,
            };
            used.push(RuleUse {
                rule: c.rule.clone(),
                window_start_ms: start,
                used: WindowUse { count, cap: c.cap },
            });
        }
        used.sort_by(|a, b| {
            (a.rule.as_str(), a.window_start_ms).cmp(&(b.rule.as_str(), b.window_start_ms))
        });
        used
    }

    /// Admitted per rule period at `now`: the current period and the one
    /// just ended, the whole rule then its [`ADMITTED_TOP_KEYS`] busiest
    /// keys. Periods older than that are dropped here.
    fn admitted(&mut self, now: Millis) -> Vec<PeriodAdmitted> {
        let mut out = Vec::new();
        for (id, rule) in &mut self.rules {
            let Some(periods) = rule.periods.as_mut() else {
                continue;
            };
            let p = periods.period_ms;
            let oldest = now.div_euclid(p) * p - p;
            if periods.ended.as_ref().is_some_and(|e| e.start_ms < oldest) {
                self.period_keys -= periods.ended.take().map_or(0, |e| e.keys.len());
            }
            if periods.current.start_ms < oldest {
                self.period_keys -= periods.current.keys.len();
                rule.periods = None;
                continue;
            }
            for count in periods.ended.iter().chain([&periods.current]) {
                out.push(PeriodAdmitted {
                    rule: id.clone(),
                    key: None,
                    period_start_ms: count.start_ms,
                    admitted: count.total,
                });
                let mut keys: Vec<(&String, u64)> =
                    count.keys.iter().map(|(k, n)| (k, *n)).collect();
                keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
                out.extend(keys.into_iter().take(ADMITTED_TOP_KEYS).map(|(key, n)| {
                    PeriodAdmitted {
                        rule: id.clone(),
                        key: Some(key.clone()),
                        period_start_ms: count.start_ms,
                        admitted: n,
                    }
                }));
            }
        }
        // Grouped by rule and period, the whole rule first: the same input
        // gives the same report.
        out.sort_by(|a, b| {
            (a.rule.as_str(), a.period_start_ms, a.key.is_some()).cmp(&(
                b.rule.as_str(),
                b.period_start_ms,
                b.key.is_some(),
            ))
        });
        out
    }

    /// Each windowed rule's window end and the most any key had used of its
    /// limit in that window, as this pod's checks saw it (the limiter's
    /// `meridian_allocation_window_admitted_max`).
    pub fn window_peaks(&self) -> impl Iterator<Item = (&str, Millis, u64)> {
        self.rules
            .iter()
            .filter_map(|(id, r)| r.peak.map(|(_, end, used)| (id.as_str(), end, used)))
    }
}

/// Adds the decision to its rule's demand; the (asked, allowed) of the
/// key's entry (or of the rule's remainder) after it. `tracked` counts keys
/// over every rule.
fn count_demand(rule: &mut RuleAccount, tracked: &mut usize, d: &Decided<'_>) -> (u64, u64) {
    if *tracked < MAX_TRACKED_KEYS && !rule.keys.contains_key(d.key) {
        rule.keys.insert(d.key.to_string(), (0, 0));
        *tracked += 1;
    }
    let hits = match rule.keys.get_mut(d.key) {
        Some(h) => h,
        None => &mut rule.rest,
    };
    hits.0 += d.cost;
    if d.allowed {
        hits.1 += d.cost;
    }
    *hits
}

/// Adds `admitted` hits of `key` to the period starting at `start`: a newer
/// period pushes the current one to `ended` (and the one before out); a
/// decision of a period older than both is not counted (its reports have
/// gone). `period_keys` counts keys over every rule and period.
fn count_admitted(
    rule: &mut RuleAccount,
    period_keys: &mut usize,
    key: &str,
    admitted: u64,
    period: Millis,
    start: Millis,
) {
    let periods = rule.periods.get_or_insert_with(|| RulePeriods {
        period_ms: period,
        current: PeriodCount::new(start),
        ended: None,
    });
    periods.period_ms = period;
    if start > periods.current.start_ms {
        let ended = std::mem::replace(&mut periods.current, PeriodCount::new(start));
        if let Some(dropped) = periods.ended.replace(ended) {
            *period_keys -= dropped.keys.len();
        }
    }
    let count = if start == periods.current.start_ms {
        &mut periods.current
    } else {
        match periods.ended.as_mut() {
            Some(ended) if ended.start_ms == start => ended,
            _ => return,
        }
    };
    if admitted == 0 {
        return;
    }
    count.total += admitted;
    if let Some(n) = count.keys.get_mut(key) {
        *n += admitted;
    } else if *period_keys < MAX_PERIOD_KEYS {
        count.keys.insert(key.to_string(), admitted);
        *period_keys += 1;
    }
}

/// Takes the refunds owed off the demand counted since the last report, key
/// by key; a refund still owed after [`OWED_REPORTS`] reports is dropped.
fn pay_owed(rule: &mut RuleAccount, owed_keys: &mut usize) {
    let before = rule.owed.len();
    let keys = &mut rule.keys;
    rule.owed.retain(|key, (owed, reports)| {
        if let Some(hits) = keys.get_mut(key) {
            let taken = (*owed).min(hits.1);
            hits.0 -= taken;
            hits.1 -= taken;
            *owed -= taken;
        }
        *reports += 1;
        *owed > 0 && *reports < OWED_REPORTS
    });
    *owed_keys -= before - rule.owed.len();
}

/// Takes `refunded` hits of `key` off the period starting at `start`, if it
/// is still held (a refund of an older period changes nothing reported).
fn uncount_admitted(rule: &mut RuleAccount, key: &str, refunded: u64, start: Millis) {
    let Some(periods) = rule.periods.as_mut() else {
        return;
    };
    let count = if periods.current.start_ms == start {
        &mut periods.current
    } else {
        match periods.ended.as_mut() {
            Some(ended) if ended.start_ms == start => ended,
            _ => return,
        }
    };
    count.total = count.total.saturating_sub(refunded);
    if let Some(n) = count.keys.get_mut(key) {
        *n = n.saturating_sub(refunded);
    }
}

/// Notes that a key of a counted rule had been admitted `used` times in the
/// window starting at `start`.
fn count_window(rule: &mut RuleAccount, start: Millis, used: u64) {
    match rule.seen.as_mut() {
        Some(seen) if seen.0 == start => seen.1 = seen.1.max(used),
        Some(seen) if seen.0 < start => rule.ended = Some(std::mem::replace(seen, (start, used))),
        // Answered after a newer window's first: the window before is
        // still the last ended one, so it is not lost.
        Some(_) => {
            if let Some(ended) = rule.ended.as_mut()
                && ended.0 == start
            {
                ended.1 = ended.1.max(used);
            }
        }
        None => rule.seen = Some((start, used)),
    }
}

/// The start of the fixed window a decision was counted in, from its reset
/// time (when that window ends) and the clock when its answer arrived. Not
/// from the clock alone: an answer can arrive after the boundary of the
/// window that decided it. Rounding to the nearest boundary absorbs the
/// answer's latency and clock skew with Redis of up to half a window.
pub fn decided_window(answered: Millis, reset_after_us: u64, period: Millis) -> Millis {
    let period = period.max(1);
    let end = answered.saturating_add((reset_after_us / 1_000) as Millis);
    ((end + period / 2).div_euclid(period) - 1) * period
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
