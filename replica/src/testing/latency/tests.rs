//! Unit tests of the latency-shaped store: delays follow the shape exactly under paused time,
//! the sequential depth tells chained requests from concurrent ones, and the s3 shape's draws
//! have S3's median and tail.

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::{LatencyStore, Op, Shape, Shapes};
use idem_base::rng::SeededRng;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn constant(ms: u64) -> LatencyStore {
    let shapes = Shapes::all(Shape::Constant(Duration::from_millis(ms)));
    LatencyStore::new(Arc::new(InMemory::new()), shapes, 1)
}

fn body() -> PutPayload {
    PutPayload::from_static(b"x")
}

#[tokio::test(start_paused = true)]
async fn sequential_requests_add_their_delays_and_depth() -> TestResult {
    let store = constant(28);
    let trace = store.trace();
    let began = super::now();
    for i in 0..3 {
        store.put(&Path::from(format!("k{i}")), body()).await?;
    }
    store.get(&Path::from("k0")).await?;
    store.head(&Path::from("k1")).await?;
    let recorded = trace.finish();
    assert_eq!(super::now() - began, Duration::from_millis(5 * 28));
    assert_eq!(recorded.depth(), 5);
    assert_eq!(
        (
            recorded.count(Op::Put),
            recorded.count(Op::Get),
            recorded.count(Op::Head)
        ),
        (3, 1, 1)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_are_one_round_trip() -> TestResult {
    let store = constant(28);
    let trace = store.trace();
    let began = super::now();
    let paths: Vec<Path> = (0..8).map(|i| Path::from(format!("k{i}"))).collect();
    let puts = paths.iter().map(|p| store.put(p, body()));
    for r in futures::future::join_all(puts).await {
        r?;
    }
    // Then a listing and two gets side by side: two round trips in all after the puts.
    let listed: Vec<_> = futures::StreamExt::collect(store.list(None)).await;
    assert_eq!(listed.len(), 8);
    let (a, b) = tokio::join!(store.get(&paths[1]), store.get(&paths[2]));
    a?;
    b?;
    let recorded = trace.finish();
    assert_eq!(super::now() - began, Duration::from_millis(3 * 28));
    assert_eq!(recorded.requests.len(), 11);
    assert_eq!(recorded.count(Op::List), 1);
    assert_eq!(recorded.depth(), 3);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn deletes_are_one_request_per_path_and_a_trace_sees_only_its_stretch() -> TestResult {
    let store = constant(10);
    for i in 0..2 {
        store.put(&Path::from(format!("k{i}")), body()).await?;
    }
    let trace = store.trace();
    let paths = futures::stream::iter(["k0", "k1"].map(|p| Ok(Path::from(p))));
    let deleted: Vec<_> = futures::StreamExt::collect(store.delete_stream(Box::pin(paths))).await;
    assert_eq!(deleted.len(), 2);
    let recorded = trace.finish();
    assert_eq!(
        (recorded.count(Op::Delete), recorded.requests.len()),
        (2, 2)
    );
    assert_eq!(recorded.depth(), 2);
    store.put(&Path::from("after"), body()).await?;
    assert_eq!(recorded.count(Op::Put), 0);
    Ok(())
}

#[test]
fn s3_shape_has_s3s_median_and_tail() {
    let mut rng = SeededRng::new(27);
    let mut draws: Vec<Duration> = (0..10_000).map(|_| Shape::s3().draw(&mut rng)).collect();
    draws.sort_unstable();
    let ms = |q: f64| draws[((draws.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    let (p50, p99) = (ms(0.5), ms(0.99));
    assert!((26.5..=29.5).contains(&p50), "p50 {p50:.1} ms");
    assert!((66.0..=85.0).contains(&p99), "p99 {p99:.1} ms");
}

#[test]
fn one_seed_draws_one_sequence() {
    let draw = |seed| {
        let mut rng = SeededRng::new(seed);
        (0..100)
            .map(|_| Shape::s3().draw(&mut rng))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

#[test]
fn depth_of_nothing_is_zero() {
    assert_eq!(super::Recorded::default().depth(), 0);
}
