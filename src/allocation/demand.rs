//! Demand: what regions ask for, smoothed; and which epoch each pod holds.
//!
//! [`DemandTracker`] lives in the leader's memory (and the simulator's). It
//! holds an EWMA per (rule, region) and per (rule, key, region) for every key
//! reported, compactly enough for a million keys; the smoothed values the
//! rebalancer used are committed with each epoch, and a new leader
//! [`seed`s](DemandTracker::seed) from them instead of learning again.

use std::collections::HashMap;

use super::{Allocations, Epoch, Millis, Recent, RegionWindow, TOP_UP_JUMP, WindowUse};

/// Keys one pod reports per global rule, by hits asked; the rest are summed
/// into a remainder. The coordinator refuses a report with more.
pub const REPORT_TOP_KEYS: usize = 1_000;
/// Top-up requests one report may carry; the coordinator refuses a report
/// with more, so a pod stops asking once it holds this many.
pub const MAX_REPORT_TOP_UPS: usize = 1_000;

/// One report line: demand for a key (or the rest of a rule) over an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDemand {
    /// The key as the rule counts it (`Resolved::counter_key`).
    pub key: String,
    /// Hits asked for: allowed + denied.
    pub asked: u64,
    /// Hits admitted of `asked`.
    pub allowed: u64,
}

/// Keeps the `top_n` keys with the most hits asked and folds the rest into
/// one remainder (asked, allowed), so a flood of distinct keys cannot make a
/// report grow. Ties go to the smaller key, for determinism.
pub fn bound_report(mut keys: Vec<KeyDemand>, top_n: usize) -> (Vec<KeyDemand>, u64, u64) {
    if keys.len() <= top_n {
        keys.sort_by(|a, b| b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key)));
        return (keys, 0, 0);
    }
    keys.select_nth_unstable_by(top_n, |a, b| {
        b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key))
    });
    let rest = keys.split_off(top_n);
    keys.sort_by(|a, b| b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key)));
    let asked = rest.iter().map(|k| k.asked).sum();
    let allowed = rest.iter().map(|k| k.allowed).sum();
    (keys, asked, allowed)
}

/// Smoothed demand in hits per rule period.
///
/// ## Why a round without a report is no news
/// Pods report on their own timers (every report interval, out of phase,
/// jittered, sometimes lost, late or repeated), and rounds run on the
/// leader's. So a round's sample is never "the hits that arrived since the
/// last round over the time since": with reports every 10 s and rounds every
/// 2 s that reads 0 in four rounds of five and 5× the real rate in the fifth,
/// and the split flapped 10/190 ↔ 190/10 (the real two-region runs used
/// 60–79 % of capacity). Instead each report is turned into the pace it
/// measured — its hits over *its own* interval — and a region's sample for
/// a round is the mean pace of the demand reports its pods sent in that
/// round, times its live pods:
/// - a round with no report from a region leaves its demand where it was;
/// - a repeated report adds a copy of the same pace, leaving the mean;
/// - a late or jittered report measured its own interval, so its pace is
///   right whenever it arrives;
/// - a report that does not list a rule (or key) says that pod saw none of
///   it, so traffic that stops still brings demand down.
#[derive(Debug, Default)]
pub struct DemandTracker {
    alpha: f64,
    regions: Vec<String>,
    /// Demand reports (interval > 0) each region sent since the last roll:
    /// the denominator of every pace mean of the region.
    reports: Vec<u32>,
    rules: HashMap<String, RuleDemand>,
}

#[derive(Debug, Default)]
struct RuleDemand {
    period_ms: u64,
    /// Per region index.
    total: Vec<Sample>,
    /// Per key: `[ewma; R]` then `[pace sum; R]` (this round's reported
    /// paces, hits per period), f32 to keep a key small.
    keys: HashMap<Box<str>, Box<[f32]>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Sample {
    ewma: f64,
    /// Sum of the paces (hits per period) reported since the last roll.
    pending: f64,
    seen: bool,
    /// [`DemandTracker::follow_steps`] set `ewma` this interval: the roll
    /// keeps it.
    stepped: bool,
}

/// A region's pace for a key or rule, measured by one pod: `pod_per_period`
/// hits per rule period over `interval_ms`, in a region of `pods` pods that
/// share its traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pace {
    /// The pace, hits per rule period, as seen by this one pod.
    pub pod_per_period: f64,
    /// 0: unknown, no noise test.
    pub interval_ms: u64,
    /// Pods in the region sharing its traffic: the region's pace is the pod's
    /// times this.
    pub pods: usize,
}

/// How many standard deviations of Poisson noise a pace must stand from the
/// average before it moves demand out of cycle.
const NOISE_SIGMAS: f64 = 3.0;

impl Pace {
    /// `hits` asked at one pod over `interval_ms`.
    pub fn of_report(hits: u64, interval_ms: u64, period_ms: u64, pods: usize) -> Pace {
        Pace {
            pod_per_period: hits as f64 * period_ms as f64 / interval_ms.max(1) as f64,
            interval_ms,
            pods,
        }
    }

    /// The region's hits per period.
    pub fn per_period(&self) -> f64 {
        self.pod_per_period * self.pods.max(1) as f64
    }

    /// Whether the pod's count differs from what `average` (the region's,
    /// per period) predicts by more than Poisson noise.
    fn beyond_noise(&self, average: f64, period_ms: u64) -> bool {
        if self.interval_ms == 0 {
            return true;
        }
        let span = self.interval_ms as f64 / period_ms.max(1) as f64;
        let observed = self.pod_per_period * span;
        let expected = average / self.pods.max(1) as f64 * span;
        (observed - expected).abs() >= NOISE_SIGMAS * expected.max(1.0).sqrt()
    }

    /// At least twice or at most half `average`, beyond noise.
    fn is_step_from(&self, average: f64, period_ms: u64) -> bool {
        let rate = self.per_period();
        (rate >= 2.0 * average || rate * 2.0 <= average) && self.beyond_noise(average, period_ms)
    }
}

/// A key's `[ewma; R]` then `[pending; R]`, with room for region `r`.
fn key_slots<'a>(
    keys: &'a mut HashMap<Box<str>, Box<[f32]>>,
    key: &str,
    r: usize,
) -> &'a mut [f32] {
    let slots = keys
        .entry(key.into())
        .or_insert_with(|| vec![0.0; 2 * (r + 1)].into_boxed_slice());
    if slots.len() < 2 * (r + 1) {
        *slots = widen(slots, r + 1);
    }
    slots
}

impl DemandTracker {
    /// An empty tracker whose EWMA weights the newest sample by `alpha`
    /// (clamped to 0.01–1.0).
    pub fn new(alpha: f64) -> Self {
        DemandTracker {
            alpha: alpha.clamp(0.01, 1.0),
            ..Default::default()
        }
    }

    fn region_index(&mut self, region: &str) -> usize {
        match self.regions.iter().position(|r| r == region) {
            Some(i) => i,
            None => {
                self.regions.push(region.to_string());
                self.reports.push(0);
                self.regions.len() - 1
            }
        }
    }

    /// A demand report (one with an interval) arrived from a pod of
    /// `region`: call once per report, before [`DemandTracker::record`] of
    /// its rules. Rules and keys the report does not list count as a pace
    /// of 0 at that pod.
    pub fn count_report(&mut self, region: &str) {
        let r = self.region_index(region);
        self.reports[r] = self.reports[r].saturating_add(1);
    }

    /// Adds one rule of a pod's report: its keys and the remainder, hits
    /// asked over the report's `interval_ms`. A report without an interval
    /// (the first a pod sends, an acknowledgement) has no pace and adds
    /// nothing.
    pub fn record(
        &mut self,
        region: &str,
        rule: &str,
        period_ms: u64,
        keys: &[KeyDemand],
        remainder_asked: u64,
        interval_ms: u64,
    ) {
        if interval_ms == 0 {
            return;
        }
        let r = self.region_index(region);
        let entry = self.rules.entry(rule.to_string()).or_default();
        entry.period_ms = period_ms.max(1);
        if entry.total.len() <= r {
            entry.total.resize(r + 1, Sample::default());
        }
        let per_period = entry.period_ms as f64 / interval_ms as f64;
        let total: u64 = keys.iter().map(|k| k.asked).sum::<u64>() + remainder_asked;
        entry.total[r].pending += total as f64 * per_period;
        for k in keys {
            let slots = key_slots(&mut entry.keys, &k.key, r);
            let half = slots.len() / 2;
            // NaN (a step followed this round) stays NaN.
            slots[half + r] += (k.asked as f64 * per_period) as f32;
        }
    }

    /// Ends a round: every region that sent demand reports since the last
    /// roll gets the mean of their paces times `pods(region)` (its live
    /// pods) as a sample, smoothed into its EWMA; a region that sent none
    /// keeps its demand (no news). Keys that faded to nothing are dropped.
    pub fn roll(&mut self, pods: &dyn Fn(&str) -> usize) {
        let alpha = self.alpha;
        // Per region: what one report's pace is multiplied by (0: no news).
        let scale: Vec<f64> = self
            .regions
            .iter()
            .zip(&self.reports)
            .map(|(name, n)| match n {
                0 => 0.0,
                n => pods(name).max(1) as f64 / *n as f64,
            })
            .collect();
        for rule in self.rules.values_mut() {
            for (r, s) in rule.total.iter_mut().enumerate() {
                let k = scale.get(r).copied().unwrap_or(0.0);
                if k > 0.0 {
                    let rate = s.pending * k;
                    s.ewma = match (s.seen, s.stepped) {
                        (_, true) => s.ewma,
                        (true, false) => smooth(alpha, rate, s.ewma),
                        (false, false) => rate,
                    };
                    s.seen = true;
                }
                s.stepped = false;
                s.pending = 0.0;
            }
            rule.keys.retain(|_, slots| {
                let half = slots.len() / 2;
                let mut alive = false;
                for i in 0..half {
                    let pending = slots[half + i] as f64;
                    let k = scale.get(i).copied().unwrap_or(0.0);
                    let e = if pending.is_nan() || k == 0.0 {
                        slots[i] as f64
                    } else {
                        smooth(alpha, pending * k, slots[i] as f64)
                    };
                    slots[i] = e as f32;
                    slots[half + i] = 0.0;
                    alive |= e >= 0.5;
                }
                alive
            });
        }
        self.reports.iter_mut().for_each(|n| *n = 0);
    }

    /// Early top-up: a region reports mid-window that `key` runs at `pace`.
    /// If that is clearly above the key's smoothed demand there — by
    /// [`TOP_UP_JUMP`] and by more than Poisson noise — the demand (and the
    /// rule's) is raised to it at once, so the next round — run out of cycle —
    /// acts on it instead of waiting for the EWMA. Returns whether it raised.
    ///
    /// A pace is a noisy sample, and every contended key asks for top-ups
    /// each window: raising to any sample above the average would ratchet
    /// demand up to the noisiest sample and hand capacity to regions that do
    /// not use it (the simulator measured ~2 % of L lost that way, and ~0.5 %
    /// more from short samples before the noise test).
    pub(crate) fn bump(
        &mut self,
        region: &str,
        rule: &str,
        period_ms: u64,
        key: &str,
        pace: Pace,
    ) -> bool {
        let r = self.region_index(region);
        let entry = self.rules.entry(rule.to_string()).or_default();
        entry.period_ms = period_ms.max(1);
        if entry.total.len() <= r {
            entry.total.resize(r + 1, Sample::default());
        }
        let slots = key_slots(&mut entry.keys, key, r);
        let current = slots[r] as f64;
        let rate = pace.per_period();
        if rate <= current * TOP_UP_JUMP || !pace.beyond_noise(current, entry.period_ms) {
            return false;
        }
        let raise = rate - current;
        slots[r] += raise as f32;
        let total = &mut entry.total[r];
        total.ewma += raise;
        total.seen = true;
        true
    }

    /// Follows a step change seen in one pod's report at once, instead of at
    /// the next roll: where the region's pace (the pod's times `pods`) for
    /// the rule, or for a key already tracked, is at least twice or at most
    /// half its smoothed demand, by more than Poisson noise, the demand is
    /// set to that pace and the sample this interval collects is dropped at
    /// the roll (it mixes the rates before and after the step). Returns
    /// whether anything stepped, so the caller can run a round out of cycle.
    ///
    /// A shift then reaches the round before the next window boundary with
    /// both regions' new demand; the simulator lost most of two windows per
    /// shift waiting for the roll and the EWMA.
    #[allow(clippy::too_many_arguments)]
    pub fn follow_steps(
        &mut self,
        region: &str,
        rule: &str,
        period_ms: u64,
        keys: &[KeyDemand],
        remainder_asked: u64,
        interval_ms: u64,
        pods: usize,
    ) -> bool {
        if interval_ms == 0 {
            return false;
        }
        let r = self.region_index(region);
        let Some(entry) = self.rules.get_mut(rule) else {
            return false;
        };
        let period = period_ms.max(1);
        let pace = |hits: u64| Pace::of_report(hits, interval_ms, period, pods);
        let mut stepped = false;
        if let Some(total) = entry.total.get_mut(r).filter(|s| s.seen) {
            let hits = keys.iter().map(|k| k.asked).sum::<u64>() + remainder_asked;
            let p = pace(hits);
            // After a step, later reports keep refining it: the first to
            // see a step straddles it and understates it.
            let moved = p.is_step_from(total.ewma, period)
                || total.stepped && p.beyond_noise(total.ewma, period);
            if moved {
                total.ewma = p.per_period();
                total.stepped = true;
                stepped = true;
            }
        }
        for k in keys {
            let Some(slots) = entry.keys.get_mut(k.key.as_str()) else {
                continue;
            };
            let half = slots.len() / 2;
            if r >= half || slots[r] <= 0.0 {
                continue;
            }
            let p = pace(k.asked);
            let (average, refining) = (slots[r] as f64, slots[half + r].is_nan());
            let moved =
                p.is_step_from(average, period) || refining && p.beyond_noise(average, period);
            if moved {
                slots[r] = p.per_period() as f32;
                // NaN marks the sample as dropped; hits added later keep it NaN.
                slots[half + r] = f32::NAN;
                stepped = true;
            }
        }
        stepped
    }

    /// Forgets rules that are no longer global.
    pub fn retain_rules(&mut self, keep: impl Fn(&str) -> bool) {
        self.rules.retain(|id, _| keep(id));
    }

    /// Starts from the demand committed with the last epoch.
    pub fn seed(&mut self, state: &Allocations) {
        for (id, rule) in &state.rules {
            for (region, d) in &rule.demand {
                let r = self.region_index(region);
                let entry = self.rules.entry(id.clone()).or_default();
                if entry.total.len() <= r {
                    entry.total.resize(r + 1, Sample::default());
                }
                entry.total[r] = Sample {
                    ewma: *d,
                    seen: true,
                    ..Sample::default()
                };
            }
            for (key, entry) in &rule.keys {
                for (region, d) in &entry.demand {
                    let r = self.region_index(region);
                    let rd = self.rules.entry(id.clone()).or_default();
                    key_slots(&mut rd.keys, key, r)[r] = *d as f32;
                }
            }
        }
    }

    /// Smoothed demand of the whole rule, per region in `names` order.
    pub fn rule_totals(&self, rule: &str, names: &[&str], out: &mut Vec<f64>) {
        out.clear();
        let entry = self.rules.get(rule);
        out.extend(names.iter().map(|n| {
            let Some(i) = self.regions.iter().position(|r| r == n) else {
                return 0.0;
            };
            entry.and_then(|e| e.total.get(i)).map_or(0.0, |s| s.ewma)
        }));
    }

    /// Calls `f(key, demand per region in names order)` for every tracked key.
    pub fn for_each_key(&self, rule: &str, names: &[&str], f: &mut dyn FnMut(&str, &[f64])) {
        let Some(entry) = self.rules.get(rule) else {
            return;
        };
        let index: Vec<Option<usize>> = names
            .iter()
            .map(|n| self.regions.iter().position(|r| r == n))
            .collect();
        let mut buf = vec![0.0; names.len()];
        for (key, slots) in &entry.keys {
            let half = slots.len() / 2;
            for (b, i) in buf.iter_mut().zip(&index) {
                *b = match i {
                    Some(i) if *i < half => slots[*i] as f64,
                    _ => 0.0,
                };
            }
            f(key, &buf);
        }
    }

    /// Keys tracked for a rule.
    pub fn key_count(&self, rule: &str) -> usize {
        self.rules.get(rule).map_or(0, |e| e.keys.len())
    }
}

/// The EWMA step, except that a step change — the new rate at least twice or
/// at most half the average, by more than noise (10 hits per period) — is
/// followed at once: a regional shift is then acted on in one round instead
/// of several (the simulator measured 300 s to catch up with plain EWMA).
fn smooth(alpha: f64, rate: f64, ewma: f64) -> f64 {
    let step = (rate - ewma).abs() > 10.0 && (rate >= 2.0 * ewma || rate * 2.0 <= ewma);
    if step {
        rate
    } else {
        alpha * rate + (1.0 - alpha) * ewma
    }
}

fn widen(slots: &[f32], regions: usize) -> Box<[f32]> {
    let half = slots.len() / 2;
    let mut wide = vec![0.0; 2 * regions];
    wide[..half].copy_from_slice(&slots[..half]);
    wide[regions..regions + half].copy_from_slice(&slots[half..]);
    wide.into_boxed_slice()
}

/// Most pods tracked per region: a region's certificate holder can name
/// pods freely, so their number needs a bound (about 150 bytes each, plus
/// the rules each reports a window's use of). Reports from further pods
/// are refused until silent ones are forgotten (after two leases).
pub const MAX_PODS_PER_REGION: usize = 10_000;

/// Which epoch each pod holds, from its reports and acknowledgements.
/// Pods are keyed by (region, pod): pod names are unique only within a
/// region (two clusters may both run `limiter-0`), and a pod speaks only
/// for the region its certificate names.
#[derive(Debug)]
pub(crate) struct AckTracker {
    pods: HashMap<(String, String), PodAck>,
    /// Pods tracked per region, for [`MAX_PODS_PER_REGION`].
    per_region: HashMap<String, usize>,
    /// Silence after which a pod heard again counts as back from a
    /// partition or a restart (`suspect_after`).
    quiet_ms: i64,
}

impl Default for AckTracker {
    fn default() -> Self {
        AckTracker::new(super::Config::default().suspect_after_ms)
    }
}

/// A pod's latest report of one rule's window, and the count it reported
/// before in the same window (for the region's recent pace).
#[derive(Debug, Clone)]
struct UseReport {
    rule: String,
    window_start_ms: Millis,
    used: WindowUse,
    at_ms: Millis,
    /// The pace since the pod's previous report of the same window.
    recent: Option<Recent>,
}

#[derive(Debug, Clone)]
struct PodAck {
    region: String,
    epoch: Epoch,
    at_ms: Millis,
    /// Per rule: the pod's use of its current window, latest report.
    used: Vec<UseReport>,
    /// Heard without a silence longer than `quiet_ms` since then.
    since_ms: Millis,
}

impl AckTracker {
    /// An empty tracker; a pod silent for longer than `quiet_ms` counts as
    /// settled again only from its next report (`RegionWindow::settled_since`).
    pub fn new(quiet_ms: i64) -> AckTracker {
        AckTracker {
            pods: HashMap::new(),
            per_region: HashMap::new(),
            quiet_ms,
        }
    }

    /// Whether a report from `pod` of `region` may be tracked: it is
    /// already, or the region holds fewer than [`MAX_PODS_PER_REGION`].
    pub fn admits(&self, region: &str, pod: &str) -> bool {
        self.pods
            .contains_key(&(region.to_string(), pod.to_string()))
            || self.per_region.get(region).copied().unwrap_or(0) < MAX_PODS_PER_REGION
    }

    /// Records that `pod` of `region` holds `epoch`, heard at `now_ms`.
    pub fn record(&mut self, pod: &str, region: &str, epoch: Epoch, now_ms: Millis) {
        let key = (region.to_string(), pod.to_string());
        if !self.pods.contains_key(&key) {
            *self.per_region.entry(region.to_string()).or_insert(0) += 1;
        }
        let entry = self.pods.entry(key).or_insert(PodAck {
            region: region.to_string(),
            epoch,
            at_ms: now_ms,
            used: Vec::new(),
            since_ms: now_ms,
        });
        if now_ms - entry.at_ms > self.quiet_ms {
            entry.since_ms = now_ms;
        }
        entry.epoch = epoch;
        entry.at_ms = entry.at_ms.max(now_ms);
    }

    /// Records what a pod saw of `rule`'s window starting at `window_start_ms`
    /// (after [`AckTracker::record`] for the same report).
    pub fn record_use(
        &mut self,
        pod: &str,
        region: &str,
        rule: &str,
        window_start_ms: Millis,
        used: WindowUse,
    ) {
        let Some(entry) = self.pods.get_mut(&(region.to_string(), pod.to_string())) else {
            return;
        };
        let at_ms = entry.at_ms;
        let report = UseReport {
            rule: rule.to_string(),
            window_start_ms,
            used,
            at_ms,
            recent: None,
        };
        match entry.used.iter_mut().find(|u| u.rule == rule) {
            Some(last) if window_start_ms == last.window_start_ms => {
                // A later report of the same window: the count's rise since
                // the last one is the region's pace now. A count that fell
                // (the pod restarted) has no pace; one heard at the same
                // moment as the last keeps the last one's.
                let over_ms = at_ms - last.at_ms;
                *last = if over_ms > 0 {
                    UseReport {
                        recent: used.count.checked_sub(last.used.count).map(|hits| Recent {
                            hits,
                            over_ms: over_ms as u64,
                        }),
                        ..report
                    }
                } else {
                    UseReport {
                        at_ms: last.at_ms,
                        recent: last.recent,
                        ..report
                    }
                };
            }
            Some(last) if window_start_ms > last.window_start_ms => *last = report,
            Some(_) => {}
            None => entry.used.push(report),
        }
    }

    /// What `region`'s pods heard within `within_ms` reported of `rule`'s
    /// window starting at `window_start_ms`.
    pub fn region_use(
        &self,
        region: &str,
        rule: &str,
        window_start_ms: Millis,
        now_ms: Millis,
        within_ms: i64,
    ) -> RegionWindow {
        let mut out = RegionWindow::default();
        for pod in self.pods.values().filter(|p| p.region == region) {
            if pod.at_ms < now_ms - within_ms {
                continue;
            }
            out.live += 1;
            out.settled_since = out.settled_since.max(pod.since_ms);
            if let Some(u) = pod
                .used
                .iter()
                .find(|u| u.rule == rule && u.window_start_ms == window_start_ms)
            {
                out.reported += 1;
                out.used.count = out.used.count.max(u.used.count);
                out.used.cap = out.used.cap.max(u.used.cap);
                if let Some(pace) = u.recent {
                    out.keep_faster(pace);
                }
            }
        }
        out
    }

    /// The region's acknowledged epoch — the oldest held by any pod heard
    /// within `window_ms` — and when it was last heard. Pods silent for
    /// longer do not hold the region back (their lease covers them).
    pub fn region(
        &self,
        region: &str,
        now_ms: Millis,
        window_ms: i64,
    ) -> (Option<Epoch>, Option<Millis>) {
        let mut acked: Option<Epoch> = None;
        let mut heard: Option<Millis> = None;
        for pod in self.pods.values().filter(|p| p.region == region) {
            heard = Some(heard.map_or(pod.at_ms, |h| h.max(pod.at_ms)));
            if pod.at_ms >= now_ms - window_ms {
                acked = Some(acked.map_or(pod.epoch, |a| a.min(pod.epoch)));
            }
        }
        (acked, heard)
    }

    /// Pods of `region` heard within `window_ms` (at least 1): a pod's pace
    /// times this is the region's, as a load balancer spreads a key's
    /// traffic over a region's pods.
    pub fn live_pods(&self, region: &str, now_ms: Millis, window_ms: i64) -> usize {
        self.pods
            .values()
            .filter(|p| p.region == region && p.at_ms >= now_ms - window_ms)
            .count()
            .max(1)
    }

    /// Drops pods silent for longer than `window_ms`.
    pub fn forget_before(&mut self, cutoff_ms: Millis) {
        let per_region = &mut self.per_region;
        self.pods.retain(|(region, _), p| {
            let keep = p.at_ms >= cutoff_ms;
            if !keep && let Some(n) = per_region.get_mut(region) {
                *n = n.saturating_sub(1);
            }
            keep
        });
        per_region.retain(|_, n| *n > 0);
    }

    /// Every pod heard, with the epoch it holds, by region then pod (admin API).
    pub fn pods(&self) -> Vec<PodEpoch> {
        let mut out: Vec<PodEpoch> = self
            .pods
            .iter()
            .map(|((region, pod), p)| PodEpoch {
                region: region.clone(),
                pod: pod.clone(),
                epoch: p.epoch,
                last_heard_ms: p.at_ms,
            })
            .collect();
        out.sort_by(|a, b| (&a.region, &a.pod).cmp(&(&b.region, &b.pod)));
        out
    }
}

/// One pod as the leader last heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEpoch {
    /// The pod's region.
    pub region: String,
    /// The pod's name, unique within its region.
    pub pod: String,
    /// The allocation epoch it holds (its acknowledgement).
    pub epoch: Epoch,
    /// When the pod last reported or acknowledged.
    pub last_heard_ms: Millis,
}
