//! The journal mark of a format-5 log entry (`docs/design.md` 3g, "Objects"): what an entry
//! of an org's log says about the journal. A claim names the run its tenure's sections go
//! to and the slot walks enter it at; a checkpoint names the slot its state is exactly at.
//!
//! On the wire the mark is the entry's `"journal"` key, e.g.
//! `"journal":{"from":3,"role":"claim","run":"<instance>-<run>"}`. An entry with a mark is
//! format version 5 ([`crate::format::entry::JOURNAL_ENTRY_VERSION`]): every per-org reader
//! refuses it (K3), so a build that does not follow journals never reads such a log as a
//! per-org chain.

use serde::{Deserialize, Serialize};

use crate::format::journal::{RunName, Via};

/// What a format-5 entry says about the journal, by role (`"role"` on the wire).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum JournalMark {
    /// A claim (K1.2, K1b.1) whose tenure's sections are in `run` at or above `from`: the
    /// claimant's floor when the batch announcing the claim was issued (J4-1).
    Claim {
        /// The run the tenure's sections go to.
        run: RunName,
        /// The slot walks enter `run` at (at least 1).
        from: u64,
        /// The free point the claimant's walk passed (K1b): a claim naming it continues a
        /// walk that reached it. `None` for a claim over a holder (K1), which an exclusion
        /// of its round makes part of walks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<FreePoint>,
    },
    /// A checkpoint (J5): the entry's state is exactly the org's state at slot `through` of
    /// `run`, in the tenure that came through `tenure` with the entry's round.
    Checkpoint {
        /// The run of the slot.
        run: RunName,
        /// The slot the state is exactly at (at least 1): inside its writer's resolved
        /// prefix and below any exclusion of the org its writer met.
        through: u64,
        /// The claim or adopt seal the tenure came through; sections above `through` of this
        /// tenure name the same.
        tenure: Via,
        /// J4's released checkpoint: once the log holds its Release entry, walks end free
        /// there.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        released: bool,
    },
}

/// A point where an org is free, which a claim after it names (K0, "At a free point").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "at", rename_all = "snake_case", deny_unknown_fields)]
pub enum FreePoint {
    /// The log held no entry at all.
    Empty,
    /// A log entry: a Release entry, or the claim of a per-org segment a journal claim takes
    /// over (K1.6).
    Entry {
        /// Its log position.
        seq: u64,
    },
    /// A release seal.
    Seal {
        /// The sealed run.
        run: RunName,
        /// The seal's slot.
        slot: u64,
    },
}

impl JournalMark {
    /// The slot this mark names in its run: a claim's `from`, a checkpoint's `through`.
    pub fn slot(&self) -> u64 {
        match self {
            JournalMark::Claim { from, .. } => *from,
            JournalMark::Checkpoint { through, .. } => *through,
        }
    }

    /// The run this mark names.
    pub fn run(&self) -> &RunName {
        match self {
            JournalMark::Claim { run, .. } | JournalMark::Checkpoint { run, .. } => run,
        }
    }
}
