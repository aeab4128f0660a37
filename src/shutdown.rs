//! How the services learn they should stop: SIGTERM (Kubernetes, systemd)
//! or Ctrl-C.

/// SIGTERM or Ctrl-C. The handlers are registered when this is called, not
/// when the future is first polled: a SIGTERM that arrives right after a
/// service said it is serving must stop it cleanly, not kill it.
pub fn signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (term, interrupt) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(interrupt) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
