//! J5 (`docs/design.md` 3g, "Writer rules"): a checkpoint as a delta against the writer's
//! own previous checkpoint (one inline PUT when it is small), and a checkpoint's create
//! settled by a walk when another entry holds its seq: our tenure still ends the walk → create
//! again above the log's head; otherwise the org is fenced (J4-4: a claim alone fences
//! nothing, its exclusion does).

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use object_store::{ObjectStoreExt, PutPayload};

use crate::format::blob::pack;
use crate::format::entry::{BlobRef, DeltaLink, EntryBody, Stored};
use crate::format::journal::Base;
use crate::format::layout::{delta_blob_name, new_nonce};
use crate::journal::entries::{Checkpoint, CheckpointHeader, EntryCreated};
use crate::journal::org_walk::OrgEnd;
use crate::replica::blocking;
use crate::{Delta, Error, LogEntry, OrgId, Replica};

/// Times J5 creates a checkpoint again above an abandoned claim before giving up.
const MAX_CHECKPOINT_ATTEMPTS: u32 = 8;

/// A checkpoint (J5) written as a delta: the pages changed since `base`, the writer's own
/// previous checkpoint, leading to `checksum`; the state is exactly the org's at `through`.
#[derive(Clone, Debug)]
pub struct DeltaCheckpoint {
    /// Where the checkpoint goes and the slot it is through.
    pub header: CheckpointHeader,
    /// The entry the pages apply to (a snapshot or delta of the org's log) and the
    /// database checksum there (16 hex digits).
    pub base: Base,
    /// The database checksum after the pages.
    pub checksum: String,
    /// The pages changed since `base`, with the database size and commit counter after.
    pub pages: Delta,
}

/// A checkpoint of either shape, for [`Replica::checkpoint`].
#[derive(Clone, Debug)]
pub enum AnyCheckpoint {
    /// A full snapshot.
    Snapshot(Checkpoint),
    /// A delta against the writer's previous checkpoint.
    Delta(DeltaCheckpoint),
}

impl AnyCheckpoint {
    fn header(&self) -> &CheckpointHeader {
        match self {
            AnyCheckpoint::Snapshot(c) => &c.header,
            AnyCheckpoint::Delta(c) => &c.header,
        }
    }

    fn header_mut(&mut self) -> &mut CheckpointHeader {
        match self {
            AnyCheckpoint::Snapshot(c) => &mut c.header,
            AnyCheckpoint::Delta(c) => &mut c.header,
        }
    }
}

impl Replica {
    /// Packs `checkpoint`'s pages (inline in the entry when at most
    /// [`crate::Settings::inline_delta_bytes`] packed, else one blob PUT first) and creates
    /// its entry: a delta entry of format 5 naming `through`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a `through` of 0 or a base not below `seq`;
    /// [`Error::Compress`]; the blob's upload errors (nothing created); as
    /// [`Replica::create_journal_claim`] for the create.
    pub async fn create_delta_checkpoint(
        &self,
        org: &OrgId,
        checkpoint: DeltaCheckpoint,
    ) -> Result<EntryCreated, Error> {
        let DeltaCheckpoint {
            header,
            base,
            checksum,
            pages,
        } = checkpoint;
        let (seq, round, through) = (header.seq, header.round, header.through);
        if through == 0 || base.seq >= seq {
            return Err(Error::corrupt(
                &format!("orgs/{org}/log/{seq:020}.json"),
                format!("a checkpoint through {through} on base {base:?}"),
            ));
        }
        let level = self.inner.settings.zstd_level;
        let (o, page_size, db_pages) = (org.to_string(), pages.page_size(), pages.db_pages());
        let (changed_pages, commit) = (pages.changed_pages() as u32, pages.commit());
        let packed = blocking("compressing a checkpoint", move || {
            pack(&o, "delta", &pages.body(), level)
        })
        .await?;
        let compressed_bytes = packed.blob.len() as u64;
        let blob = if packed.blob.len() > self.inner.settings.inline_delta_bytes {
            let name = delta_blob_name(seq, round, &new_nonce()?);
            let path = self.inner.store.layout.blob(org, &name);
            self.inner
                .store
                .object
                .put(&path, PutPayload::from(packed.blob))
                .await
                .map_err(|e| Error::store("put", &path, e))?;
            BlobRef::Object(name)
        } else {
            BlobRef::Inline(BASE64_STANDARD.encode(&packed.blob))
        };
        let link = DeltaLink {
            stored: Stored {
                blob,
                sha256: packed.sha256,
                bytes: packed.bytes,
                compressed_bytes,
                commit,
            },
            base: base.seq,
            base_checksum: base.checksum,
            checksum,
            page_size,
            db_pages,
            changed_pages,
        };
        let (at, writer, mark) = header.into_entry();
        self.create_marked(org, at, &writer, Some(mark), EntryBody::Delta(link))
            .await
    }

    /// J5's create: creates `checkpoint` at its seq; when another entry holds it, walks the
    /// org: if the walk still ends in the checkpoint's tenure (the entry is an abandoned
    /// claim, or a claim whose exclusion has not landed), creates it again above the log's
    /// head; otherwise the tenure is fenced. Returns the landed entry.
    ///
    /// # Errors
    /// [`Error::Fenced`] when the walk ends elsewhere or in a higher round (J4-4);
    /// [`Error::Contended`] after several entries in a row above ours; the creates' and
    /// the walk's errors.
    pub async fn checkpoint(
        &self,
        org: &OrgId,
        mut checkpoint: AnyCheckpoint,
    ) -> Result<Box<LogEntry>, Error> {
        for _ in 0..MAX_CHECKPOINT_ATTEMPTS {
            let header = checkpoint.header();
            let (round, run, via) = (header.round, header.run.clone(), header.tenure.clone());
            let created = match checkpoint.clone() {
                AnyCheckpoint::Snapshot(c) => self.create_checkpoint(org, c).await?,
                AnyCheckpoint::Delta(c) => self.create_delta_checkpoint(org, c).await?,
            };
            let theirs = match created {
                EntryCreated::Landed(entry) => return Ok(entry),
                EntryCreated::Taken(theirs) => theirs,
            };
            let walk = self.walk_org(org).await?;
            let ours = matches!(&walk.end, OrgEnd::Held { run: r, tenure, .. }
                if r.instance() == run.instance() && tenure.round == round && tenure.via == via);
            if !ours {
                return Err(Error::Fenced {
                    org: org.to_string(),
                    ours: round,
                    theirs: theirs.round().max(walk.highest_round),
                });
            }
            checkpoint.header_mut().seq = walk.next_seq();
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts: MAX_CHECKPOINT_ATTEMPTS,
        })
    }
}
