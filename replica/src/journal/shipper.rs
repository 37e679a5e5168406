//! One org's writer on the journal (`docs/design.md` 3g, "The org layer on the journal"):
//! what the per-org [`crate::Shipper`] is to a claim, [`JournalShipper`] is to a tenure in
//! the process's run. Each ship captures the org's committed state, takes every page
//! changed since the previous capture, and hands the issuer one **cumulative** section:
//! every page changed since the tenure's base checkpoint, the checksum after, the commit.
//! Once the pages since the base pass `section_bytes`, the next ship first writes a
//! checkpoint of the acknowledged state into the org's log (J5) and the sections start
//! again from it. A checkpoint is a delta on the previous one, or a snapshot once
//! `max_chain_deltas` deltas lead down to the newest snapshot: a hydrate or a restore then
//! reads at most that many deltas.
//!
//! A tenure's first capture checkpoints the WAL into the file and diffs the file against
//! the hydrated image's page hashes: the open path may have written the file outside the
//! WAL. Every later capture reads only the WAL's committed frames after the position the
//! previous one reached, as the per-org shipper does, and checkpoints the WAL only once it
//! passes `wal_checkpoint_bytes` (a checkpoint writes pages back and fsyncs: per ship it
//! was most of a small ship's cost).
//!
//! ```text
//! start:   base = the walk's entry, or a first checkpoint through JournalStart::through
//! ship:    [checkpoint due → J5 delta checkpoint through the last acked slot]
//!          capture: first → checkpoint WAL, diff file vs hashes
//!                   later → committed WAL frames after the last position (I13 proof)
//!          cumulative += changed → issuer.submit(section) → acked at (run, slot)
//! confirm: issuer.confirm (J6), then the files are still ours (I13)
//! release: released section → released checkpoint through its slot → Release entry (J4)
//! park:    (newest capture acked, WAL folded into the file, connection closed) drop files
//! unpark:  the file's page hashes == the acked state's (I13), else FilesChanged
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::format::body::{self, DeltaBody};
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::journal::{Base, Via};
use crate::format::pages::canonical_page1;
use crate::journal::acquire::JournalStart;
use crate::journal::checkpoint::{AnyCheckpoint, DeltaCheckpoint};
use crate::journal::entries::{Checkpoint, CheckpointHeader, EntryCreated};
use crate::journal::issuer::{Issuer, SectionAcked};
use crate::journal::org_walk::WalkState;
use crate::journal::run::SectionInput;
use crate::live::shipper::{WalState, proved_frames};
use crate::live::{self, CaptureError, CaptureRequest, Checkpoint as WalCheckpoint, OwnedFiles};
use crate::{
    CaptureSource, Delta, Error, FailPoint, LogEntry, OrgId, ShipKind, ShipReport, Snapshot,
};

/// Submits of one ship whose batch was not acknowledged (its slot taken, the run sealed
/// below it) before the ship fails, retryably.
const NOT_ACKED_TRIES: u32 = 3;

/// The byte bounds a journal tenure ships by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalLimits {
    /// J5: bytes of pages changed since the base past which the next ship first writes a
    /// checkpoint.
    pub section_bytes: u64,
    /// WAL bytes past which a capture checkpoints the WAL into the database file (as
    /// [`crate::ShipPolicy::wal_checkpoint_bytes`]).
    pub wal_checkpoint_bytes: u64,
    /// J5's chain bound: once this many delta checkpoints lead down to the newest snapshot,
    /// the next checkpoint is a snapshot (0: every checkpoint is one).
    pub max_chain_deltas: u64,
}

/// One org's tenure on the journal: its base, the pages changed since, and where its
/// newest section was acknowledged.
pub struct JournalShipper {
    issuer: Issuer,
    org: OrgId,
    round: u64,
    via: Via,
    /// The writer's descriptors; `None` while the org is parked ([`JournalShipper::park`]).
    files: Option<Arc<OwnedFiles>>,
    /// Where the database file is, for errors while parked.
    db_path: std::path::PathBuf,
    /// Page hashes of the state the newest capture left (page 1 canonical).
    hashes: PageHashes,
    /// The checkpoint sections are cumulative from.
    base: Base,
    /// Every page changed since `base`, page 1 canonical; empty while parked.
    cumulative: BTreeMap<u32, Vec<u8>>,
    /// While parked, the numbers of `cumulative`'s pages: their bytes are read back from the
    /// proven file at unpark, so a parked org holds no page (I14).
    parked_pages: Vec<u32>,
    db_pages: u32,
    /// The commit counter the newest capture proved.
    commit: u64,
    /// The newest acknowledged section: its slot and commit.
    acked: Option<(SectionAcked, u64)>,
    /// The log seq after the newest entry of ours (J5's create, no LIST).
    next_seq: u64,
    /// Where the next capture reads the WAL from; `Lost` until a capture checkpointed the
    /// WAL and diffed the file (a tenure's first, or after a failed capture).
    wal: WalState,
    /// The database file holds exactly `commit`'s state: the newest capture checkpointed
    /// the WAL into it, and only captures (under the shipper lock) checkpoint.
    file_at_commit: bool,
    /// Delta checkpoints from `base` down to its snapshot (`u64::MAX` when unknown).
    chain: u64,
    limits: JournalLimits,
}

impl std::fmt::Debug for JournalShipper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalShipper")
            .field("org", &self.org)
            .field("round", &self.round)
            .field("base", &self.base)
            .field("commit", &self.commit)
            .finish_non_exhaustive()
    }
}

/// A walk's state installed in a local file ([`JournalShipper::install`]), before the
/// tenure's first checkpoint: the installed commit counter (`None`: the org was never
/// written, nothing installed), the section body the install checked and applied, the
/// installed image's page hashes, and its name for the writer's `quick_check`
/// ([`Installed::image`]).
#[derive(Debug)]
pub struct Installed {
    commit: Option<u64>,
    section_body: Option<Vec<u8>>,
    hashes: Option<PageHashes>,
    image: String,
}

impl Installed {
    /// What the installed image is called in errors (the log entry or the section whose
    /// state it holds), for its `quick_check` on the writer's connection
    /// ([`crate::sqlite::open_installed`]); `None` when nothing was installed (the org was
    /// never written: the writer creates its file).
    pub fn image(&self) -> Option<&str> {
        self.commit.map(|_| self.image.as_str())
    }
}

/// The state an org's tenure starts from, read before the writer opens the file.
#[derive(Debug)]
pub struct Hydrated {
    /// The installed image's commit counter.
    pub commit: u64,
    image_hashes: PageHashes,
    /// The entry sections may name as their base, when the walk's state is one.
    base: Option<Base>,
    /// Delta checkpoints from that base down to its snapshot.
    chain: u64,
}

impl JournalShipper {
    /// A tenure's hydrate, first half: installs `walk`'s state of `org` at `dest` (nothing
    /// when the org was never written) as a file of this process's lifetime
    /// ([`crate::sqlite::Durability::Volatile`]: a journal tenure's file is never kept or
    /// resumed) and reads nothing else. It depends on the walk alone, so an acquire may run
    /// it beside its claim ([`Issuer::acquire_walked`]); the result serves only a tenure that
    /// came from this same walk. The image is not `quick_check`ed: open the writer on it with
    /// [`crate::sqlite::open_installed`] naming [`Installed::image`], which checks it before
    /// anything writes to it (I10).
    ///
    /// # Errors
    /// As [`crate::Replica::restore_walk`].
    pub async fn install(
        replica: &crate::Replica,
        org: &crate::OrgId,
        walk: &crate::journal::OrgWalk,
        dest: &std::path::Path,
    ) -> Result<Installed, Error> {
        let (commit, installed) = replica.restore_walk_volatile(org, walk, dest).await?;
        let image = match &walk.state {
            WalkState::Section { batch, .. } => format!(
                "journals/{}/{:020}.jnl#{org}",
                batch.header.run, batch.header.slot
            ),
            WalkState::Entry { seq } => format!("orgs/{org}/log/{seq:020}.json"),
            WalkState::Empty => String::new(),
        };
        Ok(Installed {
            commit,
            section_body: installed.section_body,
            hashes: installed.hashes,
            image,
        })
    }

    /// A tenure's hydrate, second half, on what [`JournalShipper::install`] put at `dest`
    /// from `start`'s own walk: the installed image's page hashes and, when the walk's state
    /// is a section, the tenure's first checkpoint of it through `start.through` (J5), so
    /// sections have a base. Call before the writer opens the file: the open path's own
    /// writes (schema, WAL mode) ride in the first section, and a read of the file after the
    /// writer took its lock would release that lock when it closes (POSIX locks are per
    /// process).
    ///
    /// # Errors
    /// As [`crate::Replica::restore_walk`] and [`crate::Replica::checkpoint`];
    /// [`Error::Io`] reading the installed file.
    pub async fn hydrate_installed(
        issuer: &Issuer,
        start: &mut JournalStart,
        dest: &std::path::Path,
        installed: Installed,
    ) -> Result<Option<Hydrated>, Error> {
        let Installed {
            commit: installed,
            section_body,
            hashes,
            ..
        } = installed;
        let Some(commit) = installed else {
            return Ok(None);
        };
        // The install's own hashes of the image it wrote: the file is read again only for a
        // snapshot checkpoint of it (or by an install that kept none).
        let read = || async {
            let image = tokio::fs::read(dest).await.map_err(|source| Error::Io {
                path: dest.display().to_string(),
                source,
            })?;
            Ok::<_, Error>(Snapshot::from_bytes(image, commit))
        };
        let hashes = match hashes {
            Some(h) => h,
            None => {
                let snapshot = read().await?;
                PageHashes::of_image(&dest.display().to_string(), snapshot.bytes())?
            }
        };
        if cfg!(debug_assertions) {
            let file = PageHashes::of_image(&dest.display().to_string(), read().await?.bytes())?;
            debug_assert_eq!(file, hashes, "the install's hashes are not its file's");
        }
        let checksum = checksum_hex(hashes.sum());
        let log = &start.tenure.walk.log;
        let (base, chain) = match start.base_entry() {
            Some(seq) => (Base { seq, checksum }, chain_deltas(log, seq)),
            None => match section_pages(start, section_body)? {
                // The section's own pages on its own base: one inline PUT.
                Some((base, pages)) => {
                    let chain = chain_deltas(log, base.seq).saturating_add(1);
                    let seq = first_delta_checkpoint(issuer, start, base, pages, &checksum).await?;
                    (Base { seq, checksum }, chain)
                }
                None => {
                    // The file's bytes go to the store here, before the writer's
                    // `quick_check`: they must be the image the install verified, page for
                    // page, so the checkpoint records only a state the store already holds.
                    let snapshot = read().await?;
                    let what = dest.display().to_string();
                    if PageHashes::of_image(&what, snapshot.bytes())? != hashes {
                        return Err(Error::corrupt(
                            &what,
                            "the installed file differs from the image the install verified",
                        ));
                    }
                    let seq = first_checkpoint(issuer, start, snapshot).await?;
                    (Base { seq, checksum }, 0)
                }
            },
        };
        issuer
            .replica()
            .failpoint(FailPoint::JournalInstalled, &start.org)
            .await?;
        Ok(Some(Hydrated {
            commit,
            image_hashes: hashes,
            base: Some(base),
            chain,
        }))
    }

    /// The tenure's writer, once the file is open on `files`. A never-written org
    /// (`hydrated` is `None`) is captured now and its first checkpoint written through
    /// `start.through`: it holds no acknowledged commit, only what the open path wrote.
    ///
    /// # Errors
    /// [`Error::FilesChanged`] when the file is not the writer's; the capture's and the
    /// checkpoint's errors.
    pub async fn start(
        issuer: Issuer,
        mut start: JournalStart,
        hydrated: Option<Hydrated>,
        files: Arc<OwnedFiles>,
        source: &dyn CaptureSource,
        limits: JournalLimits,
    ) -> Result<JournalShipper, Error> {
        let (hashes, base, commit, wal, chain) = match hydrated {
            Some(Hydrated {
                commit,
                image_hashes,
                base: Some(base),
                chain,
            }) => (image_hashes, base, commit, WalState::Lost, chain),
            _ => {
                let (cap, _, reset) = capture(&start.org, start.tenure.round, source).await?;
                let image = read_file(&files).await?;
                let snapshot = Snapshot::from_bytes(image, cap);
                let hashes = PageHashes::of_image(start.org.as_ref(), snapshot.bytes())?;
                let checksum = checksum_hex(hashes.sum());
                let seq = first_checkpoint(&issuer, &mut start, snapshot).await?;
                // The file was read whole after a checkpoint that emptied the WAL: later
                // captures need only its frames.
                let wal = if reset {
                    WalState::Fresh
                } else {
                    WalState::Lost
                };
                (hashes, Base { seq, checksum }, cap, wal, 0)
            }
        };
        let db_pages = u32::try_from(hashes.pages()).map_err(|_| Error::InvalidDelta {
            reason: "a database of more than 2^32 pages".into(),
        })?;
        Ok(JournalShipper {
            org: start.org,
            round: start.tenure.round,
            via: start.tenure.via,
            db_path: files.db_path().to_owned(),
            files: Some(files),
            hashes,
            base,
            cumulative: BTreeMap::new(),
            parked_pages: Vec::new(),
            db_pages,
            commit,
            acked: None,
            next_seq: start.next_seq,
            wal,
            file_at_commit: false,
            chain,
            limits,
            issuer,
        })
    }

    /// The org.
    pub fn org(&self) -> &OrgId {
        &self.org
    }

    /// The tenure's round.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The checkpoint sections are cumulative from (its log seq and checksum).
    pub fn base(&self) -> &Base {
        &self.base
    }

    /// Ships everything committed so far as one cumulative section and returns once the
    /// issuer acknowledged it (J1); writes a due checkpoint first (J5). The report's kind
    /// is [`ShipKind::Full`] when that checkpoint was a snapshot (retention may then run,
    /// T4), else [`ShipKind::Delta`].
    ///
    /// # Errors
    /// [`Error::FilesChanged`]; [`Error::NotAcknowledged`] (ship again; nothing lost);
    /// [`Error::Fenced`], [`Error::RunFenced`] (the tenure is over); the checkpoint's and
    /// the capture's errors.
    pub async fn ship(&mut self, source: &dyn CaptureSource) -> Result<ShipReport, Error> {
        // A snapshot checkpoint is reported as a full ship: it makes older entries of the
        // org's log deletable (T4).
        let mut kind = ShipKind::Delta;
        if self.checkpoint_due() && self.checkpoint(false).await? {
            kind = ShipKind::Full;
        }
        // A slot another writer's exclusion of some other org took acknowledges nothing
        // but fences nothing either: the next batch carries the (cumulative) section.
        let mut tries = 0;
        let acked = loop {
            match self.submit(source, false).await {
                Err(Error::NotAcknowledged { .. }) if tries < NOT_ACKED_TRIES => tries += 1,
                other => break other?,
            }
        };
        Ok(ShipReport {
            commit_seq: self.commit,
            kind,
            bytes: self.cumulative_bytes(),
            seq: acked.slot,
        })
    }

    /// J6: returns once a batch issued after this call confirms the tenure, and the files
    /// are still the writer's (I13).
    ///
    /// # Errors
    /// [`Error::Fenced`], [`Error::RunFenced`]; [`Error::FilesChanged`].
    pub async fn confirm(&mut self) -> Result<(), Error> {
        self.issuer.confirm(&self.org).await?;
        self.files()?
            .check_unchanged()
            .map_err(|f| self.files_changed(&f))
    }

    /// J4 for one org: ships a released section of everything committed, then the
    /// released checkpoint through its slot, then the Release entry: walks end free there.
    /// The tenure is detached from the run. After [`Issuer::begin_close`] it writes
    /// nothing: the run's release seal frees the org.
    ///
    /// # Errors
    /// As [`JournalShipper::ship`]; the entries' creates. Until the Release entry landed
    /// the org stays held by this run (a successor adopts it, J3-7).
    pub async fn release(&mut self, source: &dyn CaptureSource) -> Result<(), Error> {
        if self.issuer.is_closing() {
            // J4 for every org: the caller shipped everything committed; the run's release
            // seal frees this org with the others (its walk reads its newest section, then
            // meets the seal), and its entry stays counted in the seal's retain_below.
            return Ok(());
        }
        let mut tries = 0;
        loop {
            match self.submit(source, true).await {
                Err(Error::NotAcknowledged { .. }) if tries < NOT_ACKED_TRIES => tries += 1,
                other => break other.map(|_| ())?,
            }
        }
        self.checkpoint(true).await?;
        let created = self
            .issuer
            .replica()
            .create_release(&self.org, (self.next_seq, self.round), self.issuer.writer())
            .await?;
        if let EntryCreated::Taken(theirs) = created {
            return Err(Error::Fenced {
                org: self.org.to_string(),
                ours: self.round,
                theirs: theirs.round(),
            });
        }
        self.next_seq += 1;
        self.issuer.detach(&self.org);
        Ok(())
    }

    /// True when the writer may park ([`JournalShipper::park`]): the newest capture's
    /// commit was acknowledged and the WAL position is known, so the WAL holds nothing
    /// beyond what was captured and the file, once the writer checkpointed the WAL into it,
    /// holds exactly the state `hashes` describe; and the descriptors are held. After an
    /// unpark that found the WAL written (an application hook at open) the position is
    /// unknown until a capture diffs the file: the caller ships once first.
    pub fn parkable(&self) -> bool {
        self.files.is_some()
            && !matches!(self.wal, WalState::Lost)
            && self.acked.as_ref().is_some_and(|(_, c)| *c == self.commit)
    }

    /// Lets go of the writer's descriptors (I14: a parked org keeps no descriptor of its
    /// database), as [`crate::Shipper::park`], and of the cumulative section's page bytes
    /// (their numbers are kept; [`JournalShipper::unpark`] reads them back from the proven
    /// file, which holds exactly the acknowledged state). The tenure stays attached to the run: its
    /// walk entry still counts for retention, and J7's lag trigger may release it. Call
    /// only once the writer closed its connection after checkpointing the WAL into the file
    /// (closing a descriptor while SQLite has the file open drops its locks, I13). Until
    /// [`JournalShipper::unpark`], ships, confirmations and releases fail with
    /// [`Error::Io`].
    pub fn park(&mut self) {
        self.parked_pages = std::mem::take(&mut self.cumulative).into_keys().collect();
        self.files = None;
        self.wal = WalState::Lost;
        self.file_at_commit = false;
    }

    /// Takes the descriptors of a reopened writer after proving, before anything is served
    /// from it, that the database file is exactly the acknowledged state: every page's hash
    /// (page 1 canonical) and the size equal `hashes` (I8, I13). Local, no store request.
    /// Whatever the open path wrote into the WAL since (an application hook) ships with the
    /// next section: that capture checkpoints the WAL and diffs the file.
    ///
    /// # Errors
    /// [`Error::FilesChanged`] when the file was changed, replaced or truncated while
    /// parked: nothing may be answered from it; [`Error::Io`] reading it; [`Error::Task`]
    /// when the blocking read panicked.
    pub async fn unpark(&mut self, files: Arc<OwnedFiles>) -> Result<(), Error> {
        let reader = files.clone();
        let hashes = self.hashes.clone();
        let (pages, db_pages) = (self.parked_pages.clone(), self.db_pages);
        // The proof, then the cumulative section's pages read back from the proven file
        // (the writer's exclusive lock is held again, and the read checks the file did not
        // change since).
        let read = tokio::task::spawn_blocking(move || {
            if !live::file_is(&reader, &hashes)? {
                return Ok(None);
            }
            let db = reader.db_state()?;
            live::read_pages(&reader, db, hashes.page_size(), db_pages, &pages).map(Some)
        })
        .await
        .map_err(|source| Error::Task {
            op: "proving a parked journal org's file",
            source,
        })?;
        let Some(mut cumulative) = read.map_err(|e| self.capture_error(e))? else {
            return Err(self.files_changed(&live::Foreign(
                "the parked database file is not the acknowledged state".into(),
            )));
        };
        if let Some(p1) = cumulative.get_mut(&1) {
            canonical_page1(p1);
        }
        self.cumulative = cumulative;
        self.parked_pages.clear();
        let wal = files.wal_len().map_err(|source| Error::Io {
            path: self.db_path.display().to_string(),
            source,
        })?;
        self.files = Some(files);
        (self.wal, self.file_at_commit) = if wal == 0 {
            (WalState::Fresh, true)
        } else {
            (WalState::Lost, false)
        };
        Ok(())
    }

    fn files(&self) -> Result<&Arc<OwnedFiles>, Error> {
        self.files.as_ref().ok_or_else(|| Error::Io {
            path: self.db_path.display().to_string(),
            source: std::io::Error::other("the writer is parked"),
        })
    }

    /// True when [`JournalShipper::release`] captures from the writer (a released section of
    /// everything committed); false once the run is closing, when it writes nothing.
    pub fn release_captures(&self) -> bool {
        !self.issuer.is_closing()
    }

    fn cumulative_bytes(&self) -> u64 {
        self.cumulative.len() as u64 * u64::from(self.hashes.page_size())
    }

    /// J5's byte trigger, or J7's lag trigger for an org that commits.
    fn checkpoint_due(&self) -> bool {
        self.acked.is_some()
            && (self.cumulative_bytes() > self.limits.section_bytes
                || self.issuer.is_lagging(&self.org))
    }

    /// Captures what changed since the previous capture and submits the cumulative
    /// section.
    async fn submit(
        &mut self,
        source: &dyn CaptureSource,
        released: bool,
    ) -> Result<SectionAcked, Error> {
        // A snapshot checkpoint is read from the file: while one is due, captures
        // checkpoint the WAL, so the file holds the acknowledged state when J5 comes.
        let (commit, db_pages, mut changed, reset) = match self.wal {
            WalState::Fresh | WalState::At(_) if !self.snapshot_due() => {
                self.capture_frames(source).await?
            }
            _ => self.capture_file(source).await?,
        };
        self.file_at_commit = reset;
        if let Some(p1) = changed.get_mut(&1) {
            canonical_page1(p1);
        }
        let change = self.hashes.change(db_pages, &changed);
        self.hashes.apply_change(change);
        self.cumulative.extend(changed);
        self.cumulative.retain(|p, _| *p <= db_pages);
        self.db_pages = db_pages;
        self.commit = commit;
        let section = SectionInput {
            org: self.org.clone(),
            via: self.via.clone(),
            base: self.base.clone(),
            checksum: checksum_hex(self.hashes.sum()),
            pages: self.pages()?,
            released,
        };
        let acked = self.issuer.submit(section).await?;
        self.acked = Some((acked.clone(), commit));
        Ok(acked)
    }

    /// The committed WAL frames after the position the previous capture reached, proved
    /// (I13: the newest counter page holds the commit, or the frames leave it alone and the
    /// commit is the one proved before); the WAL is checkpointed after the read once it
    /// passes `wal_checkpoint_bytes`. Returns the commit, the size in pages and the
    /// changed pages. Only this writer restarts the WAL and it tracks where, so frames that
    /// cannot be read from the position mean someone else rewrote it: `FilesChanged`.
    async fn capture_frames(&mut self, source: &dyn CaptureSource) -> Result<Capture, Error> {
        let from = match self.wal {
            WalState::At(pos) => Some(pos),
            WalState::Fresh | WalState::Lost => None,
        };
        let request = CaptureRequest {
            from: from.map_or(0, |p| p.offset),
            checkpoint: WalCheckpoint::AfterIfOver(self.limits.wal_checkpoint_bytes),
        };
        let cap = match source.capture(request).await {
            Ok(cap) => cap,
            Err(e) => {
                // A failed capture may have checkpointed: the position is unknown, so the
                // next capture diffs the file.
                self.wal = WalState::Lost;
                return Err(self.capture_error(e));
            }
        };
        check_counter(&cap)?;
        let (commit, reset) = (cap.commit, cap.reset);
        let frames = proved_frames(
            cap.head,
            cap.tail,
            cap.counter_page,
            commit,
            from,
            Some(self.commit),
        )
        .await?
        .map_err(|f| self.files_changed(&f))?;
        if let Some(pos) = frames.end
            && pos.page_size != self.hashes.page_size()
        {
            return Err(self.files_changed(&live::Foreign(
                "the WAL's page size is not the database's".into(),
            )));
        }
        self.wal = if reset {
            WalState::Fresh
        } else {
            frames.end.map_or(self.wal, WalState::At)
        };
        let db_pages = frames.db_pages.unwrap_or(self.db_pages);
        Ok((commit, db_pages, frames.pages, reset))
    }

    /// Captures with the WAL checkpointed into the file first and takes every page of the
    /// file that differs from the previous state's hashes, proving the counter (I13).
    async fn capture_file(&mut self, source: &dyn CaptureSource) -> Result<Capture, Error> {
        let (commit, counter_page, reset) = capture(&self.org, self.round, source).await?;
        let files = self.files()?.clone();
        let hashes = self.hashes.clone();
        let read = tokio::task::spawn_blocking(move || live::file_changes(&files, &hashes))
            .await
            .map_err(|source| Error::Task {
                op: "reading a journal capture",
                source,
            })?;
        let Some((db_pages, changed)) = read.map_err(|e| self.capture_error(e))? else {
            return Err(self.files_changed(&live::Foreign(
                "the database file's page size changed".into(),
            )));
        };
        // I13: the pages hold exactly the commit the capture reported: the counter page
        // changed to it, or it did not change and neither did the commit.
        let proven = match changed.get(&counter_page) {
            Some(page) => live::proof::commit_counter(page, counter_page).ok(),
            None => Some(self.commit),
        };
        if proven != Some(commit) {
            return Err(self.files_changed(&live::Foreign(format!(
                "the captured pages hold commit {proven:?}, the writer committed {commit}"
            ))));
        }
        // The checkpoint emptied the WAL: the next capture reads its new generation.
        self.wal = if reset {
            WalState::Fresh
        } else {
            WalState::Lost
        };
        Ok((commit, db_pages, changed, reset))
    }

    fn pages(&self) -> Result<Delta, Error> {
        Delta::new(
            self.hashes.page_size(),
            self.db_pages,
            self.cumulative.clone(),
            self.commit,
        )
    }

    /// J5's chain bound is reached: the next checkpoint should be a snapshot.
    fn snapshot_due(&self) -> bool {
        self.chain >= self.limits.max_chain_deltas
    }

    /// J5: the acknowledged state (the newest acked section, nothing captured since),
    /// through that section's slot, as a delta on the base, or as a snapshot read from the
    /// file when the chain bound is reached and the file holds exactly that state; the
    /// sections start again from it.
    /// Returns true when it wrote a snapshot.
    async fn checkpoint(&mut self, released: bool) -> Result<bool, Error> {
        let Some((acked, commit)) = self.acked.clone() else {
            return Ok(false);
        };
        // Checkpoints are through slots of the writer's current run (J3.5): after a
        // self-seal the next acknowledged section gives one.
        if acked.run != self.issuer.run_name() || commit != self.commit {
            return Ok(false);
        }
        let snapshot = self.snapshot_due() && self.file_at_commit;
        let header = CheckpointHeader {
            seq: self.next_seq,
            round: self.round,
            writer: self.issuer.writer().to_owned(),
            run: acked.run.clone(),
            through: acked.slot,
            tenure: self.via.clone(),
            released,
        };
        let checkpoint = if snapshot {
            AnyCheckpoint::Snapshot(Checkpoint {
                header,
                snapshot: self.acked_image().await?,
            })
        } else {
            AnyCheckpoint::Delta(DeltaCheckpoint {
                header,
                base: self.base.clone(),
                checksum: checksum_hex(self.hashes.sum()),
                pages: self.pages()?,
            })
        };
        let entry = self
            .issuer
            .replica()
            .checkpoint(&self.org, checkpoint)
            .await?;
        let seq = entry.header.seq;
        self.chain = if snapshot {
            0
        } else {
            self.chain.saturating_add(1)
        };
        self.base = Base {
            seq,
            checksum: checksum_hex(self.hashes.sum()),
        };
        self.cumulative.clear();
        self.next_seq = seq + 1;
        self.issuer.entry(&self.org, acked.slot + 1);
        Ok(snapshot)
    }

    /// The database file as a snapshot of the acknowledged commit: the caller checked the
    /// file holds exactly it, and its page hashes must say so (I10), else `FilesChanged`.
    async fn acked_image(&self) -> Result<Snapshot, Error> {
        let image = read_file(self.files()?).await?;
        self.files()?
            .check_unchanged()
            .map_err(|f| self.files_changed(&f))?;
        // Hashed as stored: page 1 canonical.
        let snapshot = Snapshot::from_bytes(image, self.commit);
        let hashes = PageHashes::of_image(self.org.as_ref(), snapshot.bytes())?;
        if hashes.sum() != self.hashes.sum() || hashes.pages() != self.hashes.pages() {
            return Err(self.files_changed(&live::Foreign(
                "the database file is not the acknowledged state".into(),
            )));
        }
        Ok(snapshot)
    }

    fn files_changed(&self, f: &live::Foreign) -> Error {
        Error::FilesChanged {
            org: self.org.clone(),
            round: self.round,
            reason: f.to_string(),
        }
    }

    fn capture_error(&self, e: CaptureError) -> Error {
        match e {
            CaptureError::Io(source) => Error::Io {
                path: self.db_path.display().to_string(),
                source,
            },
            CaptureError::Foreign(f) => self.files_changed(&f),
        }
    }
}

/// A capture's commit, the database's size in pages, the pages changed since the previous
/// capture (page 1 as the file holds it), and whether it checkpointed the WAL into the file
/// (which then holds exactly the commit).
type Capture = (u64, u32, BTreeMap<u32, Vec<u8>>, bool);

/// Captures with the WAL checkpointed into the file first, so the file holds exactly the
/// commit the capture reports; returns that commit, the counter's page number, and whether
/// the checkpoint emptied the WAL.
async fn capture(
    org: &OrgId,
    round: u64,
    source: &dyn CaptureSource,
) -> Result<(u64, u32, bool), Error> {
    let request = CaptureRequest {
        from: 0,
        checkpoint: WalCheckpoint::Before,
    };
    match source.capture(request).await {
        Ok(cap) => {
            check_counter(&cap)?;
            Ok((cap.commit, cap.counter_page, cap.reset))
        }
        Err(CaptureError::Io(source)) => Err(Error::Io {
            path: format!("orgs/{org}"),
            source,
        }),
        Err(CaptureError::Foreign(f)) => Err(Error::FilesChanged {
            org: org.clone(),
            round,
            reason: f.to_string(),
        }),
    }
}

/// I13: after a checkpoint the WAL holds no frame, so the counter is read from the file by
/// the diff; here only the capture's own shape is checked.
fn check_counter(cap: &live::Captured) -> Result<(), Error> {
    if cap.page_size == 0 {
        return Err(Error::InvalidDelta {
            reason: "a capture with no page size".into(),
        });
    }
    Ok(())
}

async fn read_file(files: &Arc<OwnedFiles>) -> Result<Vec<u8>, Error> {
    let files = files.clone();
    tokio::task::spawn_blocking(move || {
        let len = files.db_state()?.len();
        files.read_db(0, len)
    })
    .await
    .map_err(|source| Error::Task {
        op: "reading a journal org's file",
        source,
    })?
    .map_err(|source| Error::Io {
        path: "journal org file".into(),
        source,
    })
}

/// J5's chain length: the delta checkpoints from the entry at `seq` of `log` down to a
/// snapshot, by their `base` links; `u64::MAX` (a snapshot is due) when an entry on the way
/// is not in `log` or a link does not go down.
fn chain_deltas(log: &BTreeMap<u64, LogEntry>, mut seq: u64) -> u64 {
    let mut n = 0u64;
    loop {
        let Some(entry) = log.get(&seq) else {
            return u64::MAX;
        };
        match entry.delta().map(|d| d.base) {
            None => return n,
            Some(base) if base < seq => {
                n += 1;
                seq = base;
            }
            Some(_) => return u64::MAX,
        }
    }
}

/// The pages of the walk's newest section (`body`: the delta body the install read,
/// checked by its digest, applied and checked against the section's checksum), when every
/// one is stored whole (a section written by [`JournalShipper`] always is), with the base
/// it names; `None` otherwise.
fn section_pages(
    start: &JournalStart,
    body: Option<Vec<u8>>,
) -> Result<Option<(Base, Delta)>, Error> {
    let WalkState::Section { batch, section } = &start.tenure.walk.state else {
        return Ok(None);
    };
    let Some(body) = body else {
        return Ok(None);
    };
    let object = format!("{} slot {}", batch.header.run, batch.header.slot);
    let parsed = DeltaBody::parse(&object, &body)?;
    let mut pages = BTreeMap::new();
    for (pgno, encoding, bytes) in parsed.records() {
        if encoding != body::WHOLE {
            return Ok(None);
        }
        pages.insert(pgno, bytes.to_vec());
    }
    let delta = Delta::new(parsed.page_size(), parsed.db_pages(), pages, section.commit)?;
    Ok(Some((section.base.clone(), delta)))
}

/// The tenure's first checkpoint as a delta: the walk's newest section's pages on the base
/// it names, through `start.through`, at `start.next_seq` (J5); returns its seq.
async fn first_delta_checkpoint(
    issuer: &Issuer,
    start: &mut JournalStart,
    base: Base,
    pages: Delta,
    checksum: &str,
) -> Result<u64, Error> {
    let checkpoint = DeltaCheckpoint {
        header: first_header(issuer, start),
        base,
        checksum: checksum.to_owned(),
        pages,
    };
    create_first(issuer, start, AnyCheckpoint::Delta(checkpoint)).await
}

/// The tenure's first checkpoint: `snapshot` (the walk's state, or a never-written org's
/// opened file) through `start.through`, at `start.next_seq` (J5); returns its seq.
async fn first_checkpoint(
    issuer: &Issuer,
    start: &mut JournalStart,
    snapshot: Snapshot,
) -> Result<u64, Error> {
    let checkpoint = Checkpoint {
        header: first_header(issuer, start),
        snapshot,
    };
    create_first(issuer, start, AnyCheckpoint::Snapshot(checkpoint)).await
}

/// The header of the tenure's first checkpoint: through `start.through`, at
/// `start.next_seq`, not released.
fn first_header(issuer: &Issuer, start: &JournalStart) -> CheckpointHeader {
    CheckpointHeader {
        seq: start.next_seq,
        round: start.tenure.round,
        writer: issuer.writer().to_owned(),
        run: start.run.clone(),
        through: start.through,
        tenure: start.tenure.via.clone(),
        released: false,
    }
}

/// Creates a tenure's first checkpoint (J5's collision rule included), moves the tenure's
/// next log seq above it and the org's walk entry past `start.through`; returns its seq.
async fn create_first(
    issuer: &Issuer,
    start: &mut JournalStart,
    checkpoint: AnyCheckpoint,
) -> Result<u64, Error> {
    let entry = issuer.replica().checkpoint(&start.org, checkpoint).await?;
    let seq = entry.header.seq;
    start.next_seq = seq + 1;
    issuer.entry(&start.org, start.through + 1);
    Ok(seq)
}
