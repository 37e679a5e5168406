//! A real child process writing a journal run (three orgs, window 4, batches landing
//! concurrently) killed with SIGKILL at several points: an adopter's one seal fences the
//! run, and every commit the child acknowledged (printed only after `settle` returned it)
//! is read by each org's walk (I7); nothing is read that was not written. The test binary
//! re-runs itself as the child.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use idem_replica::journal::{
    Adoption, Base, BatchMeta, Run, RunName, ScanEnd, SectionInput, Via, WalkTenure,
};
use idem_replica::{Delta, OrgId, Replica, Settings};

const CHILD_ENV: &str = "IDEM_REPLICA_JOURNAL_CRASH_CHILD";
const TEST_NAME: &str = "a_writer_killed_between_landings_loses_no_acknowledged_commit";
const ORGS: [&str; 3] = ["acme", "beta", "gamma"];

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn pages(commit: u64) -> Result<Delta, idem_replica::Error> {
    let mut page = vec![0u8; 4096];
    page[..8].copy_from_slice(&commit.to_le_bytes());
    Delta::new(4096, 2, BTreeMap::from([(2, page)]), commit)
}

/// The child: prints its run's name, then writes batches of every org for ever, printing
/// `ACK <org> <commit>` for each commit `settle` acknowledges.
async fn child(dir: &str) -> R {
    let r = Replica::open(
        Replica::local_store(std::path::Path::new(dir))?,
        "",
        Settings::default(),
    )
    .await?;
    let mut run = Run::new(RunName::new(r.instance(), 1)?, "child", 4)?;
    let orgs = ORGS
        .iter()
        .map(|o| OrgId::new(o))
        .collect::<Result<Vec<_>, _>>()?;
    for o in &orgs {
        run.attach(o, 1)?;
    }
    {
        let mut out = std::io::stdout().lock();
        // On a line of its own: the test harness has printed the test's name before it.
        writeln!(out, "\nRUN {}", run.name())?;
        out.flush()?;
    }
    let mut commit = 0u64;
    let mut in_flight = FuturesUnordered::new();
    loop {
        while run.room() > 0 {
            commit += 1;
            let sections = orgs
                .iter()
                .map(|o| {
                    Ok(SectionInput {
                        org: o.clone(),
                        via: Via::Claim { seq: 1 },
                        base: Base {
                            seq: 1,
                            checksum: "none".into(),
                        },
                        checksum: format!("{o}-{commit}"),
                        pages: pages(commit)?,
                        released: false,
                    })
                })
                .collect::<Result<Vec<_>, idem_replica::Error>>()?;
            let batch = r.issue_batch(&mut run, sections, BatchMeta::new(1)).await?;
            let r = r.clone();
            in_flight.push(async move {
                let landing = r.land_batch(&batch).await;
                (batch, landing)
            });
        }
        let Some((batch, landing)) = in_flight.next().await else {
            return Ok(());
        };
        let acked = run.settle(batch, landing)?;
        let mut out = std::io::stdout().lock();
        for (o, c) in acked {
            writeln!(out, "ACK {o} {c}")?;
        }
        out.flush()?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_between_landings_loses_no_acknowledged_commit() -> R {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return child(&dir).await;
    }
    let exe = std::env::current_exe()?;
    // Kill after a different number of acknowledgements each time: at 1 the first batches
    // are still landing; later ones land with several in flight.
    for kill_after in [1usize, 5, 13, 40] {
        let tmp = tempfile::tempdir()?;
        let store_dir = tmp.path().join("store");
        let mut child = Command::new(&exe)
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &store_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut run = None;
        let mut acked: BTreeMap<String, u64> = BTreeMap::new();
        let mut count = 0;
        while let Some(Ok(line)) = lines.next() {
            if let Some(name) = line.strip_prefix("RUN ") {
                run = Some(RunName::parse(name)?);
            } else if let Some(rest) = line.strip_prefix("ACK ") {
                let (o, c) = rest.split_once(' ').ok_or("bad ACK line")?;
                let c: u64 = c.parse()?;
                let seen = acked.entry(o.to_owned()).or_insert(0);
                assert!(c > *seen, "acks out of order: {o} {c} after {seen}");
                *seen = c;
                count += 1;
                if count >= kill_after * ORGS.len() {
                    child.kill()?; // SIGKILL, batches in flight
                    break;
                }
            }
        }
        let _ = child.wait();
        let run = run.ok_or("the child named no run")?;
        assert_eq!(
            acked.len(),
            ORGS.len(),
            "kill after {kill_after}: child ended early"
        );

        let adopter =
            Replica::open(Replica::local_store(&store_dir)?, "", Settings::default()).await?;
        let ours = RunName::new(adopter.instance(), 1)?;
        let adoption = adopter.adopt_run(&run, "adopter", &ours, 1).await?;
        let Adoption::Sealed { slot, .. } = adoption else {
            return Err(format!("kill after {kill_after}: not sealed: {adoption:?}").into());
        };
        for (o, &commit) in &acked {
            let org = OrgId::new(o)?;
            let tenure = WalkTenure {
                round: 1,
                via: Via::Claim { seq: 1 },
            };
            let walk = adopter.walk_runs(&org, &run, 1, tenure).await?;
            assert_eq!(
                walk.end,
                ScanEnd::Held { end_slot: 1 },
                "ends in the adopter's run"
            );
            let (batch, section) = walk.newest.ok_or("no section read")?;
            assert!(
                section.commit >= commit,
                "kill after {kill_after}: {o} acknowledged commit {commit}, the walk reads {}",
                section.commit
            );
            assert!(batch.header.slot < slot, "a section read above the seal");
            let body = adopter.read_journal_section(&batch, &section).await?;
            let expected_page = {
                let mut p = vec![0u8; 4096];
                p[..8].copy_from_slice(&section.commit.to_le_bytes());
                p
            };
            assert!(
                body.windows(4096).any(|w| w == expected_page.as_slice()),
                "the section's page is not the commit's"
            );
        }
    }
    Ok(())
}
