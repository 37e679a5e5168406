//! An idle writer keeps its advisory lease: without traffic (so without ships) its lease is
//! renewed, so a second writer cannot claim the org without `force` and fence a live writer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{R, effect, registry};
use idem_org::{ErrorKind, Settings};
use idem_replica::{ManualClock, Replica};
use object_store::memory::InMemory;

// Paused runtime time and a manual replica clock advance together, so lease expiry and the
// keep-alive timer are deterministic.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_idle_writer_keeps_its_lease_and_is_not_claimed_away() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemory::new());
    let settings = idem_replica::Settings {
        lease_ms: 1_000,
        ..idem_replica::Settings::default()
    };
    let ra = Replica::open_with(store.clone(), "t", settings.clone(), clock.clone(), None).await?;
    let a = registry(&dir.path().join("a"), ra, "A", Settings::default())?;
    let org = a.acquire(&idem_replica::OrgId::new("acme")?).await?;
    for _ in 0..30 {
        clock.advance(100);
        tokio::time::advance(Duration::from_millis(100)).await;
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }
    let rb = Replica::open_with(store, "t", settings, clock.clone(), None).await?;
    let b = registry(&dir.path().join("b"), rb, "B", Settings::default())?;
    let err = b
        .acquire(&idem_replica::OrgId::new("acme")?)
        .await
        .err()
        .ok_or("B claimed the org of a live, idle writer after three lease lengths")?;
    assert_eq!(err.kind(), ErrorKind::Retry, "{err:?}");
    assert!(org.is_serving());
    assert!(org.once("k", effect("acme", "k")).await?.applied);
    a.shutdown().await;
    Ok(())
}
