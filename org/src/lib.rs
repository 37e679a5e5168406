//! Exactly-once request execution across writer handoffs, for one SQLite database per tenant.
//!
//! **The guarantee.** [`Org::once`] applies a request's database effect at most once in the
//! acknowledged history of an org, and returns `Ok` only after a snapshot holding the effect is
//! published in object storage under the writer's current round (ship-before-ack, I6). A new
//! writer — another replica during a rolling upgrade, or a successor after `kill -9` — claims a
//! higher round, which fences the old one (I7), and hydrates the latest snapshot before it
//! serves (I8), so every acknowledged key replays its first result and never runs again.
//! **Not covered:** effects outside the database (HTTP calls, email, payments); a request whose
//! commit was never acknowledged may be lost with its writer and runs again on retry.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // One dependency: idem-org re-exports the crates its signatures use.
//! use idem_org::replica::{OrgId, Replica, Settings};
//! use idem_org::{Registry, rusqlite};
//!
//! let dir = tempfile::tempdir()?;
//! // One URL names the store and the prefix inside it, as `idem … --store URL` takes it:
//! // a directory (here `<tmp>/store/prod`), `s3://bucket/prod`, `gs://…`, `az://…`.
//! let url = dir.path().join("store/prod").display().to_string();
//! let replica = Replica::open_url(&url, Settings::default()).await?;
//! let registry = Registry::builder(dir.path().join("data"), replica, "replica-a")
//!     .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS ledger (key TEXT, cents INT)"))
//!     .build()?;
//!
//! // Validate the tenant id once, at the edge (I12): the registry takes only an `OrgId`.
//! let acme = registry.acquire(&OrgId::new("acme")?).await?;
//! for _ in 0..2 {
//!     let out = acme
//!         .once("pay-7", |tx| {
//!             tx.execute("INSERT INTO ledger VALUES ('pay-7', 1250)", [])?;
//!             Ok::<_, rusqlite::Error>(b"paid".to_vec())
//!         })
//!         .await?; // returns once the commit is shipped to the store
//!     assert_eq!(out.result, b"paid");
//! }
//! registry.shutdown().await; // graceful handoff: final ship + Release
//! # Ok(())
//! # }
//! ```
//!
//! The store URL's path is the prefix (`idem_replica::StoreUrl`): `s3://bucket/prod` in
//! code and `--store s3://bucket/prod` on the command line name the same objects, and a
//! local store at `DIR` with the prefix `prod` is `DIR/prod`. `Replica::open(store, prefix,
//! ..)` takes a store built by hand and the same prefix.
//!
//! # Running it in a service
//! - **Runtime.** A multi-thread tokio runtime (`#[tokio::main]`). The registry runs each
//!   org's SQLite work on its own writer pool ([`RegistrySettings::writer_threads`]); hydrates,
//!   compression, connection opens and local-store I/O go to tokio's blocking pool, which
//!   `idem serve` caps at 32 threads (`max_blocking_threads(32)`, tokio's default is 512) so
//!   a handoff that hydrates thousands of orgs at once queues for a few dozen threads
//!   instead of starting hundreds.
//! - **Logs.** The library logs through `tracing`: failed ships (`ship failed`, `warn`),
//!   retention failures, and every internal error answered as a 500 by the HTTP layer (its
//!   `error_id` and cause, `error`). Without a subscriber these lines go nowhere; install
//!   one (`tracing-subscriber = { version = "0.3", features = ["env-filter"] }`).
//! - **Metrics.** Recorded through the `metrics` facade; install any exporter, then call
//!   [`metrics::describe`] for their help text and units. With
//!   `metrics-exporter-prometheus = { version = "0.17", default-features = false }`:
//!
//! ```
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! use tracing_subscriber::EnvFilter;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     tracing_subscriber::fmt().with_env_filter(EnvFilter::new("info")).init();
//!     let runtime = tokio::runtime::Builder::new_multi_thread()
//!         .max_blocking_threads(32)
//!         .enable_all()
//!         .build()?;
//!     let prometheus = PrometheusBuilder::new()
//!         .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[0.001, 0.01, 0.1, 1.0])?
//!         .install_recorder()?; // histograms with buckets, not summaries
//!     idem_org::metrics::describe();
//!     runtime.block_on(async {
//!         # let dir = tempfile::tempdir()?;
//!         # let url = dir.path().join("store/prod").display().to_string();
//!         let replica = idem_org::replica::Replica::open_url(&url, Default::default()).await?;
//!         let registry = idem_org::Registry::builder(dir.path().join("data"), replica, "a").build()?;
//!         let acme = idem_org::replica::OrgId::new("acme")?;
//!         registry.once(&acme, "k", |_tx| Ok::<_, rusqlite::Error>(b"ok".to_vec())).await?;
//!         // Serve `prometheus.render()` at GET /metrics; call `run_upkeep()` every few seconds.
//!         prometheus.run_upkeep();
//!         assert!(prometheus.render().contains("idem_ack_seconds_bucket"));
//!         registry.shutdown().await;
//!         Ok::<_, Box<dyn std::error::Error>>(())
//!     })
//! }
//! ```
//!
//! # Core types
//! - [`Registry`] (built with [`Registry::builder`]): one writer per org, opened on demand,
//!   configured by [`RegistrySettings`] (named apart from the replica's `Settings`),
//!   at most [`RegistrySettings::max_open_orgs`] open and [`RegistrySettings::max_active_orgs`] of them with a
//!   connection (idle ones park); `acquire`, and `once` / `once_with` / `effect`
//!   that acquire and retry once on a handle closed meanwhile; `prune_all`, `shutdown`.
//! - [`JournalSettings`] (`RegistrySettings::journal`, off by default): the orgs of the
//!   process ship as sections of one journal run, so one store PUT acknowledges every org
//!   that committed during a tick (docs/design.md, section 3g).
//! - [`Org`]: an acquired org: `once`, `once_with`, `applied`, `prune`, `release`, `stats`;
//!   external effects with `effect` / `effect_blocking` (the protocol runs as its own task: a
//!   caller that gives up never loses a settlement), `effects`, `effect_record`,
//!   `effect_history`, `resolve` (the holder's own resolve); `Registry::open_effects` /
//!   `record_effect_gauges` for `/metrics`.
//!
//! # Error semantics
//! [`Error::kind`]: `Retry` (ship failed, busy: same key, same handle), `Reacquire` (fenced or
//! closed: acquire again, same key), `Input`, `Rejected` (fingerprint mismatch, apply failed),
//! `Corrupt`, `Fatal`. A fenced handle is poisoned: every later call fails fast.
//! [`Error::is_fingerprint_mismatch`] tells a changed payload under an applied key (HTTP 422)
//! from other rejections; [`Error::idem`] gives the dedup transaction's own error.
//!
//! # Modules
//! `tenure` (an org's tenure from claim to end: its state, the shipper lock, claim → resume
//! or hydrate → open, release, and the one table of every way an org ends), `writer` (an
//! org's writer: `job` its job vocabulary, `run` how every job runs), `pool` (the writer
//! threads shared by every org), `budget` (open-org and active-org limits and caches from
//! settings and the open-files limit), `active` (the registry's active set), `park`
//! (parking idle orgs, unparking after proving the file), `commit` (the commit sequence),
//! `ack` (waiters: ship-before-ack with group commit), `ship` (one ship or confirmation),
//! `shipper` (the task driving `idem_replica::Shipper`), `registry`, `effect` (external
//! effects), `sync` (the poison-tolerant lock helper); `testing` (feature `test-util`)
//! what only tests use.
#![forbid(unsafe_code)]

mod ack;
mod active;
mod budget;
mod commit;
mod effect;
mod error;
#[cfg(feature = "axum")]
pub mod http;
mod local;
pub mod metrics;
mod org;
mod park;
mod pipeline;
mod pool;
mod prepare;
mod published;
mod registry;
mod settings;
mod ship;
mod shipper;
mod sync;
mod tenure;
#[cfg(feature = "test-util")]
pub mod testing;
mod warm;
mod writer;

// The crates this one's signatures use, at the versions it is built against: an embedder
// depends on `idem-org` alone.
pub use idem;
pub use idem_replica as replica;
pub use object_store;
pub use rusqlite;

pub use budget::{FDS_PER_ORG, FDS_PER_PARKED_ORG, MIN_ORG_BYTES, RESERVED_FDS};
pub use effect::OpenEffects;
pub use error::{Error, ErrorKind};
pub use local::home_id;
pub use org::{Org, OrgStats};
pub use prepare::prepare_database;
pub use published::{ReadOutcome, ReadSource};
pub use registry::{PruneProgress, Registry, RegistryBuilder, SHUTDOWN_CONCURRENCY};
pub use settings::{JournalSettings, RegistrySettings, WARM_POLL_MS, WarmSettings};

/// The registry's settings under their former name, which `idem_replica::Settings` shares.
#[deprecated(note = "renamed `RegistrySettings`: `idem_replica::Settings` has the same name")]
pub type Settings = RegistrySettings;
pub use writer::InitFn;
