//! Connection slots: how many connections a listener holds at once, and
//! which one gives way when a new one arrives and none is free.
//!
//! A connection holds its [`Slot`] from accept until it closes. While it has
//! no request in flight — in its TLS handshake, before its first whole
//! request head, between keep-alive requests — it is *idle*, and a full
//! listener gives an idle connection's slot to the newcomer: one of the peer
//! address that holds the most slots, the one idle the longest. Sockets that
//! connect and say nothing therefore hold a slot only until somebody needs
//! it, while a client that connects and asks at once (a probe, a limiter's
//! report) gives way only when no address holds more slots than its own
//! (an attacker then needs as many addresses as the listener has slots).
//! The evicted connection is told through its slot and is counted out of
//! the table at once.
//!
//! Addresses are compared as [`peer_group`]s: an IPv6 client counts by its
//! /64, which one host can fill with addresses.
//!
//! When every held connection is busy, up to `reserve` more are admitted as
//! *reserve* connections, which the HTTP servers use only to answer their
//! probes (`serve`); a newcomer then takes an idle reserve slot the same
//! way, and with none idle it is refused (closed at once).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The address a peer is counted under: an IPv4 address (also when mapped
/// into IPv6) as it is, an IPv6 address by its /64 prefix, which a single
/// host is routinely given whole.
pub fn peer_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// What a slot may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One of the listener's `max` slots: anything the listener serves.
    Full,
    /// Past `max`, while every full slot is busy: probes only.
    Reserve,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::Reserve => "reserve",
        }
    }

    fn index(self) -> usize {
        match self {
            Kind::Full => 0,
            Kind::Reserve => 1,
        }
    }
}

/// The slots of one listener. Cheap to clone; every clone is the same table.
#[derive(Clone)]
pub struct Slots {
    shared: Arc<Shared>,
}

struct Shared {
    /// `listener` label of the metrics.
    name: &'static str,
    max: usize,
    reserve: usize,
    /// What idle times are measured from (milliseconds in an atomic).
    epoch: Instant,
    /// Held for a scan of at most `max + reserve` entries at an accept on
    /// a full listener, and for an insert or a remove otherwise; never
    /// across an `.await`.
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    held: BTreeMap<u64, Arc<Occupant>>,
    per_peer: HashMap<IpAddr, u32>,
    count: [usize; 2],
}

/// The table's view of one connection, shared with the connection's task.
struct Occupant {
    id: u64,
    peer: IpAddr,
    kind: Kind,
    epoch: Instant,
    /// Requests being served; 0 is idle.
    in_flight: AtomicU32,
    /// Requests begun so far (0: still waiting for the first head).
    begun: AtomicU64,
    /// Milliseconds since `epoch` at which the connection last went idle
    /// (or was accepted); read only while `in_flight` is 0.
    idle_since_ms: AtomicU64,
    evicted: AtomicBool,
    /// Tells the connection's task it was evicted (a stored permit, so a
    /// task that starts waiting later still sees it).
    evict: Notify,
    /// Tells the connection's task it went idle (not busy: its task looks
    /// again at its next deadline anyway, and a request costs no wake-up).
    went_idle: Notify,
}

impl Occupant {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

impl Slots {
    /// `max` slots (at least 1) and `reserve` more for probes; `name` labels
    /// the metrics (`meridian_listener_connections{listener=name,kind}`, and
    /// `meridian_listener_evictions_total` and
    /// `meridian_listener_refusals_total` by `listener`).
    pub fn new(name: &'static str, max: usize, reserve: usize) -> Slots {
        Slots {
            shared: Arc::new(Shared {
                name,
                max: max.max(1),
                reserve,
                epoch: Instant::now(),
                table: Mutex::new(Table::default()),
            }),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.shared.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection from `peer`, evicting an idle connection if
    /// none is free; `None` when every slot, reserve included, is busy.
    pub fn admit(&self, peer: IpAddr) -> Option<Slot> {
        let peer = peer_group(peer);
        let shared = &self.shared;
        let mut table = self.table();
        let now_ms = shared.epoch.elapsed().as_millis() as u64;
        let kind = if table.count[0] < shared.max {
            Kind::Full
        } else if let Some(victim) = table.victim(Kind::Full, now_ms) {
            self.evict(&mut table, victim);
            Kind::Full
        } else if table.count[1] < shared.reserve {
            Kind::Reserve
        } else if let Some(victim) = table.victim(Kind::Reserve, now_ms) {
            self.evict(&mut table, victim);
            Kind::Reserve
        } else {
            drop(table);
            metrics::counter!("meridian_listener_refusals_total", "listener" => shared.name)
                .increment(1);
            return None;
        };
        let id = table.next_id;
        table.next_id += 1;
        let occupant = Arc::new(Occupant {
            id,
            peer,
            kind,
            epoch: shared.epoch,
            in_flight: AtomicU32::new(0),
            begun: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(now_ms),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
            went_idle: Notify::new(),
        });
        table.held.insert(id, Arc::clone(&occupant));
        *table.per_peer.entry(peer).or_default() += 1;
        table.count[kind.index()] += 1;
        let held = table.count[kind.index()];
        drop(table);
        self.gauge(kind, held);
        Some(Slot {
            slots: self.clone(),
            occupant,
        })
    }

    /// Takes `id` out of the table and tells its task.
    fn evict(&self, table: &mut Table, id: u64) {
        if let Some(occupant) = table.remove(id) {
            occupant.evicted.store(true, Ordering::Release);
            occupant.evict.notify_one();
            metrics::counter!("meridian_listener_evictions_total", "listener" => self.shared.name)
                .increment(1);
        }
    }

    fn gauge(&self, kind: Kind, held: usize) {
        metrics::gauge!(
            "meridian_listener_connections",
            "listener" => self.shared.name,
            "kind" => kind.label()
        )
        .set(held as f64);
    }

    /// Connections held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.table().held.len()
    }
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Arc<Occupant>> {
        let occupant = self.held.remove(&id)?;
        self.count[occupant.kind.index()] -= 1;
        if let Some(n) = self.per_peer.get_mut(&occupant.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&occupant.peer);
            }
        }
        Some(occupant)
    }

    /// The idle connection of `kind` to evict, by [`choose`].
    fn victim(&self, kind: Kind, now_ms: u64) -> Option<u64> {
        let candidates = self
            .held
            .values()
            .filter(|o| o.kind == kind && o.in_flight.load(Ordering::Acquire) == 0)
            .map(|o| Candidate {
                id: o.id,
                peer_slots: self.per_peer.get(&o.peer).copied().unwrap_or(0),
                idle_ms: now_ms.saturating_sub(o.idle_since_ms.load(Ordering::Acquire)),
            });
        choose(candidates)
    }
}

/// An idle connection that could give way.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u64,
    /// Slots its peer address holds, busy ones included.
    peer_slots: u32,
    idle_ms: u64,
}

/// The connection that gives way: of the address holding the most slots,
/// the one idle the longest (the oldest, on a tie).
fn choose(candidates: impl Iterator<Item = Candidate>) -> Option<u64> {
    candidates
        .max_by(|a, b| {
            (a.peer_slots, a.idle_ms)
                .cmp(&(b.peer_slots, b.idle_ms))
                .then(b.id.cmp(&a.id))
        })
        .map(|c| c.id)
}

/// One connection's place in a listener's table; dropping it frees the
/// place (unless it was evicted, which freed it already).
pub struct Slot {
    slots: Slots,
    occupant: Arc<Occupant>,
}

impl Slot {
    /// Full or reserve.
    pub fn kind(&self) -> Kind {
        self.occupant.kind
    }

    /// The handle the connection's request handling reports through.
    pub fn activity(&self) -> Activity {
        Activity(Arc::clone(&self.occupant))
    }

    /// Whether another connection took this one's place.
    pub fn is_evicted(&self) -> bool {
        self.occupant.evicted.load(Ordering::Acquire)
    }

    /// Resolves once another connection took this one's place.
    pub async fn evicted(&self) {
        if !self.is_evicted() {
            self.occupant.evict.notified().await;
        }
    }

    /// Resolves when the connection goes idle (or went idle before this
    /// was called and nobody looked since).
    pub async fn went_idle(&self) {
        self.occupant.went_idle.notified().await;
    }

    /// Requests being served on the connection now.
    pub fn in_flight(&self) -> u32 {
        self.occupant.in_flight.load(Ordering::Acquire)
    }

    /// Whether a request has begun on the connection yet.
    pub fn has_begun(&self) -> bool {
        self.occupant.begun.load(Ordering::Acquire) > 0
    }

    /// How long the connection has been idle (since accept, before its first
    /// request); zero while a request is in flight.
    pub fn idle_for(&self) -> Duration {
        if self.in_flight() > 0 {
            return Duration::ZERO;
        }
        let since = self.occupant.idle_since_ms.load(Ordering::Acquire);
        Duration::from_millis(self.occupant.now_ms().saturating_sub(since))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.table();
        let freed = table.remove(self.occupant.id).is_some();
        let kind = self.occupant.kind;
        let held = table.count[kind.index()];
        drop(table);
        if freed {
            self.slots.gauge(kind, held);
        }
    }
}

/// How a connection's request handling says a request began and ended.
#[derive(Clone)]
pub struct Activity(Arc<Occupant>);

impl Activity {
    /// A request began; it ends when the returned guard drops (once its
    /// response has been sent whole, or abandoned).
    pub fn begin(&self) -> InFlight {
        self.0.begun.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(&self.0))
    }
}

/// A request in flight on a connection (see [`Activity::begin`]).
pub struct InFlight(Arc<Occupant>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // The idle time is stamped before the count drops, so a scan that
        // sees the connection idle never reads a stale stamp.
        self.0
            .idle_since_ms
            .store(self.0.now_ms(), Ordering::Release);
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.went_idle.notify_one();
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
    fn ipv6_peers_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().expect("ip");
        let other: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(peer_group(a), peer_group(b));
        assert_ne!(peer_group(a), peer_group(other));
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().expect("ip");
        assert_eq!(peer_group(mapped), ip(7));
        assert_eq!(peer_group(ip(7)), ip(7));
    }

    #[test]
    fn the_address_holding_most_slots_gives_way_first_its_longest_idle() {
        let c = |id, peer_slots, idle_ms| Candidate {
            id,
            peer_slots,
            idle_ms,
        };
        // A lone client idle for long keeps its place against a crowd.
        let picked = choose([c(1, 1, 9_000), c(2, 40, 10), c(3, 40, 20)].into_iter());
        assert_eq!(picked, Some(3));
        // Equal crowds: the longest idle; equal idle: the oldest.
        assert_eq!(choose([c(4, 2, 5), c(5, 2, 7)].into_iter()), Some(5));
        assert_eq!(choose([c(7, 2, 5), c(6, 2, 5)].into_iter()), Some(6));
        assert_eq!(choose(std::iter::empty()), None);
    }

    #[tokio::test]
    async fn a_full_table_evicts_an_idle_connection_then_uses_the_reserve_then_refuses() {
        let slots = Slots::new("test", 2, 1);
        let a = slots.admit(ip(1)).expect("free slot");
        let b = slots.admit(ip(1)).expect("free slot");
        let _busy_b = b.activity().begin();
        // Full: the idle one (a) gives way.
        let c = slots.admit(ip(2)).expect("a's slot");
        assert!(a.is_evicted() && !b.is_evicted());
        a.evicted().await;
        assert_eq!(c.kind(), Kind::Full);
        let _busy_c = c.activity().begin();
        // Every full slot busy: the reserve, then its idle one gives way.
        let r1 = slots.admit(ip(3)).expect("reserve");
        assert_eq!(r1.kind(), Kind::Reserve);
        let r2 = slots.admit(ip(3)).expect("r1's reserve slot");
        assert!(r1.is_evicted());
        let _busy_r2 = r2.activity().begin();
        assert!(slots.admit(ip(4)).is_none(), "everything busy");
        assert_eq!(slots.held(), 3);
        drop(a);
        assert_eq!(slots.held(), 3, "an evicted slot was freed already");
    }

    #[tokio::test]
    async fn a_connection_is_idle_between_requests_and_frees_its_slot_when_closed() {
        let slots = Slots::new("test", 4, 0);
        let a = slots.admit(ip(1)).expect("slot");
        assert!(!a.has_begun());
        let request = a.activity().begin();
        assert_eq!((a.in_flight(), a.idle_for()), (1, Duration::ZERO));
        drop(request);
        a.went_idle().await;
        assert_eq!(a.in_flight(), 0);
        assert!(a.has_begun());
        assert_eq!(slots.held(), 1);
        drop(a);
        assert_eq!(slots.held(), 0);
    }
}
