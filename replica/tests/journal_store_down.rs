//! A journal writer whose store is down (J3.2): the self-seal it needs is retried with a
//! wait that doubles per refusal, up to a second, however often its callers resubmit; every
//! caller gets a retryable answer at once; and once the store answers again the seal lands
//! within the longest wait, with nobody asking the writer anything, and batches go on.
//!
//! Runs on tokio's paused clock: every wait below is virtual, and time moves only when
//! every task waits, so the counts are the same on any host.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{R, memory, open, org};
use idem_replica::Error;
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::journal::{Issuer, IssuerSettings};

#[tokio::test(start_paused = true)]
async fn a_store_that_is_down_gets_one_self_seal_attempt_a_second_and_the_seal_lands_when_it_is_back()
-> R {
    let faults = Arc::new(FaultStore::new(memory()));
    let replica = open(faults.clone()).await;
    let issuer = Issuer::start(&replica, "w", IssuerSettings::default()).await?;
    faults.inject_times(Op::Put, ".jnl", 1, u64::MAX, Fault::FailBefore);
    let before = faults.calls(Op::Put);

    // A caller that asks again a millisecond after each refusal, as shippers resubmit.
    let answered = Arc::new(AtomicU64::new(0));
    let caller = tokio::spawn({
        let (issuer, answered) = (issuer.clone(), answered.clone());
        async move {
            let o = org("o");
            loop {
                match issuer.announce(&o, false).await {
                    Err(Error::NotAcknowledged { .. }) => {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    other => return other.map(|_| ()),
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });

    tokio::time::sleep(Duration::from_secs(30)).await;
    let puts = faults.calls(Op::Put) - before;
    // The first batch, then seal attempts after waits of 15, 30, 60, … ms, reaching 1 s
    // within the first second: about 36 attempts in 30 s, each a few PUTs (its tries at
    // the slot; six PUTs here), so about 220. Without the doubling an attempt followed
    // every resubmission after one wait of 15 ms: about 14,000.
    assert!(
        (100..=300).contains(&puts),
        "{puts} store writes in 30 s of a store that is down"
    );
    // Every resubmission was answered at once, not after the wait: a refusal per ms.
    let refusals = answered.load(Ordering::SeqCst);
    assert!(refusals > 10_000, "only {refusals} answers in 30 s");
    assert!(
        !caller.is_finished(),
        "the caller got an answer other than a refusal"
    );

    // The store is back, and nobody asks the writer anything: within the longest wait its
    // own timer places the seal (the run it writes to moves to the continued one), and the
    // next announcement lands there.
    caller.abort();
    let sealed = issuer.run_name();
    faults.clear();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_ne!(
        issuer.run_name(),
        sealed,
        "no seal 1.5 s after the store came back"
    );
    tokio::time::timeout(Duration::from_secs(1), issuer.announce(&org("o"), false)).await??;
    Ok(())
}
