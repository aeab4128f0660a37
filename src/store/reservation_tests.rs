use super::*;
use crate::algorithm::{Algorithm, Params};

const T: Micros = 1_000_000_000_000;
const TTL: Micros = 30_000_000;

fn limits(algorithm: Algorithm, limit: i64) -> Vec<Limit> {
    vec![Limit {
        rule: "r".into(),
        params: Params::new(algorithm, limit, Duration::from_secs(3600), None).expect("valid"),
    }]
}

fn hold<'a>(limits: &'a [Limit], key: &'a str, nonce: &'a Nonce) -> Hold<'a> {
    Hold { limits, key, nonce }
}

fn nonce(i: u64) -> Nonce {
    let mut n = [0u8; 16];
    n[..8].copy_from_slice(&i.to_be_bytes());
    n
}

#[test]
fn a_budget_of_10000_admits_100_of_100_then_150_of_40_after_commits_at_40() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let (store, book) = (MemoryStore::new(), MemoryBook::default());
        let l = limits(algorithm, 10_000);
        let nonces: Vec<Nonce> = (0..200).map(nonce).collect();
        let admitted: Vec<&Nonce> = std::thread::scope(|s| {
            let handles: Vec<_> = nonces
                .iter()
                .map(|n| {
                    let (store, book, l) = (&store, &book, &l);
                    s.spawn(move || {
                        let r = book
                            .reserve(store, hold(l, "k", n), 100, TTL, T)
                            .expect("reserve");
                        r.admitted.then_some(n)
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("thread"))
                .collect()
        });
        assert_eq!(admitted.len(), 100, "{algorithm}");
        assert_eq!(book.outstanding("r", "k", T).expect("key"), 10_000);
        let mut refunded = 0;
        for n in &admitted {
            let s = book
                .settle(&store, hold(&l, "k", n), Settle::Commit(40), &[0], T + 1)
                .expect("commit");
            refunded += s.limits[0].refunded;
        }
        assert_eq!(refunded, 6_000, "{algorithm}");
        assert_eq!(book.outstanding("r", "k", T + 1).expect("key"), 0);
        let more = (1000..1200)
            .filter(|i| {
                book.reserve(&store, hold(&l, "k", &nonce(*i)), 40, TTL, T + 2)
                    .expect("reserve")
                    .admitted
            })
            .count();
        assert_eq!(more, 150, "{algorithm}");
    }
}

#[test]
fn a_retried_commit_changes_nothing_and_answers_the_same() {
    let (store, book) = (MemoryStore::new(), MemoryBook::default());
    let l = limits(Algorithm::FixedWindow, 1000);
    let n = nonce(1);
    assert!(
        book.reserve(&store, hold(&l, "k", &n), 100, TTL, T)
            .expect("reserve")
            .admitted
    );
    let first = book
        .settle(&store, hold(&l, "k", &n), Settle::Commit(30), &[0], T + 1)
        .expect("commit");
    let again = book
        .settle(&store, hold(&l, "k", &n), Settle::Commit(30), &[0], T + 2)
        .expect("retried commit");
    assert!(!first.replayed && again.replayed);
    assert_eq!(first.limits, again.limits);
    assert_eq!(again.limits[0].remaining, 970);
    // Settled otherwise: refused, nothing changed.
    let e = book
        .settle(&store, hold(&l, "k", &n), Settle::Release, &[0], T + 3)
        .expect_err("release after commit");
    assert!(
        matches!(
            e,
            ReservationError::AlreadySettled {
                was: Settle::Commit(30)
            }
        ),
        "{e}"
    );
    let e = book
        .settle(&store, hold(&l, "k", &n), Settle::Commit(31), &[0], T + 3)
        .expect_err("another actual");
    assert!(e.to_string().contains("actual 30"), "{e}");
}

#[test]
fn unknown_altered_and_expired_ids_are_errors_not_charges() {
    let (store, book) = (MemoryStore::new(), MemoryBook::default());
    let l = limits(Algorithm::TokenBucket, 1000);
    let n = nonce(1);
    assert!(
        book.reserve(&store, hold(&l, "k", &n), 100, TTL, T)
            .expect("reserve")
            .admitted
    );
    // Another key with the right nonce, or the right key with another nonce.
    for (key, n) in [("k2", n), ("k", nonce(2))] {
        let e = book
            .settle(
                &store,
                hold(&l, key, &n),
                Settle::Commit(500),
                &[1000],
                T + 1,
            )
            .expect_err("unknown");
        assert!(matches!(e, ReservationError::Unknown), "{e}");
    }
    // Past the ttl: settled at the estimate, refused with it named.
    let e = book
        .settle(&store, hold(&l, "k", &n), Settle::Release, &[0], T + TTL)
        .expect_err("expired");
    assert!(
        matches!(e, ReservationError::Expired { estimate: 100 }),
        "{e}"
    );
    assert_eq!(
        store
            .settle_all_at(&l, "k", T + TTL, |_, _| ())
            .expect("peek")[0]
            .1
            .remaining,
        900 + (TTL * 1000 / 3_600_000_000),
        "the estimate stays charged (plus the refill since)"
    );
    // After the grace, unknown.
    let later = T + TTL + GRACE.as_micros() as u64;
    let e = book
        .settle(&store, hold(&l, "k", &n), Settle::Release, &[0], later)
        .expect_err("forgotten");
    assert!(matches!(e, ReservationError::Unknown), "{e}");
}

#[test]
fn excess_is_charged_up_to_the_overdraft() {
    let (store, book) = (MemoryStore::new(), MemoryBook::default());
    let l = limits(Algorithm::FixedWindow, 1000);
    let n = nonce(1);
    assert!(
        book.reserve(&store, hold(&l, "k", &n), 900, TTL, T)
            .expect("reserve")
            .admitted
    );
    let s = book
        .settle(
            &store,
            hold(&l, "k", &n),
            Settle::Commit(1500),
            &[200],
            T + 1,
        )
        .expect("commit");
    // 600 over the estimate: 100 to the limit, 200 past it, 300 left uncharged.
    assert_eq!((s.limits[0].refunded, s.limits[0].charged), (0, 300));
    assert_eq!(s.limits[0].remaining, 0);
}

#[test]
fn a_flood_of_reservations_is_bounded_per_key_and_in_total() {
    let store = MemoryStore::new();
    let book = MemoryBook::with_capacity(MAX_OPEN_PER_KEY + 500);
    let l = limits(Algorithm::FixedWindow, 1_000_000_000);
    let mut refused = 0;
    for i in 0..(MAX_OPEN_PER_KEY as u64 + 100) {
        match book.reserve(&store, hold(&l, "one", &nonce(i)), 1, TTL, T) {
            Ok(r) => assert!(r.admitted),
            Err(ReservationError::TooManyOpen { what }) => {
                assert!(what.contains("on this key"), "{what}");
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, 100);
    // Other keys: the total bound.
    let mut total_refused = 0;
    for i in 0..2_000u64 {
        let key = format!("k{i}");
        match book.reserve(&store, hold(&l, &key, &nonce(1_000_000 + i)), 1, TTL, T) {
            Ok(_) => {}
            Err(ReservationError::TooManyOpen { what }) => {
                assert!(what.contains("in memory"), "{what}");
                total_refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(book.len(), MAX_OPEN_PER_KEY + 500);
    assert_eq!(total_refused, 1_500);
    // Once they are past ttl and grace, room again; the charges stay.
    let later = T + TTL + GRACE.as_micros() as u64;
    let r = book
        .reserve(&store, hold(&l, "new", &nonce(9_999_999)), 1, TTL, later)
        .expect("room after the sweep");
    assert!(r.admitted);
    assert_eq!(book.len(), 1);
}

#[test]
fn a_stream_done_charge_takes_the_key_at_most_its_overdraft_past_the_limit() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let store = MemoryStore::new();
        let l = limits(algorithm, 10_000);
        let first = store.charge_at(&l, "k", 9_900, &[500], T).expect("charged");
        assert_eq!(
            (first[0].charged, first[0].remaining),
            (9_900, 100),
            "{algorithm}"
        );
        // 1,000 asked with 100 left: 600 fit under the 500 of overdraft.
        let over = store.charge_at(&l, "k", 1_000, &[500], T).expect("charged");
        assert_eq!(
            (over[0].charged, over[0].remaining),
            (600, 0),
            "{algorithm}"
        );
        let capped = store.charge_at(&l, "k", 50, &[500], T).expect("charged");
        assert_eq!(capped[0].charged, 0, "{algorithm}");
    }
}
