//! P2: acknowledged requests per second for one org at 1, 8, 64, 256 concurrent clients on
//! the local-directory store, with ack latency p50/p99 (group commit); target 64:1 >= 30x.
//! P6: the same at 256 clients against local commits only (no ship): the price of
//! durability at high concurrency.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_org::replica::{OrgId, Replica};
use idem_org::{Registry, RegistrySettings, idem, replica, rusqlite};
use tokio::sync::oneshot;

use super::{BenchResult, ms, quantile};

/// The value written by one request: 100 bytes, half random (compresses about 2:1).
pub(crate) const VALUE: &str = "randomblob(50) || zeroblob(50)";

/// The workload of one request: one 100-byte row.
pub(crate) fn write(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Vec<u8>> {
    tx.prepare_cached(&format!("INSERT INTO t VALUES (?1, {VALUE})"))?
        .execute([key])?;
    Ok(Vec::new())
}

/// Result of one throughput row.
pub(crate) struct Row {
    pub rps: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub ships: u64,
    pub bytes_shipped: u64,
    pub acks: u64,
    pub elapsed: f64,
}

/// A registry over a fresh local-directory store in `dir`.
pub(crate) async fn registry(dir: &Path) -> BenchResult<Registry> {
    registry_with(dir, RegistrySettings::default()).await
}

/// [`registry`] with other settings.
pub(crate) async fn registry_with(dir: &Path, settings: RegistrySettings) -> BenchResult<Registry> {
    registry_with_replica(dir, settings, replica::Settings::default()).await
}

/// [`registry_with`] over a replica with `replica_settings`.
pub(crate) async fn registry_with_replica(
    dir: &Path,
    settings: RegistrySettings,
    replica_settings: replica::Settings,
) -> BenchResult<Registry> {
    let store = Replica::local_store(&dir.join("store"))?;
    let replica = Replica::open(store, "", replica_settings).await?;
    Ok(Registry::builder(dir.join("data"), replica, "bench")
        .settings(settings)
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)"))
        .build()?)
}

/// `clients` concurrent clients sending sequential requests for `time` through `org`.
pub(crate) async fn acked_row(
    org: &idem_org::Org,
    clients: usize,
    time: Duration,
) -> BenchResult<Row> {
    acked_row_with(org, clients, time, write).await
}

/// A request's write: runs in the org's transaction with the request's key.
pub(crate) type Write = fn(&rusqlite::Transaction<'_>, &str) -> rusqlite::Result<Vec<u8>>;

/// [`acked_row`] with another write per request.
pub(crate) async fn acked_row_with(
    org: &idem_org::Org,
    clients: usize,
    time: Duration,
    write: Write,
) -> BenchResult<Row> {
    let before = org.stats();
    let deadline = Instant::now() + time;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let org = org.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for i in 0u64.. {
                if Instant::now() >= deadline {
                    break;
                }
                let key = format!("{c}-{i}-{}", org.round());
                let k = key.clone();
                let t = Instant::now();
                org.once(&key, move |tx| write(tx, &k)).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, idem_org::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort();
    let after = org.stats();
    Ok(Row {
        rps: lat.len() as f64 / elapsed,
        p50: quantile(&lat, 0.5),
        p99: quantile(&lat, 0.99),
        ships: after.ships - before.ships,
        bytes_shipped: after.bytes_shipped - before.bytes_shipped,
        acks: lat.len() as u64,
        elapsed,
    })
}

/// Prints the P2 table.
pub async fn p2(dir: &Path, time: Duration) -> BenchResult<()> {
    outln!(
        "\nP2 group commit: one org, local-directory store (fsync), {:.1} s per row",
        time.as_secs_f64()
    );
    outln!(
        "| clients | acked req/s | ack p50 | ack p99 | ships/s | requests/ship | bytes shipped/ack | store requests/ack |"
    );
    outln!("|---|---|---|---|---|---|---|---|");
    let mut rates = Vec::new();
    for clients in [1usize, 8, 64, 256] {
        let work = dir.join(format!("p2-{clients}"));
        let reg = registry(&work).await?;
        let org = reg.acquire(&OrgId::new("acme")?).await?;
        let before = reg.replica().store_requests().total();
        let r = acked_row(&org, clients, time).await?;
        let store_requests = reg.replica().store_requests().total() - before;
        reg.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
        outln!(
            "| {clients} | {:.0} | {} | {} | {:.0} | {:.1} | {:.0} | {:.2} |",
            r.rps,
            ms(r.p50),
            ms(r.p99),
            r.ships as f64 / r.elapsed,
            r.acks as f64 / r.ships.max(1) as f64,
            r.bytes_shipped as f64 / r.acks.max(1) as f64,
            store_requests as f64 / r.acks.max(1) as f64
        );
        rates.push((clients, r.rps));
    }
    let one = rates
        .first()
        .map_or(f64::MIN_POSITIVE, |r| r.1.max(f64::MIN_POSITIVE));
    for (clients, rps) in rates.iter().skip(1) {
        let note = if *clients == 64 {
            " (target >= 30x)"
        } else {
            ""
        };
        outln!("{clients}:1 throughput ratio {:.1}x{note}", rps / one);
    }
    Ok(())
}

type Job = (String, oneshot::Sender<rusqlite::Result<()>>);

/// The same writer shape as an org (one thread, `idem::once`), acknowledging after the local
/// commit: what the clients would see without ship-before-ack.
async fn local_only(
    dir: &Path,
    clients: usize,
    time: Duration,
) -> BenchResult<(f64, Duration, Duration)> {
    let path = dir.join("p6-local.db");
    let mut conn = rusqlite::Connection::open(&path)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)",
    )?;
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let writer = std::thread::spawn(move || {
        while let Ok((key, reply)) = rx.recv() {
            let out = idem::once(&mut conn, &key, 1, |tx| write(tx, &key))
                .map(|_| ())
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)));
            let _ = reply.send(out);
        }
    });
    let tx = Arc::new(std::sync::Mutex::new(tx));
    let deadline = Instant::now() + time;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for i in 0u64.. {
                if Instant::now() >= deadline {
                    break;
                }
                let (reply, done) = oneshot::channel();
                let t = Instant::now();
                let sent = tx
                    .lock()
                    .is_ok_and(|s| s.send((format!("{c}-{i}"), reply)).is_ok());
                if !sent {
                    break;
                }
                if !matches!(done.await, Ok(Ok(()))) {
                    break;
                }
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(tx);
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    lat.sort();
    Ok((
        lat.len() as f64 / elapsed,
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
    ))
}

/// Prints the P6 table.
pub async fn p6(dir: &Path, time: Duration) -> BenchResult<()> {
    let clients = 256;
    outln!(
        "\nP6 price of durability: {clients} clients, one org, {:.1} s per row",
        time.as_secs_f64()
    );
    outln!("| mode | acked req/s | ack p50 | ack p99 |");
    outln!("|---|---|---|---|");
    let work = dir.join("p6");
    let reg = registry(&work).await?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    let shipped = acked_row(&org, clients, time).await?;
    reg.shutdown().await;
    let (rps, p50, p99) = local_only(&work, clients, time).await?;
    outln!(
        "| ship-before-ack (idem-org) | {:.0} | {} | {} |",
        shipped.rps,
        ms(shipped.p50),
        ms(shipped.p99)
    );
    outln!(
        "| local commit only (no ship) | {rps:.0} | {} | {} |",
        ms(p50),
        ms(p99)
    );
    outln!(
        "durable/local throughput ratio {:.2}",
        shipped.rps / rps.max(f64::MIN_POSITIVE)
    );
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
