//! The start of an org's tenure: claim, then resume the file this host kept or hydrate, then
//! open the writer (I8).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_replica::journal::{
    Installed, Issuer, JournalAcquire, JournalLimits, JournalShipper, JournalStart,
};
use idem_replica::sqlite::Durability::{self, Synced, Volatile};
use idem_replica::sqlite::{OwnError, Owned};
use idem_replica::{Claim, OrgId, Replica, Shipper};

use super::publishing::{Publisher, ShipperLock};
use super::state::{ActiveOrgs, Inner, SERIAL, TICK};
use crate::ack::{AckState, Acks, Counters};
use crate::commit::{self, CommitSeq};
use crate::local::LocalFiles;
use crate::pool::Pool;
use crate::writer::{self, InitFn, OpenError, Writer, WriterCtx};
use crate::{Error, Org, RegistrySettings};

/// What opening an org needs from its registry.
pub(crate) struct Opening<'a> {
    pub replica: Replica,
    pub data_dir: &'a std::path::Path,
    pub writer_id: &'a str,
    pub home: &'a Arc<crate::local::Home>,
    pub settings: RegistrySettings,
    pub clock: Arc<dyn idem::Clock>,
    pub init: Option<InitFn>,
    /// The registry's writer threads.
    pub pool: &'a Pool,
    /// SQLite page cache of the writer connection, in KiB.
    pub cache_kib: u64,
    /// The registry's orgs holding a connection; the new org joins it.
    pub active: &'a Arc<ActiveOrgs>,
    /// The process's journal issuer, when the registry journals (3g).
    pub journal: Option<&'a Issuer>,
}

impl Org {
    /// Claims, hydrates and opens an org (I8): nothing is served before the latest state
    /// published before the claim is installed in a fresh, locked local file, and the
    /// commit sequence in that file equals the one the store says it holds.
    pub(crate) async fn open(opening: Opening<'_>, org: OrgId) -> Result<Org, Error> {
        let span = tracing::info_span!(
            "acquire",
            org = %org,
            round = tracing::field::Empty,
            seq = tracing::field::Empty,
        );
        tracing::Instrument::instrument(Self::open_traced(opening, org), span).await
    }

    async fn open_traced(opening: Opening<'_>, org: OrgId) -> Result<Org, Error> {
        crate::local::prepare(opening.data_dir, &org)?;
        if let Some(issuer) = opening.journal {
            // A walk that ends at a per-org holder is claimed per org (K1.6 is not built).
            if let Some((start, staged)) = acquire_journal(&opening, &org, issuer).await? {
                let issuer = issuer.clone();
                return open_journal(opening, org, issuer, start, staged).await;
            }
        }
        let began = idem_base::Stopwatch::start();
        let home_id = Some((opening.home.id.as_str(), opening.home.locked()));
        let (replica, settings) = (&opening.replica, &opening.settings);
        // An org this host may resume from a kept file claims alone; any other downloads
        // its hydrate beside the claim's requests (`docs/design.md`, section 3d).
        let resumable =
            settings.reuse_released_files && crate::local::has_kept(opening.data_dir, &org);
        let (writer_id, force) = (opening.writer_id, settings.force_claim);
        let claimed = if resumable {
            (replica.claim_from(&org, writer_id, home_id, force)).await
        } else {
            (replica.claim_to_hydrate(&org, writer_id, home_id, force)).await
        };
        let mut claim = claimed.map_err(|e| Error::replica(&org, e))?;
        let span = tracing::Span::current();
        span.record("round", claim.round());
        span.record("seq", claim.seq());
        let mut files = LocalFiles::create(opening.data_dir, &org, claim.round(), claim.nonce())?;
        let (cache_kib, init) = (opening.cache_kib, opening.init.clone());
        let opened = open_files(replica, &mut claim, &mut files, settings, cache_kib, init).await;
        let opened = match opened {
            Ok(v) => v,
            Err(e) => {
                files.remove();
                return Err(e);
            }
        };
        let (owned_files, commit_seq) = (opened.owned.files().clone(), opened.commit_seq);
        let (round, seq) = (claim.round(), claim.seq());
        let serving = Serving::start(&opening, &org, round, files, opened, Synced)?;
        metrics::histogram!(crate::metrics::HYDRATE_SECONDS)
            .record(crate::metrics::seconds(began.elapsed()));
        tracing::info!(org = %org, round, seq, commit_seq, "acquired");
        let mut shipper = Shipper::new(
            replica.clone(),
            claim,
            owned_files,
            opening.settings.ship.clone(),
        );
        shipper.share_cache_limit(opening.active.cache_limit());
        serving
            .serve(&opening, Publisher::PerOrg(Box::new(shipper)))
            .await
    }
}

/// The local files of a tenure-to-be and the walk's state installed in them while the
/// acquire claimed ([`acquire_journal`]).
type Staged = (LocalFiles, Installed);

/// Acquires `org` on the journal, installing the walk's state beside the claim when the
/// walk goes straight to one (K1b) or to an attach in this process's chain (K4): the
/// install's reads (the section, the base's snapshot and deltas) depend on the walk alone,
/// so they overlap the announcement, claim, C2 and attach instead of following them
/// (`docs/design.md` 3g, "The install beside the claim"). The installed file is kept only
/// when the tenure came from that same walk, in the round its files were named for;
/// otherwise it is deleted and the tenure installs its own walk's state as before.
/// `None`: the walk ends at a per-org holder.
async fn acquire_journal(
    opening: &Opening<'_>,
    org: &OrgId,
    issuer: &Issuer,
) -> Result<Option<(JournalStart, Option<Staged>)>, Error> {
    let replica = issuer.replica();
    let walk = replica
        .walk_org(org)
        .await
        .map_err(|e| Error::replica(org, e))?;
    let staging = match issuer.tenure_round(&walk) {
        Some(round) => Some((round, staged_files(opening.data_dir, org, round)?)),
        None => None,
    };
    let install = async {
        match &staging {
            Some((_, files)) => Some(JournalShipper::install(replica, org, &walk, &files.db).await),
            None => None,
        }
    };
    let force = opening.settings.force_claim;
    let (acquired, installed) = tokio::join!(
        issuer.acquire_walked(org, force, Some(walk.clone())),
        install
    );
    let discard = |staging: Option<(u64, LocalFiles)>| {
        if let Some((_, files)) = staging {
            files.remove();
        }
    };
    let (acquired, given) = match acquired {
        Ok(a) => a,
        Err(e) => {
            discard(staging);
            return Err(Error::replica(org, e));
        }
    };
    let JournalAcquire::Tenure(start) = acquired else {
        discard(staging);
        return Ok(None);
    };
    let staged = match (staging, installed) {
        (Some((round, files)), Some(Ok(installed))) if given && round == start.tenure.round => {
            Some((files, installed))
        }
        (staging, _) => {
            discard(staging);
            None
        }
    };
    Ok(Some((*start, staged)))
}

/// Local files for a tenure of `org` in `round` whose slot is not known yet: a random
/// nonce keeps the name apart from every other tenure's.
fn staged_files(data_dir: &std::path::Path, org: &OrgId, round: u64) -> Result<LocalFiles, Error> {
    let mut raw = [0u8; 8];
    getrandom::fill(&mut raw).map_err(|e| Error::Local {
        org: org.clone(),
        path: data_dir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    LocalFiles::create(data_dir, org, round, &format!("j{}", hex::encode(raw)))
}

/// The journal's start of a tenure: the walk's state installed (a first checkpoint of
/// it when it is a section, J5), the writer opened, then a [`JournalShipper`] (a
/// never-written org's first checkpoint is of the file the open path wrote). `staged`:
/// the files the acquire installed the same walk's state in.
async fn open_journal(
    opening: Opening<'_>,
    org: OrgId,
    issuer: Issuer,
    mut start: JournalStart,
    staged: Option<Staged>,
) -> Result<Org, Error> {
    let began = idem_base::Stopwatch::start();
    let round = start.tenure.round;
    tracing::Span::current().record("round", round);
    let (files, installed) = match staged {
        Some((files, installed)) => (files, Some(installed)),
        None => {
            let nonce = format!("j{}-{}", start.run.number(), start.through);
            match LocalFiles::create(opening.data_dir, &org, round, &nonce) {
                Ok(f) => (f, None),
                Err(e) => {
                    issuer.detach(&org);
                    return Err(e);
                }
            }
        }
    };
    let installed = async {
        let installed = match installed {
            Some(i) => i,
            None => JournalShipper::install(issuer.replica(), &org, &start.tenure.walk, &files.db)
                .await
                .map_err(|e| Error::replica(&org, e))?,
        };
        let image = installed.image().map(str::to_owned);
        let hydrated = JournalShipper::hydrate_installed(&issuer, &mut start, &files.db, installed)
            .await
            .map_err(|e| Error::replica(&org, e))?;
        let (busy, cache_kib) = (
            Duration::from_millis(opening.settings.busy_timeout_ms),
            opening.cache_kib,
        );
        let init = opening.init.clone();
        let opened = open_writer(
            &org,
            &files.db,
            busy,
            cache_kib,
            init,
            Volatile,
            image.as_deref(),
        )
        .await?;
        if let Some(h) = &hydrated
            && h.commit != opened.commit_seq
        {
            return Err(Error::CommitMismatch {
                org: org.clone(),
                hydrated: h.commit,
                in_file: opened.commit_seq,
            });
        }
        Ok((hydrated, opened))
    }
    .await;
    let (hydrated, opened) = match installed {
        Ok(v) => v,
        Err(e) => {
            issuer.detach(&org);
            files.remove();
            return Err(e);
        }
    };
    let (owned_files, commit_seq) = (opened.owned.files().clone(), opened.commit_seq);
    let serving = Serving::start(&opening, &org, round, files, opened, Volatile)?;
    let shipper = JournalShipper::start(
        issuer.clone(),
        start,
        hydrated,
        owned_files,
        &*serving.writer,
        JournalLimits {
            section_bytes: opening.settings.journal.section_bytes,
            wal_checkpoint_bytes: opening.settings.journal.wal_checkpoint_bytes,
            max_chain_deltas: opening.settings.journal.max_chain_deltas,
        },
    )
    .await;
    let shipper = match shipper {
        Ok(s) => s,
        Err(e) => {
            issuer.detach(&org);
            serving.abandon().await;
            return Err(Error::replica(&org, e));
        }
    };
    metrics::histogram!(crate::metrics::HYDRATE_SECONDS)
        .record(crate::metrics::seconds(began.elapsed()));
    tracing::info!(org = %org, round, base = shipper.base().seq, commit_seq, "acquired on the journal");
    serving
        .serve(&opening, Publisher::Journal(Box::new(shipper)))
        .await
}

/// A tenure's writer started on its installed file, before its publisher exists.
struct Serving {
    acks: Arc<Acks>,
    writer: Arc<Writer>,
    files: LocalFiles,
    effects: Arc<crate::effect::holder::Holder>,
}

impl Serving {
    /// Starts the writer on `opened` (the installed file, opened with `durability`, which a
    /// reopen keeps).
    fn start(
        opening: &Opening<'_>,
        org: &OrgId,
        round: u64,
        files: LocalFiles,
        opened: Opened,
        durability: Durability,
    ) -> Result<Serving, Error> {
        let Opened {
            owned,
            commit_seq,
            open_effects,
        } = opened;
        let acks = Arc::new(Acks {
            org: org.clone(),
            round,
            commit_seq: Arc::new(CommitSeq::new(commit_seq)),
            state: Mutex::new(AckState {
                shipped: commit_seq,
                ..AckState::default()
            }),
            demand: tokio::sync::Notify::new(),
            counters: Counters::default(),
        });
        let effects = Arc::new(crate::effect::holder::Holder::new(
            opening.writer_id,
            opening.replica.instance(),
            round,
            opening.clock.clone(),
        ));
        *crate::sync::lock(&effects.open) = open_effects;
        let reopen = writer::Reopen {
            path: files.db.clone(),
            busy: Duration::from_millis(opening.settings.busy_timeout_ms),
            cache_kib: opening.cache_kib,
            init: opening.init.clone(),
            durability,
        };
        let ctx = WriterCtx {
            round,
            commit_seq: acks.commit_seq.clone(),
            clock: opening.clock.clone(),
            reopen,
        };
        let writer = match Writer::start(owned, ctx, opening.pool) {
            Ok(w) => Arc::new(w),
            Err(source) => {
                // No writer thread could start: `owned` was dropped, connection first.
                let path = files.db.clone();
                files.remove();
                return Err(Error::Local {
                    org: org.clone(),
                    path,
                    source,
                });
            }
        };
        Ok(Serving {
            acks,
            writer,
            files,
            effects,
        })
    }

    /// Gives up before serving: the writer closes and the files go.
    async fn abandon(self) {
        self.writer.close().await;
        self.files.remove();
    }

    /// Serves the org with `publisher`: its shared state, its shipper task, its handle.
    async fn serve(self, opening: &Opening<'_>, publisher: Publisher) -> Result<Org, Error> {
        metrics::gauge!(crate::metrics::OPEN_ORGS).increment(1.0);
        let inner = Arc::new(Inner {
            acks: self.acks,
            replica: opening.replica.clone(),
            settings: opening.settings.clone(),
            shipper: ShipperLock::new(publisher),
            writer: self.writer,
            _home: opening.home.clone(),
            files: Mutex::new(Some(self.files)),
            inflight: AtomicUsize::new(0),
            last_used: AtomicU64::new(TICK.fetch_add(1, Ordering::Relaxed)),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            active: opening.active.clone(),
            closed: tokio::sync::watch::channel(false).0,
            effects: self.effects,
        });
        inner.active.insert(&inner);
        tokio::spawn(crate::shipper::run(inner.clone()));
        Ok(Org::from_inner(inner))
    }
}

/// A writer connection opened on a tenure's file, with what the open read through it.
struct Opened {
    owned: Owned,
    /// The commit sequence the file holds.
    commit_seq: u64,
    /// The open effect rows (RESERVED and AMBIGUOUS) the effects gauge counts, read on the
    /// opening thread so the tenure's first job is its first request's.
    open_effects: Vec<idem::effect::Effect>,
}

/// Opens the writer on `path` (a file of `durability`) and reads the commit sequence the
/// file holds and its open effect rows (a failure to read those is logged: the gauge then
/// counts from the next effect write).
async fn open_writer(
    org: &OrgId,
    path: &std::path::Path,
    busy: Duration,
    cache_kib: u64,
    init: Option<InitFn>,
    durability: Durability,
    installed: Option<&str>,
) -> Result<Opened, Error> {
    let (org2, path) = (org.clone(), path.to_owned());
    let installed = installed.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let opened = writer::open(
            &path,
            busy,
            cache_kib,
            init.as_ref(),
            durability,
            installed.as_deref(),
        );
        let owned = opened.map_err(|e| match e {
            OpenError::Own(OwnError::Corrupt(source)) => Error::replica(&org2, *source),
            OpenError::Idem(source) => Error::from_idem(&org2, source),
            OpenError::Own(source) => Error::Writer {
                org: org2.clone(),
                path: path.clone(),
                source,
            },
        })?;
        let commit_seq = commit::read(&owned.conn).map_err(|source| Error::Sqlite {
            org: org2.clone(),
            source,
        })?;
        let open_effects = idem::effect::list_open(&owned.conn).unwrap_or_else(|e| {
            tracing::warn!(org = %org2, error = %idem_base::ErrorChain::new(&e), "could not count the open effects");
            Vec::new()
        });
        Ok::<_, Error>(Opened {
            owned,
            commit_seq,
            open_effects,
        })
    })
    .await
    .map_err(|source| Error::Task {
        org: org.clone(),
        op: "opening the writer",
        source,
    })?
}

/// Installs the claim's state in the local file — the released file this host kept, when
/// the store proves it holds the newest published position, else a hydrate — opens the
/// writer on it, and checks that the file's commit sequence is the one the store's entry
/// says it holds. Either way the claim holds the position as its chain tip.
async fn open_files(
    replica: &Replica,
    claim: &mut Claim,
    files: &mut LocalFiles,
    settings: &RegistrySettings,
    cache_kib: u64,
    init: Option<InitFn>,
) -> Result<Opened, Error> {
    let org = claim.org().clone();
    let resumed = match files.cached.take() {
        Some(point) if settings.reuse_released_files => replica
            .resume(claim, &files.db, &point)
            .await
            .map_err(|e| Error::replica(&org, e))?,
        _ => None,
    };
    let (commit, image) = match resumed {
        Some(r) => {
            metrics::counter!(crate::metrics::RESUMES).increment(1);
            tracing::debug!(
                position = r.position,
                commit_seq = r.commit,
                "reused the local file"
            );
            (r.commit, None)
        }
        // A hydrate replaces whatever file is there (a kept one the store did not confirm).
        // Its `quick_check` is the writer's first access (I10): on a finding the open fails
        // and the caller removes the files, so the image is never served nor kept.
        None => {
            let span = tracing::info_span!("hydrate", org = %org, round = claim.round());
            let hydrating = replica.hydrate_for_writer(claim, &files.db);
            let (hydrated, image) = tracing::Instrument::instrument(hydrating, span)
                .await
                .map_err(|e| Error::replica(&org, e))?;
            tracing::debug!(position = ?hydrated.position, deltas = hydrated.deltas, commit_seq = hydrated.commit, "hydrated");
            (hydrated.commit, image)
        }
    };
    let busy = Duration::from_millis(settings.busy_timeout_ms);
    let installed = image.as_deref();
    let opened = open_writer(&org, &files.db, busy, cache_kib, init, Synced, installed).await;
    let opened = opened?;
    if opened.commit_seq != commit {
        return Err(Error::CommitMismatch {
            org,
            hydrated: commit,
            in_file: opened.commit_seq,
        });
    }
    Ok(opened)
}

impl From<OwnError> for OpenError {
    fn from(e: OwnError) -> Self {
        OpenError::Own(e)
    }
}
