//! Takeovers in the journal (`docs/design.md` 3g): a crash takeover adopts every org of a
//! dead writer's run with one seal (K2) and K4 attaches each; a claim over a live writer's
//! run excludes one org (K1) while the run keeps acknowledging the others. Each new tenure
//! restores the last acknowledged image byte for byte.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::ObjectStore;

use super::db::{Db, diff};
use super::{CaseResult, org, prefix};
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::journal::{
    Adoption, Base, BatchLanding, BatchMeta, Checkpoint, CheckpointHeader, EntryCreated, HeldClaim,
    IssuedBatch, OrgEnd, Run, SectionInput, Via,
};
use crate::{Error, OrgId, Replica, Settings, Snapshot};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn checksum(img: &[u8]) -> Result<String, Error> {
    Ok(checksum_hex(PageHashes::of_image("image", img)?.sum()))
}

/// An org a test writer holds: its tenure, database and first base (its checkpoint at 2).
struct Held {
    org: OrgId,
    via: Via,
    db: Db,
    base: Vec<u8>,
}

/// Claims each of `orgs` (never written) by K1b and checkpoints its empty database through
/// the run's resolved prefix, its tenure's first base.
async fn hold(r: &Replica, run: &mut Run, orgs: &[OrgId]) -> R<Vec<Held>> {
    let mut held = Vec::new();
    for o in orgs {
        let tenure = r
            .claim_free(o, run)
            .await?
            .map_err(|w| format!("{o} held: {:?}", w.end))?;
        let mut db = Db::new()?;
        let base = db.image()?;
        let created = r
            .create_checkpoint(
                o,
                Checkpoint {
                    header: CheckpointHeader {
                        seq: 2,
                        round: tenure.round,
                        writer: run.writer().to_owned(),
                        run: run.name().clone(),
                        through: run.resolved_below() - 1,
                        tenure: tenure.via.clone(),
                        released: false,
                    },
                    snapshot: Snapshot::from_bytes(base.clone(), 0),
                },
            )
            .await?;
        assert!(matches!(created, EntryCreated::Landed(_)), "{created:?}");
        held.push(Held {
            org: o.clone(),
            via: tenure.via,
            db,
            base,
        });
    }
    Ok(held)
}

/// Commits one row in each of `held` and issues one batch of their sections (the roster
/// with the first); returns it and each org's image after the commit.
async fn commit_all(
    r: &Replica,
    run: &mut Run,
    held: &mut [Held],
    commit: u64,
) -> R<(IssuedBatch, BTreeMap<String, Vec<u8>>)> {
    let mut sections = Vec::new();
    let mut images = BTreeMap::new();
    for h in held.iter_mut() {
        h.db.exec(&format!("INSERT INTO t VALUES ({commit}, randomblob(900))"))?;
        let img = h.db.image()?;
        sections.push(SectionInput {
            org: h.org.clone(),
            via: h.via.clone(),
            base: Base {
                seq: 2,
                checksum: checksum(&h.base)?,
            },
            checksum: checksum(&img)?,
            pages: diff(&h.base, &img, commit)?,
            released: false,
        });
        images.insert(h.org.to_string(), img);
    }
    let meta = BatchMeta {
        roster: (commit == 1).then(|| held.iter().map(|h| h.org.clone()).collect()),
        ..BatchMeta::new(1)
    };
    Ok((r.issue_batch(run, sections, meta).await?, images))
}

/// K2 whole: a writer claims three never-written orgs by K1b, checkpoints each, journals
/// two commits of each and has a third batch in flight when it dies. One adopt seal fences
/// the run; the adopter learns the orgs from the roster (K2.3), each org's walk passes the
/// seal into the adopter's run, K4 attaches each with the implied round, and each restores
/// the last acknowledged image byte for byte. The dead writer's late batch is fenced.
pub(super) async fn a_crash_takeover_adopts_every_org_with_one_seal_and_restores_each(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = Replica::open(store.clone(), &p, Settings::default()).await?;
    let b = Replica::open(store, &p, Settings::default()).await?;
    let orgs = [org("acme"), org("beta"), org("gamma")];
    let mut ra = a.start_run("a", 4).await?;
    let mut held = hold(&a, &mut ra, &orgs).await?;
    let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for commit in 1..=2u64 {
        let (batch, images) = commit_all(&a, &mut ra, &mut held, commit).await?;
        let landing = a.land_batch(&batch).await;
        for (o, c) in ra.settle(batch, landing)? {
            assert_eq!(c, commit);
            acked.insert(o.to_string(), images[o.as_str()].clone());
        }
    }
    let (late, _) = commit_all(&a, &mut ra, &mut held, 3).await?;

    let mut rb = b.start_run("b", 4).await?;
    let Adoption::Sealed { slot, listing, .. } =
        b.adopt_run(ra.name(), "b", rb.name(), rb.floor()).await?
    else {
        return Err("the run was not sealed".into());
    };
    // Headers already read are not read again while a LIST shows the same objects: every
    // org's walk lists the run, and a batch header indexes every org.
    let again = b.store_requests();
    let relisted = b.list_run(ra.name(), 1).await?;
    let cost = b.store_requests().since(&again);
    assert_eq!((cost.list, cost.get), (1, 0), "{cost:?}");
    assert_eq!(relisted.objects, listing.objects);
    let learned = b.run_orgs(&listing, slot).await?;
    assert_eq!(
        learned.orgs.iter().collect::<Vec<_>>(),
        orgs.iter().collect::<Vec<_>>()
    );
    let dir = tempfile::tempdir()?;
    for o in &learned.orgs {
        let walk = b.walk_org(o).await?;
        let tenure = b
            .attach_own(o, walk, &mut rb)?
            .ok_or_else(|| format!("{o}: its walk does not end in the adopter's run"))?;
        assert_eq!(tenure.round, 2);
        assert_eq!(
            tenure.via,
            Via::Adopt {
                run: ra.name().clone(),
                slot
            }
        );
        let dest = dir.path().join(format!("{o}.db"));
        assert_eq!(b.restore_walk(o, &tenure.walk, &dest).await?, Some(2));
        assert!(
            std::fs::read(&dest)? == acked[o.as_str()],
            "{o}: not the acknowledged image"
        );
    }
    let landing = a.land_batch(&late).await;
    assert!(matches!(landing, BatchLanding::Taken(_)), "{landing:?}");
    assert!(matches!(
        ra.settle(late, landing),
        Err(Error::RunFenced { .. })
    ));
    Ok(())
}

/// K1 over a live writer: a claim that judges the holder's process lease is refused while
/// it is fresh; a forced one creates its claim and places one exclusion in the holder's run.
/// The holder's next batch collides with it: that batch acknowledges nothing, the excluded
/// org is fenced, and the next batch of the others is acknowledged. The claimant's tenure
/// restores the holder's last acknowledged image, and walks end in each org's own holder.
pub(super) async fn a_claim_over_a_live_run_excludes_one_org_and_the_run_keeps_the_rest(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = Replica::open(store.clone(), &p, Settings::default()).await?;
    let b = Replica::open(store, &p, Settings::default()).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut ra = a.start_run("a", 4).await?;
    let mut held = hold(&a, &mut ra, &[acme.clone(), beta.clone()]).await?;
    let (batch, images) = commit_all(&a, &mut ra, &mut held, 1).await?;
    let landing = a.land_batch(&batch).await;
    assert_eq!(ra.settle(batch, landing)?.len(), 2);

    let mut rb = b.start_run("b", 4).await?;
    let refused = b.claim_held(&acme, &mut rb, false).await;
    assert!(
        matches!(refused, Err(Error::LeaseHeld { .. })),
        "{refused:?}"
    );
    let HeldClaim::Claimed(tenure) = b.claim_held(&acme, &mut rb, true).await? else {
        return Err("a forced claim over a run found no holder".into());
    };
    assert_eq!(tenure.round, 2);
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("acme.db");
    assert_eq!(b.restore_walk(&acme, &tenure.walk, &dest).await?, Some(1));
    assert!(
        std::fs::read(&dest)? == images["acme"],
        "not acme's acknowledged image"
    );

    // The holder's next batch meets the exclusion in its slot.
    let (batch, _) = commit_all(&a, &mut ra, &mut held, 2).await?;
    let landing = a.land_batch(&batch).await;
    assert!(matches!(landing, BatchLanding::Taken(_)), "{landing:?}");
    assert_eq!(ra.settle(batch, landing)?, vec![]);
    assert!(matches!(ra.holds(&acme), Err(Error::Fenced { .. })));
    ra.holds(&beta)?;
    held.retain(|h| h.org == beta);
    let (batch, _) = commit_all(&a, &mut ra, &mut held, 3).await?;
    let landing = a.land_batch(&batch).await;
    assert_eq!(ra.settle(batch, landing)?, vec![(beta.clone(), 3)]);

    let ends = (a.walk_org(&acme).await?.end, a.walk_org(&beta).await?.end);
    assert!(
        matches!(&ends.0, OrgEnd::Held { run, .. } if run == rb.name()),
        "{:?}",
        ends.0
    );
    assert!(
        matches!(&ends.1, OrgEnd::Held { run, .. } if run == ra.name()),
        "{:?}",
        ends.1
    );
    Ok(())
}

/// J5: a delta checkpoint against the writer's own snapshot checkpoint is one inline entry
/// and restores byte for byte; one whose seq an abandoned claim took is created again above
/// it (the walk still ends in its tenure); once another writer's claim and exclusion took
/// the org, the next checkpoint is `Fenced` (J4-4).
pub(super) async fn a_checkpoint_whose_seq_is_taken_is_settled_by_a_walk(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    use crate::journal::{
        AnyCheckpoint, CheckpointHeader, DeltaCheckpoint, FreePoint, JournalClaim, RunName,
    };
    let p = prefix()?;
    let a = Replica::open(store.clone(), &p, Settings::default()).await?;
    let b = Replica::open(store, &p, Settings::default()).await?;
    let acme = org("acme");
    let mut ra = a.start_run("a", 4).await?;
    let mut held = hold(&a, &mut ra, std::slice::from_ref(&acme)).await?;
    let (batch, images) = commit_all(&a, &mut ra, &mut held, 1).await?;
    let landing = a.land_batch(&batch).await;
    assert_eq!(ra.settle(batch, landing)?.len(), 1);
    let (img, base) = (images["acme"].clone(), held[0].base.clone());
    let delta = |seq: u64| -> R<AnyCheckpoint> {
        Ok(AnyCheckpoint::Delta(DeltaCheckpoint {
            header: CheckpointHeader {
                seq,
                round: 1,
                writer: "a".into(),
                run: ra.name().clone(),
                through: ra.resolved_below() - 1,
                tenure: held[0].via.clone(),
                released: false,
            },
            base: Base {
                seq: 2,
                checksum: checksum(&base)?,
            },
            checksum: checksum(&img)?,
            pages: diff(&base, &img, 1)?,
        }))
    };
    let entry = a.checkpoint(&acme, delta(3)?).await?;
    assert_eq!(entry.seq(), 3);
    assert!(entry.is_inline(), "a small checkpoint is one inline entry");
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("acme.db");
    let walk = b.walk_org(&acme).await?;
    assert_eq!(b.restore_walk(&acme, &walk, &dest).await?, Some(1));
    assert!(std::fs::read(&dest)? == img, "not the checkpointed image");

    // An abandoned claim (it names a free point no walk reaches) holds seq 4.
    let stray = b
        .create_journal_claim(
            &acme,
            JournalClaim {
                seq: 4,
                round: 2,
                writer: "z".into(),
                run: RunName::new(&crate::format::layout::new_nonce()?, 1)?,
                from: 1,
                after: Some(FreePoint::Empty),
            },
        )
        .await?;
    assert!(matches!(stray, EntryCreated::Landed(_)), "{stray:?}");
    assert_eq!(a.checkpoint(&acme, delta(4)?).await?.seq(), 5);

    let mut rb = b.start_run("b", 4).await?;
    let HeldClaim::Claimed(_) = b.claim_held(&acme, &mut rb, true).await? else {
        return Err("no holder to claim over".into());
    };
    let fenced = a.checkpoint(&acme, delta(6)?).await;
    assert!(matches!(fenced, Err(Error::Fenced { .. })), "{fenced:?}");
    Ok(())
}
