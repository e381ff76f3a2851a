//! A node's graceful shutdown, shared by its client front ends (RESP and PostgreSQL): once the
//! drain begins, the front end takes no new clients, each connection closes as soon as it has
//! nothing under way, and the node exits when every connection closed or the drain's time ran
//! out — so a write or COMMIT a client is waiting for gets its answer, not a broken connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How often a drain looks whether what it waits for is done.
const POLL: Duration = Duration::from_millis(10);

pub struct Drain {
    signal: watch::Sender<bool>,
    connections: AtomicUsize,
    /// A client asked the node to shut down (Redis's SHUTDOWN), as SIGTERM does.
    shutdown_requested: tokio::sync::Notify,
}

impl Drain {
    pub fn new() -> Arc<Drain> {
        Arc::new(Drain {
            signal: watch::Sender::new(false),
            connections: AtomicUsize::new(0),
            shutdown_requested: tokio::sync::Notify::new(),
        })
    }

    /// Asks whoever awaits `shutdown_requested` to shut the node down.
    pub fn request_shutdown(&self) {
        self.shutdown_requested.notify_one();
    }

    /// Returns once a client asked the node to shut down.
    pub async fn shutdown_requested(&self) {
        self.shutdown_requested.notified().await;
    }

    /// Counts a client connection (or a request a peer makes for its client) open until the
    /// guard drops.
    pub fn connection(self: &Arc<Self>) -> ConnectionOpen {
        self.connections.fetch_add(1, Ordering::AcqRel);
        ConnectionOpen(self.clone())
    }

    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Becomes true when the drain begins.
    pub fn signal(&self) -> watch::Receiver<bool> {
        self.signal.subscribe()
    }

    pub fn is_draining(&self) -> bool {
        *self.signal.borrow()
    }

    /// Begins the drain and waits, up to `within`, until `done` (no connection open, and
    /// whatever else the front end waits for); whether it came to that.
    pub async fn run(&self, within: Duration, done: impl Fn() -> bool) -> bool {
        self.signal.send_replace(true);
        let deadline = Instant::now() + within;
        loop {
            if done() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A client connection open; see `Drain::connection`.
pub struct ConnectionOpen(Arc<Drain>);

impl Drop for ConnectionOpen {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Returns once the drain began: for a connection that is idle whenever it waits for its
/// client, as a RESP connection is. Made once and kept, it stays registered with the signal
/// instead of joining and leaving it at every wait.
pub async fn begun(mut signal: watch::Receiver<bool>) {
    if signal.wait_for(|draining| *draining).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Returns once the drain began and `idle` says the connection has nothing under way. `idle`
/// changes only while the connection handles something of its own, so it is checked when the
/// drain begins and again at every call (each wait for the client's next request).
pub async fn until_idle(signal: &mut watch::Receiver<bool>, idle: impl Fn() -> bool) {
    loop {
        if *signal.borrow_and_update() && idle() {
            return;
        }
        if signal.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_waits_for_the_connections_open_and_no_longer_than_it_is_given() {
        let drain = Drain::new();
        let mut signal = drain.signal();
        let open = drain.connection();
        assert_eq!(drain.open_connections(), 1);
        let watcher = tokio::spawn(async move {
            until_idle(&mut signal, || true).await;
        });
        assert!(
            !drain
                .run(Duration::from_millis(30), || drain.open_connections() == 0)
                .await
        );
        assert!(drain.is_draining());
        watcher.await.unwrap();
        drop(open);
        assert!(
            drain
                .run(Duration::from_secs(5), || drain.open_connections() == 0)
                .await
        );
    }

    #[tokio::test]
    async fn a_busy_connection_is_not_idle_until_it_says_so() {
        let drain = Drain::new();
        drain.signal.send_replace(true);
        let mut signal = drain.signal();
        let busy = tokio::time::timeout(Duration::from_millis(30), until_idle(&mut signal, || false)).await;
        assert!(busy.is_err(), "a connection with something under way is not closed");
        tokio::time::timeout(Duration::from_secs(5), until_idle(&mut signal, || true))
            .await
            .expect("idle once it says so");
    }
}
