//! Bulk imports staged in chunks. One Raft log entry must reach every
//! follower within a heartbeat (openraft times an AppendEntries out after
//! one), so a large import is never one entry: its rows arrive as chunks of
//! at most [`CHUNK_ROWS`], each its own entry, and a last, small entry
//! applies the whole import at once — all or nothing, as one change. An
//! import whose last entry never comes (its proposer died) is dropped after
//! [`IMPORT_TTL_MS`].

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{MAX_OVERRIDES, Override};

/// Rows per staged chunk: about 45 KB as one log entry, so 32 of them (a
/// lagging follower's batch, 1.4 MB) still cross a region within a
/// heartbeat. With 1,000 rows (6.4 MB batches) a loaded test machine saw
/// its followers fall behind for seconds while a 100,000-row import was
/// replicated.
pub const CHUNK_ROWS: usize = 250;

/// How long a staged import waits for the entry that applies it.
pub const IMPORT_TTL_MS: i64 = 10 * 60 * 1000;

/// One staged import.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// When its first chunk was staged (the proposer's clock).
    pub at_unix_ms: i64,
    /// Its chunks in order; shared, so staging one more copies no rows.
    pub chunks: Vec<Arc<Vec<Override>>>,
}

impl Import {
    /// Rows staged.
    pub fn rows(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }
}

/// Every staged import, by the id its proposer chose.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imports {
    pub by_id: BTreeMap<u64, Import>,
}

impl Imports {
    /// Stages chunk `seq` of import `id` at `now`; refused when out of
    /// order, over [`CHUNK_ROWS`], or past [`MAX_OVERRIDES`] staged in all.
    pub fn stage(
        &mut self,
        id: u64,
        seq: u32,
        rows: Vec<Override>,
        now_unix_ms: i64,
    ) -> Result<(), String> {
        self.by_id
            .retain(|_, i| now_unix_ms - i.at_unix_ms < IMPORT_TTL_MS);
        if rows.len() > CHUNK_ROWS {
            return Err(format!(
                "a staged chunk holds at most {CHUNK_ROWS} rows, not {}",
                rows.len()
            ));
        }
        let held = self.by_id.get(&id).map_or(0, |i| i.chunks.len());
        if seq as usize != held {
            return Err(format!(
                "import {id}: chunk {seq} arrived, chunk {held} was expected (its earlier \
                 chunks were dropped or the import expired); start the import again"
            ));
        }
        let staged: usize = self.by_id.values().map(Import::rows).sum();
        if staged + rows.len() > MAX_OVERRIDES {
            return Err(format!(
                "imports would stage {} rows, over the bound of {MAX_OVERRIDES}",
                staged + rows.len()
            ));
        }
        let import = self.by_id.entry(id).or_insert_with(|| Import {
            at_unix_ms: now_unix_ms,
            chunks: Vec::new(),
        });
        import.chunks.push(Arc::new(rows));
        Ok(())
    }

    /// Takes import `id`'s rows (it is no longer staged).
    pub fn take(&mut self, id: u64) -> Option<Vec<Override>> {
        let import = self.by_id.remove(&id)?;
        Some(
            import
                .chunks
                .into_iter()
                .flat_map(|c| Arc::unwrap_or_clone(c).into_iter())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Vec<Override> {
        (0..n)
            .map(|i| Override {
                domain: "api".into(),
                entries: Vec::new(),
                rule: "api|customer".into(),
                rule_name: None,
                key: format!("customer={i}"),
                limit: 2_000,
                burst: None,
                expires_at_unix_ms: None,
                reason: String::new(),
                set_by: String::new(),
                set_at_unix_ms: 0,
            })
            .collect()
    }

    #[test]
    fn chunks_stage_in_order_within_bounds_and_are_taken_whole() {
        let mut imports = Imports::default();
        imports.stage(7, 0, rows(CHUNK_ROWS), 0).expect("first");
        assert!(imports.stage(7, 2, rows(1), 0).is_err(), "out of order");
        assert!(
            imports.stage(7, 1, rows(CHUNK_ROWS + 1), 0).is_err(),
            "too big"
        );
        imports.stage(7, 1, rows(5), 0).expect("second");
        assert_eq!(imports.by_id[&7].rows(), CHUNK_ROWS + 5);
        assert_eq!(imports.take(7).map(|r| r.len()), Some(CHUNK_ROWS + 5));
        assert!(imports.take(7).is_none(), "taken once");
        // An import left behind expires; its next chunk is refused.
        imports.stage(8, 0, rows(1), 0).expect("staged");
        assert!(imports.stage(8, 1, rows(1), IMPORT_TTL_MS).is_err());
        assert!(imports.by_id.is_empty());
    }
}
