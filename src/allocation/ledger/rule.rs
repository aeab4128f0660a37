//! One rule's ledger: its open periods, finishing them when final, and the
//! history of finished figures (the last hour).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::figure::{Dropped, KeyFigure, PeriodFigure};
use super::period::OpenPeriod;
use super::terms::Terms;
use super::{HOUR_MS, MAX_FINISHED, OPEN_PERIODS, PeriodAdmitted, final_wait_ms};
use crate::allocation::Millis;

/// Tracked keys with their world-wide counts, busiest first.
pub type KeyCounts = Vec<(Arc<str>, u64)>;

/// One rule's open periods and history.
#[derive(Debug)]
pub struct RuleLedger {
    pub(super) terms: Terms,
    pub(super) open: BTreeMap<Millis, OpenPeriod>,
    /// Finished periods, oldest first.
    pub(super) finished: VecDeque<PeriodFigure>,
    /// The newest finished period's start: reports for it or older are late.
    pub(super) finished_through: Option<Millis>,
}

impl RuleLedger {
    pub(super) fn new(terms: Terms) -> RuleLedger {
        RuleLedger {
            terms,
            open: BTreeMap::new(),
            finished: VecDeque::new(),
            finished_through: None,
        }
    }

    /// The terms the figures are stated against.
    pub fn terms(&self) -> &Terms {
        &self.terms
    }

    pub(super) fn period(&self) -> Millis {
        Millis::try_from(self.terms.period_ms).unwrap_or(Millis::MAX)
    }

    pub(super) fn take(
        &mut self,
        region: &Arc<str>,
        pod: &str,
        a: &PeriodAdmitted,
        now: Millis,
        dropped: &mut Dropped,
    ) {
        let p = self.period();
        if p <= 0 || a.period_start_ms.rem_euclid(p) != 0 {
            dropped.misaligned += 1;
            return;
        }
        let start = a.period_start_ms;
        if start > now.saturating_add(p) {
            dropped.future += 1;
            return;
        }
        let finishable = start
            .saturating_add(p)
            .saturating_add(final_wait_ms(self.terms.period_ms))
            <= now;
        if finishable || self.finished_through.is_some_and(|f| start <= f) {
            dropped.late += 1;
            return;
        }
        if !self.open.contains_key(&start) && self.open.len() >= OPEN_PERIODS {
            match self.open.keys().next().copied() {
                Some(oldest) if oldest < start => self.finish(oldest),
                _ => {
                    dropped.late += 1;
                    return;
                }
            }
        }
        let terms = &self.terms;
        let period = self
            .open
            .entry(start)
            .or_insert_with(|| OpenPeriod::new(terms));
        if !period.admit(region, pod) {
            dropped.pods += 1;
            return;
        }
        let slot = match &a.key {
            None => None,
            Some(key) => match period.slot(key, a.admitted) {
                Some(slot) => Some(slot),
                None => {
                    dropped.keys += 1;
                    return;
                }
            },
        };
        period.take(
            (region, pod),
            slot,
            a.admitted,
            now >= start.saturating_add(p),
            now,
        );
    }

    pub(super) fn finish(&mut self, start: Millis) {
        let Some(period) = self.open.remove(&start) else {
            return;
        };
        let figure = period.figure(start);
        self.finished_through = Some(self.finished_through.map_or(start, |f| f.max(start)));
        self.finished.push_back(figure);
        while self.finished.len() > MAX_FINISHED {
            self.finished.pop_front();
        }
    }

    pub(super) fn advance(&mut self, now: Millis) {
        let p = self.period();
        let wait = final_wait_ms(self.terms.period_ms);
        let due: Vec<Millis> = self
            .open
            .keys()
            .copied()
            .filter(|s| s.saturating_add(p).saturating_add(wait) <= now)
            .collect();
        for start in due {
            self.finish(start);
        }
        // The last hour, and the newest two whatever their age (a period
        // longer than an hour still shows its last figures).
        while self.finished.len() > 2
            && self
                .finished
                .front()
                .is_some_and(|f| f.end_ms() < now.saturating_sub(HOUR_MS))
        {
            self.finished.pop_front();
        }
    }

    /// The period containing `now`, as counted so far (zero when no pod
    /// reported it yet).
    pub fn current(&self, now: Millis) -> PeriodFigure {
        let p = self.period().max(1);
        let start = now.div_euclid(p) * p;
        match self.open.get(&start) {
            Some(period) => period.figure(start),
            None => OpenPeriod::new(&self.terms).figure(start),
        }
    }

    /// The periods still open (the current one, the one just ended, …),
    /// oldest first.
    pub fn open(&self) -> Vec<PeriodFigure> {
        self.open
            .iter()
            .map(|(start, period)| period.figure(*start))
            .collect()
    }

    /// The busiest tracked keys of the period containing `now`, at most `n`.
    pub fn top_keys(&self, now: Millis, n: usize) -> Vec<(Arc<str>, u64)> {
        let p = self.period().max(1);
        self.open
            .get(&(now.div_euclid(p) * p))
            .map(|period| period.top_keys(n))
            .unwrap_or_default()
    }

    /// The start of the period containing `now`.
    pub fn period_start(&self, now: Millis) -> Millis {
        let p = self.period().max(1);
        now.div_euclid(p) * p
    }

    /// `key`'s counts in the open period that starts at `start_ms`;
    /// `None` when that period is not open (no pod reported it yet, or it
    /// is final and only its busiest key's figure is kept).
    pub fn key_figure(&self, key: &str, start_ms: Millis) -> Option<KeyFigure> {
        self.open
            .get(&start_ms)
            .map(|period| period.key_figure(start_ms, key))
    }

    /// Every open period that began by `now`, oldest first: its start and
    /// its tracked keys with their world-wide counts, busiest first.
    pub fn tracked_keys(&self, now: Millis) -> Vec<(Millis, KeyCounts)> {
        self.open
            .range(..=now)
            .map(|(start, period)| (*start, period.top_keys(usize::MAX)))
            .collect()
    }

    /// Finished periods, oldest first.
    pub fn finished(&self) -> &VecDeque<PeriodFigure> {
        &self.finished
    }

    /// The finished period of the last `within_ms` (ended since) with the
    /// largest `admitted / L`; the newest of equals.
    pub fn worst_within(&self, now: Millis, within_ms: Millis) -> Option<&PeriodFigure> {
        self.finished
            .iter()
            .filter(|f| f.end_ms() >= now.saturating_sub(within_ms))
            .max_by(|a, b| {
                a.ratio()
                    .total_cmp(&b.ratio())
                    .then(a.start_ms.cmp(&b.start_ms))
            })
    }

    /// Finished periods of the last `within_ms` above their stated bound.
    pub fn over_bound_within(&self, now: Millis, within_ms: Millis) -> usize {
        self.finished
            .iter()
            .filter(|f| f.end_ms() >= now.saturating_sub(within_ms) && f.over_bound())
            .count()
    }

    pub(super) fn bytes(&self) -> usize {
        let open: usize = self.open.values().map(OpenPeriod::bytes).sum();
        let finished: usize = self
            .finished
            .iter()
            .map(|f| {
                std::mem::size_of::<PeriodFigure>()
                    + (f.regions.capacity() + f.all_keys_regions.capacity())
                        * std::mem::size_of::<(Arc<str>, u64)>()
                    + f.key.as_ref().map_or(0, |k| k.len() + 16)
            })
            .sum();
        std::mem::size_of::<RuleLedger>() + self.terms.rule.capacity() + open + finished
    }
}
