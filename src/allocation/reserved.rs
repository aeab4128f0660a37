//! Reserved vs settled per key (issue 31, part 4): what each region holds
//! in open reservations of a global rule's keys, as its pods report it, for
//! `ctl usage` and the dashboard. The ledger's admitted counts are settled
//! cost plus the estimates still open; this says how much of them is open.
//!
//! A pod cannot read its region's open total cheaply (it lives in Redis,
//! under each key), so every pod keeps its own net view
//! ([`OpenReservations`]): `+estimate` when it opens a reservation,
//! `−estimate` when it settles one — whichever pod of the region opened it
//! — each until the reservation's expiry (after which it settles by itself
//! at its estimate, nothing open). Summed over a region's pods the nets are
//! the region's open total; one pod's net may be negative. A pod killed with
//! reservations open takes its `+` with it: its region reads low until they
//! expire.
//!
//! The leader keeps each pod's latest net per key ([`ReservedBook`]): a
//! report lists every key the pod holds open (up to
//! [`REPORT_RESERVED_KEYS`]), so it replaces that pod's entries.
//!
//! Pure: times are arguments.

use std::collections::{BTreeMap, HashMap};

use super::Millis;

/// (rule, key) entries times expiry seconds one pod keeps; a reservation
/// beyond them is not tracked (its region's figure reads low).
pub const MAX_OPEN_ENTRIES: usize = 100_000;
/// Keys one report lists, the largest open totals first; the coordinator
/// refuses more (`coordinator::report_bounds`).
pub const REPORT_RESERVED_KEYS: usize = 1_000;
/// Keys the leader keeps open totals of; a key first reported once this
/// many are held is not shown.
pub const MAX_RESERVED_KEYS: usize = 10_000;

/// One key's open reservations at one pod, as a report carries them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyReserved {
    /// The limit's id (`Rule::limit_id`).
    pub rule: String,
    /// The key as the rule counts it.
    pub key: String,
    /// Estimates opened here less estimates settled here, of reservations
    /// not yet expired (may be negative: see the module doc).
    pub outstanding: i64,
}

/// A pod's net open estimates per (rule, key), by expiry second.
#[derive(Debug, Default)]
pub struct OpenReservations {
    keys: HashMap<(String, String), BTreeMap<Millis, i64>>,
    /// Expiry buckets held, over every key: at most [`MAX_OPEN_ENTRIES`].
    entries: usize,
}

impl OpenReservations {
    /// Adds `delta` (an estimate opened, or minus one settled) to `key` of
    /// `rule` until `expires_ms`. Expiries are kept to the second: a pod
    /// settling another's reservation computes the same expiry from the
    /// store's clock, within a second.
    pub fn add(&mut self, rule: &str, key: &str, delta: i64, expires_ms: Millis) {
        if delta == 0 {
            return;
        }
        let bucket = (expires_ms + 999).div_euclid(1_000) * 1_000;
        let id = (rule.to_string(), key.to_string());
        let known = self.keys.get(&id).is_some_and(|b| b.contains_key(&bucket));
        if !known && self.entries >= MAX_OPEN_ENTRIES {
            return;
        }
        let buckets = self.keys.entry(id.clone()).or_default();
        let n = buckets.entry(bucket).or_default();
        if !known {
            self.entries += 1;
        }
        *n += delta;
        if *n == 0 {
            buckets.remove(&bucket);
            self.entries -= 1;
            if buckets.is_empty() {
                self.keys.remove(&id);
            }
        }
    }

    /// Every key's net open estimates at `now` (expired ones dropped), the
    /// largest magnitudes first, at most [`REPORT_RESERVED_KEYS`].
    pub fn report(&mut self, now: Millis) -> Vec<KeyReserved> {
        let mut out = Vec::new();
        let entries = &mut self.entries;
        self.keys.retain(|(rule, key), buckets| {
            let live = buckets.split_off(&(now + 1));
            *entries -= buckets.len();
            *buckets = live;
            let outstanding: i64 = buckets.values().sum();
            if outstanding != 0 {
                out.push(KeyReserved {
                    rule: rule.clone(),
                    key: key.clone(),
                    outstanding,
                });
            }
            !buckets.is_empty()
        });
        out.sort_by(|a, b| {
            (b.outstanding.abs(), &a.rule, &a.key).cmp(&(a.outstanding.abs(), &b.rule, &b.key))
        });
        out.truncate(REPORT_RESERVED_KEYS);
        out
    }
}

/// A (rule, key) or a (region, pod): two names.
type Pair = (String, String);

/// The leader's view: each pod's latest net per key, to sum per region.
#[derive(Debug, Default)]
pub struct ReservedBook {
    /// (rule, key) → (region, pod) → the pod's net.
    keys: HashMap<Pair, HashMap<Pair, i64>>,
    /// (region, pod) → the keys its last report listed, and when heard.
    pods: HashMap<Pair, (Vec<Pair>, Millis)>,
}

impl ReservedBook {
    /// Takes a pod's report: its list replaces what it said before.
    pub fn record(&mut self, region: &str, pod: &str, reserved: &[KeyReserved], now: Millis) {
        let who = (region.to_string(), pod.to_string());
        let before = self.pods.remove(&who).map(|(keys, _)| keys);
        for id in before.into_iter().flatten() {
            if let Some(pods) = self.keys.get_mut(&id) {
                pods.remove(&who);
                if pods.is_empty() {
                    self.keys.remove(&id);
                }
            }
        }
        let mut listed = Vec::new();
        for r in reserved {
            let id = (r.rule.clone(), r.key.clone());
            if !self.keys.contains_key(&id) && self.keys.len() >= MAX_RESERVED_KEYS {
                continue;
            }
            self.keys
                .entry(id.clone())
                .or_default()
                .insert(who.clone(), r.outstanding);
            listed.push(id);
        }
        if !listed.is_empty() {
            self.pods.insert(who, (listed, now));
        }
    }

    /// Open estimates of `key` of `rule` per region: the nets of its pods
    /// heard within `fresh_ms` of `now`, summed (never below 0).
    pub fn regions(
        &self,
        rule: &str,
        key: &str,
        now: Millis,
        fresh_ms: i64,
    ) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, i64> = BTreeMap::new();
        let Some(pods) = self.keys.get(&(rule.to_string(), key.to_string())) else {
            return BTreeMap::new();
        };
        for (who, n) in pods {
            let heard = self.pods.get(who).map_or(Millis::MIN, |p| p.1);
            if now - heard <= fresh_ms {
                *out.entry(who.0.clone()).or_default() += n;
            }
        }
        out.into_iter().map(|(r, n)| (r, n.max(0) as u64)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_700_006_400_000;

    #[test]
    fn a_pod_reports_what_it_opened_less_what_it_settled_until_expiry() {
        let mut open = OpenReservations::default();
        open.add("r", "42", 100, T0 + 60_000);
        open.add("r", "42", 100, T0 + 60_400);
        open.add("r", "7", 50, T0 + 10_000);
        // Another pod's reservation settled here: negative until it expires.
        open.add("r", "9", -30, T0 + 20_000);
        open.add("r", "42", -100, T0 + 60_000);
        let report = open.report(T0);
        let net: Vec<(&str, i64)> = report
            .iter()
            .map(|k| (k.key.as_str(), k.outstanding))
            .collect();
        assert_eq!(net, vec![("42", 100), ("7", 50), ("9", -30)]);
        let later = open.report(T0 + 30_000);
        assert_eq!(later.len(), 1, "7 and 9 expired: {later:?}");
        assert!(open.report(T0 + 61_000).is_empty());
        assert_eq!(open.entries, 0);
    }

    #[test]
    fn open_reservations_stay_bounded_under_a_flood_of_keys() {
        let mut open = OpenReservations::default();
        for i in 0..MAX_OPEN_ENTRIES + 1_000 {
            open.add("r", &format!("k{i}"), 1, T0 + 60_000);
        }
        assert_eq!(open.entries, MAX_OPEN_ENTRIES);
        assert_eq!(open.report(T0).len(), REPORT_RESERVED_KEYS);
    }

    #[test]
    fn the_leader_sums_a_regions_pods_and_a_report_replaces_the_last() {
        let mut book = ReservedBook::default();
        let key = |outstanding| {
            vec![KeyReserved {
                rule: "r".into(),
                key: "42".into(),
                outstanding,
            }]
        };
        book.record("east", "a", &key(300), T0);
        book.record("east", "b", &key(-100), T0);
        book.record("west", "c", &key(50), T0);
        let at = |book: &ReservedBook, now| book.regions("r", "42", now, 10_000);
        assert_eq!(
            at(&book, T0),
            BTreeMap::from([("east".into(), 200), ("west".into(), 50)])
        );
        book.record("east", "a", &[], T0 + 1_000);
        assert_eq!(
            at(&book, T0 + 1_000)["east"],
            0,
            "a holds nothing now; b's −100 stops at 0"
        );
        assert_eq!(
            at(&book, T0 + 20_000),
            BTreeMap::new(),
            "silent pods are not counted"
        );
    }

    #[test]
    fn the_leader_keeps_a_bounded_number_of_keys() {
        let mut book = ReservedBook::default();
        let many: Vec<KeyReserved> = (0..MAX_RESERVED_KEYS + 10)
            .map(|i| KeyReserved {
                rule: "r".into(),
                key: format!("k{i}"),
                outstanding: 1,
            })
            .collect();
        book.record("east", "a", &many, T0);
        assert_eq!(book.keys.len(), MAX_RESERVED_KEYS);
    }
}
