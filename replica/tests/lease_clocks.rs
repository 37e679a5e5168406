//! Leases no clock can fool (I15): seeded schedules of writer processes over one store, each
//! `Replica` with its own wall clock — an hour or a day ahead or behind, stepping either way
//! mid-run — and its own monotonic clock (its own start, and a rate up to 1% off). Processes
//! claim orgs, release them, die (`kill -9`: the handle and its renewal task are gone), and
//! restart, on the same home (its lock proves the old process gone) or as new ones.
//!
//! Whatever the schedule:
//! - no org moves while its holder lives and has not released it;
//! - a released org, or one whose dead holder restarts on its home, is claimed at once;
//! - a dead holder's org is claimed within a watch (the lease plus a tenth) of the
//!   successor's own monotonic clock, counted from its first attempt after the death, and
//!   every refusal's `retry_after_ms` is honest: retrying after it goes through while the
//!   holder stays dead.
//!
//! Runtime time is paused and advanced by the test, so renewal timers fire in order, and
//! every schedule replays exactly from its seed (`SCHEDULE_LOG=1` prints it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_replica::fault::SeededRng as Rng;
use idem_replica::{Claim, Clock, Error, ManualClock, OrgId, Replica, Settings};
use object_store::ObjectStore;
use object_store::memory::InMemory;

type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LEASE_MS: u64 = 1_000;
const WATCH_MS: u64 = LEASE_MS + LEASE_MS / 10;
/// An observation nobody consulted for ten watches is forgotten.
const FORGET_AFTER_MS: u64 = 10 * WATCH_MS;
const ORGS: [&str; 4] = ["acme", "beta", "gamma", "delta"];
const STEPS: usize = 120;
const MAX_PROCESSES: usize = 7;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// One writer process: its handle (gone once killed), its clocks, its identity.
struct Process {
    replica: Option<Replica>,
    clock: Arc<ManualClock>,
    /// Its monotonic clock's rate, in ms per 1000 ms of the test's time.
    rate: u64,
    /// Sub-ms of its clock not yet advanced (so a rate off by 1% adds up exactly).
    carry: u64,
    writer: String,
    home: String,
    claims: BTreeMap<&'static str, Claim>,
}

/// Who holds an org as far as the schedule knows.
#[derive(Default)]
struct OrgState {
    holder: Option<usize>,
    released: bool,
    /// Per claimant: its monotonic time at its first attempt since the holder died, and at
    /// its latest attempt.
    watching: BTreeMap<usize, (u64, u64)>,
}

/// What a schedule exercised: the cases the test exists for must occur across its seeds.
#[derive(Default, Debug)]
struct Seen {
    refused_while_alive: usize,
    moved_from_dead: usize,
    waited_for_dead: usize,
    released_at_once: usize,
    restarted_at_once: usize,
    wall_steps: usize,
}

fn open_clock(rng: &mut Rng, now: u64) -> (Arc<ManualClock>, u64) {
    let skew = [0, HOUR_MS, -HOUR_MS, DAY_MS, -DAY_MS][rng.below(5) as usize];
    let wall = now.saturating_add_signed(skew);
    let clock = Arc::new(ManualClock::new(wall));
    // Its own monotonic start: let some time pass, then put the wall back.
    clock.advance(rng.below(1_000_000));
    clock.set(wall);
    let rate = [990, 1_000, 1_010][rng.below(3) as usize];
    (clock, rate)
}

async fn start(
    store: &Arc<dyn ObjectStore>,
    rng: &mut Rng,
    now: u64,
    writer: String,
    home: String,
) -> R<Process> {
    let (clock, rate) = open_clock(rng, now);
    let settings = Settings {
        lease_ms: LEASE_MS,
        ..Settings::default()
    };
    let replica = Replica::open_with(store.clone(), "t", settings, clock.clone(), None).await?;
    Ok(Process {
        replica: Some(replica),
        clock,
        rate,
        carry: 0,
        writer,
        home,
        claims: BTreeMap::new(),
    })
}

async fn schedule(seed: u64) -> R<Seen> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut rng = Rng::new(seed);
    let mut now = 1_700_000_000_000u64;
    let mut procs = Vec::new();
    for i in 0..3 {
        procs.push(start(&store, &mut rng, now, format!("w{i}"), format!("h{i}")).await?);
    }
    let mut orgs: BTreeMap<&'static str, OrgState> =
        ORGS.iter().map(|o| (*o, OrgState::default())).collect();
    let mut seen = Seen::default();
    let mut log = Vec::new();
    let fail = |log: &Vec<String>, what: String| -> Box<dyn std::error::Error + Send + Sync> {
        format!("seed {seed}: {what}\nschedule:\n{}", log.join("\n")).into()
    };
    for _ in 0..STEPS {
        let p = rng.below(procs.len() as u64) as usize;
        match rng.below(12) {
            0..=2 => {
                let ms = 100 * (1 + rng.below(6));
                now += ms;
                for _ in 0..ms / 100 {
                    for proc in procs.iter_mut().filter(|q| q.replica.is_some()) {
                        let due = 100 * proc.rate + proc.carry;
                        proc.clock.advance(due / 1_000);
                        proc.carry = due % 1_000;
                    }
                    tokio::time::advance(Duration::from_millis(100)).await;
                    for _ in 0..5 {
                        tokio::task::yield_now().await;
                    }
                }
                log.push(format!("advance {ms}"));
            }
            3 => {
                // A wall clock steps (an NTP step, a mis-set host): nothing may follow from it.
                let step = [HOUR_MS, -HOUR_MS, DAY_MS, -DAY_MS][rng.below(4) as usize];
                let wall = procs[p].clock.now_ms().saturating_add_signed(step);
                procs[p].clock.set(wall);
                seen.wall_steps += 1;
                log.push(format!("p{p} wall {step:+}"));
            }
            4 if procs[p].replica.is_some() && !procs[p].claims.is_empty() => {
                let org = *procs[p].claims.keys().next().ok_or("no claim")?;
                let mut claim = procs[p].claims.remove(org).ok_or("no claim")?;
                let replica = procs[p].replica.clone().ok_or("dead")?;
                replica.release(&mut claim).await?;
                let state = orgs.get_mut(org).ok_or("org")?;
                state.released = true;
                log.push(format!("p{p} releases {org}"));
            }
            5 if procs[p].replica.is_some()
                && procs.iter().filter(|q| q.replica.is_some()).count() > 1 =>
            {
                // kill -9: the handle, its claims and its renewal task go, nothing released.
                procs[p].replica = None;
                procs[p].claims.clear();
                log.push(format!("kill p{p}"));
            }
            6 if procs[p].replica.is_none() && procs.len() < MAX_PROCESSES => {
                // A restart: on the dead process's home (same writer id, its lock now free),
                // or a new process elsewhere.
                // Only one live process holds a home's lock.
                let home_free = procs
                    .iter()
                    .all(|q| q.replica.is_none() || q.home != procs[p].home);
                let same_home = home_free && rng.below(2) == 0;
                let (writer, home) = if same_home {
                    (procs[p].writer.clone(), procs[p].home.clone())
                } else {
                    let n = procs.len();
                    (format!("w{n}"), format!("h{n}"))
                };
                let q = procs.len();
                procs.push(start(&store, &mut rng, now, writer, home).await?);
                log.push(format!(
                    "start p{q} as {} on {}",
                    procs[q].writer, procs[q].home
                ));
            }
            _ if procs[p].replica.is_some() => {
                let org = ORGS[rng.below(ORGS.len() as u64) as usize];
                if procs[p].claims.contains_key(org) {
                    continue;
                }
                let replica = procs[p].replica.clone().ok_or("dead")?;
                let state = orgs.get_mut(org).ok_or("org")?;
                let holder = state.holder.map(|h| &procs[h]);
                let alive = holder.is_some_and(|h| h.replica.is_some());
                let same_home =
                    holder.is_some_and(|h| h.writer == procs[p].writer && h.home == procs[p].home);
                let at_once = state.holder.is_none() || state.released || (!alive && same_home);
                let mono = procs[p].clock.monotonic_ms();
                let home = procs[p].home.clone();
                let got = replica
                    .claim_from(
                        &OrgId::new(org)?,
                        &procs[p].writer,
                        Some((&home, true)),
                        false,
                    )
                    .await;
                match got {
                    Ok(claim) => {
                        log.push(format!("p{p} claims {org}: ok"));
                        if alive && !state.released {
                            return Err(fail(
                                &log,
                                format!("{org} moved to p{p} from a live holder"),
                            ));
                        }
                        if state.released && state.holder.is_some() {
                            seen.released_at_once += 1;
                        } else if !alive && same_home {
                            seen.restarted_at_once += 1;
                        } else if state.holder.is_some() {
                            seen.moved_from_dead += 1;
                        }
                        if let Some(h) = state.holder {
                            procs[h].claims.remove(org);
                        }
                        *state = OrgState {
                            holder: Some(p),
                            ..OrgState::default()
                        };
                        procs[p].claims.insert(org, claim);
                    }
                    Err(Error::LeaseHeld { retry_after_ms, .. }) => {
                        log.push(format!("p{p} claims {org}: held, {retry_after_ms} ms"));
                        if at_once {
                            return Err(fail(&log, format!("p{p} was made to wait for {org}")));
                        }
                        if !(1..=WATCH_MS).contains(&retry_after_ms) {
                            return Err(fail(&log, format!("retry after {retry_after_ms} ms")));
                        }
                        if alive {
                            seen.refused_while_alive += 1;
                        } else {
                            // Dead holder: the claim goes through once this claimant's own
                            // clock has run a watch since its first attempt after the death.
                            let (first, latest) = state.watching.entry(p).or_insert((mono, mono));
                            // A claimant that stayed away for ten watches was forgotten and
                            // watches again (bounded memory).
                            if mono - *latest > FORGET_AFTER_MS {
                                *first = mono;
                            }
                            *latest = mono;
                            let first = *first;
                            seen.waited_for_dead += 1;
                            if mono - first + retry_after_ms > WATCH_MS {
                                return Err(fail(
                                    &log,
                                    format!(
                                        "p{p} waits for {org} {} ms after its first attempt and \
                                         is told to wait {retry_after_ms} ms more",
                                        mono - first
                                    ),
                                ));
                            }
                        }
                    }
                    Err(e) => return Err(fail(&log, format!("p{p} claims {org}: {e}"))),
                }
            }
            _ => {}
        }
    }
    if std::env::var_os("SCHEDULE_LOG").is_some() {
        eprintln!("seed {seed}:\n{}", log.join("\n"));
    }
    Ok(seen)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn skewed_and_stepping_clocks_move_no_live_holders_org_and_every_dead_ones_within_a_watch()
-> R {
    let mut total = Seen::default();
    for seed in 0..24 {
        let s = schedule(seed).await?;
        total.refused_while_alive += s.refused_while_alive;
        total.moved_from_dead += s.moved_from_dead;
        total.waited_for_dead += s.waited_for_dead;
        total.released_at_once += s.released_at_once;
        total.restarted_at_once += s.restarted_at_once;
        total.wall_steps += s.wall_steps;
    }
    eprintln!("{total:?}");
    assert!(
        total.refused_while_alive > 0
            && total.moved_from_dead > 0
            && total.waited_for_dead > 0
            && total.released_at_once > 0
            && total.restarted_at_once > 0
            && total.wall_steps > 0,
        "the schedules missed a case: {total:?}"
    );
    Ok(())
}
