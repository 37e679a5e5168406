//! A batch's sections are compressed on the issuer's task: inline up to 256 KiB of pages,
//! above that with the worker's other tasks handed off on a multi-thread runtime, or in the
//! blocking pool on a current-thread one (`docs/design.md` J7). Each path, on each runtime
//! flavor, writes a batch every section of which reads back checked (its digest binds it to
//! its org, run and slot) with the pages it was given.

mod common;

use common::journal::{run_of, section, writer};
use common::{R, memory, open, org};
use idem_replica::OrgId;
use idem_replica::journal::{BatchLanding, BatchMeta, JournalObject, Via};

/// Issues and lands one batch of `orgs` sections of two 4 KiB pages each (commit `i + 1`
/// for the i-th org), then reads every section back: its body holds its org's page fill.
async fn batch_reads_back(orgs: usize) -> R {
    let r = open(memory()).await;
    let ids: Vec<OrgId> = (0..orgs).map(|i| org(&format!("org-{i:04}"))).collect();
    let run = run_of(7);
    let mut w = writer(&run, "h", 1, &ids.iter().collect::<Vec<_>>());
    let sections = ids
        .iter()
        .enumerate()
        .map(|(i, o)| section(o, Via::Claim { seq: 1 }, i as u64 + 1))
        .collect();
    let b = r.issue_batch(&mut w, sections, BatchMeta::new(1)).await?;
    let slot = b.slot();
    let landed = r.land_batch(&b).await;
    assert!(matches!(landed, BatchLanding::Landed), "{landed:?}");

    let listing = r.list_run(&run, 1).await?;
    let listed = listing
        .objects
        .get(&slot)
        .ok_or("the batch is not listed")?;
    let JournalObject::Batch(batch) = &listed.header.object else {
        return Err(format!("slot {slot} holds {:?}", listed.header.object).into());
    };
    assert_eq!(batch.sections.len(), orgs);
    for s in &batch.sections {
        let body = r.read_journal_section(listed, s).await?;
        // `section` fills page 2 with the commit's low byte.
        let fill = vec![s.commit as u8; 4096];
        assert!(
            body.windows(4096).any(|w| w == fill.as_slice()),
            "{}: page 2 not in its body",
            s.org
        );
    }
    Ok(())
}

/// 70 sections of 8 KiB: 560 KiB of pages, past the inline bound.
const LARGE: usize = 70;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_on_a_multi_thread_runtime_reads_back() -> R {
    batch_reads_back(LARGE).await
}

#[tokio::test(flavor = "current_thread")]
async fn a_large_batch_on_a_current_thread_runtime_reads_back() -> R {
    batch_reads_back(LARGE).await
}

#[tokio::test(flavor = "current_thread")]
async fn a_small_batch_compressed_inline_reads_back() -> R {
    batch_reads_back(3).await
}
