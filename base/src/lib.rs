//! What every layer of idem shares, with one owner each: the injected [`Clock`] (wall time in
//! ms since the Unix epoch and a monotonic clock for durations and liveness, I15), the
//! [`Stopwatch`] that measures elapsed time on the host's monotonic clock, the
//! [`SeededRng`] that seeded test schedules draw from, the [`ErrorChain`] renderer that
//! joins an error with its sources, and [`lock()`], a poison-tolerant `Mutex` lock.
//!
//! `idem`, `idem-replica` and `idem-org` re-export [`Clock`], [`SystemClock`] and
//! [`ManualClock`], so one clock value drives every layer. The workspace's `clippy.toml`
//! forbids `Instant::now` and `SystemTime::now` everywhere but [`clock`], so no code reads
//! time the clock cannot control.
//!
//! ```
//! use std::sync::Arc;
//! use idem_base::{Clock, ErrorChain, ManualClock, SeededRng};
//!
//! let clock = Arc::new(ManualClock::new(1_700_000_000_000));
//! clock.advance(500);
//! assert_eq!(clock.now_ms(), 1_700_000_000_500);
//! assert_eq!(clock.monotonic_ms(), 500);
//!
//! let (mut a, mut b) = (SeededRng::new(7), SeededRng::new(7));
//! assert_eq!(a.below(1000), b.below(1000));
//!
//! let io = std::io::Error::other("disk full");
//! assert_eq!(ErrorChain::new(&io).to_string(), "disk full");
//! ```
//!
//! # Core types
//! - [`Clock`], [`SystemClock`], [`ManualClock`], [`Stopwatch`]: time ([`clock`]).
//! - [`SeededRng`]: a reproducible generator for seeded schedules ([`rng`]).
//! - [`ErrorChain`]: an error and its sources on one line ([`error`]).
//! - [`lock()`]: a `Mutex` guard whether or not a holder panicked ([`mod@lock`]).
//!
//! # Error semantics
//! Nothing here fails: clocks saturate rather than overflow, and [`lock()`] takes the guard of
//! a poisoned mutex.

#![forbid(unsafe_code)]

pub mod clock;
pub mod error;
pub mod lock;
pub mod rng;

pub use clock::{Clock, ManualClock, Stopwatch, SystemClock, system_time_ms};
pub use error::ErrorChain;
pub use lock::lock;
pub use rng::SeededRng;
