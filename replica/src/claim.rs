//! A writer's claim on an org: claiming a round (I7), releasing it, and confirming that no
//! successor appended since (I6, I11). A [`Claim`] is the only handle that publishes under
//! its round; it cannot be copied, and only this crate changes it.

use std::sync::Arc;

use object_store::ObjectStoreExt;
use tracing::{debug, info, warn};

use crate::checksum::{PageHashes, checksum_hex};
use crate::layout::new_nonce;
use crate::lease::Lease;
use crate::log::Published;
use crate::log::entry::{EntryBody, EntryHeader};
use crate::org_id::check_writer;
use crate::{Error, FailPoint, LogEntry, OrgId, Replica};

/// The newest snapshot or delta a claim published: where the next delta applies, and the
/// page hashes of the database there.
#[derive(Clone)]
pub(crate) struct Tip {
    pub(crate) seq: u64,
    pub(crate) hashes: Arc<PageHashes>,
}

impl std::fmt::Debug for Tip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tip")
            .field("seq", &self.seq)
            .field("checksum", &checksum_hex(self.hashes.sum()))
            .finish()
    }
}

/// A writer's claim on an org for one round: ship, confirm and release with it; any later
/// claim fences it (I7).
///
/// Not `Clone`, and its fields are private: the round it publishes under and the log
/// position it publishes at change only through [`Replica`]'s calls, and no copy can go on
/// publishing (or fence its original) after the claim was fenced, released or poisoned.
///
/// ```compile_fail
/// fn copy(claim: &idem_replica::Claim) -> idem_replica::Claim {
///     claim.clone()
/// }
/// ```
///
/// ```compile_fail
/// fn rewrite(claim: &mut idem_replica::Claim) {
///     claim.round += 1;
/// }
/// ```
#[derive(Debug)]
pub struct Claim {
    org: OrgId,
    round: u64,
    writer: String,
    nonce: String,
    seq: u64,
    /// The log position the next ship or release publishes at.
    pub(crate) next_seq: u64,
    /// When the lease was last written, ms since the Unix epoch.
    pub(crate) lease_renewed_ms: u64,
    /// The home written into this claim's leases.
    pub(crate) home: Option<String>,
    /// Why the claim can no longer publish, once it cannot.
    pub(crate) unusable: Option<&'static str>,
    /// The newest snapshot or delta published under this claim.
    pub(crate) tip: Option<Tip>,
    /// The snapshot the chain started from (compacted deltas apply to it).
    pub(crate) snapshot_tip: Option<Tip>,
}

impl Claim {
    /// The org claimed.
    pub fn org(&self) -> &OrgId {
        &self.org
    }

    /// The round claimed: strictly greater than every round claimed before it (I7).
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The writer id that claimed it.
    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// The nonce of the claim entry: unique per claim, so local files named by round and
    /// nonce are never shared by two claims (I8).
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// Log position of the claim entry.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The log position the next ship or release will publish at.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Log position of the newest snapshot or delta this claim published, which the next
    /// [`crate::Replica::ship_delta`] applies to; `None` until a snapshot is shipped.
    pub fn chain_tip(&self) -> Option<u64> {
        self.tip.as_ref().map(|t| t.seq)
    }

    /// Why this claim can no longer publish (fenced, released, unknown outcome), if so.
    pub fn unusable(&self) -> Option<&'static str> {
        self.unusable
    }

    /// `Ok` while the claim may publish.
    ///
    /// # Errors
    /// [`Error::ClaimUnusable`] once it was fenced, released or left unknown.
    pub(crate) fn usable(&self) -> Result<(), Error> {
        match self.unusable {
            Some(reason) => Err(Error::ClaimUnusable {
                org: self.org.to_string(),
                round: self.round,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// The header of the entry this claim publishes next.
    pub(crate) fn next_header(&self, at_ms: u64) -> Result<EntryHeader, Error> {
        Ok(EntryHeader {
            seq: self.next_seq,
            round: self.round,
            writer: self.writer.clone(),
            nonce: new_nonce()?,
            at_ms,
        })
    }
}

impl Replica {
    /// Claims the next round for `org` (highest round seen + 1) with a create-only log entry,
    /// fencing every older writer (I7), and writes the advisory lease.
    ///
    /// A live lease of another writer blocks the claim unless `force`; a `Release` entry at
    /// the head lets it through at once. A lease of the same `writer` id blocks too unless it
    /// is this instance's own (this [`Replica`]): two live processes configured with one
    /// writer id never take orgs from each other. See [`Replica::claim_from`] for a restart.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`]; [`Error::Contended`] after `claim_retries` lost races;
    /// [`Error::StoreRefused`] when the store refuses the claim's write;
    /// [`Error::InvalidWriter`]; [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`]
    /// for an unreadable log.
    pub async fn claim(&self, org: &OrgId, writer: &str, force: bool) -> Result<Claim, Error> {
        self.claim_from(org, writer, None, force).await
    }

    /// [`Replica::claim`] by a writer working in a data directory with id `home.0`. The
    /// lease records the home; when `home.1` is true — the caller holds that directory's
    /// exclusive lock, which every earlier process working in it held until it died — a live
    /// lease of the same writer id and the same home belongs to a dead process and does not
    /// block the claim (a restart after `kill -9` claims at once).
    ///
    /// # Errors
    /// As [`Replica::claim`].
    pub async fn claim_from(
        &self,
        org: &OrgId,
        writer: &str,
        home: Option<(&str, bool)>,
        force: bool,
    ) -> Result<Claim, Error> {
        self.writable("claim")?;
        check_writer(writer)?;
        let attempts = self.inner.settings.claim_retries.saturating_add(1);
        for attempt in 0..attempts {
            let log = self.history(org).await?;
            let head = log.last().map(LogEntry::seq).unwrap_or(0);
            let max_round = log.iter().map(LogEntry::round).max().unwrap_or(0);
            let now = self.inner.clock.now_ms();
            if !force && let Some(lease) = self.lease(org).await? {
                let released = log.last().is_some_and(|e| {
                    matches!(e.body, EntryBody::Release) && e.round() >= lease.round
                });
                let ours = lease.writer == writer
                    && (lease.instance == self.inner.instance
                        || home.is_some_and(|(id, locked)| {
                            locked && lease.home.as_deref() == Some(id)
                        }));
                if !ours && lease.expires_at_ms > now && !released && lease.round >= max_round {
                    return Err(Error::LeaseHeld {
                        org: org.to_string(),
                        holder: lease.writer,
                        expires_at_ms: lease.expires_at_ms,
                        holder_addr: lease.addr,
                    });
                }
            }
            self.failpoint(FailPoint::ClaimBeforePublish, org).await?;
            let entry = LogEntry {
                header: EntryHeader {
                    seq: head + 1,
                    round: max_round + 1,
                    writer: writer.to_owned(),
                    nonce: new_nonce()?,
                    at_ms: now,
                },
                body: EntryBody::Claim,
            };
            match self.publish(org, &entry).await {
                Ok(Published::Landed) => {}
                Ok(Published::Taken(theirs)) => {
                    debug!(%org, seq = head + 1, theirs = theirs.round(), attempt, "claim lost the race");
                    continue;
                }
                // A claim of unknown outcome fences nobody we care about: retry higher.
                Err(Error::PublishUnknown { .. }) => continue,
                Err(e) => return Err(e),
            }
            // A claimer that read a stale head may land in a slot retention freed.
            if self.max_seq(org).await? > head + 1 {
                debug!(%org, seq = head + 1, attempt, "claim landed below a newer entry");
                continue;
            }
            let EntryHeader {
                seq, round, nonce, ..
            } = entry.header;
            self.failpoint(FailPoint::ClaimAfterPublish, org).await?;
            // Only a holder of the home's lock names it: a process waiting for the lock (the
            // old one still runs) must not write leases the old one would take as its own.
            let home = home
                .filter(|(_, locked)| *locked)
                .map(|(id, _)| id.to_owned());
            let lease = Lease {
                writer: writer.to_owned(),
                round,
                expires_at_ms: now + self.inner.settings.lease_ms,
                instance: self.inner.instance.clone(),
                home: home.clone(),
                addr: self.inner.settings.advertise.clone(),
            };
            self.put_lease(org, &lease).await;
            info!(%org, round, seq, writer, "claimed");
            return Ok(Claim {
                org: org.clone(),
                round,
                writer: writer.to_owned(),
                nonce,
                seq,
                next_seq: seq + 1,
                lease_renewed_ms: now,
                home,
                unusable: None,
                tip: None,
                snapshot_tip: None,
            });
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts,
        })
    }

    /// Publishes a Release entry (same create/compare/fence rules as ship, and like a ship no
    /// LIST after it: the create in the slot after the claim's own last entry proves no
    /// successor claimed) and drops the lease, so the next claim goes through at once. The
    /// claim is unusable afterwards.
    ///
    /// # Errors
    /// As [`Replica::ship`]'s publish step.
    pub async fn release(&self, claim: &mut Claim) -> Result<(), Error> {
        claim.usable()?;
        let org = claim.org.clone();
        self.failpoint(FailPoint::ReleaseBeforePublish, &org)
            .await?;
        let entry = LogEntry {
            header: claim.next_header(self.inner.clock.now_ms())?,
            body: EntryBody::Release,
        };
        let seq = entry.seq();
        self.publish_for_claim(claim, &entry).await?;
        claim.unusable = Some("released");
        let path = self.inner.layout.lease(&org);
        if let Ok(Some(lease)) = self.lease(&org).await
            && lease.writer == claim.writer
            && lease.round == claim.round
            && let Err(e) = self.inner.store.delete(&path).await
        {
            warn!(%org, round = claim.round, error = %e, "could not drop lease after release");
        }
        info!(%org, round = claim.round, seq, "released");
        Ok(())
    }

    /// Publishes `entry` at `claim.next_seq` and moves the claim past it; maps a taken slot
    /// to [`Error::Fenced`], and makes the claim unusable on that and on
    /// [`Error::PublishUnknown`].
    pub(crate) async fn publish_for_claim(
        &self,
        claim: &mut Claim,
        entry: &LogEntry,
    ) -> Result<(), Error> {
        match self.publish(&claim.org, entry).await {
            Ok(Published::Landed) => {
                claim.next_seq = entry.seq() + 1;
                Ok(())
            }
            Ok(Published::Taken(theirs)) => {
                claim.unusable = Some("fenced");
                warn!(org = %claim.org, round = claim.round, seq = entry.seq(), theirs = theirs.round(), "fenced");
                Err(Error::Fenced {
                    org: claim.org.to_string(),
                    ours: claim.round,
                    theirs: theirs.round(),
                })
            }
            Err(e) => {
                if matches!(e, Error::PublishUnknown { .. }) {
                    claim.unusable = Some("outcome of a publish is unknown");
                }
                Err(e)
            }
        }
    }

    /// Keeps an idle writer's advisory lease alive. Once more than half of `lease_ms` has
    /// elapsed since the last renewal, confirms that no successor appended to the log since
    /// this claim's last entry, then renews `lease.json`. Ships renew the lease themselves;
    /// this is for orgs without traffic, so a live writer's lease does not lapse while it idles
    /// (which would let another writer claim without `force` and fence it on its next ship).
    ///
    /// # Errors
    /// [`Error::Fenced`] when a successor appended (the claim becomes unusable, I7);
    /// [`Error::ClaimUnusable`]; [`Error::Store`] when the log cannot be listed.
    pub async fn keep_alive(&self, claim: &mut Claim) -> Result<(), Error> {
        claim.usable()?;
        let now = self.inner.clock.now_ms();
        if now.saturating_sub(claim.lease_renewed_ms) * 2 <= self.inner.settings.lease_ms {
            return Ok(());
        }
        // Confirming renews the lease.
        self.confirm(claim).await
    }

    /// Confirms that this claim still owns the org: no entry was appended to the log after
    /// the claim's last entry (one LIST). A writer answers a replay or a read only after a
    /// ship or a confirmation that started after the request arrived, so a fenced writer never
    /// acknowledges from its local file (I6, I7). Renews the advisory lease once past half
    /// its term, as a ship does, so a writer serving only replays keeps its org.
    ///
    /// # Errors
    /// [`Error::Fenced`] when a successor appended (the claim becomes unusable);
    /// [`Error::ClaimUnusable`]; [`Error::Store`] when the log cannot be listed.
    pub async fn confirm(&self, claim: &mut Claim) -> Result<(), Error> {
        claim.usable()?;
        let last = claim.next_seq.saturating_sub(1);
        self.check_no_successor(claim, last).await?;
        // A writer that only answers replays and reads is active: it must not look dead.
        self.renew_lease(claim).await;
        Ok(())
    }

    /// After our create at `seq`, anything above it means a successor owns the org (I11):
    /// the claim becomes unusable and the error is [`Error::Fenced`].
    /// One LIST; only the highest entry above is read (for the error's `theirs`), so the cost
    /// does not grow with the length of the log.
    pub(crate) async fn check_no_successor(
        &self,
        claim: &mut Claim,
        seq: u64,
    ) -> Result<(), Error> {
        let above: Vec<u64> = self
            .log_seqs_after(&claim.org, Some(seq))
            .await?
            .into_iter()
            .filter(|s| *s > seq)
            .collect();
        let Some(&top) = above.iter().max() else {
            return Ok(());
        };
        claim.unusable = Some("fenced");
        let theirs = match self.read_entry(&claim.org, top).await {
            Ok(Some(entry)) => entry.round(),
            // Unreadable or gone (retention): still a successor; report the next round.
            _ => claim.round + 1,
        };
        warn!(org = %claim.org, round = claim.round, seq, theirs, "successor above our entry");
        Err(Error::Fenced {
            org: claim.org.to_string(),
            ours: claim.round,
            theirs,
        })
    }
}
