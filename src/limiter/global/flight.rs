//! Checks of global rules under way, so a report waits for the ones that
//! read the allocation table before it changed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Checks under way, so a report can wait for those that read the table
/// before it changed: their counts belong in the window use it reports.
///
/// A check enters under the current era; [`Flight::drain`] starts a new era
/// and waits until the old one's checks have left. Drains are serialised
/// (one reporter task), so a slot is never shared by two live eras.
#[derive(Default)]
pub(super) struct Flight {
    /// Bumped by each drain; its parity picks the slot a check enters.
    era: AtomicU64,
    /// Checks inside, per era parity.
    inside: [AtomicU64; 2],
}

/// Leaves the flight when dropped (also when a check fails or is cancelled).
pub struct InFlight<'a> {
    slot: &'a AtomicU64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Flight {
    pub(super) fn enter(&self) -> InFlight<'_> {
        loop {
            let era = self.era.load(Ordering::SeqCst);
            let slot = &self.inside[(era & 1) as usize];
            slot.fetch_add(1, Ordering::SeqCst);
            if self.era.load(Ordering::SeqCst) == era {
                return InFlight { slot };
            }
            slot.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits (at most `limit`) for every check that entered before now to
    /// leave; false if some did not in time.
    pub(super) async fn drain(&self, limit: Duration) -> bool {
        let era = self.era.fetch_add(1, Ordering::SeqCst);
        let slot = &self.inside[(era & 1) as usize];
        let start = Instant::now();
        while slot.load(Ordering::SeqCst) != 0 {
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}
