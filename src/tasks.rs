//! Background tasks a service owns: each is spawned under a name, all are told
//! to stop by one signal, and shutdown waits for them up to a deadline,
//! aborting only those that overrun it. Dropping the set aborts whatever
//! still runs, so an early error return leaves no task behind (mini-redis's
//! `DbDropGuard` does the same for its purge task).
//!
//! [`crate::shutdown::signal`] decides *when* a service stops; this decides
//! *how* its tasks do.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinSet};

/// The background tasks of one service and the signal that stops them.
pub struct Tasks {
    /// `true` once shutdown began. A watch rather than a `Notify`: a task or
    /// server that starts waiting after the signal was sent still sees it.
    stop: watch::Sender<bool>,
    /// The tasks still running; the `JoinSet` aborts them when dropped.
    running: JoinSet<()>,
    /// Task id → the name it was spawned under, for the log line of a task
    /// that panicked or overran the deadline.
    names: HashMap<Id, &'static str>,
}

/// A task's view of the stop signal. Cheap to clone, and usable on any
/// runtime (the limiter's worker threads each run their own).
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    /// Resolves once shutdown began (at once if it already has, or if the
    /// owning [`Tasks`] is gone).
    pub async fn stopped(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// [`Stop::stopped`] by value: the shape servers' graceful-shutdown
    /// hooks take.
    pub async fn wait(mut self) {
        self.stopped().await;
    }
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks::new()
    }
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            stop: watch::Sender::new(false),
            running: JoinSet::new(),
            names: HashMap::new(),
        }
    }

    /// The stop signal, for work this set does not spawn itself (servers on
    /// the limiter's worker threads).
    pub fn stop_signal(&self) -> Stop {
        Stop(self.stop.subscribe())
    }

    /// Runs `task` until it ends or the stop signal arrives; then it is
    /// dropped at its next `.await`. For tasks with nothing to finish.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.spawn_with_stop(name, move |mut stop| async move {
            tokio::select! {
                () = task => {}
                () = stop.stopped() => {}
            }
        });
    }

    /// Runs `task(stop)`: the task itself finishes what it must once `stop`
    /// resolves (a last report, a graceful drain), within the deadline given
    /// to [`Tasks::shutdown`].
    pub fn spawn_with_stop<F, Fut>(&mut self, name: &'static str, task: F)
    where
        F: FnOnce(Stop) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop_signal();
        let handle = self.running.spawn(task(stop));
        self.names.insert(handle.id(), name);
    }

    /// Sends the stop signal without waiting: for a service that must stop
    /// something else between the signal and the wait.
    pub fn signal_stop(&self) {
        self.stop.send_replace(true);
    }

    /// Signals every task, waits up to `deadline` for them to end, and
    /// aborts those still running then. Returns the names of those aborted.
    pub async fn shutdown(mut self, deadline: Duration) -> Vec<&'static str> {
        self.signal_stop();
        let all_ended = tokio::time::timeout(deadline, async {
            while let Some(ended) = self.running.join_next_with_id().await {
                self.ended(ended);
            }
        })
        .await
        .is_ok();
        if all_ended {
            return Vec::new();
        }
        let mut overran: Vec<&'static str> = self.names.values().copied().collect();
        overran.sort_unstable();
        tracing::warn!(tasks = ?overran, ?deadline, "tasks did not stop in time; aborting them");
        self.running.abort_all();
        while let Some(ended) = self.running.join_next_with_id().await {
            self.ended(ended);
        }
        overran
    }

    fn ended(&mut self, ended: Result<(Id, ()), tokio::task::JoinError>) {
        let id = match &ended {
            Ok((id, ())) => *id,
            Err(e) => e.id(),
        };
        let name = self.names.remove(&id).unwrap_or("unnamed");
        if let Err(e) = ended
            && e.is_panic()
        {
            tracing::error!(task = name, "background task panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_task_finishes_its_last_work_after_the_signal() {
        let mut tasks = Tasks::new();
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        tasks.spawn_with_stop("reporter", move |mut stop| async move {
            stop.stopped().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            done.store(true, Ordering::SeqCst);
        });
        let overran = tasks.shutdown(Duration::from_secs(5)).await;
        assert!(overran.is_empty(), "{overran:?}");
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_plain_task_ends_at_the_signal() {
        let mut tasks = Tasks::new();
        tasks.spawn("forever", std::future::pending());
        let started = std::time::Instant::now();
        assert!(tasks.shutdown(Duration::from_secs(5)).await.is_empty());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn only_a_task_that_overruns_the_deadline_is_aborted() {
        let mut tasks = Tasks::new();
        let quick = Arc::new(AtomicBool::new(false));
        let done = quick.clone();
        tasks.spawn_with_stop("quick", move |stop| async move {
            stop.wait().await;
            done.store(true, Ordering::SeqCst);
        });
        tasks.spawn_with_stop("stuck", |_stop| std::future::pending());
        let overran = tasks.shutdown(Duration::from_millis(100)).await;
        assert_eq!(overran, vec!["stuck"]);
        assert!(quick.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn dropping_the_set_aborts_its_tasks() {
        let mut tasks = Tasks::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn_with_stop("holder", move |_stop| async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        drop(tasks);
        assert!(rx.await.is_err(), "the task still holds its sender");
    }
}
