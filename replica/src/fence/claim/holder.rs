//! Whose liveness a claimant must judge before it claims an org without force (I15): the
//! holder of the newest claim in the log, which the org lease names only once that claimer
//! wrote it. A claim entry lands before its org lease (and the lease's write may fail, or two
//! claimers' lease writes land out of order), so a lease older than the log's newest round
//! says nothing about who holds the org: the claim entry itself names its claimer's process
//! ([`Claimer`]), and that process lease is watched.

use crate::fence::lease::Lease;
use crate::format::entry::{Claimer, EntryBody};
use crate::{Error, LogEntry, OrgId, Replica};

/// How many entries below the head a claimant reads, at most, to find the newest claim when
/// the head is a snapshot or delta newer than the org lease (its claimer's lease write
/// failed). Only that anomaly pays them; past the bound the org lease itself is watched.
const MAX_CLAIM_WALK: u64 = 64;

impl Replica {
    /// The lease a claim by `writer` (in `home`, see [`Replica::claim_from`]) must see lapse
    /// before it claims `org`, whose log head is `top`; `None` when nothing blocks: an empty
    /// log, a `Release` at the head of the lease's round or newer, or a holder that is this
    /// process (or its dead predecessor in the same home).
    ///
    /// When the org lease is of the log's newest round (or newer) it is the answer. When it
    /// is older, or absent, while the log holds a newer round: the newest claim's
    /// [`Claimer`] as a lease of that round; for a claim of an older version (no instance)
    /// the org lease itself, watched for this handle's own `lease_ms`.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease
    /// or log entry.
    pub(crate) async fn blocking_lease(
        &self,
        org: &OrgId,
        top: Option<&LogEntry>,
        writer: &str,
        home: Option<(&str, bool)>,
    ) -> Result<Option<Lease>, Error> {
        let lease = self.inner.leases.lease(org).await?;
        let Some(top) = top else {
            return Ok(lease.filter(|l| !self.owns(l, writer, home)));
        };
        let lease_round = lease.as_ref().map_or(0, |l| l.round);
        if matches!(top.body, EntryBody::Release) && top.round() >= lease_round {
            return Ok(None);
        }
        if let Some(lease) = lease.filter(|l| l.round >= top.round()) {
            return Ok((!self.owns(&lease, writer, home)).then_some(lease));
        }
        let claimer = self.newest_claimer(org, top).await?;
        let by_us = claimer
            .as_ref()
            .is_some_and(|(_, c)| c.instance == self.inner.leases.instance());
        if by_us {
            return Ok(None);
        }
        let (holder, claimer) =
            claimer.unwrap_or_else(|| (top.writer().to_owned(), Claimer::default()));
        Ok(Some(Lease {
            writer: holder,
            round: top.round(),
            // For people only, and nobody reads this one: it is never written.
            expires_at_ms: 0,
            process: !claimer.instance.is_empty(),
            instance: claimer.instance,
            home: None,
            addr: None,
            term_ms: claimer.term_ms,
        }))
    }

    /// True when `lease` is this process's own, or its dead predecessor's in the same home:
    /// it never blocks a claim by `writer`.
    fn owns(&self, lease: &Lease, writer: &str, home: Option<(&str, bool)>) -> bool {
        lease.writer == writer
            && (lease.instance == self.inner.leases.instance()
                || home.is_some_and(|(id, locked)| locked && lease.home.as_deref() == Some(id)))
    }

    /// The writer and [`Claimer`] of the claim of `top`'s round: `top` itself, or found by
    /// reading down from it (at most [`MAX_CLAIM_WALK`] entries); `None` when not found.
    async fn newest_claimer(
        &self,
        org: &OrgId,
        top: &LogEntry,
    ) -> Result<Option<(String, Claimer)>, Error> {
        let mut entry = Some(top.clone());
        let lowest = top.seq().saturating_sub(MAX_CLAIM_WALK);
        let mut seq = top.seq();
        loop {
            match entry {
                Some(e) if e.round() != top.round() => return Ok(None),
                Some(LogEntry {
                    header,
                    body: EntryBody::Claim(claimer),
                }) => return Ok(Some((header.writer, claimer))),
                _ => {}
            }
            if seq <= lowest.max(1) {
                return Ok(None);
            }
            seq -= 1;
            entry = self.inner.log.read_entry(org, seq).await?;
        }
    }
}
