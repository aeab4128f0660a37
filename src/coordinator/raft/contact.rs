//! What this node heard from the leader and from its peers, as the Raft
//! transport records it, and whether that makes it caught up with the
//! leader's commit. The client stamps [`PeerContacts`] on every answer from
//! a peer; the service tells [`LeaderContact`] the commit each AppendEntries
//! carries. Both live here, below the transport that writes them and the
//! coordinator's `freshness` (whether to serve watches), which reads them.
//!
//! openraft 0.9's metrics do not say whether a node is caught up: a
//! follower's committed index is the smaller of the leader's commit and what
//! it has accepted, so a node that replays a backlog looks
//! committed-and-applied at every step, and nothing times the leader's last
//! message on a follower. So the Raft service tells [`LeaderContact`] the
//! commit every AppendEntries carries (`leader_commit`), and "caught up"
//! means:
//!
//! - **a follower or learner** heard AppendEntries from the leader within
//!   `within` (the longest election timeout), and has applied what the leader
//!   had committed `grace` ago (the shortest election timeout), or — when its
//!   contact began or resumed less than `grace` ago — what the leader last
//!   told it. `grace` absorbs the ordinary gap between a commit and its
//!   apply; a node that was stopped or cut off starts over from the newest
//!   commit, so it never counts as caught up on what it knew before.
//! - **the leader** heard from a quorum of voters (itself included) within
//!   `within`: a leader cut off from its cluster keeps its role in openraft
//!   0.9 until it hears a higher term, while the others move on.
//!
//! A follower that follows a leader which is itself cut off is caught up
//! with that leader only; the limiter's own fence (it takes no update read at
//! an older log index) covers that case.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::ServerState;

use super::NodeId;

/// When each peer last answered a Raft RPC, for `GET /api/v1/cluster`.
/// `std::sync::Mutex`: held only to read or write one map entry, never across `.await`.
#[derive(Clone, Default)]
pub struct PeerContacts(Arc<Mutex<HashMap<NodeId, Instant>>>);

impl PeerContacts {
    pub(super) fn touch(&self, id: NodeId) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(id, Instant::now());
        }
    }

    /// Time since `id` last answered, if it ever did.
    pub fn since(&self, id: NodeId) -> Option<Duration> {
        let map = self.0.lock().ok()?;
        map.get(&id).map(Instant::elapsed)
    }
}

/// Leader commits remembered; at heartbeat rate this spans far more than
/// `grace`, and dropping the oldest only makes the test stricter.
const MAX_SAMPLES: usize = 1024;

/// Why this node does not serve its state as current.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Lag {
    /// No AppendEntries from a leader since this node started.
    #[error("this node has not heard from a leader since it started")]
    NeverHeard,
    /// The last AppendEntries is older than `within`.
    #[error("this node last heard from the leader {silent_ms} ms ago (more than {within_ms} ms)")]
    Silent {
        /// Since the last AppendEntries.
        silent_ms: u64,
        /// The bound.
        within_ms: u64,
    },
    /// It has not applied what the leader committed.
    #[error(
        "this node is catching up: it applied log index {applied}, the leader had committed {committed}"
    )]
    Behind {
        /// This node's last applied index.
        applied: u64,
        /// The leader's commit it must have applied.
        committed: u64,
    },
    /// The leader has not heard from a majority of voters within `within`.
    #[error(
        "this leader heard from {heard} of {voters} voters within {within_ms} ms, not a majority"
    )]
    NoQuorum {
        /// Voters heard from, itself included.
        heard: usize,
        /// Voters in the membership.
        voters: usize,
        /// The bound.
        within_ms: u64,
    },
}

/// The leader's commits as AppendEntries told them, newest last, each with
/// when it arrived.
#[derive(Debug, Default)]
struct Told {
    samples: VecDeque<(Instant, u64)>,
}

/// What this node last heard from the leader; written by the Raft service
/// on every AppendEntries it answers, read by every watch. Cheap to clone:
/// clones share the record. `std::sync::Mutex`: held to push or scan a few
/// samples, never across an `.await`.
#[derive(Clone)]
pub struct LeaderContact {
    told: Arc<Mutex<Told>>,
    /// Heard within this, or the node counts as cut off.
    within: Duration,
    /// How long a node may take to apply a commit it was told.
    grace: Duration,
}

impl LeaderContact {
    /// `within`: the longest election timeout; `grace`: the shortest.
    pub fn new(within: Duration, grace: Duration) -> LeaderContact {
        LeaderContact {
            told: Arc::new(Mutex::new(Told::default())),
            within,
            grace,
        }
    }

    /// An AppendEntries from the current leader said it had committed
    /// `leader_commit` (0: nothing yet).
    pub fn told(&self, leader_commit: u64) {
        self.told_at(leader_commit, Instant::now());
    }

    fn told_at(&self, leader_commit: u64, now: Instant) {
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        let samples = &mut told.samples;
        // A silence longer than `within` (the node was stopped or cut off):
        // what it was told before says nothing about now.
        if samples
            .back()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > self.within)
        {
            samples.clear();
        }
        samples.push_back((now, leader_commit));
        // Keep the newest sample at least `grace` old and all newer ones.
        while samples.len() >= 2
            && samples
                .get(1)
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= self.grace)
        {
            samples.pop_front();
        }
        if samples.len() > MAX_SAMPLES {
            samples.pop_front();
        }
    }

    /// `Ok` when a follower or learner that applied up to `applied` is
    /// caught up at `now`. Within `grace` of the contact's start there is
    /// no commit old enough to measure against: a new stream then needs the
    /// newest commit applied, but an open one only the first commit of this
    /// contact — else every commit racing ahead of its apply in a cluster's
    /// first second would end every stream.
    fn follower(&self, applied: u64, now: Instant, stream: Stream) -> Result<(), Lag> {
        let told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        let Some(&(last, newest)) = told.samples.back() else {
            return Err(Lag::NeverHeard);
        };
        let silent = now.saturating_duration_since(last);
        if silent > self.within {
            return Err(Lag::Silent {
                silent_ms: silent.as_millis() as u64,
                within_ms: self.within.as_millis() as u64,
            });
        }
        let committed = told
            .samples
            .iter()
            .rev()
            .find(|(at, _)| now.saturating_duration_since(*at) >= self.grace)
            .map_or_else(
                || match stream {
                    Stream::New => newest,
                    Stream::Open => told.samples.front().map_or(newest, |(_, c)| *c),
                },
                |(_, c)| *c,
            );
        if applied < committed {
            return Err(Lag::Behind { applied, committed });
        }
        Ok(())
    }

    /// `Ok` when this node may serve its applied state (up to `applied`) as
    /// current, given its Raft role and membership and when each peer last
    /// answered it.
    pub fn check(
        &self,
        me: NodeId,
        state: ServerState,
        voters: &BTreeSet<NodeId>,
        applied: u64,
        peers: &PeerContacts,
        stream: Stream,
    ) -> Result<(), Lag> {
        if state != ServerState::Leader {
            return self.follower(applied, Instant::now(), stream);
        }
        let heard = voters
            .iter()
            .filter(|id| **id == me || peers.since(**id).is_some_and(|d| d <= self.within))
            .count();
        if heard * 2 <= voters.len() {
            return Err(Lag::NoQuorum {
                heard,
                voters: voters.len(),
                within_ms: self.within.as_millis() as u64,
            });
        }
        Ok(())
    }
}

/// Whether the check is for a stream about to open or one already open
/// (see [`LeaderContact::follower`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    New,
    Open,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn contact() -> LeaderContact {
        LeaderContact::new(1500 * MS, 1000 * MS)
    }

    #[test]
    fn a_follower_is_caught_up_once_it_applied_the_commit_it_had_time_to_apply() {
        let c = contact();
        let t0 = Instant::now();
        assert_eq!(c.follower(0, t0, Stream::New), Err(Lag::NeverHeard));
        // Heartbeats every 100 ms; the leader commits one entry every 100 ms.
        for i in 0..30u32 {
            c.told_at(10 + u64::from(i), t0 + i * 100 * MS);
        }
        let now = t0 + 2950 * MS;
        // What the leader had committed a second ago: index 29.
        assert_eq!(
            c.follower(29, now, Stream::New),
            Ok(()),
            "a lag under the grace"
        );
        assert_eq!(
            c.follower(20, now, Stream::New),
            Err(Lag::Behind {
                applied: 20,
                committed: 29
            })
        );
    }

    #[test]
    fn a_node_that_was_stopped_counts_nothing_it_was_told_before() {
        let c = contact();
        let t0 = Instant::now();
        for i in 0..20u32 {
            c.told_at(10, t0 + i * 100 * MS);
        }
        // Stopped for 5 s: silent.
        let resumed = t0 + 6900 * MS;
        assert!(matches!(
            c.follower(10, resumed, Stream::New),
            Err(Lag::Silent { .. })
        ));
        // The first AppendEntries after: the leader is at 500 now. The old
        // commits (10) do not excuse the node while it replays.
        c.told_at(500, resumed);
        assert_eq!(
            c.follower(10, resumed + 10 * MS, Stream::New),
            Err(Lag::Behind {
                applied: 10,
                committed: 500
            })
        );
        c.told_at(505, resumed + 1200 * MS);
        assert_eq!(
            c.follower(499, resumed + 1300 * MS, Stream::New),
            Err(Lag::Behind {
                applied: 499,
                committed: 500
            })
        );
        assert_eq!(c.follower(500, resumed + 1300 * MS, Stream::New), Ok(()));
    }

    #[test]
    fn an_open_stream_outlives_commits_racing_ahead_in_the_first_second() {
        let c = contact();
        let t0 = Instant::now();
        // A cluster's first second: every heartbeat brings a newer commit,
        // applied a few milliseconds later.
        for i in 0..5u32 {
            c.told_at(2 + u64::from(i), t0 + i * 100 * MS);
        }
        let now = t0 + 410 * MS;
        assert!(
            c.follower(5, now, Stream::New).is_err(),
            "a new stream needs the newest"
        );
        assert_eq!(
            c.follower(5, now, Stream::Open),
            Ok(()),
            "an open stream was ended"
        );
        // Resumed after a stop: the first commit of the new contact is far
        // ahead, so an open stream ends while the node replays.
        let resumed = t0 + 5000 * MS;
        c.told_at(500, resumed);
        assert_eq!(
            c.follower(5, resumed + 10 * MS, Stream::Open),
            Err(Lag::Behind {
                applied: 5,
                committed: 500
            })
        );
    }
}
