//! Pure bookkeeping of the approximate path's flushes (`batcher`): which
//! deltas share one script call, and when a call that failed is sent again.
//! No I/O and no clock reads: the batcher passes `Instant`s in.
//!
//! A call whose answer did not arrive (a timeout, a dropped connection) may
//! or may not have run in Redis. So a failed chunk is sent again *unchanged*:
//! the same flush id and the same deltas. The flush script remembers every id
//! it applied for [`FLUSH_ID_TTL`] and applies a repeated id as nothing, so a
//! chunk counts at most once whatever happened to its earlier sends — as long
//! as every send of it runs in Redis within that time of the first one that
//! ran. Sends therefore stop [`RETRY_WINDOW`] (half the id's lifetime) after
//! the first, or after [`MAX_ATTEMPTS`], whichever comes first; then the
//! chunk is given up and its hits dropped (see `batcher`'s module doc for
//! what that does to the bound).

use std::time::{Duration, Instant};

/// Keys per script call at most. A call holds every other client of its
/// Redis while it runs: the audit's single call of 228,104 keys held it for
/// 2.2 s. Calls of 512 keys took up to 60 ms in Redis's slowlog on the
/// loaded 2-core test box (a debug limiter flooding beside it); 128 keep a
/// call a quarter of that, and one call at a time still moves tens of
/// thousands of keys a second.
pub const MAX_KEYS_PER_CALL: usize = 128;

/// Keys one flush round sends at most (64 calls): a round's work, and the
/// time it holds the flusher, stay bounded however many keys are due.
/// Keys left over are due at once in the next round.
pub const MAX_KEYS_PER_ROUND: usize = 64 * MAX_KEYS_PER_CALL;

/// How long Redis remembers a flush id (the script's `PX`).
pub const FLUSH_ID_TTL: Duration = Duration::from_secs(10);

/// A chunk is sent again only this long after its first send: half the id's
/// lifetime leaves the other half for a send queued in a stalled Redis.
pub const RETRY_WINDOW: Duration = Duration::from_secs(5);

/// Sends of one chunk at most (the first included).
pub const MAX_ATTEMPTS: u32 = 16;

/// Wait before the first retry; doubled per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(25);
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Splits each shard group (indices into the round's deltas, all of one
/// shard or hash slot) into calls of at most `max` deltas, keeping order.
pub fn chunks(groups: Vec<Vec<usize>>, max: usize) -> Vec<Vec<usize>> {
    let max = max.max(1);
    groups
        .into_iter()
        .flat_map(|group| group.chunks(max).map(<[usize]>::to_vec).collect::<Vec<_>>())
        .collect()
}

/// The sends of one chunk so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    /// When the chunk was first sent.
    pub first: Instant,
    /// Sends so far.
    pub count: u32,
    /// Not sent again before this (`flush_now` does not wait for it).
    pub next: Instant,
}

/// What to do with a chunk whose send just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Send it again, same id and deltas, from `Attempts::next` on.
    Retry(Attempts),
    /// Out of sends or out of the id's safe lifetime: drop its hits.
    GiveUp,
}

impl Attempts {
    /// A chunk sent for the first time at `now`.
    pub fn first(now: Instant) -> Attempts {
        Attempts {
            first: now,
            count: 1,
            next: now,
        }
    }

    /// Whether another send may start at `now`: within the retry window and
    /// the attempt cap. Checked before each send, so a chunk whose backoff
    /// outlived the window is given up instead of sent late.
    pub fn may_send(&self, now: Instant) -> bool {
        self.count < MAX_ATTEMPTS && now.saturating_duration_since(self.first) < RETRY_WINDOW
    }

    /// The send counted in `self` failed at `now`.
    pub fn failed(self, now: Instant) -> AfterFailure {
        if !self.may_send(now) {
            return AfterFailure::GiveUp;
        }
        let doublings = self.count.saturating_sub(1).min(16);
        let backoff = (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF);
        AfterFailure::Retry(Attempts {
            next: now + backoff,
            ..self
        })
    }

    /// Counts a new send at `now` (call only when [`Attempts::may_send`]).
    pub fn resent(self) -> Attempts {
        Attempts {
            count: self.count + 1,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_each_group_and_never_mix_groups() {
        let groups = vec![(0..1200).collect::<Vec<_>>(), vec![1200, 1201]];
        let out = chunks(groups, 512);
        let sizes: Vec<usize> = out.iter().map(Vec::len).collect();
        assert_eq!(sizes, [512, 512, 176, 2]);
        assert_eq!(out[3], [1200, 1201], "the second group stays apart");
        let flat: Vec<usize> = out.concat();
        assert_eq!(
            flat,
            (0..1202).collect::<Vec<_>>(),
            "every delta once, in order"
        );
    }

    #[test]
    fn chunks_of_nothing_are_no_calls() {
        assert!(chunks(vec![], 512).is_empty());
        assert!(chunks(vec![vec![]], 512).is_empty());
    }

    #[test]
    fn retries_back_off_and_stop_at_the_attempt_cap() {
        let t0 = Instant::now();
        let mut a = Attempts::first(t0);
        let mut now = t0;
        let mut waits = Vec::new();
        while let AfterFailure::Retry(next) = a.failed(now) {
            waits.push(next.next - now);
            now = next.next;
            if !next.may_send(now) {
                break;
            }
            a = next.resent();
        }
        assert_eq!(
            waits[..3],
            [FIRST_BACKOFF, FIRST_BACKOFF * 2, FIRST_BACKOFF * 4]
        );
        assert!(waits.iter().all(|w| *w <= MAX_BACKOFF));
        assert!(a.count <= MAX_ATTEMPTS);
        assert!(
            now - t0 <= RETRY_WINDOW + MAX_BACKOFF,
            "sends stop near the window"
        );
        assert!(
            !a.resent().may_send(now),
            "no send past the cap or the window"
        );
    }

    #[test]
    fn no_send_after_the_retry_window_even_with_attempts_left() {
        let t0 = Instant::now();
        let a = Attempts::first(t0);
        assert!(a.may_send(t0 + RETRY_WINDOW - Duration::from_millis(1)));
        assert!(!a.may_send(t0 + RETRY_WINDOW));
        assert_eq!(a.failed(t0 + RETRY_WINDOW), AfterFailure::GiveUp);
    }

    #[test]
    fn the_window_fits_in_the_ids_lifetime_with_room_for_a_late_run() {
        const { assert!(RETRY_WINDOW.as_millis() * 2 <= FLUSH_ID_TTL.as_millis()) };
    }
}
