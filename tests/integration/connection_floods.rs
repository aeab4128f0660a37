//! Connections that hold a listener without using it, as the audit made
//! them (issue 28, items 1 and 10): sockets that say nothing, sockets that
//! send half a request head and stop, connections kept busy with requests
//! that are slow to answer, silent TCP connections to the control plane's
//! TLS port, and unauthenticated dashboard event streams. Each flood comes
//! from real sockets against real processes; what must hold meanwhile is
//! that the probes and the legitimate clients are answered at once and the
//! idle sockets are closed by the server within its deadline.

use crate::common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use meridian::proto::meridian::v1 as pb;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use rustls::pki_types::ServerName;

use common::coordinator::{Cluster, Options, TOKEN};
use common::limiter::LimiterProcess;

/// The admin API's default connection cap (`--admin-max-connections`).
const ADMIN_SLOTS: usize = 256;

/// Half a request head: the request line and one header, never the blank
/// line that ends it.
const HALF_HEAD: &str = "GET /api/v1/rules HTTP/1.1\r\nhost: meridian\r\nx-slow: ";

/// Sends `request` on a fresh connection to `addr` and returns what comes
/// back within `within` (empty when nothing does) and how long it took.
fn raw(addr: &str, request: &str, within: Duration) -> (String, Duration) {
    let start = Instant::now();
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return (String::new(), start.elapsed());
    };
    let _ = stream.set_read_timeout(Some(within));
    if stream.write_all(request.as_bytes()).is_err() {
        return (String::new(), start.elapsed());
    }
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).unwrap_or(0);
    (
        String::from_utf8_lossy(&buf[..n]).into_owned(),
        start.elapsed(),
    )
}

fn healthz(addr: &str) -> String {
    format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n")
}

/// A connection that asked for `/healthz`, had its answer and stays open
/// (HTTP/1.1 keep-alive).
fn served_and_idle(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .expect("request");
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("read timeout");
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).unwrap_or(0);
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    s
}

/// `n` connections to `addr`: the even ones say nothing, the odd ones send
/// [`HALF_HEAD`] and stop.
fn silent_and_half_head(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(addr).expect("connect");
            if i % 2 == 1 {
                s.write_all(HALF_HEAD.as_bytes()).expect("half a head");
            }
            s
        })
        .collect()
}

/// Waits until the server has closed every one of `held` (a read sees the
/// end of the stream or a reset), at most until `deadline`; returns how
/// many are still open then.
fn still_open_at(held: &mut [TcpStream], deadline: Instant) -> usize {
    let mut open = 0;
    for s in held.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        let mut buf = [0u8; 512];
        loop {
            match s.read(&mut buf) {
                // An answer (a 408, say) before the close is fine.
                Ok(n) if n > 0 => continue,
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    open += 1;
                    break;
                }
                Err(_) => break,
            }
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_head_connections_cannot_starve_the_admin_probes() {
    let options = Options {
        extra_args: vec![
            "--admin-header-timeout".into(),
            "2s".into(),
            "--admin-idle-timeout".into(),
            "1s".into(),
        ],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    let addr = cluster.node(1).http_addr.clone();
    // More than every slot.
    let opened = Instant::now();
    let mut held = silent_and_half_head(&addr, ADMIN_SLOTS + 44);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let (answer, took) = raw(&addr, &healthz(&addr), Duration::from_secs(3));
        assert!(
            answer.starts_with("HTTP/1.1 200") && took < Duration::from_millis(1500),
            "/healthz with {} idle connections open: {answer:?} after {took:?}",
            held.len()
        );
        eprintln!(
            "/healthz with {} idle connections open: {took:?}",
            held.len()
        );
    }
    // A keep-alive connection with nothing more to ask is closed once idle
    // for 1 s.
    let mut idle = vec![served_and_idle(&addr)];
    let open = still_open_at(&mut idle, Instant::now() + Duration::from_millis(2500));
    assert_eq!(
        open, 0,
        "an idle keep-alive connection outlived its idle timeout"
    );
    // The server closes the flood once the head deadline (2 s) has passed
    // (checked at 6 s: on a loaded 2-core box the closing of 344 sockets
    // trails the deadline; the full suite once saw 3 open at 4 s).
    let open = still_open_at(&mut held, opened + Duration::from_secs(6));
    assert_eq!(
        open, 0,
        "idle connections still open 6 s after they connected"
    );
    let closed = cluster
        .metric(
            1,
            "meridian_http_connections_closed_total{listener=\"admin\",reason=\"header_timeout\"}",
        )
        .await
        + cluster
            .metric(
                1,
                "meridian_http_connections_closed_total{listener=\"admin\",reason=\"evicted\"}",
            )
            .await;
    assert!(
        closed >= held.len() as f64,
        "closed idle connections not counted: {closed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_idle_handshakes_and_half_heads_cannot_starve_the_https_probe() {
    let options = Options {
        tls: true,
        extra_args: vec!["--admin-header-timeout".into(), "2s".into()],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    let addr = cluster.node(1).http_addr.clone();
    let pki = cluster.pki.as_ref().expect("tls");
    let mut config = pki.client_config(None);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);
    let opened = Instant::now();
    // Half of them never start the handshake; the other half finish it and
    // send half a request head inside TLS.
    let silent: Vec<TcpStream> = (0..ADMIN_SLOTS / 2 + 20)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    let mut half: Vec<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> = Vec::new();
    for _ in 0..ADMIN_SLOTS / 2 + 20 {
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let conn = rustls::ClientConnection::new(Arc::clone(&config), name).expect("client");
        let tcp = TcpStream::connect(&addr).expect("connect");
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(HALF_HEAD.as_bytes())
            .expect("half a head over TLS");
        half.push(tls);
    }
    let probe = common::http_client()
        .use_preconfigured_tls({
            let mut c = pki.client_config(None);
            c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            c
        })
        .timeout(Duration::from_secs(3))
        .build()
        .expect("HTTPS client");
    let url = format!("{}/healthz", cluster.node(1).url());
    let started = Instant::now();
    let status = probe.get(&url).send().await.map(|r| r.status().as_u16());
    let took = started.elapsed();
    assert!(
        matches!(status, Ok(200)) && took < Duration::from_millis(1500),
        "HTTPS /healthz with {} idle connections open: {status:?} after {took:?}",
        silent.len() + half.len()
    );
    let mut tcp: Vec<TcpStream> = silent;
    tcp.extend(half.into_iter().map(|s| s.sock));
    let open = still_open_at(&mut tcp, opened + Duration::from_secs(5));
    assert_eq!(
        open, 0,
        "idle TLS connections still open 5 s after they connected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_kept_busy_cannot_starve_the_admin_probes() {
    let options = Options {
        extra_args: vec!["--admin-max-connections".into(), "8".into()],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    let addr = cluster.node(1).http_addr.clone();
    // Each connection queues a hundred wrong-token writes: each is answered
    // after the 0.5 s a refused token waits, so the connection always has a
    // request in flight. No credential is needed for this.
    let wrong = format!(
        "POST /api/v1/rules/rollback HTTP/1.1\r\nhost: {addr}\r\n\
         authorization: Bearer not-the-admin-token\r\ncontent-length: 0\r\n\r\n"
    );
    let busy: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).expect("connect");
            s.write_all(wrong.repeat(100).as_bytes()).expect("pipeline");
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let (answer, took) = raw(&addr, &healthz(&addr), Duration::from_secs(3));
        assert!(
            answer.starts_with("HTTP/1.1 200") && took < Duration::from_millis(1000),
            "/healthz with every slot busy: {answer:?} after {took:?}"
        );
        eprintln!("/healthz with every slot busy: {took:?}");
    }
    // Another API request is told why, at once, instead of waiting unseen.
    let rules = format!("GET /api/v1/rules HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    let (answer, took) = raw(&addr, &rules, Duration::from_secs(3));
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("admin-max-connections"),
        "an API request with every slot busy: {answer:?} after {took:?}"
    );
    drop(busy);
}

/// The limiter's resident memory, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_http_port_caps_connections_closes_half_heads_and_stays_small() {
    let limiter = LimiterProcess::start(
        &common::limiter::user_rules(100),
        &[
            "--store",
            "memory",
            "--http-max-connections",
            "64",
            "--http-header-timeout",
            "1s",
            "--http-body-timeout",
            "1s",
            "--http-idle-timeout",
            "1s",
        ],
    );
    let addr = limiter.http.to_string();
    let (answer, _) = raw(&addr, &healthz(&addr), Duration::from_secs(3));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_bytes(limiter.pid());
    // 2,000 connections, each with 24 KiB of a header line that never ends.
    let pad = format!("{HALF_HEAD}{}", "a".repeat(24 * 1024));
    let opened = Instant::now();
    let mut held = Vec::new();
    for _ in 0..2_000 {
        let Ok(mut s) = TcpStream::connect(&addr) else {
            continue;
        };
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = s.write_all(pad.as_bytes());
        held.push(s);
    }
    let flooded = rss_bytes(limiter.pid());
    let (answer, took) = raw(&addr, &healthz(&addr), Duration::from_secs(3));
    assert!(
        answer.starts_with("HTTP/1.1 200") && took < Duration::from_millis(1000),
        "/healthz during the flood: {answer:?} after {took:?}"
    );
    let grew = flooded.saturating_sub(before);
    eprintln!(
        "limiter RSS {} MiB before, {} MiB with {} half-head connections sent (+{} MiB)",
        before >> 20,
        flooded >> 20,
        held.len(),
        grew >> 20
    );
    // At most 64 connections are held, each with a read buffer of at most
    // 64 KiB: a few MiB, against ~100 MiB when every connection was kept.
    assert!(
        grew < 24 << 20,
        "RSS grew by {} MiB with the cap at 64 connections",
        grew >> 20
    );
    let open = still_open_at(&mut held, Instant::now() + Duration::from_secs(3));
    assert_eq!(
        open,
        0,
        "half-head connections still open past the 1 s deadline ({:?} after the first)",
        opened.elapsed()
    );
    // A body announced and never sent is refused at its deadline.
    let slow_body = format!(
        "POST /v1/check HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"domain\""
    );
    let (answer, took) = raw(&addr, &slow_body, Duration::from_secs(4));
    assert!(
        answer.starts_with("HTTP/1.1 400") && took < Duration::from_millis(2500),
        "a body that never arrives: {answer:?} after {took:?}"
    );
    // A keep-alive connection with nothing more to ask is closed once idle
    // for 1 s.
    let mut idle = vec![served_and_idle(&addr)];
    let open = still_open_at(&mut idle, Instant::now() + Duration::from_millis(2500));
    assert_eq!(
        open, 0,
        "an idle keep-alive connection outlived its idle timeout"
    );
    // A head larger than 64 KiB is refused, not buffered.
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nhost: {addr}\r\nx-pad: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let (answer, _) = raw(&addr, &huge, Duration::from_secs(3));
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "a 70 KiB head: {answer:?}"
    );
}

/// Keeps `n` silent TCP connections open to `addr`, opening a new one as
/// the server closes one, until `stop`.
fn keep_silent(addr: SocketAddr, n: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            held.retain(|s| {
                let _ = s.set_nonblocking(true);
                let mut buf = [0u8; 64];
                matches!((&*s).read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            while held.len() < n {
                match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    Ok(s) => held.push(s),
                    Err(_) => break,
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_to_the_control_plane_port_do_not_delay_a_limiters_report() {
    let cluster = Cluster::start(
        1,
        Options {
            tls: true,
            ..Options::default()
        },
    )
    .await;
    cluster.register_region(1, "mumbai").await;
    let raft: SocketAddr = cluster.node(1).raft_addr.parse().expect("address");
    let stop = Arc::new(AtomicBool::new(false));
    let flood = keep_silent(raft, 300, Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A restarted limiter: a new connection, a handshake, its first report.
    let mut slowest = Duration::ZERO;
    for pod in 0..3 {
        let mut client = CoordinatorClient::new(cluster.channel_as(1, "region-mumbai"));
        let report = pb::DemandReport {
            region: "mumbai".into(),
            pod: format!("p-{pod}"),
            interval_ms: 1_000,
            ..Default::default()
        };
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(8), client.report(report)).await;
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            matches!(answer, Ok(Ok(_))),
            "report under a flood of silent connections: {answer:?} after {took:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let _ = flood.join();
    eprintln!("slowest first report under 300 silent connections: {slowest:?}");
    assert!(
        slowest < Duration::from_millis(1000),
        "a first report took {slowest:?} under 300 silent connections"
    );
}

/// An HTTP client whose connections come from `source` (any 127.0.0.0/8
/// address reaches a loopback listener on Linux), each stream its own
/// connection.
fn client_from(source: IpAddr) -> reqwest::Client {
    common::http_client()
        .local_address(source)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_event_streams_cannot_lock_the_dashboard_out() {
    let cluster = Cluster::start(1, Options::default()).await;
    let url = format!("{}/api/v1/events", cluster.node(1).url());
    let mut open = Vec::new();
    // One address may hold a few anonymous streams, not the node's all.
    let one = client_from("127.0.0.1".parse().expect("ip"));
    let mut per_peer = 0;
    let refused = loop {
        let r = one.get(&url).send().await.expect("answer");
        if r.status() != 200 {
            break r;
        }
        open.push(r);
        per_peer += 1;
        assert!(
            per_peer <= 16,
            "one address opened {per_peer} anonymous streams"
        );
    };
    assert_eq!(refused.status(), 503);
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(
        body["max_anonymous_event_streams_per_peer"], per_peer,
        "{body}"
    );
    // Many addresses fill the anonymous share; then anonymous viewers wait,
    // while a viewer with a token is still served.
    let mut sources = 2u8..;
    let anonymous_refused = 'fill: loop {
        let source = sources.next().expect("addresses");
        let client = client_from(IpAddr::from([127, 0, 0, source]));
        for _ in 0..per_peer {
            let r = client.get(&url).send().await.expect("answer");
            if r.status() != 200 {
                break 'fill r;
            }
            open.push(r);
        }
        assert!(
            open.len() < 64,
            "anonymous streams took every one of the 64"
        );
    };
    assert_eq!(anonymous_refused.status(), 503);
    let with_token = client_from("127.0.0.250".parse().expect("ip"))
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("answer");
    assert_eq!(
        with_token.status(),
        200,
        "the dashboard with a token is locked out by {} anonymous streams",
        open.len()
    );
    // A wrong token counts as none, after the wait of every refused token:
    // the places kept for tokens are no quick oracle.
    let started = Instant::now();
    let wrong = client_from("127.0.0.251".parse().expect("ip"))
        .get(&url)
        .bearer_auth("not-the-admin-token")
        .send()
        .await
        .expect("answer");
    let took = started.elapsed();
    assert!(
        wrong.status() == 503 && took >= Duration::from_millis(450),
        "a wrong token: {} after {took:?}",
        wrong.status()
    );
}
