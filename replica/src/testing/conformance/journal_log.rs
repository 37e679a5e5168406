//! K0 from an org's log (`docs/design.md` 3g): format-5 entries (claims naming a run,
//! checkpoints, a released checkpoint's Release entry) send a walk through runs, free points
//! and tenures, and the state it finds restores byte for byte; per-org readers refuse such a
//! log (K3), and damage is a typed error with nothing installed (I10).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt};

use super::db::{Db, diff};
use super::{CaseResult, org, prefix};
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::layout::new_nonce;
use crate::journal::{
    Base, BatchMeta, Checkpoint, CheckpointHeader, EntryCreated, FreePoint, JournalClaim, OrgEnd,
    Run, RunName, SectionInput, Via, WalkState, WalkTenure,
};
use crate::{Error, OrgId, Replica, Settings, Snapshot};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn checksum(img: &[u8]) -> Result<String, Error> {
    Ok(checksum_hex(PageHashes::of_image("image", img)?.sum()))
}

/// One org's writer in a test: its database, and the base its sections are cumulative from.
struct Tenant {
    org: OrgId,
    db: Db,
    base: (u64, Vec<u8>),
    via: Via,
    commit: u64,
}

impl Tenant {
    /// Commits one row and returns its section against the base, and the image after it.
    fn section(&mut self, released: bool) -> R<(SectionInput, Vec<u8>)> {
        self.commit += 1;
        let c = self.commit;
        self.db
            .exec(&format!("INSERT INTO t VALUES ({c}, randomblob(700))"))?;
        let img = self.db.image()?;
        let input = SectionInput {
            org: self.org.clone(),
            via: self.via.clone(),
            base: Base {
                seq: self.base.0,
                checksum: checksum(&self.base.1)?,
            },
            checksum: checksum(&img)?,
            pages: diff(&self.base.1, &img, c)?,
            released,
        };
        Ok((input, img))
    }
}

/// Issues and lands one batch of `sections`; every commit in it is acknowledged.
async fn land(r: &Replica, run: &mut Run, sections: Vec<SectionInput>) -> R<u64> {
    let n = sections.len();
    let batch = r.issue_batch(run, sections, BatchMeta::new(1)).await?;
    let slot = batch.slot();
    let landing = r.land_batch(&batch).await;
    assert_eq!(
        run.settle(batch, landing)?.len(),
        n,
        "not every section acknowledged"
    );
    Ok(slot)
}

fn landed(created: EntryCreated) -> R<u64> {
    match created {
        EntryCreated::Landed(e) => Ok(e.seq()),
        EntryCreated::Taken(e) => Err(format!("slot taken by {e:?}").into()),
    }
}

/// The walk's state restored at `dest`. A writer's install of it (a journal tenure's,
/// `Durability::Volatile`) is checked beside it: the same database, page 1 in WAL mode
/// instead of canonical, readable by SQLite as it is.
async fn restored(r: &Replica, o: &OrgId, dest: &Path) -> R<Vec<u8>> {
    let walk = r.walk_org(o).await?;
    let commit = r.restore_walk(o, &walk, dest).await?;
    commit.ok_or("the walk found no state")?;
    let image = std::fs::read(dest)?;
    let volatile = dest.with_extension("volatile");
    let (installed, body) = r.restore_walk_volatile(o, &walk, &volatile).await?;
    assert_eq!(installed, commit);
    // The section the install applied comes back, as a read of it gives it.
    match &walk.state {
        crate::journal::WalkState::Section { batch, section } => {
            let read = r.read_journal_section(batch, section).await?;
            assert_eq!(
                body.section_body.as_deref(),
                Some(&read[..]),
                "the section's body"
            );
        }
        _ => assert!(body.section_body.is_none(), "a body with no section"),
    }
    // The hashes the install kept are the restored image's (page 1 canonical).
    let hashes = crate::format::checksum::PageHashes::of_image("restored", &image)?;
    assert_eq!(
        body.hashes.as_ref(),
        Some(&hashes),
        "the install's page hashes"
    );
    let mut written = std::fs::read(&volatile)?;
    assert_eq!((image[18], image[19]), (1, 1), "a restore is canonical");
    assert_eq!(
        (written[18], written[19]),
        (2, 2),
        "a writer's install is in WAL mode"
    );
    let conn = rusqlite::Connection::open(&volatile)?;
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
    let check: String = conn.query_row("PRAGMA quick_check", [], |row| row.get(0))?;
    assert_eq!((mode.as_str(), check.as_str()), ("wal", "ok"));
    drop(conn);
    written[18..20].copy_from_slice(&[1, 1]);
    assert!(
        written == image,
        "a writer's install differs beyond page 1's mode"
    );
    Ok(image)
}

/// A per-org history, taken over by a journal claim naming its claim (K1.6), journaled,
/// checkpointed, released (released section, released checkpoint, Release entry), claimed
/// after that free point into a second run, released by a release seal and claimed after
/// that into a third: at every step the walk ends where the log and runs say and restores
/// the last acknowledged image byte for byte. A per-org reader refuses the log throughout.
pub(super) async fn a_walk_follows_claims_checkpoints_and_free_points_across_runs(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let r = Replica::open(store, &p, Settings::default()).await?;
    let o = org("acme");
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("acme.db");

    // A per-org history: claim at 1, snapshot at 2.
    let mut claim = r.claim(&o, "a", false).await?;
    let mut db = Db::new()?;
    db.exec("INSERT INTO t VALUES (0, randomblob(3000))")?;
    let img = db.image()?;
    let snap = r
        .ship(&mut claim, Snapshot::from_bytes(img.clone(), 0))
        .await?;
    let walk = r.walk_org(&o).await?;
    assert_eq!(walk.end, OrgEnd::HeldPerOrg { claim: 1, round: 1 });
    assert_eq!(restored(&r, &o, &dest).await?, img);

    // K1.6: a journal claim over the per-org holder, naming its claim.
    let run1 = RunName::new(&new_nonce()?, 1)?;
    let c = landed(
        r.create_journal_claim(
            &o,
            JournalClaim {
                seq: 3,
                round: 2,
                writer: "b".into(),
                run: run1.clone(),
                from: 1,
                after: Some(FreePoint::Entry { seq: 1 }),
            },
        )
        .await?,
    )?;
    // A reader of the per-org path refuses the log; `restore` follows the journal.
    let refused = r.history(&o).await;
    assert!(
        matches!(refused, Err(Error::JournalRequired { .. })),
        "{refused:?}"
    );
    let dest2 = dir.path().join("restored.db");
    let first = r.restore(&o, None, &dest2).await?;
    assert_eq!((first.position, first.commit), (Some(snap.seq), 0));
    assert!(
        std::fs::read(&dest2)? == img,
        "restore is not the walk's state"
    );
    let walk = r.walk_org(&o).await?;
    let tenure = WalkTenure {
        round: 2,
        via: Via::Claim { seq: c },
    };
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run: run1.clone(),
            end_slot: 1,
            tenure: tenure.clone()
        }
    );
    assert!(
        matches!(walk.state, WalkState::Entry { seq } if seq == snap.seq),
        "{:?}",
        walk.state
    );

    // Journal two commits on the snapshot, checkpoint through the second, one more on it.
    let mut t = Tenant {
        org: o.clone(),
        db,
        base: (snap.seq, img),
        via: Via::Claim { seq: c },
        commit: 0,
    };
    let mut run = Run::new(run1.clone(), "b", 4)?;
    run.attach(&o, 2)?;
    let (s, _) = t.section(false)?;
    land(&r, &mut run, vec![s]).await?;
    let (s, img) = t.section(false)?;
    let through = land(&r, &mut run, vec![s]).await?;
    assert_eq!(restored(&r, &o, &dest).await?, img);
    let ckpt = landed(
        r.create_checkpoint(
            &o,
            Checkpoint {
                header: CheckpointHeader {
                    seq: 4,
                    round: 2,
                    writer: "b".into(),
                    run: run1.clone(),
                    through,
                    tenure: tenure.via.clone(),
                    released: false,
                },
                snapshot: Snapshot::from_bytes(img.clone(), t.commit),
            },
        )
        .await?,
    )?;
    t.base = (ckpt, img);
    let (s, img) = t.section(false)?;
    land(&r, &mut run, vec![s]).await?;
    let walk = r.walk_org(&o).await?;
    assert_eq!(walk.runs.first().map(|w| w.visited[0].0), Some(through + 1));
    assert_eq!(restored(&r, &o, &dest).await?, img);

    // J4 for one org: a released section, its released checkpoint, its Release entry.
    let (s, img) = t.section(true)?;
    let last = land(&r, &mut run, vec![s]).await?;
    let released = landed(
        r.create_checkpoint(
            &o,
            Checkpoint {
                header: CheckpointHeader {
                    seq: 5,
                    round: 2,
                    writer: "b".into(),
                    run: run1.clone(),
                    through: last,
                    tenure: tenure.via.clone(),
                    released: true,
                },
                snapshot: Snapshot::from_bytes(img.clone(), t.commit),
            },
        )
        .await?,
    )?;
    let walk = r.walk_org(&o).await?;
    assert!(
        matches!(walk.end, OrgEnd::Held { .. }),
        "free before its Release entry"
    );
    let release = landed(r.create_release(&o, (6, 2), "b").await?)?;
    let walk = r.walk_org(&o).await?;
    assert_eq!(walk.end, OrgEnd::Free(FreePoint::Entry { seq: release }));
    assert!(
        walk.runs.is_empty(),
        "a released checkpoint's walk lists no run"
    );
    assert_eq!(restored(&r, &o, &dest).await?, img);

    // K1b after the Release entry into a second run, which a release seal ends. A claim
    // below it naming the same free point is abandoned (C2 found the higher one above it):
    // walks take the highest.
    let abandoned = RunName::new(&new_nonce()?, 1)?;
    landed(
        r.create_journal_claim(
            &o,
            JournalClaim {
                seq: 7,
                round: 3,
                writer: "x".into(),
                run: abandoned,
                from: 1,
                after: Some(FreePoint::Entry { seq: release }),
            },
        )
        .await?,
    )?;
    let run2 = RunName::new(&new_nonce()?, 1)?;
    let c2 = landed(
        r.create_journal_claim(
            &o,
            JournalClaim {
                seq: 8,
                round: 3,
                writer: "c".into(),
                run: run2.clone(),
                from: 1,
                after: Some(FreePoint::Entry { seq: release }),
            },
        )
        .await?,
    )?;
    t.base = (released, img);
    t.via = Via::Claim { seq: c2 };
    let mut run = Run::new(run2.clone(), "c", 4)?;
    run.attach(&o, 3)?;
    let (s, img) = t.section(false)?;
    land(&r, &mut run, vec![s]).await?;
    let sealed = r.seal_release(&mut run, 1).await?;
    let walk = r.walk_org(&o).await?;
    assert_eq!(
        walk.end,
        OrgEnd::Free(FreePoint::Seal {
            run: run2.clone(),
            slot: sealed
        })
    );
    assert_eq!(walk.highest_round, 3);
    assert_eq!(restored(&r, &o, &dest).await?, img);

    // K1b after the release seal into a third run: held there, the state still the
    // second run's section.
    let run3 = RunName::new(&new_nonce()?, 1)?;
    let c3 = landed(
        r.create_journal_claim(
            &o,
            JournalClaim {
                seq: 9,
                round: 4,
                writer: "d".into(),
                run: run3.clone(),
                from: 1,
                after: Some(FreePoint::Seal {
                    run: run2,
                    slot: sealed,
                }),
            },
        )
        .await?,
    )?;
    let walk = r.walk_org(&o).await?;
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run: run3,
            end_slot: 1,
            tenure: WalkTenure {
                round: 4,
                via: Via::Claim { seq: c3 }
            }
        }
    );
    assert_eq!(walk.runs.len(), 2, "{:?}", walk.runs);
    assert_eq!(restored(&r, &o, &dest).await?, img);
    // `restore` follows the journal to the same state, and restores a checkpoint by its seq.
    let newest = r.restore(&o, None, &dest2).await?;
    assert_eq!((newest.position, newest.commit), (Some(released), t.commit));
    assert!(
        std::fs::read(&dest2)? == img,
        "restore's newest is not the walk's"
    );
    let at = r.restore(&o, Some(released), &dest2).await?;
    assert_eq!(at.position, Some(released));
    Ok(())
}

/// An org never written walks free at `empty` and restores nothing; a section whose base
/// is a claim, or whose base checksum is not its base's, installs nothing; a journal mark
/// on the wrong kind of entry is `Corrupt` to the walk.
pub(super) async fn a_walk_over_damaged_journal_entries_is_a_typed_error(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let r = Replica::open(store.clone(), &p, Settings::default()).await?;
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("x.db");
    let o = org("acme");
    let walk = r.walk_org(&o).await?;
    assert_eq!(walk.end, OrgEnd::Free(FreePoint::Empty));
    assert_eq!(r.restore_walk(&o, &walk, &dest).await?, None);
    assert!(!dest.exists());

    // A claim after `empty`, then a section whose base names that claim.
    let run1 = RunName::new(&new_nonce()?, 1)?;
    let c = landed(
        r.create_journal_claim(
            &o,
            JournalClaim {
                seq: 1,
                round: 1,
                writer: "a".into(),
                run: run1.clone(),
                from: 1,
                after: Some(FreePoint::Empty),
            },
        )
        .await?,
    )?;
    let mut t = Tenant {
        org: o.clone(),
        db: Db::new()?,
        base: (c, Db::new()?.image()?),
        via: Via::Claim { seq: c },
        commit: 0,
    };
    let mut run = Run::new(run1.clone(), "a", 4)?;
    run.attach(&o, 1)?;
    let (s, _) = t.section(false)?;
    land(&r, &mut run, vec![s]).await?;
    let walk = r.walk_org(&o).await?;
    assert!(
        matches!(walk.state, WalkState::Section { .. }),
        "{:?}",
        walk.state
    );
    let refused = r.restore_walk(&o, &walk, &dest).await;
    assert!(
        matches!(refused, Err(Error::NoSuchSnapshot { seq: 1, .. })),
        "{refused:?}"
    );
    assert!(!dest.exists());

    // A checkpoint, then a section naming it with the wrong checksum.
    let mut held = BTreeMap::new();
    let img = t.db.image()?;
    held.insert("img", img.clone());
    let ckpt = landed(
        r.create_checkpoint(
            &o,
            Checkpoint {
                header: CheckpointHeader {
                    seq: 2,
                    round: 1,
                    writer: "a".into(),
                    run: run1.clone(),
                    through: 1,
                    tenure: Via::Claim { seq: c },
                    released: false,
                },
                snapshot: Snapshot::from_bytes(img.clone(), t.commit),
            },
        )
        .await?,
    )?;
    assert_eq!(restored(&r, &o, &dest).await?, img, "the checkpoint alone");
    std::fs::remove_file(&dest)?;
    t.base = (ckpt, Db::new()?.image()?);
    let (s, _) = t.section(false)?;
    land(&r, &mut run, vec![s]).await?;
    let walk = r.walk_org(&o).await?;
    let refused = r.restore_walk(&o, &walk, &dest).await;
    assert!(
        matches!(refused, Err(Error::ChainBroken { .. })),
        "{refused:?}"
    );
    assert!(!dest.exists(), "a section on the wrong base was installed");

    // A checkpoint mark on a claim entry, written as raw bytes: the walk refuses the log.
    let bad = format!(
        r#"{{"at_ms":1,"instance":"{i}","journal":{{"role":"checkpoint","run":"{run1}","through":1,"tenure":{{"via":"claim","seq":1}}}},"kind":"claim","nonce":"n","round":9,"seq":9,"v":5,"writer":"z"}}"#,
        i = new_nonce()?
    );
    let path = object_store::path::Path::from(format!("{p}/orgs/acme/log/{:020}.json", 9));
    store.put(&path, bad.into_bytes().into()).await?;
    let refused = r.walk_org(&o).await;
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    Ok(())
}
