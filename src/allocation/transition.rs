//! Shrink before grow: one round's move of a rule's slots (the split or a
//! key entry) from what they grant toward their targets. Decreases are
//! published at once; increases only out of `L − Σ bound`, capacity no
//! region may still be enforcing, so Σ `bound` ≤ L holds in every epoch.
//! Within a window whose use every region reported, an unused shrink and a
//! grow that fits apply at once, and a swing is handed over in steps (down
//! to what the shrinking region still needs, up by what fits) until the
//! boundary ([`transition_tracked`]).

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
    /// `paces`: each region's demand per window for these slots, when this
    /// round measured it.
    pub(super) fn apply(
        &self,
        slots: &mut [Slot],
        old: &mut Vec<u64>,
        high_water: Option<&mut u64>,
        paces: Option<&[f64]>,
    ) {
        old.clear();
        old.extend(slots.iter().map(|s| s.granted));
        let in_window = self.in_window.map(|w| (w, paces));
        transition_tracked(slots, self.limit, self.epoch, high_water, in_window);
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
            // A step grow keeps the part it takes now until the boundary.
            if slot.before_until_ms != end {
                slot.before_until_ms = 0;
            }
        } else if slot.before_until_ms != end {
            slot.before = *old;
            slot.before_until_ms = end;
        }
    }
}

/// A step down within the window frees at least this share of `L`, or it
/// is not taken: smaller steps moved rejections between contended regions
/// more than they freed capacity (llm-tokens scenario).
pub const STEP_SHRINK_FROM: f64 = 0.15;

/// What a slot may enforce for the rest of the window when its whole grow
/// does not fit: `limit` less what the `others` may admit, if that is more
/// than the slot may admit already (`now_use`). The whole grow still
/// applies from the boundary (a step grow: `before` until then).
fn partial_room(limit: u64, others: u64, now_use: u64) -> Option<u64> {
    let room = limit.checked_sub(others)?;
    (room > now_use).then_some(room)
}

/// Shrink before grow: decreases are published now; increases are granted
/// only out of `limit − Σ bound` (capacity nobody may still be enforcing),
/// shared in proportion to what each grower still wants.
pub fn transition(slots: &mut [Slot], limit: u64, epoch: Epoch) {
    transition_tracked(slots, limit, epoch, None, None);
}

/// Where a shrink of region `i` to `to` steps down within the window, if it
/// does ([`InWindow::shrink_step`]): never below the pace of the region's
/// own demand (`paces`, with headroom), so a step frees only what the
/// region would not use — a region that lost its share to another's growth
/// but still asks as much (steady contention) keeps it to the boundary,
/// where a step only moved rejections between regions and cost capacity
/// (steady scenario: false rejections 0.1 → 0.2 %). No step without a
/// measured pace: a pace of 0 is a key the region has not reported yet (a
/// new key's first window, where steps cut regions that were still being
/// heard from), not a region whose traffic stopped.
fn step_for(
    w: &InWindow,
    paces: Option<&[f64]>,
    i: usize,
    to: u64,
    old: u64,
    limit: u64,
) -> Option<u64> {
    let pace = paces?
        .get(i)
        .copied()
        .filter(|p| p.is_finite() && *p > 0.0)?;
    let floor = (pace.ceil() as u64).max(to);
    w.shrink_step(i, floor)
        .filter(|s| *s < old && (old - *s) as f64 >= STEP_SHRINK_FROM * limit as f64)
}

/// A shrink decided in an earlier round of `w`'s window that waits for the
/// boundary: the region enforces `before` (above `granted`) until then.
fn waits_shrunk(slot: &Slot, w: &InWindow) -> bool {
    !slot.shrink_now && enforced_in(slot, w) > slot.granted
}

/// What the region enforces for the rest of `w`'s window: `before` after a
/// shrink of this window that waits for the boundary or steps down, else
/// `granted`.
fn enforced_in(slot: &Slot, w: &InWindow) -> u64 {
    if !slot.immediate && slot.before_until_ms == w.until_ms && slot.before > slot.granted {
        slot.before
    } else {
        slot.granted
    }
}

/// How slot `i`'s shrink to `granted` from `enforced` (what the region
/// enforces this window) applies within `w`'s window: at once when the
/// region has not used it yet; in a step down to what it still needs;
/// else at the boundary — recorded in `before` (the region keeps
/// `enforced` until then; pods ignore a `before` above the value of a
/// change that is neither `immediate` nor `shrink_now`), so that a later
/// round of the window can still step it once the region's pace shows.
fn shrink_in_window(
    slot: &mut Slot,
    w: &InWindow,
    paces: Option<&[f64]>,
    i: usize,
    enforced: u64,
    limit: u64,
) {
    if w.may_shrink_now(i, slot.granted) {
        slot.shrink_now = true;
        if slot.before >= slot.granted {
            // A step or a wait of an earlier round: this shrink goes below
            // it now.
            slot.before = 0;
            slot.before_until_ms = 0;
        }
    } else if let Some(step) = step_for(w, paces, i, slot.granted, enforced, limit) {
        slot.shrink_now = true;
        slot.before = step;
        slot.before_until_ms = w.until_ms;
    } else {
        // A record of this window (a wait, a step, the value of a grow that
        // waits) already holds what the region enforces until the boundary.
        if slot.before_until_ms != w.until_ms && enforced > slot.granted {
            slot.before = enforced;
            slot.before_until_ms = w.until_ms;
        }
        return;
    }
    slot.now_until_ms = w.until_ms;
}

/// [`transition`], also tracking the highest Σ bound ever issued: grows that
/// fit under `limit − high_water` are marked `immediate`. With the current
/// window's use known (`in_window`), a shrink the region has not used yet
/// applies at once (`shrink_now`), and a grow that fits under `L` minus what
/// every region may still admit this window is `immediate` for the rest of
/// the window — the grow of this round, and one of an earlier round of the
/// window that waited for the boundary when it did not fit then (the
/// shrink it waited for was applied since); a grow only part of which fits
/// takes that part now (`before`, a step grow) and the whole from the
/// boundary. A shrink whose region used
/// more than the new value's pace steps down at once to what it counted
/// plus that pace for the rest of the window ([`InWindow::shrink_step`]),
/// and to the new value at the boundary — never below the pace of its own
/// demand (`paces`: each region's demand per window, with headroom, when the
/// round measured it; see [`step_for`]).
pub fn transition_tracked(
    slots: &mut [Slot],
    limit: u64,
    epoch: Epoch,
    high_water: Option<&mut u64>,
    in_window: Option<(&InWindow, Option<&[f64]>)>,
) {
    let paces = in_window
        .and_then(|(_, p)| p)
        .filter(|p| p.len() == slots.len());
    let in_window = in_window
        .map(|(w, _)| w)
        .filter(|w| w.regions.len() == slots.len());
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.target < slot.granted {
            // What the region enforces this window: a shrink of an earlier
            // round that waits for the boundary still leaves it the value
            // it had (`before`).
            let enforced = in_window.map_or(slot.granted, |w| enforced_in(slot, w));
            slot.granted = slot.target;
            slot.since = epoch;
            slot.immediate = false;
            slot.shrink_now = false;
            slot.now_until_ms = 0;
            if let Some(w) = in_window {
                shrink_in_window(slot, w, paces, i, enforced, limit);
            }
        } else if let Some(w) =
            in_window.filter(|w| slot.target == slot.granted && waits_shrunk(slot, w))
        {
            // A shrink of an earlier round of this window that waited for
            // the boundary: the region's pace may have fallen since (the
            // estimate that held the step back trails a swing by rounds).
            let enforced = slot.before;
            shrink_in_window(slot, w, paces, i, enforced, limit);
            if slot.shrink_now {
                // Published in this epoch: until the region acknowledges
                // it, it may still enforce what it had.
                slot.since = epoch;
                slot.bound = slot.bound.max(enforced);
            }
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
            let to = slot.granted + g;
            slot.since = epoch;
            slot.shrink_now = false;
            slot.now_until_ms = 0;
            slot.immediate = given <= never_issued;
            if !slot.immediate
                && let (Some(total), Some(before), Some(w)) = (admissible, before, complete)
            {
                let others = total - before;
                let now = if others + before.max(to) <= limit {
                    // The whole grow, at once.
                    slot.before_until_ms = 0;
                    Some(to)
                } else if let Some(room) = partial_room(limit, others, before) {
                    // Only part of it fits this window: that part now, the
                    // whole from the boundary.
                    slot.before = room;
                    slot.before_until_ms = w.until_ms;
                    Some(room)
                } else {
                    None
                };
                if let Some(now) = now {
                    slot.immediate = true;
                    admissible = Some(others + before.max(now));
                    slot.now_until_ms = w.until_ms;
                }
            }
            slot.granted = to;
            slot.bound = slot.bound.max(to);
        }
    }
    // A grow of an earlier round of this window that waited for the
    // boundary: what every other region may admit now may have room for it
    // (or part of it) since — the shrink it waited for was applied and
    // reported. Only when no pod of any region started within the window:
    // a pod that did reports a count that misses what its region admitted
    // before it.
    if let Some(w) = complete.filter(|w| w.settled()) {
        for i in 0..slots.len() {
            let slot = slots[i];
            // Waiting for the boundary, whole or in part (a step grow).
            let waiting = slot.before_until_ms == w.until_ms && slot.granted > slot.before;
            if !waiting || slot.shrink_now {
                continue;
            }
            let others: u64 = slots
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .filter_map(|(j, s)| window_use(j, s))
                .sum();
            // What the region may admit this window without the grow.
            let u = w.regions[i].used;
            let now_use = u.count.max(u.cap).max(slot.before);
            let slot = &mut slots[i];
            if others + now_use.max(slot.granted) <= limit {
                slot.before_until_ms = 0;
            } else if let Some(room) = partial_room(limit, others, now_use) {
                slot.before = room;
            } else {
                continue;
            }
            slot.immediate = true;
            slot.now_until_ms = w.until_ms;
        }
    }
    if let Some(hw) = high_water {
        *hw = (*hw).max(bound + given);
    }
}
