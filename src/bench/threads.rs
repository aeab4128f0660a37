//! The closed loop's client threads.
//!
//! On tokio's multi-threaded scheduler the load generator spent about as much
//! CPU per check as the limiter it measured (25 µs against 30 µs over Envoy
//! RLS on a 2-core box): every response wakes a stream's task on one worker
//! while the connection's I/O task runs on another. On a shared machine that
//! CPU is taken from the server and shows in its latency. So, like the
//! limiter's workers, each client thread runs its own single-threaded runtime
//! with its own connections and the streams that use them; a request never
//! leaves the thread that sends it.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::api::Connection;
use super::recorder::Recorder;
use super::{BenchArgs, BenchError, Plan, Window, closed_loop};

/// Client threads with their connections open, waiting for the window.
pub(super) struct ClientThreads {
    go: Vec<oneshot::Sender<(Window, Arc<Recorder>)>>,
    done: Vec<oneshot::Receiver<Result<(), BenchError>>>,
}

impl ClientThreads {
    /// One thread per connection, at most one per core; connection `c` and
    /// the streams on it (stream `s` uses connection `s % connections`) live
    /// on thread `c % threads`. Returns once every connection is open.
    pub(super) async fn open(
        plan: &Arc<Plan>,
        concurrency: usize,
        args: &BenchArgs,
    ) -> Result<ClientThreads, BenchError> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let threads = args.connections.clamp(1, cores);
        let mut client = ClientThreads {
            go: Vec::with_capacity(threads),
            done: Vec::with_capacity(threads),
        };
        let mut ready = Vec::with_capacity(threads);
        for thread in 0..threads {
            let connections: Vec<usize> = (0..args.connections)
                .filter(|c| c % threads == thread)
                .collect();
            let (ready_tx, ready_rx) = oneshot::channel();
            let (go_tx, go_rx) = oneshot::channel();
            let (done_tx, done_rx) = oneshot::channel();
            let (plan, timeout, seed) = (plan.clone(), args.timeout, args.seed);
            let total = args.connections;
            let body = async move {
                let mut open = Vec::with_capacity(connections.len());
                for &c in &connections {
                    match Connection::open(plan.api, &plan.target, timeout).await {
                        Ok(connection) => open.push((c, connection)),
                        Err(reason) => {
                            let _ = ready_tx.send(Err(BenchError::Connect {
                                target: plan.target.clone(),
                                reason,
                            }));
                            return;
                        }
                    }
                }
                let _ = ready_tx.send(Ok(()));
                let Ok((window, recorder)) = go_rx.await else {
                    return; // another thread could not connect
                };
                let streams: Vec<_> = (0..concurrency)
                    .filter_map(|s| {
                        let c = s % total;
                        let (_, connection) = open.iter().find(|(i, _)| *i == c)?;
                        Some((s, connection.clone()))
                    })
                    .collect();
                let result = closed_loop(&plan, streams, &recorder, window, seed).await;
                let _ = done_tx.send(result);
            };
            std::thread::Builder::new()
                .name(format!("bench-client-{thread}"))
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime.block_on(body),
                        Err(e) => {
                            tracing::error!(error = %e, "cannot start a client thread's runtime")
                        }
                    }
                })
                .map_err(|e| BenchError::Thread(e.to_string()))?;
            ready.push(ready_rx);
            client.go.push(go_tx);
            client.done.push(done_rx);
        }
        for r in ready {
            r.await.map_err(|_| {
                BenchError::Thread("a client thread stopped while connecting".into())
            })??;
        }
        Ok(client)
    }

    /// Runs every stream through `window`, recording into `recorder`.
    pub(super) async fn run(
        self,
        window: Window,
        recorder: &Arc<Recorder>,
    ) -> Result<(), BenchError> {
        for go in self.go {
            let _ = go.send((window, recorder.clone()));
        }
        for done in self.done {
            done.await.map_err(|_| {
                BenchError::Thread("a client thread stopped before its streams ended".into())
            })??;
        }
        Ok(())
    }
}
