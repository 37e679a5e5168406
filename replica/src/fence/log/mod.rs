//! The create-only log of an org (`orgs/<org>/log/<seq:020>.json`): publishing an entry in
//! a free slot, settled by re-reading when the outcome is in doubt (I9), and reading entries
//! and positions back.

pub(crate) mod known;
mod window;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt, PutMode, PutPayload};
use tracing::debug;

use crate::format::entry::MAX_ENTRY_BYTES;
use crate::format::layout::parse_log_name;
use crate::store::Store;
use crate::{Error, LogEntry, OrgId, Settings};

pub(crate) use window::Window;

/// Outcome of a create-only publish that did not fail.
pub(crate) enum Published {
    /// Our entry is in the slot (created now, or by an earlier try of this publish).
    Landed,
    /// Another entry holds the slot.
    Taken(Box<LogEntry>),
}

/// The org logs under the prefix: the only code that reads, lists or creates
/// `orgs/<org>/log/` objects, with the entries it has seen (`known.rs`).
#[derive(Debug)]
pub(crate) struct Log {
    store: Store,
    /// Entries published or read by retention, so retention reads only new ones.
    known: known::Known,
    /// Log objects read at once (`Settings::read_concurrency`).
    read_concurrency: usize,
}

impl Log {
    /// The logs over `store`, remembering up to `settings.known_entries` entries.
    pub(crate) fn new(store: Store, settings: &Settings) -> Log {
        Log {
            store,
            known: known::Known::new(settings.known_entries),
            read_concurrency: settings.read_concurrency,
        }
    }

    /// Create-only put of `entry` at its seq, settled by re-reading and comparing the whole
    /// entry, nonce included, whenever the put does not plainly succeed (I9): our own entry
    /// read back is [`Published::Landed`] (an earlier try landed), another's is
    /// [`Published::Taken`]; an empty slot is tried once more.
    ///
    /// # Errors
    /// [`Error::StoreRefused`] when the put failed twice and the slot read back empty both
    /// times; [`Error::PublishUnknown`] when the re-read itself fails (the caller must treat
    /// the entry as possibly published); [`Error::Encode`].
    pub(crate) async fn publish(&self, org: &OrgId, entry: &LogEntry) -> Result<Published, Error> {
        let seq = entry.seq();
        let path = self.store.layout.log(org, seq);
        let body = Bytes::from(entry.encode()?);
        let mut retried = false;
        loop {
            let put = self
                .store
                .object
                .put_opts(
                    &path,
                    PutPayload::from(body.clone()),
                    PutMode::Create.into(),
                )
                .await;
            let cause = match put {
                Ok(done) => {
                    // A journal entry is never remembered: the per-org readers of `known`
                    // (retention) must meet it as the store holds it, and refuse it (K3).
                    if entry.header.journal.is_none() {
                        self.known.insert(org, body.len() as u64, done.e_tag, entry);
                    }
                    return Ok(Published::Landed);
                }
                Err(
                    e @ (object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }),
                ) => e,
                Err(e) => {
                    debug!(%org, seq, error = %e, "publish outcome unknown; re-reading");
                    e
                }
            };
            // Read back with the journal's reader: a journal claim in a per-org writer's
            // slot is a newer entry that fences it (K1.6), not a damaged one.
            match self.read_journal_entry(org, seq).await {
                Ok(Some(found)) if found == *entry => return Ok(Published::Landed),
                Ok(Some(found)) => return Ok(Published::Taken(Box::new(found))),
                Ok(None) if !retried => {
                    retried = true;
                    continue;
                }
                // Put failed twice and the slot read back empty twice: the store refused
                // it. A put that still lands later holds our own entry, which a later
                // create at this slot reads back as taken: conservative, never an ack.
                Ok(None) => {
                    return Err(Error::StoreRefused {
                        org: org.to_string(),
                        seq,
                        source: Box::new(Error::store("put", &path, cause)),
                    });
                }
                Err(e) => {
                    return Err(Error::PublishUnknown {
                        org: org.to_string(),
                        seq,
                        source: Box::new(e),
                    });
                }
            }
        }
    }

    /// Reads one log entry; `None` when absent. An entry with a journal mark is refused
    /// ([`LogEntry::decode`], K3).
    pub(crate) async fn read_entry(
        &self,
        org: &OrgId,
        seq: u64,
    ) -> Result<Option<LogEntry>, Error> {
        self.read_entry_as(org, seq, false).await
    }

    /// [`Log::read_entry`] for the journal's readers: entries with a journal mark are read
    /// too ([`LogEntry::decode_journal`]).
    pub(crate) async fn read_journal_entry(
        &self,
        org: &OrgId,
        seq: u64,
    ) -> Result<Option<LogEntry>, Error> {
        self.read_entry_as(org, seq, true).await
    }

    async fn read_entry_as(
        &self,
        org: &OrgId,
        seq: u64,
        journal: bool,
    ) -> Result<Option<LogEntry>, Error> {
        let path = self.store.layout.log(org, seq);
        match self.store.get_bytes(&path, MAX_ENTRY_BYTES).await? {
            Some(b) if journal => LogEntry::decode_journal(path.as_ref(), &b, Some(seq)).map(Some),
            Some(b) => LogEntry::decode(path.as_ref(), &b, Some(seq)).map(Some),
            None => Ok(None),
        }
    }

    /// Log positions present for `org`, ascending.
    pub(crate) async fn seqs(&self, org: &OrgId) -> Result<Vec<u64>, Error> {
        self.seqs_after(org, None).await
    }

    /// Log positions strictly above `after` (all of them for `None`), sorted. With a bound it
    /// lists from that name on (S3 `start-after`), so the cost follows the entries above, not
    /// the length of the log.
    pub(crate) async fn seqs_after(
        &self,
        org: &OrgId,
        after: Option<u64>,
    ) -> Result<Vec<u64>, Error> {
        Ok(self
            .listing(org, after)
            .await?
            .into_iter()
            .map(|(seq, _)| seq)
            .collect())
    }

    /// [`Log::seqs_after`] with what the listing said about each object.
    pub(crate) async fn listing(
        &self,
        org: &OrgId,
        after: Option<u64>,
    ) -> Result<Vec<(u64, ObjectMeta)>, Error> {
        let dir = self.store.layout.log_dir(org);
        let listing = match after {
            Some(seq) => self
                .store
                .object
                .list_with_offset(Some(&dir), &self.store.layout.log(org, seq)),
            None => self.store.object.list(Some(&dir)),
        };
        let metas: Vec<_> = listing
            .try_collect()
            .await
            .map_err(|e| Error::store("list", &dir, e))?;
        let mut seqs = Vec::with_capacity(metas.len());
        for m in metas {
            let name = m.location.filename().unwrap_or("");
            match parse_log_name(name) {
                Some(seq)
                    if m.location.prefix_matches(&dir)
                        && m.location.parts().count() == dir.parts().count() + 1 =>
                {
                    seqs.push((seq, m))
                }
                // Not a log entry's name (an editor's backup, a `.DS_Store`): no entry is
                // ever written under another name, so it is not history; skip it, loudly.
                _ => {
                    tracing::warn!(%org, object = %m.location, "skipping an object that is not a log entry");
                }
            }
        }
        seqs.sort_unstable_by_key(|(seq, _)| *seq);
        Ok(seqs)
    }

    /// Every log entry of `org`, sorted by seq, as [`Log::history`] reads them, except
    /// that an entry this handle already holds (published or read before, with the size and
    /// ETag the listing reports) is not read again, and inline bodies are left out (empty):
    /// what retention reads (I14). Returns the listed seqs too.
    ///
    /// # Errors
    /// As [`Log::history`].
    pub(crate) async fn history_known(
        &self,
        org: &OrgId,
    ) -> Result<(Vec<LogEntry>, Vec<u64>), Error> {
        let listing = self.listing(org, None).await?;
        let listed: Vec<u64> = listing.iter().map(|(seq, _)| *seq).collect();
        let reads = listing.into_iter().map(|(seq, meta)| async move {
            let known = self.known.get(org, seq, meta.size, meta.e_tag.as_deref());
            match known {
                Some(entry) => Ok(Some(entry)),
                None => self.read_entry_noting(org, seq).await,
            }
        });
        let entries: Vec<Option<LogEntry>> = futures::stream::iter(reads)
            .buffered(self.read_concurrency)
            .try_collect()
            .await?;
        self.known.forget(org, &[], &listed);
        Ok((entries.into_iter().flatten().collect(), listed))
    }

    /// [`Log::read_entry`], recording the entry read with the object's size and ETag.
    async fn read_entry_noting(&self, org: &OrgId, seq: u64) -> Result<Option<LogEntry>, Error> {
        let path = self.store.layout.log(org, seq);
        let Some((bytes, meta)) = self.store.get_capped(&path, MAX_ENTRY_BYTES).await? else {
            return Ok(None);
        };
        let entry = LogEntry::decode(path.as_ref(), &bytes, Some(seq))?;
        self.known.insert(org, meta.size, meta.e_tag, &entry);
        Ok(Some(entry))
    }

    /// Deletes the entry of `org` at `seq`; one already gone counts as deleted. Only
    /// retention calls it, for entries no reader needs (I11).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn delete(&self, org: &OrgId, seq: u64) -> Result<(), Error> {
        let path = self.store.layout.log(org, seq);
        match self.store.object.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store("delete", &path, e)),
        }
    }

    /// Drops what this handle remembers of `org`'s entries at `deleted` (retention deleted
    /// them) and of any not in `listed` (gone from the log).
    pub(crate) fn forget(&self, org: &OrgId, deleted: &[u64], listed: &[u64]) {
        self.known.forget(org, deleted, listed);
    }

    /// Every log entry of `org`, sorted by seq. Entries deleted between listing and reading
    /// (retention) are skipped.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable entry.
    pub(crate) async fn history(&self, org: &OrgId) -> Result<Vec<LogEntry>, Error> {
        self.history_as(org, false).await
    }

    /// [`Log::history`] for the journal's readers: entries with a journal mark are read too.
    ///
    /// # Errors
    /// As [`Log::history`].
    pub(crate) async fn journal_history(&self, org: &OrgId) -> Result<Vec<LogEntry>, Error> {
        self.history_as(org, true).await
    }

    /// [`Log::journal_history`] with what the listing held: each seq with its object's
    /// Last-Modified (ms since the Unix epoch, the store's clock). Fewer entries than seqs
    /// means some were deleted between the listing and their read.
    ///
    /// # Errors
    /// As [`Log::history`].
    pub(crate) async fn journal_history_listed(
        &self,
        org: &OrgId,
    ) -> Result<(Vec<LogEntry>, Vec<(u64, u64)>), Error> {
        let listed: Vec<(u64, u64)> = self
            .listing(org, None)
            .await?
            .into_iter()
            .map(|(seq, meta)| {
                let modified = u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
                (seq, modified)
            })
            .collect();
        let seqs: Vec<u64> = listed.iter().map(|(s, _)| *s).collect();
        let entries = self.read_all(org, &seqs, true).await?;
        Ok((entries, listed))
    }

    async fn history_as(&self, org: &OrgId, journal: bool) -> Result<Vec<LogEntry>, Error> {
        let seqs = self.seqs(org).await?;
        self.read_all(org, &seqs, journal).await
    }

    async fn read_all(
        &self,
        org: &OrgId,
        seqs: &[u64],
        journal: bool,
    ) -> Result<Vec<LogEntry>, Error> {
        let entries: Vec<Option<LogEntry>> = futures::stream::iter(
            seqs.iter()
                .copied()
                .map(|s| self.read_entry_as(org, s, journal)),
        )
        .buffered(self.read_concurrency)
        .try_collect()
        .await?;
        Ok(entries.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests;
