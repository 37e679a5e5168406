//! Seeded schedules of two and three writer processes over one store, each with its own
//! process lease, its own wall clock (skewed an hour apart, and stepping an hour either way
//! mid-run) and its own monotonic clock (I2, I6, I7, I14, I15). A step advances time, steps
//! one process's wall clock, pauses a process (its renewals stop reaching the store and its
//! clocks stop, so a successor that watches its process lease sees it unchanged), resumes one
//! (after a successor may have claimed its orgs), or sends a first run or a replay to a
//! running process. Whatever the schedule, every acknowledged key is in the store exactly
//! once with its first result, a resumed process whose orgs were claimed acknowledges
//! nothing from them (the exactly-once oracle at the end), and no org ever moves away from a
//! process that was never paused: a wall clock, however wrong, moves nothing.
//!
//! Runtime time is paused and advanced by the test; each process's replica clock is a
//! `ManualClock` the test advances and steps, so every schedule replays exactly from its seed.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{R, effect, oracle, registry};
use idem_org::{Registry, RegistrySettings};
use idem_replica::fault::{Fault, FaultStore, Op, SeededRng as Rng};
use idem_replica::{ManualClock, OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;
const ORGS: [&str; 2] = ["acme", "beta"];
const STEPS: usize = 60;

/// An hour, in ms: how far apart the processes' wall clocks start, and how far one steps.
const HOUR_MS: u64 = 3_600_000;

struct Process {
    clock: Arc<ManualClock>,
    /// Its view of the store: while paused, its process-lease PUTs fail (a paused process
    /// reaches nothing), and the test sends it no request.
    store: Arc<FaultStore>,
    /// Its wall clock's offset from the test's time (skew and steps), in ms.
    wall_offset: i64,
    registry: Registry,
    paused: bool,
    /// The test's time when it last resumed: after a pause its renewals restart within a
    /// renewal period, so until a watch and a period have passed a successor may still take
    /// its orgs.
    resumed_at: Option<u64>,
}

impl Process {
    fn wall(&self, now: u64) -> u64 {
        now.saturating_add_signed(self.wall_offset)
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
        // p0 on time, p1 an hour ahead, p2 an hour behind.
        let wall_offset = [0, HOUR_MS as i64, -(HOUR_MS as i64)][w % 3];
        let clock = Arc::new(ManualClock::new(now.saturating_add_signed(wall_offset)));
        let faults = Arc::new(FaultStore::new(store.clone()));
        let replica =
            Replica::open_with(faults.clone(), "t", settings.clone(), clock.clone(), None).await?;
        let registry = registry(
            &dir.path().join(format!("p{w}")),
            replica,
            &format!("w{w}"),
            RegistrySettings::default(),
        )?;
        procs.push(Process {
            clock,
            store: faults,
            wall_offset,
            registry,
            paused: false,
            resumed_at: None,
        });
    }
    let mut rng = Rng::new(seed);
    let mut acked: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut sent = 0usize;
    let mut log = Vec::new();
    let mut seen = Seen::default();
    // The process whose last Ok answer for an org was the newest (its writer, as far as
    // clients know).
    let mut owner: BTreeMap<&str, usize> = BTreeMap::new();
    let mut resumed = vec![false; writers];
    for _ in 0..STEPS {
        let p = rng.below(writers as u64) as usize;
        match rng.below(10) {
            0..=1 => {
                let ms = 100 * (1 + rng.below(8));
                now += ms;
                for proc in procs.iter().filter(|q| !q.paused) {
                    proc.clock.advance(ms);
                }
                // Renewal timers of every process fire on runtime time, paused or not: a
                // paused process's renewals fail before they reach the store.
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
                procs[p]
                    .store
                    .inject_times(Op::Put, "processes/", 1, u64::MAX, Fault::FailBefore);
                resumed[p] = false;
                log.push(format!("pause p{p}"));
            }
            3 if procs[p].paused => {
                procs[p].paused = false;
                procs[p].resumed_at = Some(now);
                procs[p].store.clear();
                // Its wall clock catches up in one step; its monotonic clock stayed behind.
                procs[p].clock.set(procs[p].wall(now));
                resumed[p] = true;
                log.push(format!("resume p{p}"));
            }
            4 if rng.below(2) == 0 => {
                // A wall clock steps an hour either way (an NTP step, a mis-set host).
                let step = if rng.below(2) == 0 {
                    HOUR_MS as i64
                } else {
                    -(HOUR_MS as i64)
                };
                procs[p].wall_offset += step;
                if !procs[p].paused {
                    procs[p].clock.set(procs[p].wall(now));
                }
                log.push(format!("step p{p} wall {step:+}"));
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
                if out.is_ok() {
                    // Nobody releases here, so an org moves only from a process that is paused
                    // or was until lately (stopped renewing): never from one that kept
                    // running, whatever its wall clock said.
                    if let Some(q) = owner.insert(org, p)
                        && q != p
                    {
                        let lately = procs[q].resumed_at.is_some_and(|t| now - t <= 2 * LEASE_MS);
                        assert!(
                            procs[q].paused || lately,
                            "seed {seed}: {org} moved to p{p} from p{q}, which kept running\n{}",
                            log.join("\n")
                        );
                        if procs[q].paused {
                            seen.claimed_from_paused += 1;
                        }
                    }
                }
                if let Err(e) = &out
                    && e.kind() == idem_org::ErrorKind::Reacquire
                    && resumed[p]
                {
                    seen.fenced_after_resume += 1;
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
        proc.store.clear();
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
