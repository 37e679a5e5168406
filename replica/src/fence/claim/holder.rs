//! Whose liveness a claimant must judge before it claims an org without force (I15): the
//! holder of the newest claim in the log. A claim entry of this version names its claimer's
//! process, term and home ([`Claimer`]): it is the lease of its round, and no org lease is
//! written or read for it. Only a claim of an older version (no instance) sends the claimant
//! to `orgs/<org>/lease.json`, which those versions wrote after their claim landed.

use crate::fence::lease::Lease;
use crate::fence::log::Window;
use crate::format::entry::{Claimer, EntryBody, MAX_SHIP_WINDOW};
use crate::{Error, LogEntry, OrgId, Replica};

/// How many entries below the head a claimant reads, at most, to find the newest claim when
/// the head is a snapshot or delta. Past the bound the org lease itself is watched.
const MAX_CLAIM_WALK: u64 = 64;

impl Replica {
    /// The lease a claim by `writer` (in `home`, see [`Replica::claim_from`]) must see lapse
    /// before it claims `org`, whose log's top is `window`; `None` when nothing blocks: a
    /// `Release` at the head, or a holder that is this process (or its dead predecessor in
    /// the same home).
    ///
    /// The holder is the newest claim's [`Claimer`], as a lease of the head's round. The org
    /// lease is read only when no claim of this version answers: an empty log (a lease
    /// written by hand or by an older version), a newest claim of an older version, or none
    /// found within [`MAX_CLAIM_WALK`]; then a lease of the head's round or newer is the
    /// answer, else the org lease is watched for this handle's own `lease_ms`.
    ///
    /// A `Release` at the head lets any claim through without reading the org lease: a
    /// lease of a newer round than the release belongs to a claim that is either above the
    /// listing (the new claim's create collides with it) or abandoned in a slot retention
    /// freed, which never publishes.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease
    /// or log entry.
    pub(crate) async fn blocking_lease(
        &self,
        org: &OrgId,
        window: &Window,
        writer: &str,
        home: Option<(&str, bool)>,
    ) -> Result<Option<Lease>, Error> {
        // The newest round's newest entry, not the head: strays may sit above a claim (C3).
        let Some(top) = window.newest() else {
            let lease = self.inner.leases.lease(org).await?;
            return Ok(lease.filter(|l| !self.owns(l, writer, home)));
        };
        if matches!(top.body, EntryBody::Release) {
            return Ok(None);
        }
        let claimer = self.newest_claimer(org, window, top).await?;
        if let Some((holder, claimer)) = claimer.clone().filter(|(_, c)| !c.instance.is_empty()) {
            let mut lease = claimer_lease(holder, top.round(), claimer);
            // A claim of the previous version names its instance but not its home, which its
            // org lease holds: read it only when the home could let this claim through.
            if lease.home.is_none()
                && lease.writer == writer
                && home.is_some_and(|(_, locked)| locked)
                && let Some(old) = self.inner.leases.lease(org).await?
                && old.round == lease.round
                && old.instance == lease.instance
            {
                lease.home = old.home;
            }
            return Ok((!self.owns(&lease, writer, home)).then_some(lease));
        }
        if let Some(lease) = self
            .inner
            .leases
            .lease(org)
            .await?
            .filter(|l| l.round >= top.round())
        {
            return Ok((!self.owns(&lease, writer, home)).then_some(lease));
        }
        let (holder, claimer) =
            claimer.unwrap_or_else(|| (top.writer().to_owned(), Claimer::default()));
        Ok(Some(claimer_lease(holder, top.round(), claimer)))
    }

    /// Who holds `org` now, as a [`Lease`]: the newest claim's [`Claimer`] with its process
    /// lease's address and expiry, or for a log whose newest claim is of an older version (or
    /// an empty log) the org lease those versions wrote. `None` when neither names anyone.
    /// A LIST and a GET of the head, the claim's GET when the head is not one, and the
    /// process lease's GET.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease
    /// or log entry.
    pub(crate) async fn holder(&self, org: &OrgId) -> Result<Option<Lease>, Error> {
        let mut window = match self.inner.log.window(org, 1).await {
            Err(Error::JournalRequired { .. }) => return self.journal_holder(org).await,
            other => other?,
        };
        // Retention never deletes the head: one that vanished means the log moved on.
        for _ in 0..3 {
            if window.seqs.is_empty() || window.top().is_some() {
                break;
            }
            window = self.inner.log.window(org, 1).await?;
        }
        // A pipelined head may be a stray above the newest claim: read enough of the top to
        // hold that claim's round (C3).
        if window.top().is_some_and(LogEntry::is_pipelined) {
            window = self
                .inner
                .log
                .window(org, MAX_SHIP_WINDOW as usize + 1)
                .await?;
        }
        let Some(top) = window.newest() else {
            return self.inner.leases.lease(org).await;
        };
        match self.newest_claimer(org, &window, top).await? {
            Some((holder, claimer)) if !claimer.instance.is_empty() => {
                let process = self
                    .inner
                    .leases
                    .process_lease(&claimer.instance, false)
                    .await?;
                let mut lease = claimer_lease(holder, top.round(), claimer);
                if let Some(p) = process {
                    lease.expires_at_ms = p.expires_at_ms;
                    lease.addr = p.addr;
                }
                Ok(Some(lease))
            }
            _ => self.inner.leases.lease(org).await,
        }
    }

    /// True when `lease` is this process's own, or its dead predecessor's in the same home:
    /// it never blocks a claim by `writer`.
    fn owns(&self, lease: &Lease, writer: &str, home: Option<(&str, bool)>) -> bool {
        lease.writer == writer
            && (lease.instance == self.inner.leases.instance()
                || home.is_some_and(|(id, locked)| locked && lease.home.as_deref() == Some(id)))
    }

    /// The writer and [`Claimer`] of the claim of `top`'s round: `top` itself, or found by
    /// reading down from it (at most [`MAX_CLAIM_WALK`] entries; those in `window` are not
    /// read again); `None` when not found.
    async fn newest_claimer(
        &self,
        org: &OrgId,
        window: &Window,
        top: &LogEntry,
    ) -> Result<Option<(String, Claimer)>, Error> {
        let mut entry = Some(top.clone());
        let lowest = top.seq().saturating_sub(MAX_CLAIM_WALK);
        let mut seq = top.seq();
        loop {
            match entry {
                // A fenced writer's pipelined ship above the claim (a stray, R1).
                Some(e) if e.round() < top.round() && e.is_pipelined() && e.is_delta() => {}
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
            entry = match window.entry(seq) {
                Some(e) => Some(e.clone()),
                None => self.inner.log.read_entry(org, seq).await?,
            };
        }
    }
}

/// The lease a claim entry of round `round` by `writer` stands for: its claimer's process
/// lease is the object watched (`process` unless the claim is of an older version). The
/// expiry and address are the process lease's, filled in by whoever reads it.
fn claimer_lease(writer: String, round: u64, claimer: Claimer) -> Lease {
    Lease {
        writer,
        round,
        expires_at_ms: 0,
        process: !claimer.instance.is_empty(),
        instance: claimer.instance,
        home: claimer.home,
        addr: None,
        term_ms: claimer.term_ms,
    }
}

impl Replica {
    /// The holder of a journal org (`docs/design.md` 3g): the writer of the run its walk
    /// (K0) ends in, judged by that run's process lease; `None` when the walk ends free.
    async fn journal_holder(&self, org: &OrgId) -> Result<Option<Lease>, Error> {
        let walk = self.walk_org(org).await?;
        let crate::journal::OrgEnd::Held { run, tenure, .. } = &walk.end else {
            return Ok(None);
        };
        let claim = walk
            .log
            .values()
            .rev()
            .find(|e| e.round() <= tenure.round && e.is_claim());
        let (writer, term_ms) = match claim.map(|e| (&e.header.writer, &e.body)) {
            Some((w, crate::format::entry::EntryBody::Claim(c))) => (w.clone(), c.term_ms),
            _ => (String::new(), 0),
        };
        let process = self
            .inner
            .leases
            .process_lease(run.instance(), false)
            .await?;
        Ok(Some(Lease {
            writer,
            round: tenure.round,
            expires_at_ms: process.as_ref().map_or(0, |p| p.expires_at_ms),
            instance: run.instance().to_owned(),
            home: None,
            addr: process.and_then(|p| p.addr),
            process: true,
            term_ms,
        }))
    }
}
