//! Reservations in Redis (see `store::reservation`): one call of
//! `scripts/reserve.lua` decides and records a reservation, one call of
//! `scripts/settle.lua` settles it, both on the node that owns the key's
//! hash tag, beside its counters.

use redis::{Cmd, Script};

use super::{RedisStore, decision_from_reply, limit_args, multi_library};
use crate::algorithm::{Micros, precheck};
use crate::store::reservation::{
    GRACE, Hold, LimitSettled, MAX_OPEN_PER_KEY, ReservationError, Reserved, Settle, Settled,
};
use crate::store::{Limit, StoreError, key};

/// The reservation scripts, built from the multi script's library.
pub(super) struct Scripts {
    reserve: Script,
    settle: Script,
    outstanding: Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            reserve: Script::new(&format!(
                "{}{}",
                multi_library(),
                include_str!("scripts/reserve.lua")
            )),
            settle: Script::new(&format!(
                "{}{}",
                multi_library(),
                include_str!("scripts/settle.lua")
            )),
            outstanding: Script::new(include_str!("scripts/outstanding.lua")),
        }
    }
}

impl Scripts {
    /// Every reservation script, for preloading: the first reservations
    /// arrive together as often as not, and each would pay a NOSCRIPT.
    pub(super) fn all(&self) -> [&Script; 3] {
        [&self.reserve, &self.settle, &self.outstanding]
    }
}

impl RedisStore {
    /// Reserves `estimate` against every limit of `hold` for `ttl_us` on
    /// the Redis clock: admitted only when all admit, then charged and
    /// recorded in the same call.
    pub async fn reserve(
        &self,
        hold: Hold<'_>,
        estimate: u64,
        ttl_us: Micros,
    ) -> Result<Reserved, ReservationError> {
        for limit in hold.limits {
            if let Some(denied) = precheck(&limit.params, estimate)? {
                return Ok(Reserved {
                    admitted: false,
                    decisions: vec![denied],
                    expired: 0,
                });
            }
        }
        let mut cmd =
            self.limits_call(&self.reservations.reserve, hold.limits, hold.key, |_| {
                estimate
            })?;
        cmd.arg(hex(hold.nonce))
            .arg(ttl_us)
            .arg(GRACE.as_micros() as u64)
            .arg(MAX_OPEN_PER_KEY);
        let reply = self.here().invoke(&self.reservations.reserve, &cmd).await?;
        let (status, expired) = match reply.as_slice() {
            [status, expired, ..] => (*status, u64::try_from(*expired).unwrap_or(0)),
            _ => return Err(unexpected(&reply)),
        };
        match status {
            -1 => Err(ReservationError::TooManyOpen {
                what: format!(
                    "{} on this key, at most {MAX_OPEN_PER_KEY}",
                    reply.get(2).copied().unwrap_or_default()
                ),
            }),
            -2 => Err(ReservationError::Invalid(
                crate::algorithm::InvalidInput::new(
                    "nonce",
                    "(random)",
                    "collides with a held reservation; reserve again",
                ),
            )),
            0 | 1 => Ok(Reserved {
                admitted: status == 1,
                decisions: reply[2..]
                    .chunks(6)
                    .map(decision_from_reply)
                    .collect::<Result<_, _>>()?,
                expired,
            }),
            _ => Err(unexpected(&reply)),
        }
    }

    /// Settles the reservation `hold.nonce` (see `scripts/settle.lua`); each
    /// limit `j` may go past itself by `overdrafts[j]` hits.
    pub async fn settle(
        &self,
        hold: Hold<'_>,
        how: Settle,
        overdrafts: &[u64],
    ) -> Result<Settled, ReservationError> {
        let mut cmd = self.limits_call(&self.reservations.settle, hold.limits, hold.key, |j| {
            overdrafts.get(j).copied().unwrap_or(0)
        })?;
        let actual: i64 = match how {
            Settle::Commit(actual) => i64::try_from(actual).map_err(|_| {
                crate::algorithm::InvalidInput::new("actual", actual, "must be at most 10^15")
            })?,
            Settle::Release => -1,
        };
        cmd.arg(hex(hold.nonce)).arg(actual);
        let reply = self.here().invoke(&self.reservations.settle, &cmd).await?;
        let settle_of = |a: i64| match u64::try_from(a) {
            Ok(actual) => Settle::Commit(actual),
            Err(_) => Settle::Release,
        };
        let non_negative = |v: i64| u64::try_from(v).map_err(|_| unexpected(&reply));
        match reply.as_slice() {
            [-1, ..] => Err(ReservationError::Unknown),
            [-2, estimate, ..] => Err(ReservationError::Expired {
                estimate: non_negative(*estimate)?,
            }),
            [-3, _, was, ..] => Err(ReservationError::AlreadySettled {
                was: settle_of(*was),
            }),
            [status @ (1 | 2), estimate, was, rest @ .., age, left]
                if rest.len() == 4 * hold.limits.len() =>
            {
                let limits = rest
                    .chunks(4)
                    .map(|l| {
                        Ok(LimitSettled {
                            refunded: non_negative(l[0])?,
                            charged: non_negative(l[1])?,
                            remaining: non_negative(l[2])?,
                            limit: non_negative(l[3])?,
                        })
                    })
                    .collect::<Result<Vec<_>, ReservationError>>()?;
                Ok(Settled {
                    estimate: non_negative(*estimate)?,
                    settled: settle_of(*was),
                    replayed: *status == 2,
                    limits,
                    charged_age_us: non_negative(*age)?,
                    expires_in_us: non_negative(*left)?,
                })
            }
            _ => Err(unexpected(&reply)),
        }
    }

    /// Charges `amount` hits now on every one of `limits` for `key`, limit
    /// `j` at most `overdrafts[j]` past itself: settle.lua's charge with no
    /// record (an empty nonce), on the Redis clock.
    pub async fn charge(
        &self,
        limits: &[Limit],
        key: &str,
        amount: u64,
        overdrafts: &[u64],
    ) -> Result<Vec<LimitSettled>, ReservationError> {
        let mut cmd = self.limits_call(&self.reservations.settle, limits, key, |j| {
            overdrafts.get(j).copied().unwrap_or(0)
        })?;
        let amount = i64::try_from(amount).map_err(|_| {
            crate::algorithm::InvalidInput::new("hits_addend", amount, "must be at most 10^15")
        })?;
        cmd.arg("").arg(amount);
        let reply = self.here().invoke(&self.reservations.settle, &cmd).await?;
        let non_negative = |v: i64| u64::try_from(v).map_err(|_| unexpected(&reply));
        match reply.as_slice() {
            [3, _, _, rest @ ..] if rest.len() == 4 * limits.len() => rest
                .chunks(4)
                .map(|l| {
                    Ok(LimitSettled {
                        refunded: 0,
                        charged: non_negative(l[1])?,
                        remaining: non_negative(l[2])?,
                        limit: non_negative(l[3])?,
                    })
                })
                .collect(),
            _ => Err(unexpected(&reply)),
        }
    }

    /// The estimates of `rule` and `counter_key`'s open reservations,
    /// summed, on the Redis clock (see `scripts/outstanding.lua`).
    pub async fn outstanding(&self, rule: &str, counter_key: &str) -> Result<u64, StoreError> {
        let prefix = key::key_prefix(rule, counter_key)?;
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(self.reservations.outstanding.get_hash())
            .arg(1)
            .arg(prefix);
        let reply = self
            .here()
            .invoke(&self.reservations.outstanding, &cmd)
            .await?;
        match reply.as_slice() {
            [total] => u64::try_from(*total)
                .map_err(|_| StoreError::Reply(format!("negative total {total}"))),
            _ => Err(StoreError::Reply(format!(
                "expected one total, got {reply:?}"
            ))),
        }
    }

    /// EVALSHA of `script` with multi.lua's arguments for `limits` of
    /// `key`, each limit's ninth argument from `ninth(j)`.
    fn limits_call(
        &self,
        script: &Script,
        limits: &[Limit],
        key: &str,
        ninth: impl Fn(usize) -> u64,
    ) -> Result<Cmd, ReservationError> {
        let first: &Limit = limits.first().ok_or_else(|| {
            crate::algorithm::InvalidInput::new("limits", "[]", "a reservation needs a limit")
        })?;
        let prefix = key::key_prefix(&first.rule, key)?;
        let n = limits.len();
        let mut cmd = Cmd::with_capacity(8 + 10 * n, 128 + 96 * n);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(n);
        for j in 0..n {
            // As check_all names each limit's keys.
            match j {
                0 => cmd.arg(prefix.as_str()),
                j => cmd.arg(format!("{prefix}:{j}")),
            };
        }
        // Reservations always run on the Redis clock: their ttl must hold
        // whichever pod settles them.
        cmd.arg("");
        for (j, limit) in limits.iter().enumerate() {
            limit_args(&mut cmd, &limit.params).arg(ninth(j));
        }
        Ok(cmd)
    }
}

fn hex(nonce: &[u8; 16]) -> String {
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

fn unexpected(reply: &[i64]) -> ReservationError {
    ReservationError::Store(StoreError::Reply(format!(
        "unexpected reservation reply {reply:?}"
    )))
}
