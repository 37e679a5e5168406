//! A walk reads a shared listing only when its LIST began after the walk did.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::RunListings;
use crate::format::journal::RunName;
use crate::journal::io::RunListing;

fn run() -> RunName {
    RunName::new("0123456789abcdef0123456789abcdef", 1).expect("a valid run name")
}

/// A LIST that counts itself and remembers the slot it listed from.
fn lister(
    count: &Arc<AtomicU64>,
    froms: &Arc<std::sync::Mutex<Vec<u64>>>,
) -> impl FnOnce(u64) -> std::future::Ready<Result<RunListing, crate::Error>> {
    let (count, froms) = (count.clone(), froms.clone());
    move |from| {
        count.fetch_add(1, Ordering::SeqCst);
        froms.lock().expect("unpoisoned").push(from);
        std::future::ready(Ok(RunListing {
            run: run(),
            from,
            objects: Default::default(),
        }))
    }
}

#[tokio::test]
async fn a_walk_begun_before_a_list_reads_it_and_one_begun_after_lists_again() {
    let shared = RunListings::default();
    let (count, froms) = Default::default();
    let first = shared.begin();
    let second = shared.begin();
    shared
        .get(&run(), 5, first, lister(&count, &froms))
        .await
        .expect("listed");
    let got = shared
        .get(&run(), 7, second, lister(&count, &froms))
        .await
        .expect("listed");
    assert_eq!((count.load(Ordering::SeqCst), got.from), (1, 7));
    let third = shared.begin();
    shared
        .get(&run(), 7, third, lister(&count, &froms))
        .await
        .expect("listed");
    assert_eq!(
        count.load(Ordering::SeqCst),
        2,
        "a listing older than the walk was read"
    );
}

#[tokio::test]
async fn a_walk_lists_from_its_own_entry_and_higher_entries_share_it() {
    let shared = RunListings::default();
    let (count, froms) = Default::default();
    let a = shared.begin();
    let b = shared.begin();
    let c = shared.begin();
    let d = shared.begin();
    shared
        .get(&run(), 9, a, lister(&count, &froms))
        .await
        .expect("listed");
    // Lower than the kept listing: its own LIST, from its own entry only.
    shared
        .get(&run(), 3, b, lister(&count, &froms))
        .await
        .expect("listed");
    // Higher: the kept one serves.
    let got = shared
        .get(&run(), 9, c, lister(&count, &froms))
        .await
        .expect("listed");
    assert_eq!(got.from, 9);
    shared
        .get(&run(), 4, d, lister(&count, &froms))
        .await
        .expect("listed");
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!(*froms.lock().expect("unpoisoned"), vec![9, 3]);
}

#[tokio::test]
async fn walks_arriving_during_a_list_share_the_next_one() {
    let shared = Arc::new(RunListings::default());
    let count = Arc::new(AtomicU64::new(0));
    let (release, gate) = tokio::sync::oneshot::channel::<()>();
    let (listing_tx, listing_rx) = tokio::sync::oneshot::channel::<()>();
    // The first walk's LIST is held open until released.
    let first = {
        let (shared, count) = (shared.clone(), count.clone());
        let since = shared.begin();
        tokio::spawn(async move {
            shared
                .get(&run(), 1, since, move |from| async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = listing_tx.send(());
                    let _ = gate.await;
                    Ok(RunListing {
                        run: run(),
                        from,
                        objects: Default::default(),
                    })
                })
                .await
        })
    };
    listing_rx.await.expect("listed");
    // Three walks begin while that LIST is in flight: none may read it.
    let mut later = Vec::new();
    for _ in 0..3 {
        let (shared, count) = (shared.clone(), count.clone());
        let since = shared.begin();
        later.push(tokio::spawn(async move {
            shared
                .get(&run(), 1, since, move |from| {
                    count.fetch_add(1, Ordering::SeqCst);
                    std::future::ready(Ok(RunListing {
                        run: run(),
                        from,
                        objects: Default::default(),
                    }))
                })
                .await
        }));
    }
    tokio::task::yield_now().await;
    release.send(()).expect("the first walk waits");
    first.await.expect("joined").expect("listed");
    for l in later {
        l.await.expect("joined").expect("listed");
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        2,
        "one LIST for the three later walks"
    );
}
