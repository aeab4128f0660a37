//! The engine's stream-done charge (`settle: on_stream_done`, see
//! `limiter::stream_done`): a child of `engine` so that it reaches the
//! store and the reservations' in-flight cap without widening either.

use super::Engine;
use crate::store::reservation::{LimitSettled, ReservationError};
use crate::store::{AnyStore, Limit};

impl Engine {
    /// Charges `amount` hits now on every one of `limits` for `key`, limit
    /// `j` at most `overdrafts[j]` past itself (what is over is not
    /// charged): a reservation's excess with no reservation, never denied.
    /// One store call (`settle.lua` on Redis), behind the reservations'
    /// in-flight cap, not the breaker or the fail mode: the answer goes to
    /// nobody who could wait, so a store failure is the caller's to count.
    pub async fn charge(
        &self,
        limits: &[Limit],
        key: &str,
        amount: u64,
        overdrafts: &[u64],
    ) -> Result<Vec<LimitSettled>, ReservationError> {
        let _permit = self.reservations_in_flight.acquire().await.ok();
        match &self.store {
            AnyStore::Memory(memory) => {
                let now = crate::clock::now_unix_us();
                Ok(memory.charge_at(limits, key, amount, overdrafts, now)?)
            }
            #[cfg(feature = "redis")]
            AnyStore::Redis(redis) => redis.charge(limits, key, amount, overdrafts).await,
        }
    }
}
