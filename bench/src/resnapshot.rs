//! P9: what a full snapshot uploads after about 1% of the database's pages changed, against
//! the org's first full snapshot (issue 17's target: at most 3% of the database at 1 GB).
//!
//! The org is preloaded (its first full snapshot), then changed in two ways, each followed by
//! a forced full snapshot ([`idem_org::Org::full_snapshot_next`]):
//!
//! - **appends**: P3's 1 KB inserts from 8 clients until the database grew by 1% of its
//!   pages (the pages written are the new ones at the end, plus the b-tree's interior pages);
//! - **scattered updates**: 32 random 1 KB rows rewritten per request (P5b's workload), as
//!   many requests as make 1.005% of the page count in row updates (some pages are hit
//!   twice), so about 1% of the pages change.
//!
//! Pages changed are counted exactly, by hashing every page of the org's database file after
//! each full snapshot (the capture checkpoints first, so the file holds every page) and
//! comparing. Bytes uploaded are the new files in the local-directory store (blobs and log
//! entries), retention off.

use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_org::RegistrySettings;
use idem_org::replica::OrgId;

use super::BenchResult;
use super::group::{Write, registry_with_replica};
use super::growth::{end_of_row_full, preload, write_1k};
use super::hydrate::update_1k;
use super::uploaded::Uploaded;

/// Prints the P9 table: for each of `segment_kib` (KiB; empty = the replica's default), an
/// org of `mb` MB, its first full snapshot, and the full snapshots after each change.
///
/// # Errors
/// The first request, store or file failure.
pub async fn run(dir: &Path, mb: u64, segment_kib: &[usize]) -> BenchResult<()> {
    let default = idem_org::replica::Settings::default().segment_bytes >> 10;
    let sizes = if segment_kib.is_empty() {
        vec![default]
    } else {
        segment_kib.to_vec()
    };
    for (i, kib) in sizes.into_iter().enumerate() {
        one(dir, mb, kib, i == 0).await?;
    }
    Ok(())
}

/// One org of P9 with segments of `kib` KiB; `header` prints the table's head first.
async fn one(dir: &Path, mb: u64, kib: usize, header: bool) -> BenchResult<()> {
    let work = dir.join("p9");
    let _ = std::fs::remove_dir_all(&work);
    let settings = RegistrySettings {
        retain_every_ships: 0,
        ..RegistrySettings::default()
    };
    let replica_settings = idem_org::replica::Settings {
        segment_bytes: kib << 10,
        ..idem_org::replica::Settings::default()
    };
    let reg = registry_with_replica(&work, settings, replica_settings).await?;
    let id = OrgId::new("acme")?;
    let org = reg.acquire(&id).await?;
    let store = work.join("store");

    let window = Uploaded::start(&store, Duration::ZERO);
    let fulls = org.stats().full_ships;
    preload(&org, mb).await?;
    // A claim's first ship is a full snapshot; if it came before the preload (an empty
    // database), the preload shipped as a delta and the base is forced here.
    if org.stats().full_ships == fulls {
        end_of_row_full(&org, "p9-base").await?;
    }
    let first_window = window.finish();
    let (first, first_objects) = (first_window.bytes(), first_window.files());
    let db = db_file(&work.join("data").join("orgs").join(id.as_str()))?;
    let page_size = u64::try_from(
        org.read(|tx| tx.query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0)))
            .await?,
    )?;
    let mut pages = page_hashes(&db, page_size)?;

    if header {
        outln!(
            "\nP9 full snapshot after ~1% of the pages changed: {:.0} MB database ({} pages of {page_size} bytes), local-directory store; objects = files the snapshot added",
            pages.len() as u64 as f64 * page_size as f64 / 1e6,
            pages.len()
        );
        outln!(
            "| segment | change | pages changed | of all pages | first full snapshot uploaded (objects) | full snapshot after the change uploaded (objects) | of the database | of the first |"
        );
        outln!("|---|---|---|---|---|---|---|---|");
    }
    for scattered in [false, true] {
        let base = pages.len() as u64;
        if scattered {
            let need = (base as f64 * 0.01005 / 32.0).ceil() as u64;
            requests(&org, need, update_1k).await?;
        } else {
            // About three 1 KB rows fill a page; the page count says when 1% was added.
            let target = base + base.div_ceil(100);
            loop {
                let now = u64::try_from(
                    org.read(|tx| tx.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0)))
                        .await?,
                )?;
                if now >= target {
                    break;
                }
                requests(&org, (target - now) * 3, write_1k).await?;
            }
        }
        let window = Uploaded::start(&store, Duration::ZERO);
        end_of_row_full(
            &org,
            if scattered {
                "p9-updates"
            } else {
                "p9-appends"
            },
        )
        .await?;
        let done = window.finish();
        let (uploaded, objects) = (done.bytes(), done.files());
        let after = page_hashes(&db, page_size)?;
        let changed = after
            .iter()
            .enumerate()
            .filter(|(i, h)| pages.get(*i) != Some(h))
            .count();
        let db_bytes = after.len() as u64 * page_size;
        outln!(
            "| {kib} KiB | {} | {changed} | {:.2}% | {:.1} MB ({first_objects}) | {:.1} MB ({objects}) | {:.1}% | {:.1}% |",
            if scattered {
                "scattered 1 KB updates"
            } else {
                "1 KB appends"
            },
            changed as f64 * 100.0 / after.len().max(1) as f64,
            first as f64 / 1e6,
            uploaded as f64 / 1e6,
            uploaded as f64 * 100.0 / db_bytes.max(1) as f64,
            uploaded as f64 * 100.0 / first.max(1) as f64
        );
        pages = after;
    }
    drop(org);
    reg.shutdown().await;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Exactly `n` requests of `write` through `org`, from up to 8 clients at once.
async fn requests(org: &idem_org::Org, n: u64, write: Write) -> BenchResult<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (org, next) = (org.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, idem_org::Error>(());
                }
                let key = format!("p9-{}-{i}", org.stats().acks);
                let k = key.clone();
                org.once(&key, move |tx| write(tx, &k)).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The org's database file: the one `.db` in its local directory.
fn db_file(dir: &Path) -> BenchResult<PathBuf> {
    let mut found = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"));
    match (found.next(), found.next()) {
        (Some(p), None) => Ok(p),
        _ => Err(format!("not exactly one database file in {}", dir.display()).into()),
    }
}

/// A hash of every page of the file.
fn page_hashes(path: &Path, page_size: u64) -> BenchResult<Vec<u64>> {
    let mut file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut page = vec![0u8; usize::try_from(page_size)?];
    let mut out = Vec::new();
    loop {
        match file.read_exact(&mut page) {
            Ok(()) => {
                let mut h = std::hash::DefaultHasher::new();
                page.hash(&mut h);
                out.push(h.finish());
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(e) => return Err(e.into()),
        }
    }
}
