//! Fenced SQLite snapshot store on object storage.
//!
//! **Guarantee.** Once [`Replica::ship`] returns `Ok`, a verified snapshot of the database
//! (and the commit counter it contains) is durably published in the org's create-only log
//! under the writer's round, and every later [`Replica::hydrate`] by a newer claim installs
//! it or something newer — never an older one, never a damaged one. Once round R+1 is
//! claimed, no ship under round ≤ R returns `Ok` (it gets [`Error::Fenced`]). This crate
//! knows nothing of idempotency: exactly-once request execution is the `org` layer's
//! composition of this guarantee with `idem`'s dedup row.
//!
//! ```
//! # use std::sync::Arc;
//! # use idem_replica::{OrgId, Replica, Settings, Snapshot};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(object_store::memory::InMemory::new());
//! let replica = Replica::open(store, "prod", Settings::default()).await?;
//! let org = OrgId::new("acme")?;
//!
//! // A writer claims the org, and ships a snapshot of its database.
//! let mut claim = replica.claim(&org, "writer-a", false).await?;
//! let conn = rusqlite::Connection::open_in_memory()?;
//! conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (42);")?;
//! let snap = Snapshot::take(&conn, |_| Ok(1))?;
//! let shipped = replica.ship(&mut claim, snap).await?;
//! replica.release(&mut claim).await?;
//!
//! // A successor claims a higher round and hydrates what was shipped.
//! let mut next = replica.claim(&org, "writer-b", false).await?;
//! assert!(next.round() > claim.round());
//! let dir = tempfile::tempdir()?;
//! let got = replica.hydrate(&mut next, &dir.path().join("acme.db")).await?;
//! assert_eq!(got.snapshot.map(|s| s.seq), Some(shipped.seq));
//! let x: i64 = rusqlite::Connection::open(dir.path().join("acme.db"))?
//!     .query_row("SELECT x FROM t", [], |r| r.get(0))?;
//! assert_eq!(x, 42);
//! # Ok(())
//! # }
//! ```
//!
//! # Core types
//! - [`Replica`]: the store handle (claim, ship, hydrate, restore, release, retain, verify).
//! - [`Claim`]: a round held by a writer; [`Snapshot`]: a consistent database image.
//! - [`LogEntry`]: the versioned, create-only history; [`OrgId`]: validated tenant ids.
//! - [`Delta`]: pages changed since the claim's last ship, for [`Replica::ship_delta`].
//! - [`Shipper`]: ships a live database under a claim — captures handed to it by the
//!   connection's thread ([`sqlite::Owned::capture`]), proved from their own pages, published
//!   as deltas of committed WAL frames or full snapshots per [`ShipPolicy`].
//! - [`sqlite`]: the writer's exclusive ownership of its files (I13), WAL frames, captures.
//! - [`commit`]: the commit counter every write transaction raises, which a capture reads
//!   and the shipper proves from the captured pages (I6, I13).
//! - [`journal`]: the journal's store protocol (`docs/design.md` 3g): a writer process's
//!   [`journal::Run`] of create-only batches acknowledging many orgs per PUT, the seals and
//!   exclusions that fence it, and the walk of runs. The org layer does not use it yet.
//! - [`StoreTime`]: this host's clock beside the store's ([`Replica::store_time`]), which
//!   every decision by wall-clock age checks first (I15).
//! - With the `test-util` feature (tests only): `fault`, a fault-injecting store wrapper,
//!   pausing failpoints and a seeded generator for schedules; `conformance`, the suite every
//!   store runs; `latency`, a store wrapper that delays each request like S3 and counts the
//!   round trips on a step's critical path (never a product store).
//!
//! # Layout
//! One folder per layer (`docs/replica.md`, "Layout"): `format/` (bytes, no I/O), `fence/`
//! (log, claims, leases), `chain/` (chain rules and position), `publish/`, `rebuild/`,
//! `live/` (public as [`sqlite`]), `retention/`, `testing/` (`test-util`).
//!
//! # Object layout
//! `<prefix>/orgs/<org>/log/<seq:020>.json` (create-only); under `<prefix>/orgs/<org>/snap/`,
//! full snapshots as a manifest (`…-<sha256>.manifest.json`) of content-addressed segments
//! (`…-<sha256>.seg.zst`, see [`segment`]) and delta blobs (`…-<nonce>.delta.zst`);
//! `<prefix>/orgs/<org>/lease.json` and `<prefix>/processes/<instance>.json` (advisory
//! liveness, judged by watching them change, never by their timestamps).
//!
//! # Error semantics
//! [`Error::kind`] says what to do: [`ErrorKind::Retry`] (store hiccup, lease held, lost
//! claim race), [`ErrorKind::Reacquire`] (fenced, or a publish of unknown outcome: the claim
//! is lost — [`Error::is_claim_lost`] — discard local state and claim again),
//! [`ErrorKind::Input`] (including a delta the chain tip refuses: ship a full snapshot),
//! [`ErrorKind::Corrupt`] (stop; never fall back), [`ErrorKind::Fatal`] (unsafe store,
//! unknown format, a host clock the store contradicts: [`Error::ClockSkew`]).
#![forbid(unsafe_code)]

mod chain;
mod clone;
mod counted;
mod error;
mod failpoint;
mod fence;
mod format;
pub mod journal;
mod levels;
pub mod live;
pub mod metrics;
mod org_id;
mod publish;
mod rebuild;
mod replica;
mod retention;
mod settings;
mod store;
mod store_clock;
mod store_url;
#[cfg(feature = "test-util")]
mod testing;
mod verify;

#[cfg(feature = "test-util")]
pub use testing::{conformance, fault, latency};

pub use format::segment;
pub use live as sqlite;
pub use live::commit;

pub use clone::{CloneOutcome, Cloned};
pub use counted::{CountedStore, StoreRequests};
pub use error::{Error, ErrorKind};
pub use failpoint::{FailPoint, Failpoints};
pub use fence::claim::Claim;
pub use fence::lease::{Hold, Lease, MAX_LEASE_BYTES, ProcessLease, ProcessListing};
pub use format::blob::{BLOB_MAGIC, BLOB_VERSION};
pub use format::entry::{
    BlobRef, Claimer, DeltaLink, ENTRY_VERSION, EntryBody, EntryHeader, INLINE_ENTRY_VERSION,
    JOURNAL_ENTRY_VERSION, LogEntry, MANIFEST_ENTRY_VERSION, MAX_ENTRY_BYTES, MAX_SHIP_WINDOW,
    PIPELINED_ENTRY_VERSION, Pipeline, Stored,
};
pub use idem_base::clock::{Clock, ManualClock, SystemClock};
pub use levels::{LEVEL_MIN_DELTAS, LevelPosition, LevelReport, MAX_LEVEL_BYTES};
pub use live::shipper::{
    CaptureSource, FLOOR_MAX_DELTAS, Issued, ShipKind, ShipPolicy, ShipReport, Shipper,
};
pub use org_id::OrgId;
pub use publish::delta::Delta;
pub use publish::pipeline::{Acked, InFlight, Landing};
pub use publish::ship::Shipped;
pub use publish::snapshot::Snapshot;
pub use rebuild::hydrate::{Hydrated, RestoreProgress};
pub use rebuild::resume::{ResumePoint, Resumed};
pub use replica::Replica;
pub use retention::RetentionReport;
pub use retention::clones::CloneReference;
pub use settings::{
    DEFAULT_WINDOW_MS, MAX_HOLDER_TERM_MS, MAX_INLINE_DELTA_BYTES, MIN_LEASE_MS, Retention,
    Settings, max_holder_term_ms,
};
pub use store_clock::{REMEASURE_AFTER, StoreTime};
pub use store_url::{MAX_PREFIX_LISTS, StoreUrl};
pub use verify::VerifyReport;
