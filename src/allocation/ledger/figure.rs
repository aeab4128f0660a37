//! What the ledger answers: one period's world-wide figure against its
//! bound, and what it did not take.

use std::sync::Arc;

use crate::allocation::Millis;

/// One clock-aligned period of one rule, world-wide.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodFigure {
    /// The period's start, Unix ms (a multiple of `period_ms`).
    pub start_ms: Millis,
    /// The rule's period when it was measured.
    pub period_ms: u64,
    /// `L` when the period was measured.
    pub limit: u64,
    /// The stated bound then ([`Terms::bound`](super::Terms::bound)).
    pub bound: u64,
    /// The busiest tracked key; `None` when no key was reported (then
    /// `admitted` is the all-keys count).
    pub key: Option<Arc<str>>,
    /// That key's world-wide admitted hits: the figure to compare with `L`.
    pub admitted: u64,
    /// The same per region, by region name.
    pub regions: Vec<(Arc<str>, u64)>,
    /// Every key of the rule together.
    pub all_keys: u64,
    /// The same per region, by region name.
    pub all_keys_regions: Vec<(Arc<str>, u64)>,
    /// Pods whose counts are in the figure.
    pub pods: u32,
    /// Keys tracked in the period.
    pub keys: u32,
    /// Every pod counted was heard after the period ended and none was
    /// refused: the figure is final. Otherwise it is a lower bound.
    pub complete: bool,
}

impl PeriodFigure {
    /// Whether the world admitted more than the stated bound.
    pub fn over_bound(&self) -> bool {
        self.admitted > self.bound
    }

    /// `admitted / L` (0 when `L` is 0).
    pub fn ratio(&self) -> f64 {
        if self.limit == 0 {
            0.0
        } else {
            self.admitted as f64 / self.limit as f64
        }
    }

    /// When the period ends.
    pub fn end_ms(&self) -> Millis {
        self.start_ms
            .saturating_add(Millis::try_from(self.period_ms).unwrap_or(Millis::MAX))
    }
}

/// One key's counts in one open period: what `GET /api/v1/usage` shows.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyFigure {
    /// The period's start, Unix ms.
    pub start_ms: Millis,
    /// The rule's period when it was measured.
    pub period_ms: u64,
    /// `L` when the period was measured.
    pub limit: u64,
    /// The key's world-wide admitted hits so far; `None` when the key is
    /// not among the period's tracked keys (its count is unknown, not 0).
    pub admitted: Option<u64>,
    /// Every region that reported the period, by name.
    pub regions: Vec<RegionKeyCount>,
}

/// One region's share of a [`KeyFigure`].
#[derive(Debug, Clone, PartialEq)]
pub struct RegionKeyCount {
    /// The region's name.
    pub region: Arc<str>,
    /// The sum of its pods' latest counts of the key (a pod that did not
    /// report the key counts 0); `None` when the key is not tracked.
    pub admitted: Option<u64>,
    /// Pods of the region that reported the period.
    pub pods: u32,
    /// Of those, pods that reported the key.
    pub pods_with_key: u32,
    /// When the leader took the region's newest count of the period
    /// (Unix ms, its clock).
    pub newest_report_ms: Millis,
    /// When it took the count of the pod heard least recently: the region's
    /// figure is at most this old.
    pub oldest_report_ms: Millis,
}

/// Reports (entries) the ledger did not take, by reason, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// For a rule that is not a global rule of the leader.
    pub unknown_rule: u64,
    /// A period start that is not a multiple of the rule's period.
    pub misaligned: u64,
    /// A period more than one period ahead of the leader's clock.
    pub future: u64,
    /// A period already finished.
    pub late: u64,
    /// A pod beyond [`MAX_PODS_PER_REGION`](super::MAX_PODS_PER_REGION) in a period, or a region beyond
    /// [`MAX_REGIONS`](super::MAX_REGIONS).
    pub pods: u64,
    /// A key less busy than every one of the [`MAX_KEYS`](super::MAX_KEYS) tracked.
    pub keys: u64,
}
