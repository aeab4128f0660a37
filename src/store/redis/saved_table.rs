//! A region's allocation table kept in the region's own Redis, so that a pod
//! that starts while no coordinator answers enforces its region's last
//! table, not nothing (`limiter::global`, `docs/global-limits.md`).
//!
//! One hash per region, `mr:allocation:{<region>}` (its own hash tag, so one
//! slot on a Cluster): `cluster` (the coordinator cluster's id), `epoch`, and
//! `table` (JSON). Written compare-and-set by epoch (`scripts/save_table.lua`).
//! Calls here are off the hot path (once per epoch, once at start) and may
//! carry a table of megabytes, so they get the connect timeout, not the
//! check deadline.

use redis::{FromRedisValue, RedisError, Script};

use super::{Connection, RedisStore, classify};
use crate::store::StoreError;
use crate::store::key::allocation_table_key;

/// What the region's key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTable {
    /// The cluster whose epoch it is ('' when the coordinators named none).
    pub cluster: String,
    /// The table's epoch.
    pub epoch: u64,
    /// The table; empty when the pod that saved it found it too large to
    /// keep (and kept its epoch, so nothing older is restored).
    pub table: Vec<u8>,
}

fn save_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("scripts/save_table.lua")))
}

impl RedisStore {
    /// The (cluster, epoch) the region's key holds, without the table:
    /// whether a save is needed at all.
    pub async fn saved_table_epoch(
        &self,
        region: &str,
    ) -> Result<Option<(String, u64)>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(allocation_table_key(region))
            .arg("cluster")
            .arg("epoch");
        let (cluster, epoch): (Option<String>, Option<u64>) = self.control(&cmd).await?;
        Ok(cluster.zip(epoch))
    }

    /// The region's table, if its key holds one.
    pub async fn load_table(&self, region: &str) -> Result<Option<StoredTable>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(allocation_table_key(region))
            .arg("cluster")
            .arg("epoch")
            .arg("table");
        let (cluster, epoch, table): (Option<String>, Option<u64>, Option<Vec<u8>>) =
            self.control(&cmd).await?;
        Ok(match (cluster, epoch) {
            (Some(cluster), Some(epoch)) => Some(StoredTable {
                cluster,
                epoch,
                table: table.unwrap_or_default(),
            }),
            _ => None,
        })
    }

    /// Keeps `stored` as the region's table unless the key holds the same
    /// cluster's table at the same or a newer epoch; the key expires at
    /// `expire_at_ms` (Unix ms). Returns the epoch kept afterwards.
    pub async fn save_table(
        &self,
        region: &str,
        stored: &StoredTable,
        expire_at_ms: i64,
    ) -> Result<u64, StoreError> {
        let script = save_script();
        let mut invocation = script.key(allocation_table_key(region));
        invocation
            .arg(&stored.cluster)
            .arg(stored.epoch)
            .arg(&stored.table[..])
            .arg(expire_at_ms);
        let within = self.repair_timeout;
        let call = async {
            match self.connection.clone() {
                Connection::Standalone(mut c) => invocation.invoke_async::<u64>(&mut c).await,
                Connection::Cluster(c) => invocation.invoke_async::<u64>(&mut c.connection()).await,
                Connection::Sentinel(mut c) => invocation.invoke_async::<u64>(&mut c).await,
            }
        };
        tokio::time::timeout(within, call)
            .await
            .map_err(|_| StoreError::Timeout(within))?
            .map_err(|e| classify(e, within))
    }

    /// One control-plane command (not a check), within the connect timeout.
    async fn control<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let within = self.repair_timeout;
        let call = async {
            match self.connection.clone() {
                Connection::Standalone(mut c) => cmd.query_async::<T>(&mut c).await,
                Connection::Cluster(c) => cmd.query_async::<T>(&mut c.connection()).await,
                Connection::Sentinel(mut c) => cmd.query_async::<T>(&mut c).await,
            }
        };
        tokio::time::timeout(within, call)
            .await
            .map_err(|_| StoreError::Timeout(within))?
            .map_err(|e: RedisError| classify(e, within))
    }
}
