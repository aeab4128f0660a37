//! The data dir's own record that it holds a store: a small text file beside
//! `coordinator.redb`, written when the store is created and again once the
//! node has stored a vote.
//!
//! Why a file apart from the store: what it must catch is the store itself
//! gone, emptied or replaced (a volume re-provisioned, a bad restore, an
//! operator's `rm`). Anything kept inside `coordinator.redb` goes with it, and
//! an empty store otherwise looks exactly like a new node's: openraft starts
//! it with no log, no vote and no membership, and `--init` (which pod 0 of the
//! shipped StatefulSet always passes) would bootstrap a second cluster under a
//! new id. A node that forgets its vote can vote twice in one term, which is
//! how Raft elects two leaders.
//!
//! The record is written only after the store it describes is durable, and
//! atomically (a temporary file, fsync, rename, fsync of the dir), so a crash
//! leaves either the old record or the new one, never a torn file; a crash
//! before it is written leaves a store without a record, which is what a dir
//! from before the record existed looks like, and is recorded on its next
//! start.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The record's file name inside `--data-dir`.
pub const FILE: &str = "coordinator.redb.created";

/// The line a record holds once the node has stored a vote.
const VOTED: &str = "voted=true";
const CREATED: &str = "created_unix_ms=";

/// What the record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When the store was created (or, for a dir older than the record, when
    /// it was first recorded); 0 if the line is missing or unreadable.
    pub created_unix_ms: i64,
    /// Whether the node had stored a vote by the last time it was written.
    pub voted: bool,
}

/// The record in `dir`, `None` when there is none. Only its presence is
/// load-bearing: a record whose lines cannot be read still says a store was
/// created here.
pub fn read(dir: &Path) -> io::Result<Option<Record>> {
    let text = match std::fs::read_to_string(dir.join(FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let created_unix_ms = text
        .lines()
        .find_map(|l| l.strip_prefix(CREATED))
        .and_then(|ms| ms.trim().parse().ok())
        .unwrap_or(0);
    let voted = text.lines().any(|l| l.trim() == VOTED);
    Ok(Some(Record {
        created_unix_ms,
        voted,
    }))
}

/// Writes `record` into `dir` atomically and durably.
pub fn write(dir: &Path, record: Record) -> io::Result<()> {
    let mut text = format!(
        "# meridian coordinator: {db} was created in this data dir.\n\
         # While this file is here, a missing, empty or unversioned {db} (or one\n\
         # without a vote, once the line below says the node voted) is refused at\n\
         # start. Delete this file only together with {db}, to start the node over.\n\
         {CREATED}{}\n",
        record.created_unix_ms,
        db = super::DB_FILE,
    );
    if record.voted {
        text.push_str(VOTED);
        text.push('\n');
    }
    let path = dir.join(FILE);
    let tmp: PathBuf = dir.join(format!("{FILE}.tmp"));
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    // The rename itself is durable only once the directory is.
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_absent_is_none() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(read(dir.path()).expect("read"), None);
        let record = Record {
            created_unix_ms: 1_700_000_000_123,
            voted: false,
        };
        write(dir.path(), record).expect("write");
        assert_eq!(read(dir.path()).expect("read"), Some(record));
        let voted = Record {
            voted: true,
            ..record
        };
        write(dir.path(), voted).expect("rewrite");
        assert_eq!(read(dir.path()).expect("read"), Some(voted));
        // A record mangled by hand still says a store was created here.
        std::fs::write(dir.path().join(FILE), "garbage").expect("mangle");
        assert_eq!(
            read(dir.path()).expect("read"),
            Some(Record {
                created_unix_ms: 0,
                voted: false
            })
        );
    }
}
