//! The start of an org's tenure: claim, then resume the file this host kept or hydrate, then
//! open the writer (I8).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_replica::sqlite::{OwnError, Owned};
use idem_replica::{Claim, OrgId, Replica, Shipper};

use super::publishing::ShipperLock;
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
        let Opening {
            replica,
            data_dir,
            writer_id,
            home,
            settings,
            clock,
            init,
            pool,
            cache_kib,
            active,
        } = opening;
        crate::local::prepare(data_dir, &org)?;
        let began = idem_base::Stopwatch::start();
        let home_id = Some((home.id.as_str(), home.locked()));
        // An org this host may resume from a kept file claims alone; any other downloads
        // its hydrate beside the claim's requests (`docs/design.md`, section 3d).
        let resumable = settings.reuse_released_files && crate::local::has_kept(data_dir, &org);
        let claimed = if resumable {
            (replica.claim_from(&org, writer_id, home_id, settings.force_claim)).await
        } else {
            (replica.claim_to_hydrate(&org, writer_id, home_id, settings.force_claim)).await
        };
        let mut claim = claimed.map_err(|e| Error::replica(&org, e))?;
        let span = tracing::Span::current();
        span.record("round", claim.round());
        span.record("seq", claim.seq());
        let mut files = LocalFiles::create(data_dir, &org, claim.round(), claim.nonce())?;
        let reopen = writer::Reopen {
            path: files.db.clone(),
            busy: Duration::from_millis(settings.busy_timeout_ms),
            cache_kib,
            init: init.clone(),
        };
        let opened = open_files(&replica, &mut claim, &mut files, &settings, cache_kib, init).await;
        let (owned, commit_seq) = match opened {
            Ok(v) => v,
            Err(e) => {
                files.remove();
                return Err(e);
            }
        };
        let acks = Arc::new(Acks {
            org: org.clone(),
            round: claim.round(),
            commit_seq: Arc::new(CommitSeq::new(commit_seq)),
            state: Mutex::new(AckState {
                shipped: commit_seq,
                ..AckState::default()
            }),
            demand: tokio::sync::Notify::new(),
            counters: Counters::default(),
        });
        let owned_files = owned.files().clone();
        let effects = Arc::new(crate::effect::holder::Holder::new(
            writer_id,
            replica.instance(),
            claim.round(),
            clock.clone(),
        ));
        let ctx = WriterCtx {
            round: claim.round(),
            commit_seq: acks.commit_seq.clone(),
            clock,
            reopen,
        };
        let writer = match Writer::start(owned, ctx, pool) {
            Ok(w) => Arc::new(w),
            Err(source) => {
                // No writer thread could start: `owned` was dropped, connection first.
                let path = files.db.clone();
                files.remove();
                return Err(Error::Local { org, path, source });
            }
        };
        metrics::histogram!(crate::metrics::HYDRATE_SECONDS)
            .record(crate::metrics::seconds(began.elapsed()));
        metrics::gauge!(crate::metrics::OPEN_ORGS).increment(1.0);
        tracing::info!(org = %org, round = claim.round(), seq = claim.seq(), commit_seq, "acquired");
        let mut shipper = Shipper::new(replica.clone(), claim, owned_files, settings.ship.clone());
        shipper.share_cache_limit(active.cache_limit());
        let inner = Arc::new(Inner {
            acks,
            replica,
            settings,
            shipper: ShipperLock::new(shipper),
            writer,
            _home: home.clone(),
            files: Mutex::new(Some(files)),
            inflight: AtomicUsize::new(0),
            last_used: AtomicU64::new(TICK.fetch_add(1, Ordering::Relaxed)),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            active: active.clone(),
            closed: tokio::sync::watch::channel(false).0,
            effects,
        });
        inner.active.insert(&inner);
        tokio::spawn(crate::shipper::run(inner.clone()));
        let org = Org::from_inner(inner);
        org.load_effect_tally().await;
        Ok(org)
    }
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
) -> Result<(Owned, u64), Error> {
    let org = claim.org().clone();
    let resumed = match files.cached.take() {
        Some(point) if settings.reuse_released_files => replica
            .resume(claim, &files.db, &point)
            .await
            .map_err(|e| Error::replica(&org, e))?,
        _ => None,
    };
    let commit = match resumed {
        Some(r) => {
            metrics::counter!(crate::metrics::RESUMES).increment(1);
            tracing::debug!(
                position = r.position,
                commit_seq = r.commit,
                "reused the local file"
            );
            r.commit
        }
        // A hydrate replaces whatever file is there (a kept one the store did not confirm).
        None => {
            let span = tracing::info_span!("hydrate", org = %org, round = claim.round());
            let hydrated = tracing::Instrument::instrument(replica.hydrate(claim, &files.db), span)
                .await
                .map_err(|e| Error::replica(&org, e))?;
            tracing::debug!(position = ?hydrated.position, deltas = hydrated.deltas, commit_seq = hydrated.commit, "hydrated");
            hydrated.commit
        }
    };
    let path = files.db.clone();
    let busy = Duration::from_millis(settings.busy_timeout_ms);
    let org2 = org.clone();
    let opened = tokio::task::spawn_blocking(move || {
        let owned = writer::open(&path, busy, cache_kib, init.as_ref()).map_err(|e| match e {
            OpenError::Idem(source) => Error::from_idem(&org2, source),
            OpenError::Own(source) => Error::Writer {
                org: org2.clone(),
                path: path.clone(),
                source,
            },
        })?;
        let in_file = commit::read(&owned.conn).map_err(|source| Error::Sqlite {
            org: org2.clone(),
            source,
        })?;
        Ok::<_, Error>((owned, in_file))
    })
    .await
    .map_err(|source| Error::Task {
        org: org.clone(),
        op: "opening the writer",
        source,
    })??;
    let (owned, in_file) = opened;
    if in_file != commit {
        return Err(Error::CommitMismatch {
            org,
            hydrated: commit,
            in_file,
        });
    }
    Ok((owned, in_file))
}

impl From<OwnError> for OpenError {
    fn from(e: OwnError) -> Self {
        OpenError::Own(e)
    }
}
