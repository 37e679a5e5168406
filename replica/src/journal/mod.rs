//! The journal (`docs/design.md` 3g): one create-only object per group-commit tick of a
//! writer process acknowledges every org that committed during the tick, and one seal
//! fences every org of a dead writer's run.
//!
//! This layer is the store protocol of runs: the objects (`format/journal.rs`), a writer's
//! run ([`Run`]: J1-J4), P's fences ([`crate::Replica::place_fence`], [`crate::Replica::exclude`],
//! [`crate::Replica::adopt_run`]), what an adopter learns of a run's orgs
//! ([`crate::Replica::run_orgs`], K2.3), a run's retention ([`crate::Replica::retain_run`],
//! T1-T3), K0's scan of runs ([`scan`], [`crate::Replica::walk_runs`]) and, over the org
//! logs' format-5 entries ([`JournalMark`]), K0 from an org's log
//! ([`crate::Replica::walk_org`]), the state it finds installed
//! ([`crate::Replica::restore_walk`]), K1b ([`crate::Replica::claim_free`]) and K4
//! ([`crate::Replica::attach_own`]); and what a writer process runs over it: the
//! [`Issuer`] (one task per process owning its run: group commit across orgs, J1's answers,
//! J3, J6, announcements), [`Issuer::acquire`] (K1b, K4, K2 then K4) and the
//! [`JournalShipper`] (an org's cumulative sections, J5 checkpoints, J4), which `idem-org`'s
//! registry uses when `RegistrySettings::journal` enables it.

mod acquire;
mod adopting;
mod checkpoint;
mod claim;
mod claim_held;
pub(crate) mod coalesce;
mod entries;
pub(crate) mod headers;
mod io;
mod issuer;
mod log_retain;
mod org_walk;
mod place;
mod restore;
mod retain;
mod roster;
mod run;
mod shipper;
mod slots;
mod walk;

pub use crate::format::journal::{
    Announced, Base, Batch, Exclusion, JOURNAL_MAGIC, JOURNAL_VERSION, JournalHeader,
    JournalObject, MAX_JOURNAL_HEADER_BYTES, MAX_SECTION_BYTES, RunName, Seal, SealKind,
    SectionIndex, Via,
};
pub use crate::format::mark::{FreePoint, JournalMark};
pub use acquire::{JournalAcquire, JournalStart};
pub use checkpoint::{AnyCheckpoint, DeltaCheckpoint};
pub use claim::{ClaimPlan, FreeClaim, JournalTenure, MAX_FREE_CLAIM_ATTEMPTS, PlannedClaim};
pub use claim_held::{HeldClaim, MAX_HELD_CLAIM_ATTEMPTS};
pub use entries::{Checkpoint, CheckpointHeader, EntryCreated, JournalClaim};
pub use io::{Created, Listed, RunListing};
pub use issuer::{Issuer, IssuerSettings, ReleasedRun, SectionAcked};
pub use org_walk::{OrgEnd, OrgWalk, WalkState};
pub use place::{Adoption, Excluded, Placement};
pub use retain::RunRetention;
pub use roster::RunOrgs;
pub use run::{BatchLanding, BatchMeta, Commits, IssuedBatch, Run, SectionInput};
pub use shipper::{Hydrated as JournalHydrated, Installed, JournalLimits, JournalShipper};
pub use slots::Slots;
pub use walk::{MAX_WALK_HOPS, Scan, ScanEnd, Walk, WalkTenure, scan};

/// The database checksum of a canonical SQLite image (`Snapshot::take`'s bytes), 16 lowercase
/// hex digits: what a section's base and result, and a delta checkpoint's, name (I10).
///
/// # Errors
/// [`crate::Error::Corrupt`] when `image` is not whole pages of a database.
pub fn image_checksum(image: &[u8]) -> Result<String, crate::Error> {
    Ok(crate::format::checksum::checksum_hex(
        crate::format::checksum::PageHashes::of_image("image", image)?.sum(),
    ))
}
