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
//! let next = replica.claim(&org, "writer-b", false).await?;
//! assert!(next.round > claim.round);
//! let dir = std::env::temp_dir().join(format!("idem-doc-{}", std::process::id()));
//! let got = replica.hydrate(&next, &dir.join("acme.db")).await?;
//! assert_eq!(got.snapshot.map(|s| s.seq), Some(shipped.seq));
//! let x: i64 = rusqlite::Connection::open(dir.join("acme.db"))?
//!     .query_row("SELECT x FROM t", [], |r| r.get(0))?;
//! assert_eq!(x, 42);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Core types
//! - [`Replica`]: the store handle (claim, ship, hydrate, restore, release, retain, verify).
//! - [`Claim`]: a round held by a writer; [`Snapshot`]: a consistent database image.
//! - [`LogEntry`]: the versioned, create-only history; [`OrgId`]: validated tenant ids.
//! - [`Shipper`]: ships a live database under a claim — captures handed to it by the
//!   connection's thread ([`sqlite::Owned::capture`]), proved from their own pages, published
//!   as deltas of committed WAL frames or full snapshots per [`ShipPolicy`].
//! - [`sqlite`]: the writer's exclusive ownership of its files (I13), WAL frames, captures.
//! - [`fault`]: a fault-injecting store wrapper; [`conformance`]: the suite every store runs.
//!
//! # Object layout
//! `<prefix>/orgs/<org>/log/<seq:020>.json` (create-only), `<prefix>/orgs/<org>/snap/<seq:020>-<round>-<nonce>.db.zst`,
//! `<prefix>/orgs/<org>/lease.json` (advisory).
//!
//! # Error semantics
//! [`Error::kind`] says what to do: [`ErrorKind::Retry`] (store hiccup, lease held, lost
//! claim race), [`ErrorKind::Reacquire`] (fenced or unknown publish outcome: the claim is
//! dead, discard local state and claim again), [`ErrorKind::Input`], [`ErrorKind::Corrupt`]
//! (stop; never fall back), [`ErrorKind::Fatal`] (unsafe store, unknown format).
#![forbid(unsafe_code)]

mod claim;
pub mod conformance;
mod delta;
mod entry;
mod error;
mod failpoint;
pub mod fault;
mod hydrate;
mod layout;
mod org_id;
mod replica;
mod retention;
mod settings;
mod shipper;
mod snapshot;
pub mod sqlite;

pub use claim::{Claim, Hydrated, RetentionReport, Shipped, VerifyReport};
pub use delta::Delta;
pub use entry::{BLOB_MAGIC, BLOB_VERSION, ENTRY_VERSION, Lease, LogEntry};
pub use error::{Error, ErrorKind};
pub use failpoint::{FailPoint, Failpoints};
pub use org_id::OrgId;
pub use replica::Replica;
pub use settings::{Clock, ManualClock, Retention, Settings, SystemClock};
pub use shipper::{CaptureSource, ShipKind, ShipPolicy, ShipReport, Shipper};
pub use snapshot::Snapshot;
