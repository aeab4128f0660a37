//! The approximate path's write side: many keys' local deltas applied in one
//! script call (`scripts/approximate_flush.lua`; the batcher keeps calls to
//! `limiter::flush_plan::MAX_KEYS_PER_CALL` keys, one shard or slot each),
//! answering with the global counts every pod's hits add up to. Each call
//! carries a flush id that Redis remembers, so sending a call again after a
//! timeout cannot count its deltas twice.

use std::collections::HashMap;
use std::time::Duration;

use redis::Script;

use super::{Connection, RedisStore};
use crate::algorithm::{Algorithm, Micros, Params};
use crate::store::StoreError;

/// One key's hits admitted locally and not yet in Redis.
#[derive(Debug, Clone)]
pub struct Delta {
    /// `mr:{<rule>:<key>}` (see `store::key`).
    pub prefix: String,
    /// Window index the hits were admitted in (fixed window, sliding counter; 0 for a bucket).
    pub window: u64,
    pub hits: u64,
    pub params: Params,
}

/// What Redis holds for a key once a flush applied its delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Global {
    /// Count of the delta's window (fixed window).
    Window { count: u64 },
    /// Count of the delta's window and of the window before (sliding counter).
    Sliding { count: u64, previous: u64 },
    /// Tokens left in scaled units, at `tick` (token bucket).
    Bucket { tokens: u64, tick: u64 },
}

/// A flush's answer: the server clock and one [`Global`] per delta, in order.
#[derive(Debug, Clone)]
pub struct Flushed {
    pub server_now: Micros,
    pub globals: Vec<Global>,
}

pub(super) fn flush_script() -> Script {
    Script::new(concat!(
        include_str!("scripts/bucket_rescale.lua"),
        include_str!("scripts/approximate_flush.lua")
    ))
}

impl RedisStore {
    /// Splits deltas (by index) into the groups one script call may carry:
    /// everything for a standalone server, one group per hash slot on a Cluster.
    pub(crate) fn shard_groups(&self, deltas: &[Delta]) -> Vec<Vec<usize>> {
        match self.connection {
            Connection::Standalone(_) | Connection::Sentinel(_) => {
                vec![(0..deltas.len()).collect()]
            }
            Connection::Cluster(_) => {
                let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
                for (i, d) in deltas.iter().enumerate() {
                    by_slot.entry(slot(&d.prefix)).or_default().push(i);
                }
                by_slot.into_values().collect()
            }
        }
    }

    /// Applies `deltas` (from one group of [`RedisStore::shard_groups`]) in
    /// one round trip, within the store's deadline, as flush `id`. Redis
    /// applies one id at most once within `id_ttl`: on error the caller does
    /// not know whether the call ran, and sends the same id and deltas again.
    pub(crate) async fn apply_deltas(
        &self,
        id: u64,
        id_ttl: Duration,
        deltas: &[&Delta],
    ) -> Result<Flushed, StoreError> {
        let Some(first) = deltas.first() else {
            return Err(StoreError::Reply("a flush of no deltas".into()));
        };
        let mut cmd = redis::Cmd::with_capacity(5 + 10 * deltas.len(), 160 + 128 * deltas.len());
        cmd.arg("EVALSHA")
            .arg(self.flush.get_hash())
            .arg(deltas.len() + 1)
            .arg(flush_id_key(&first.prefix, id));
        for d in deltas {
            cmd.arg(&d.prefix);
        }
        cmd.arg(id_ttl.as_millis().max(1) as u64);
        for d in deltas {
            let p = &d.params;
            let scale = p.scale();
            let tag = match p.algorithm() {
                Algorithm::FixedWindow => "fw",
                Algorithm::SlidingWindowCounter => "sc",
                Algorithm::TokenBucket => "tb",
                other => {
                    return Err(StoreError::Reply(format!(
                        "{other} has no approximate path"
                    )));
                }
            };
            cmd.arg(tag)
                .arg(d.window)
                .arg(d.hits)
                .arg(p.period_us())
                .arg(p.tick_us())
                .arg(scale.unit)
                .arg(scale.refill)
                .arg(scale.capacity)
                .arg(p.ttl_floor_us());
        }
        flushed_from_reply(deltas, &self.invoke(&self.flush, &cmd).await?)
    }
}

/// The key that remembers flush `id`: under the first delta's prefix, so it
/// shares the hash tag (and the Cluster slot) of the call's keys.
fn flush_id_key(prefix: &str, id: u64) -> String {
    format!("{prefix}:f:{id:016x}")
}

fn flushed_from_reply(deltas: &[&Delta], reply: &[i64]) -> Result<Flushed, StoreError> {
    let bad = || StoreError::Reply(format!("flush of {} keys answered {reply:?}", deltas.len()));
    let (&now, pairs) = reply.split_first().ok_or_else(bad)?;
    if pairs.len() != 2 * deltas.len() {
        return Err(bad());
    }
    let nn = |v: i64| u64::try_from(v).map_err(|_| bad());
    let globals = deltas
        .iter()
        .zip(pairs.chunks_exact(2))
        .map(|(d, pair)| {
            let (a, b) = (nn(pair[0])?, nn(pair[1])?);
            Ok(match d.params.algorithm() {
                Algorithm::SlidingWindowCounter => Global::Sliding {
                    count: a,
                    previous: b,
                },
                Algorithm::TokenBucket => Global::Bucket { tokens: a, tick: b },
                _ => Global::Window { count: a },
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Flushed {
        server_now: nn(now)?,
        globals,
    })
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let len = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &bytes[open + 1..open + 1 + len])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::{flush_id_key, slot};

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // The examples of the `CLUSTER KEYSLOT` documentation.
        assert_eq!(slot("somekey"), 11058);
        assert_eq!(slot("foo{hash_tag}"), 2515);
        assert_eq!(slot("{hash_tag}.other"), 2515);
        // An empty tag does not count: the whole key is hashed.
        assert_ne!(slot("a{}x"), slot("b{}x"));
    }

    #[test]
    fn a_flush_id_lives_in_the_slot_of_its_calls_keys() {
        let prefix = "mr:{per_customer:42}";
        let id_key = flush_id_key(prefix, 0xabc);
        assert_eq!(id_key, "mr:{per_customer:42}:f:0000000000000abc");
        assert_eq!(slot(&id_key), slot(&format!("{prefix}:fw:123")));
    }
}
