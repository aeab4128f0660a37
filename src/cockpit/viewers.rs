//! Who may hold the dashboard's event streams (`GET /api/v1/events`).
//!
//! A node serves at most [`MAX_EVENT_STREAMS`]. A request without a token
//! may open one only while fewer than [`MAX_ANONYMOUS_EVENT_STREAMS`]
//! anonymous streams are open, and fewer than
//! [`MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER`] from its address: so a client
//! with no credential opens a handful, and no number of such clients takes
//! the places kept for viewers with the admin or read token, whose
//! dashboards keep their live view.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Event streams served at once by one node. Each holds a watch receiver
/// and its connection, nothing that grows.
pub const MAX_EVENT_STREAMS: usize = 64;
/// Of [`MAX_EVENT_STREAMS`], how many requests without a token may hold;
/// the other 16 are kept for viewers with a token.
pub const MAX_ANONYMOUS_EVENT_STREAMS: usize = 48;
/// Anonymous streams one client address may hold: a browser tab holds one,
/// and a reload briefly two. Behind a proxy every viewer shares the
/// proxy's address: enter the read token in the dashboard there.
pub const MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER: usize = 4;

/// Why a stream was refused: which bound it met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// [`MAX_EVENT_STREAMS`].
    Full,
    /// [`MAX_ANONYMOUS_EVENT_STREAMS`].
    AnonymousFull,
    /// [`MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER`].
    AnonymousPerPeer,
}

/// The streams open on one node.
#[derive(Default)]
pub struct Viewers {
    /// Held only to count a stream in or out; never across an `.await`.
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    anonymous: usize,
    anonymous_per_peer: HashMap<IpAddr, usize>,
}

impl Viewers {
    fn open(&self) -> MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a stream from `peer` (counted by its
    /// `slots::peer_group`: an IPv6 client by its /64), anonymous unless
    /// `with_token`.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, with_token: bool) -> Result<Seat, Refusal> {
        let peer = crate::slots::peer_group(peer);
        let mut open = self.open();
        if open.total >= MAX_EVENT_STREAMS {
            return Err(Refusal::Full);
        }
        if !with_token {
            if open.anonymous >= MAX_ANONYMOUS_EVENT_STREAMS {
                return Err(Refusal::AnonymousFull);
            }
            let mine = open.anonymous_per_peer.entry(peer).or_default();
            if *mine >= MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER {
                return Err(Refusal::AnonymousPerPeer);
            }
            *mine += 1;
            open.anonymous += 1;
        }
        open.total += 1;
        drop(open);
        Ok(Seat {
            viewers: Arc::clone(self),
            anonymous_peer: (!with_token).then_some(peer),
        })
    }
}

/// One open stream's place; dropping it frees the place.
pub struct Seat {
    viewers: Arc<Viewers>,
    /// The address an anonymous stream counts against.
    anonymous_peer: Option<IpAddr>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut open = self.viewers.open();
        open.total -= 1;
        if let Some(peer) = self.anonymous_peer {
            open.anonymous -= 1;
            if let Some(n) = open.anonymous_per_peer.get_mut(&peer) {
                *n -= 1;
                if *n == 0 {
                    open.anonymous_per_peer.remove(&peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn anonymous_streams_are_capped_per_address_and_in_all_leaving_room_for_tokens() {
        let viewers = Arc::new(Viewers::default());
        let mut seats = Vec::new();
        for _ in 0..MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER {
            seats.push(viewers.admit(ip(0), false).expect("a few per address"));
        }
        assert_eq!(
            viewers.admit(ip(0), false).err(),
            Some(Refusal::AnonymousPerPeer)
        );
        let mut peer = 1;
        while seats.len() < MAX_ANONYMOUS_EVENT_STREAMS {
            match viewers.admit(ip(peer), false) {
                Ok(seat) => seats.push(seat),
                Err(_) => peer += 1,
            }
        }
        assert_eq!(
            viewers.admit(ip(200), false).err(),
            Some(Refusal::AnonymousFull)
        );
        while seats.len() < MAX_EVENT_STREAMS {
            seats.push(viewers.admit(ip(0), true).expect("kept for tokens"));
        }
        assert_eq!(viewers.admit(ip(201), true).err(), Some(Refusal::Full));
        // A closed stream frees its place, anonymous ones their address's too.
        seats.truncate(MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER - 1);
        assert!(viewers.admit(ip(0), false).is_ok());
    }
}
