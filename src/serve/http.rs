//! The HTTP/1.1 server under `idem serve`'s routes, with the limits axum's `serve` lacks.
//!
//! Invariant: an idle or slow client never holds a descriptor for long, and no number of
//! clients runs the process out of descriptors.
//! - **Header-read timeout** (`--header-read-timeout`): hyper closes a connection whose
//!   request head has not fully arrived this long after it started waiting for one: half a
//!   header, no byte at all, or an idle keep-alive connection between requests.
//! - **Connection bound** (`--max-connections`): a connection is accepted only with a permit
//!   of a semaphore of that size, released when the connection closes. Past the bound, new
//!   connections wait in the kernel's listen backlog (no descriptor of ours) until one
//!   closes; the backlog refuses beyond its own size.
//! - **Accept errors**: a per-connection failure (the peer reset before the accept) moves on
//!   at once. Anything else (EMFILE, ENFILE, ENOBUFS) backs off, 10 ms doubling to 1 s, and
//!   logs once per streak rather than once per try; `idem_http_accept_errors_total` counts
//!   every one.
//! - **Shutdown**: the stop signal ends accepting, every connection is told to finish its
//!   request in flight and close, and [`serve`] returns once every permit is back.
//!   `--drain-timeout` (in `mod.rs`) bounds that wait.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// The server's limits (`idem serve` flags).
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// How long a connection may take to send a request head, or stay idle between requests.
    pub(super) header_read_timeout: Duration,
    /// Connections open at once, at most.
    pub(super) max_connections: u32,
}

/// Open connections (gauge).
pub(super) const CONNECTIONS: &str = "idem_http_connections";
/// Accept calls that failed (counter).
pub(super) const ACCEPT_ERRORS: &str = "idem_http_accept_errors_total";
/// Connections closed by the header-read timeout (counter).
pub(super) const HEADER_TIMEOUTS: &str = "idem_http_header_timeouts_total";

/// The first and the longest pause after a failed accept.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `stop` completes, then drains: returns once every
/// connection has closed.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections as usize));
    let (stopping_tx, stopping) = watch::channel(false);
    let mut accepting = Accepting::default();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break, // never closed: the semaphore lives here
            },
            () = &mut stop => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        match accepted {
            Ok((stream, _peer)) => {
                accepting.succeeded();
                tokio::spawn(connection(
                    stream,
                    app.clone(),
                    limits,
                    permit,
                    stopping.clone(),
                ));
            }
            Err(e) if per_connection(&e) => {}
            Err(e) => {
                let pause = accepting.failed(&e);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = &mut stop => break,
                }
            }
        }
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    // Every connection holds a permit until it closes: all of them back means all closed.
    let _ = permits.acquire_many(limits.max_connections).await;
}

/// One connection, from accept to close; its permit is released when it ends.
async fn connection(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    permit: OwnedSemaphorePermit,
    mut stopping: watch::Receiver<bool>,
) {
    let _permit = permit;
    metrics::gauge!(CONNECTIONS).increment(1.0);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let mut told = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    if e.is_timeout() {
                        metrics::counter!(HEADER_TIMEOUTS).increment(1);
                    }
                    tracing::debug!(error = %e, "connection ended");
                }
                break;
            }
            // A closed sender also means stop.
            _ = stopping.wait_for(|s| *s), if !told => {
                told = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    metrics::gauge!(CONNECTIONS).decrement(1.0);
}

/// A failure of one incoming connection (it was reset or aborted before the accept), not of
/// the listener.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// The accept loop's error streak: its backoff and its one log line.
#[derive(Default)]
struct Accepting {
    /// Failures since the last accept that succeeded.
    streak: u64,
    pause: Duration,
}

impl Accepting {
    /// Counts a failure; the pause before the next try.
    fn failed(&mut self, e: &io::Error) -> Duration {
        metrics::counter!(ACCEPT_ERRORS).increment(1);
        if self.streak == 0 {
            tracing::warn!(error = %e, "accept failed; backing off until it succeeds");
            self.pause = BACKOFF_MIN;
        } else {
            self.pause = (self.pause * 2).min(BACKOFF_MAX);
        }
        self.streak += 1;
        self.pause
    }

    fn succeeded(&mut self) {
        if self.streak > 0 {
            tracing::info!(failures = self.streak, "accepting again");
            self.streak = 0;
        }
    }
}
