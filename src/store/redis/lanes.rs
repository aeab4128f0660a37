//! Lanes: one Redis connection per serving thread.
//!
//! A limiter that runs one event loop per core (see `limiter::workers`) would,
//! with one shared connection, hand every check to the thread that owns the
//! connection's I/O task and be woken back: two cross-thread wake-ups per
//! check, which cost more CPU than the check. Each serving thread instead
//! opens its own lane (a connection and a coalescing task on its own event
//! loop) and checks made on that thread use it. Anything else (the
//! approximate path's flusher, readiness probes, an embedding application's
//! threads) uses the store's first connection.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use super::{RedisConfig, RedisStore, coalesce, open};
use crate::store::StoreError;

thread_local! {
    static LANE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Checks made on this thread from now on use lane `index` once it is open.
pub fn bind_thread(index: usize) {
    LANE.with(|lane| lane.set(Some(index)));
}

pub(super) struct Lanes {
    config: RedisConfig,
    open: Box<[OnceLock<RedisStore>]>,
}

impl Lanes {
    pub(super) fn new(config: &RedisConfig) -> Lanes {
        Lanes {
            config: config.clone(),
            open: (0..config.lanes).map(|_| OnceLock::new()).collect(),
        }
    }

    /// This thread's lane, if it has one open.
    pub(super) fn current(&self) -> Option<&RedisStore> {
        let index = LANE.with(Cell::get)?;
        self.open.get(index)?.get()
    }
}

impl RedisStore {
    /// Opens lane `index`: its connection and coalescing task run on the
    /// calling runtime, which should be the one the thread bound to `index`
    /// (`bind_thread`) serves on. Opening a lane twice keeps the first.
    pub async fn open_lane(&self, index: usize) -> Result<(), StoreError> {
        let Some(lanes) = &self.lanes else {
            return Err(StoreError::Reply(
                "this store was connected without lanes (RedisConfig::lanes = 0)".into(),
            ));
        };
        let Some(slot) = lanes.open.get(index) else {
            return Err(StoreError::Reply(format!(
                "lane {index} does not exist: the store has {} (RedisConfig::lanes)",
                lanes.open.len()
            )));
        };
        let mut lane = RedisStore {
            connection: open(&lanes.config).await?,
            scripts: self.scripts.clone(),
            flush: self.flush.clone(),
            multi: self.multi.clone(),
            clear: self.clear.clone(),
            reservations: self.reservations.clone(),
            deadline: self.deadline,
            coalescer: None,
            lanes: None,
            repairing: Default::default(),
            repair_timeout: lanes.config.connect_timeout,
        };
        lane.coalescer = Some(Arc::new(coalesce::Coalescer::start(lane.clone())));
        let _ = slot.set(lane);
        Ok(())
    }

    /// The store to send this thread's calls through: its lane, or this one.
    pub(super) fn here(&self) -> &RedisStore {
        self.lanes
            .as_ref()
            .and_then(|lanes| lanes.current())
            .unwrap_or(self)
    }
}
