//! The commit sequence: one number per org database that every write transaction raises in
//! the same transaction (`idem_org_commit.n`), so a captured state proves which commits it
//! holds (I6, I13) and a waiter knows which ship acknowledges it.
//!
//! The table and its one read and one write live in `idem_replica::commit` (re-exported here
//! as [`read`] and [`bump`]), beside the capture that reads the counter back from its pages;
//! the writer thread keeps the last value it read or wrote in a [`CommitSeq`] that requests
//! wait on.

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) use idem_replica::commit::{SCHEMA, bump, read};

/// The newest commit sequence the writer thread has seen in its database. Only raised, and
/// always before the reply of the job that raised it, so a waiter never waits for less than
/// it committed.
#[derive(Debug, Default)]
pub(crate) struct CommitSeq(AtomicU64);

impl CommitSeq {
    pub(crate) fn new(n: u64) -> CommitSeq {
        CommitSeq(AtomicU64::new(n))
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Raises the value to `n` (never lowers it) and returns the value now.
    pub(crate) fn raise(&self, n: u64) -> u64 {
        self.0.fetch_max(n, Ordering::SeqCst).max(n)
    }
}

/// A job's answer and the commit sequence the caller must see shipped (and, for answers
/// that commit nothing, confirmed) before acknowledging it.
#[derive(Debug)]
pub(crate) struct Answer<T> {
    pub value: T,
    pub commit_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_a_waiter_reads_only_rises() {
        let seq = CommitSeq::new(5);
        assert_eq!(seq.raise(3), 5);
        assert_eq!(seq.raise(9), 9);
        assert_eq!(seq.get(), 9);
    }
}
