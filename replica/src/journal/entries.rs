//! The format-5 entries of an org's log (`docs/design.md` 3g, "Objects"): a claim naming a
//! run, a checkpoint naming the slot its state is exactly at, and the Release entry that
//! follows a released checkpoint. Each is one create-only put at a seq the caller chose,
//! settled by re-reading when its outcome is in doubt (I9). The steps around them are the
//! caller's: a claim is announced in a landed batch before it is created (K1.2, K1b.1) and
//! checked by a listing above it after (C2); a checkpoint that collides is settled by a walk
//! (J5).

use std::sync::Arc;

use crate::fence::log::Published;
use crate::format::entry::{BlobRef, Claimer, EntryBody, EntryHeader, Stored};
use crate::format::journal::{RunName, Via};
use crate::format::layout::new_nonce;
use crate::format::mark::{FreePoint, JournalMark};
use crate::publish::source::MemSource;
use crate::{Error, LogEntry, OrgId, Replica, Snapshot};

/// How a create-only log entry ended when it did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryCreated {
    /// Our entry is at its seq (this put, or an earlier try of it).
    Landed(Box<LogEntry>),
    /// Another entry holds the seq.
    Taken(Box<LogEntry>),
}

/// A claim of format 5 (K1.2, K1b.1): its log position and round, and where its tenure's
/// sections go.
#[derive(Clone, Debug)]
pub struct JournalClaim {
    /// Log position to create it at: head + 1 of the claimant's listing.
    pub seq: u64,
    /// The claimed round: 1 + the highest round of the log and the walk.
    pub round: u64,
    /// Writer id.
    pub writer: String,
    /// The run its sections go to, as announced in a landed batch's `claims`.
    pub run: RunName,
    /// The claimant's floor when that batch was issued (at least 1).
    pub from: u64,
    /// The free point the claimant's walk ended at (K1b); `None` over a holder (K1).
    pub after: Option<FreePoint>,
}

/// What a checkpoint (J5) of either shape names: its log position, its writer, and the slot
/// of the tenure its state is exactly at.
#[derive(Clone, Debug)]
pub struct CheckpointHeader {
    /// Log position: the slot after the writer's own newest entry in the org's log (J5: no
    /// LIST before the create).
    pub seq: u64,
    /// The tenure's round (an adoption's implied round included).
    pub round: u64,
    /// Writer id.
    pub writer: String,
    /// The run of the slot.
    pub run: RunName,
    /// A slot of the writer's resolved prefix (at least 1).
    pub through: u64,
    /// The claim or adopt seal the tenure came through.
    pub tenure: Via,
    /// J4's released checkpoint (its Release entry follows it).
    pub released: bool,
}

impl CheckpointHeader {
    /// The checkpoint entry's position `(seq, round)`, its writer, and its journal mark.
    pub(crate) fn into_entry(self) -> ((u64, u64), String, JournalMark) {
        let mark = JournalMark::Checkpoint {
            run: self.run,
            through: self.through,
            tenure: self.tenure,
            released: self.released,
        };
        ((self.seq, self.round), self.writer, mark)
    }
}

/// A checkpoint (J5) written as a full snapshot: the org's state exactly at `through`.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// Where the checkpoint goes and the slot it is through.
    pub header: CheckpointHeader,
    /// The database, exactly as it is at `through`.
    pub snapshot: Snapshot,
}

impl Replica {
    /// Creates `claim` in `org`'s log: a claim entry of format 5 naming its run, `from` and
    /// `after`, and this process as the claimer.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a `from` of 0; [`Error::StoreRefused`],
    /// [`Error::PublishUnknown`] (the claim may have landed: treat it as abandoned), the
    /// store's errors.
    pub async fn create_journal_claim(
        &self,
        org: &OrgId,
        claim: JournalClaim,
    ) -> Result<EntryCreated, Error> {
        if claim.from == 0 {
            return Err(Error::corrupt(
                &format!("orgs/{org}/log"),
                "a claim from slot 0",
            ));
        }
        let mark = JournalMark::Claim {
            run: claim.run,
            from: claim.from,
            after: claim.after,
        };
        let body = EntryBody::Claim(Claimer {
            instance: self.inner.leases.instance().to_owned(),
            term_ms: self.inner.settings.lease_ms,
            home: None,
        });
        // The claim names this process, which a claimant watches from the moment the
        // entry lands (C3): its lease goes out beside the claim's create, as a per-org
        // claim's does; after a retire it lands first (`Leases::ready_to_claim`).
        self.inner.leases.ready_to_claim().await?;
        let (created, ()) = futures::future::join(
            self.create_marked(
                org,
                (claim.seq, claim.round),
                &claim.writer,
                Some(mark),
                body,
            ),
            self.inner.leases.ensure_process_lease(),
        )
        .await;
        created
    }

    /// Uploads `checkpoint`'s snapshot as segments, then creates its entry: a snapshot entry
    /// of format 5 naming `through`.
    ///
    /// # Errors
    /// [`Error::InvalidSnapshot`] for an image that is not a database; [`Error::Corrupt`]
    /// for a `through` of 0; the upload's errors (nothing created); as
    /// [`Replica::create_journal_claim`] for the create.
    pub async fn create_checkpoint(
        &self,
        org: &OrgId,
        checkpoint: Checkpoint,
    ) -> Result<EntryCreated, Error> {
        if checkpoint.header.through == 0 {
            return Err(Error::corrupt(
                &format!("orgs/{org}/log"),
                "a checkpoint through slot 0",
            ));
        }
        checkpoint.snapshot.check(org.as_str())?;
        let (seq, round) = (checkpoint.header.seq, checkpoint.header.round);
        let commit = checkpoint.snapshot.commit();
        let source = MemSource::new(org.as_str(), Arc::new(checkpoint.snapshot.into_bytes()))?;
        let streamed = self
            .upload_segments(org, (seq, round), Box::new(source), None)
            .await?;
        let stored = Stored {
            blob: BlobRef::Manifest(streamed.manifest_name),
            sha256: streamed.sha256,
            bytes: streamed.manifest.bytes(),
            compressed_bytes: streamed.manifest.compressed_bytes(),
            commit,
        };
        let (at, writer, mark) = checkpoint.header.into_entry();
        self.create_marked(org, at, &writer, Some(mark), EntryBody::Snapshot(stored))
            .await
    }

    /// Creates the Release entry of a tenure of `round` at `seq`: after its released
    /// checkpoint has landed, walks end free there (J4).
    ///
    /// # Errors
    /// As [`Replica::create_journal_claim`].
    pub async fn create_release(
        &self,
        org: &OrgId,
        (seq, round): (u64, u64),
        writer: &str,
    ) -> Result<EntryCreated, Error> {
        self.create_marked(org, (seq, round), writer, None, EntryBody::Release)
            .await
    }

    pub(crate) async fn create_marked(
        &self,
        org: &OrgId,
        (seq, round): (u64, u64),
        writer: &str,
        journal: Option<JournalMark>,
        body: EntryBody,
    ) -> Result<EntryCreated, Error> {
        let entry = LogEntry {
            header: EntryHeader {
                seq,
                round,
                writer: writer.to_owned(),
                nonce: new_nonce()?,
                at_ms: self.inner.clock.now_ms(),
                pipeline: None,
                journal,
            },
            body,
        };
        match self.inner.log.publish(org, &entry).await? {
            Published::Landed => Ok(EntryCreated::Landed(Box::new(entry))),
            Published::Taken(found) => Ok(EntryCreated::Taken(found)),
        }
    }
}
