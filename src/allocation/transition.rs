//! Shrink before grow: one round's move of a rule's slots (the split or a
//! key entry) from what they grant toward their targets. Decreases are
//! published at once; increases only out of `L − Σ bound`, capacity no
//! region may still be enforcing, so Σ `bound` ≤ L holds in every epoch.
//! Within a window whose use every region reported, an unused shrink and a
//! grow that fits apply at once ([`transition_tracked`]).

use super::water_fill::water_fill;
use super::{Epoch, InWindow, Millis, Slot};

/// One round's transition of a rule's slots (the split or a key entry).
pub(super) struct Moves<'a> {
    pub(super) limit: u64,
    pub(super) epoch: Epoch,
    pub(super) in_window: Option<&'a InWindow>,
    pub(super) now_ms: Millis,
    pub(super) window_ms: Option<u64>,
}

impl Moves<'_> {
    /// [`transition_tracked`], then [`remember_window_start`] for what grew.
    pub(super) fn apply(
        &self,
        slots: &mut [Slot],
        old: &mut Vec<u64>,
        high_water: Option<&mut u64>,
    ) {
        old.clear();
        old.extend(slots.iter().map(|s| s.granted));
        transition_tracked(slots, self.limit, self.epoch, high_water, self.in_window);
        remember_window_start(slots, old, self.now_ms, self.window_ms);
    }
}

/// For each slot that grew at the next boundary (not at once), what the
/// region enforced when the current window began (see [`Slot::before`]).
/// A second change within the same window keeps the first one's record.
fn remember_window_start(slots: &mut [Slot], old: &[u64], now: Millis, window_ms: Option<u64>) {
    let Some(p) = window_ms.filter(|p| *p > 0).map(|p| p as Millis) else {
        return;
    };
    let end = (now.div_euclid(p) + 1) * p;
    for (slot, old) in slots.iter_mut().zip(old) {
        if slot.granted <= *old {
            continue;
        }
        if slot.immediate {
            slot.before_until_ms = 0;
        } else if slot.before_until_ms != end {
            slot.before = *old;
            slot.before_until_ms = end;
        }
    }
}

/// Shrink before grow: decreases are published now; increases are granted
/// only out of `limit − Σ bound` (capacity nobody may still be enforcing),
/// shared in proportion to what each grower still wants.
pub fn transition(slots: &mut [Slot], limit: u64, epoch: Epoch) {
    transition_tracked(slots, limit, epoch, None, None);
}

/// [`transition`], also tracking the highest Σ bound ever issued: grows that
/// fit under `limit − high_water` are marked `immediate`. With the current
/// window's use known (`in_window`), a shrink the region has not used yet
/// applies at once (`shrink_now`), and a grow that fits under `L` minus what
/// every region may still admit this window is `immediate` for the rest of
/// the window.
pub fn transition_tracked(
    slots: &mut [Slot],
    limit: u64,
    epoch: Epoch,
    high_water: Option<&mut u64>,
    in_window: Option<&InWindow>,
) {
    let in_window = in_window.filter(|w| w.regions.len() == slots.len());
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.target < slot.granted {
            slot.granted = slot.target;
            slot.since = epoch;
            slot.immediate = false;
            slot.shrink_now = in_window.is_some_and(|w| w.may_shrink_now(i, slot.target));
            slot.now_until_ms = match in_window {
                Some(w) if slot.shrink_now => w.until_ms,
                _ => 0,
            };
        }
    }
    // What each region may still admit this window: a shrink not yet
    // acknowledged counts at its old value (`bound`).
    let complete = in_window.filter(|w| w.complete());
    let window_use = |i: usize, s: &Slot| {
        complete.map(|w| {
            let u = w.regions[i].used;
            u.count.max(u.cap).max(s.bound).max(s.granted)
        })
    };
    let mut admissible: Option<u64> = complete.map(|_| {
        slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| window_use(i, s))
            .sum()
    });
    let bound: u64 = slots.iter().map(|s| s.bound.max(s.granted)).sum();
    let free = limit.saturating_sub(bound);
    let want: Vec<f64> = slots
        .iter()
        .map(|s| s.target.saturating_sub(s.granted) as f64)
        .collect();
    let mut given = 0;
    if free > 0 && want.iter().any(|w| *w > 0.0) {
        let weights: Vec<f64> = want.iter().map(|w| w.max(1e-9)).collect();
        let give = water_fill(free, &want, &weights);
        given = give.iter().sum::<u64>();
        let never_issued = high_water
            .as_deref()
            .map_or(0, |hw| limit.saturating_sub((*hw).max(bound)));
        for (i, (slot, g)) in slots.iter_mut().zip(give).enumerate() {
            if g == 0 {
                continue;
            }
            let before = window_use(i, slot);
            slot.granted += g;
            slot.bound = slot.bound.max(slot.granted);
            slot.since = epoch;
            slot.shrink_now = false;
            slot.now_until_ms = 0;
            slot.immediate = given <= never_issued;
            if !slot.immediate
                && let (Some(total), Some(before), Some(w)) = (admissible, before, complete)
            {
                let after = total - before + before.max(slot.granted);
                if after <= limit {
                    admissible = Some(after);
                    slot.immediate = true;
                    slot.now_until_ms = w.until_ms;
                }
            }
        }
    }
    if let Some(hw) = high_water {
        *hw = (*hw).max(bound + given);
    }
}
