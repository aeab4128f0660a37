//! A TCP proxy a test can cut: the network fault between a region and its
//! coordinators. `cut()` closes every open connection and refuses new ones
//! (accepted, then dropped at once) until `restore()`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped on every cut; connections of an older generation close.
    generation: watch::Sender<u64>,
    cuts: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy listener");
        let addr = listener.local_addr().expect("proxy address");
        let open = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let cuts = Arc::new(AtomicU64::new(0));
        let task = {
            let open = open.clone();
            let generation = generation.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    if !open.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let mut gen_rx = generation.subscribe();
                    let born = *gen_rx.borrow_and_update();
                    tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let (mut ri, mut wi) = inbound.into_split();
                        let (mut ro, mut wo) = outbound.into_split();
                        let pipe = async {
                            tokio::select! {
                                _ = tokio::io::copy(&mut ri, &mut wo) => {}
                                _ = tokio::io::copy(&mut ro, &mut wi) => {}
                            }
                        };
                        tokio::select! {
                            () = pipe => {}
                            _ = gen_rx.wait_for(|g| *g != born) => {}
                        }
                    });
                }
            })
        };
        Proxy {
            addr,
            open,
            generation,
            cuts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        let n = self.cuts.fetch_add(1, Ordering::SeqCst) + 1;
        self.generation.send_replace(n);
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
