//! Seeded schedules of two and three writer processes over one store, each with its own
//! process lease and its own clock (I2, I6, I7, I14). A step advances time, pauses a process
//! (its clock stops, so the leases it keeps renewing are stale: a lease lapsing while its
//! process is paused), resumes one (after a successor may have claimed its orgs), or sends a
//! first run or a replay to a running process. Whatever the schedule, every acknowledged key
//! is in the store exactly once with its first result, and a resumed process whose orgs were
//! claimed acknowledges nothing from them (the exactly-once oracle at the end).
//!
//! Runtime time is paused and advanced by the test; each process's replica clock is a
//! `ManualClock` the test sets, so every schedule replays exactly from its seed.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{R, effect, oracle, registry};
use idem_org::{Registry, Settings};
use idem_replica::{ManualClock, OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;
const ORGS: [&str; 2] = ["acme", "beta"];
const STEPS: usize = 60;

struct Process {
    clock: Arc<ManualClock>,
    registry: Registry,
    paused: bool,
}

/// xorshift64*: a small, seedable generator, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What a schedule exercised: the cases the test exists for must occur across its seeds.
#[derive(Default, Debug)]
struct Seen {
    /// An org answered by another process while its last holder was paused.
    claimed_from_paused: usize,
    /// A resumed process told to re-acquire (its claim was lost while it was paused).
    fenced_after_resume: usize,
}

async fn schedule(writers: usize, seed: u64) -> Result<Seen, common::BoxErr> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let settings = idem_replica::Settings {
        lease_ms: LEASE_MS,
        ..idem_replica::Settings::default()
    };
    let mut now = 1_000_000u64;
    let mut procs = Vec::new();
    for w in 0..writers {
        let clock = Arc::new(ManualClock::new(now));
        let replica =
            Replica::open_with(store.clone(), "t", settings.clone(), clock.clone(), None).await?;
        let registry = registry(
            &dir.path().join(format!("p{w}")),
            replica,
            &format!("w{w}"),
            Settings::default(),
        )?;
        procs.push(Process {
            clock,
            registry,
            paused: false,
        });
    }
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut acked: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut sent = 0usize;
    let mut log = Vec::new();
    let mut seen = Seen::default();
    // The process whose last answer for an org was Ok (its writer, as far as clients know).
    let mut holder: BTreeMap<&str, usize> = BTreeMap::new();
    let mut resumed = vec![false; writers];
    for _ in 0..STEPS {
        let p = rng.below(writers as u64) as usize;
        match rng.below(10) {
            0..=1 => {
                let ms = 100 * (1 + rng.below(8));
                now += ms;
                for proc in procs.iter().filter(|q| !q.paused) {
                    proc.clock.set(now);
                }
                // Renewal timers of every process fire on runtime time, paused or not: a
                // paused process's renewals carry its stopped clock, so they lapse.
                for _ in 0..ms / 100 {
                    tokio::time::advance(Duration::from_millis(100)).await;
                    for _ in 0..5 {
                        tokio::task::yield_now().await;
                    }
                }
                log.push(format!("advance {ms}"));
            }
            2 if procs.iter().filter(|q| q.paused).count() + 1 < writers => {
                procs[p].paused = true;
                resumed[p] = false;
                log.push(format!("pause p{p}"));
            }
            3 if procs[p].paused => {
                procs[p].paused = false;
                procs[p].clock.set(now);
                resumed[p] = true;
                log.push(format!("resume p{p}"));
            }
            _ if !procs[p].paused => {
                let org = ORGS[rng.below(ORGS.len() as u64) as usize];
                let done = acked.entry(org).or_default();
                let key = if done.is_empty() || rng.below(3) > 0 {
                    sent += 1;
                    format!("k{sent}")
                } else {
                    done[rng.below(done.len() as u64) as usize].clone()
                };
                let out = procs[p]
                    .registry
                    .once(&OrgId::new(org)?, &key, effect(org, &key))
                    .await;
                match &out {
                    Ok(o) => {
                        assert_eq!(
                            o.result,
                            key.as_bytes(),
                            "seed {seed}: {key} answered another result"
                        );
                        if !done.contains(&key) {
                            done.push(key.clone());
                        }
                    }
                    Err(e) => assert!(
                        e.is_retryable() || e.kind() == idem_org::ErrorKind::Reacquire,
                        "seed {seed}: {key} on p{p}: {e:?}"
                    ),
                }
                let said = match &out {
                    Ok(_) => "ok".to_owned(),
                    Err(e) => format!("{:?}", e.kind()),
                };
                log.push(format!("p{p} {org} {key}: {said}"));
                let last = holder.insert(org, p);
                match (&out, last) {
                    (Ok(_), Some(q)) if q != p && procs[q].paused => seen.claimed_from_paused += 1,
                    (Err(e), _) if e.kind() == idem_org::ErrorKind::Reacquire && resumed[p] => {
                        seen.fenced_after_resume += 1
                    }
                    _ => {}
                }
                if out.is_err() {
                    // The org's holder is unknown after a refusal.
                    holder.remove(org);
                }
            }
            _ => {}
        }
    }
    if std::env::var_os("SCHEDULE_LOG").is_some() {
        eprintln!("seed {seed}:\n{}", log.join("\n"));
    }
    for proc in &mut procs {
        proc.paused = false;
        proc.clock.set(now);
    }
    for proc in &procs {
        proc.registry.shutdown().await;
    }
    let checker = Replica::open_with(
        store.clone(),
        "t",
        settings,
        Arc::new(ManualClock::new(now)),
        None,
    )
    .await?;
    for org in ORGS {
        let keys = acked.get(org).cloned().unwrap_or_default();
        if let Err(e) = oracle::exactly_once(&checker, org, &keys, &[], dir.path()).await {
            return Err(format!(
                "seed {seed}, {writers} writers: {e}\nschedule:\n{}",
                log.join("\n")
            )
            .into());
        }
    }
    Ok(seen)
}

async fn seeds(writers: usize, seeds: std::ops::Range<u64>) -> R {
    let (mut claimed, mut fenced) = (0, 0);
    for seed in seeds {
        let seen = schedule(writers, seed).await?;
        claimed += seen.claimed_from_paused;
        fenced += seen.fenced_after_resume;
    }
    assert!(
        claimed > 0 && fenced > 0,
        "the schedules never exercised a takeover from a paused process ({claimed}) or a fenced resume ({fenced})"
    );
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn two_writers_across_process_leases_pauses_and_resumes() -> R {
    seeds(2, 0..12).await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn three_writers_across_process_leases_pauses_and_resumes() -> R {
    seeds(3, 100..112).await
}
