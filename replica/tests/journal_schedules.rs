//! Seeded schedules of the journal's store protocol (`docs/design.md` 3g): interleavings of
//! a holder (window 4) with claimants and adopters, each ending in an oracle (I7: every
//! acknowledged commit is read by a later walk, nothing is acknowledged after a fence the
//! placer served behind; I9; I10), crafted objects, and one regression test per finding of
//! the attack on the first build (each fails without its fix).
//!
//! `JOURNAL_SCHEDULE_SEEDS=3000 cargo test -p idem-replica --test journal_schedules` runs
//! more seeds than the default 400.

#![allow(clippy::unwrap_used, clippy::too_many_lines, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::journal::{
    encode, exclusion_obj, frame, header, jpath, put_object, run_of, seal_obj, tenure,
};
use common::{R, memory, open, org};
use idem_replica::fault::{Fault, FaultStore, Op, SeededRng};
use idem_replica::journal::*;
use idem_replica::{Error, OrgId};
use object_store::{ObjectStoreExt, PutPayload};

/// A section of `o` in claim 1's tenure to commit `commit`.
fn section(o: &OrgId, commit: u64) -> SectionInput {
    common::journal::section(o, Via::Claim { seq: 1 }, commit)
}

/// Runs `f` on a task and reports whether it panicked.
async fn panics<F>(f: F) -> Option<String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match tokio::spawn(f).await {
        Ok(()) => None,
        Err(e) if e.is_panic() => {
            let p = e.into_panic();
            Some(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panic".into()),
            )
        }
        Err(e) => Some(format!("join: {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// Seeded interleavings
// ---------------------------------------------------------------------------------------

struct Flight {
    batch: IssuedBatch,
    landing: Option<BatchLanding>,
}

#[derive(Default, Debug)]
struct Outcome {
    acked: BTreeMap<String, Vec<u64>>,
    log: Vec<String>,
}

/// One seeded schedule: holder `h` (window 4) holds `acme` and `beta` (round 1, claim 1);
/// claimants exclude `acme` and `beta`, two adopters adopt; the holder's puts fail
/// (before, after = landed-but-error, unknown outcome) at random. Every landing, settle,
/// fence and seal is ordered by the seed.
async fn schedule(seed: u64) -> R<Outcome> {
    let mut rng = SeededRng::new(seed);
    let mem = memory();
    let hstore = Arc::new(FaultStore::new(mem.clone()));
    let h = open(hstore.clone()).await;
    let others = open(mem.clone()).await;
    let (acme, beta) = (org("acme"), org("beta"));
    let run1 = run_of(1);
    let mut run = Run::new(run1.clone(), "h", 4)?;
    run.attach(&acme, 1)?;
    run.attach(&beta, 1)?;
    let mut flights: Vec<Flight> = Vec::new();
    let mut counter = 0u64;
    let mut out = Outcome::default();
    let claimant_runs: BTreeMap<&str, RunName> =
        BTreeMap::from([("acme", run_of(0xc1)), ("beta", run_of(0xc2))]);
    let mut served: BTreeMap<String, u64> = BTreeMap::new();
    let mut claim_seq = 100u64;
    let mut adopted = 0;
    let mut fenced_run = false;
    let mut seal_unknown_budget = 1;
    let mut stale: BTreeMap<String, Walk> = BTreeMap::new();

    for _step in 0..80 {
        match rng.below(40) {
            // Issue a batch of every org still held.
            0..=11 => {
                if !run.is_open() || fenced_run {
                    continue;
                }
                counter += 1;
                let mut secs = Vec::new();
                for o in [&acme, &beta] {
                    if run.holds(o).is_ok() {
                        secs.push(section(o, counter));
                    }
                }
                match h.issue_batch(&mut run, secs, BatchMeta::new(1)).await {
                    Ok(batch) => {
                        out.log
                            .push(format!("issue slot {} c{counter}", batch.slot()));
                        flights.push(Flight {
                            batch,
                            landing: None,
                        });
                    }
                    Err(Error::InvalidSettings { .. }) => {}
                    Err(e) => out.log.push(format!("issue: {e}")),
                }
            }
            // Land one, perhaps with a fault.
            12..=19 => {
                let open: Vec<usize> = (0..flights.len())
                    .filter(|&i| flights[i].landing.is_none())
                    .collect();
                if open.is_empty() {
                    continue;
                }
                let i = open[rng.below(open.len() as u64) as usize];
                let slot = flights[i].batch.slot();
                let path = format!("{}/{slot:020}.jnl", run.name());
                let fault = rng.below(10);
                match fault {
                    0 => hstore.inject_times(Op::Put, &path, 1, 2, Fault::FailBefore),
                    1 => {
                        hstore.inject(Op::Put, &path, 1, Fault::FailAfter);
                        hstore.inject(Op::Get, &path, 1, Fault::FailBefore);
                    }
                    2 => hstore.inject(Op::Put, &path, 1, Fault::FailAfter),
                    3 => hstore.inject(Op::Put, &path, 1, Fault::FailBefore),
                    _ => {}
                }
                let landing = h.land_batch(&flights[i].batch).await;
                hstore.clear();
                out.log.push(format!(
                    "land {} slot {slot} fault {fault}: {landing:?}",
                    run.name()
                ));
                flights[i].landing = Some(landing);
            }
            // Settle one landed.
            20..=27 => {
                let landed: Vec<usize> = (0..flights.len())
                    .filter(|&i| flights[i].landing.is_some())
                    .collect();
                if landed.is_empty() {
                    continue;
                }
                let i = landed[rng.below(landed.len() as u64) as usize];
                let f = flights.remove(i);
                let slot = f.batch.slot();
                match run.settle(f.batch, f.landing.unwrap()) {
                    Ok(acked) => {
                        out.log.push(format!("settle slot {slot}: acked {acked:?}"));
                        for (o, c) in acked {
                            out.acked.entry(o.to_string()).or_default().push(c);
                        }
                    }
                    Err(e) => {
                        fenced_run = true;
                        out.log.push(format!("settle slot {slot}: {e}"));
                    }
                }
            }
            // A claimant excludes one org.
            28..=30 => {
                let o = if rng.below(2) == 0 { &acme } else { &beta };
                if served.contains_key(o.as_str()) {
                    continue;
                }
                let walk = match stale.remove(o.as_str()) {
                    Some(w) => w,
                    None => {
                        let w = match others.walk_runs(o, &run1, 1, tenure(1, 1)).await {
                            Ok(w) => w,
                            Err(e) => return Err(format!("seed {seed}: walk: {e}").into()),
                        };
                        if rng.below(2) == 0 {
                            // Keep the walk: the exclusion is placed from it later (P
                            // works from the walk's own listing, J3-4).
                            out.log.push(format!("walk {o} kept (stale later)"));
                            stale.insert(o.to_string(), w);
                            continue;
                        }
                        w
                    }
                };
                if !matches!(walk.end, ScanEnd::Held { .. }) {
                    continue;
                }
                let (entry, listing) = walk.visited.last().unwrap().clone();
                let theirs = &claimant_runs[o.as_str()];
                if listing.run.instance() != run1.instance() {
                    // Ends in someone else's (claimant/adopter) run: nothing to exclude.
                    continue;
                }
                claim_seq += 1;
                let round = walk.tenure.round + 1;
                let res = others
                    .exclude(
                        o,
                        claim_seq,
                        round,
                        theirs,
                        1,
                        "c",
                        &listing,
                        entry,
                        &walk.tenure,
                    )
                    .await;
                out.log.push(format!(
                    "exclude {o} round {round} in {}: {res:?}",
                    listing.run
                ));
                if let Ok(Excluded::Serves { .. }) = res {
                    // The claimant's walk must now end in its own run, in its round.
                    let w = others.walk_runs(o, &run1, 1, tenure(1, 1)).await?;
                    let newest = w.newest.as_ref().map_or(0, |(_, s)| s.commit);
                    if w.tenure.round != round {
                        return Err(format!(
                            "seed {seed}: served for {o} round {round} but the walk ends in round {} at {:?}",
                            w.tenure.round, w.end
                        )
                        .into());
                    }
                    served.insert(o.to_string(), newest);
                }
            }
            // An adopter adopts the holder's run (two adopters may race).
            31 => {
                if adopted >= 2 {
                    continue;
                }
                adopted += 1;
                let theirs = run_of(0xd0 + adopted);
                let res = others
                    .adopt_run(&run1, &format!("d{adopted}"), &theirs, 1)
                    .await;
                out.log.push(format!("adopt by d{adopted}: {res:?}"));
                if let Ok(Adoption::Sealed { .. }) = res {
                    for o in [&acme, &beta] {
                        let w = others.walk_runs(o, &run1, 1, tenure(1, 1)).await?;
                        let newest = w.newest.as_ref().map_or(0, |(_, s)| s.commit);
                        served.entry(o.to_string()).or_insert(newest);
                    }
                }
            }
            // J4: a release seal once drained (rarely).
            32 => {
                if !run.is_open() || run.in_flight() > 0 || rng.below(4) != 0 || fenced_run {
                    continue;
                }
                match h.seal_release(&mut run, 1).await {
                    Ok(slot) => out
                        .log
                        .push(format!("seal_release {} at {slot}", run.name())),
                    Err(Error::RunFenced { .. }) => {
                        fenced_run = true;
                        out.log.push("seal_release: fenced".into());
                    }
                    Err(e) => out.log.push(format!("seal_release: {e}")),
                }
            }
            // J3: seal once nothing is in flight.
            _ => {
                if !run.needs_seal() || run.in_flight() > 0 {
                    continue;
                }
                let slot = run.floor();
                let path = format!("{}/{slot:020}.jnl", run.name());
                if seal_unknown_budget > 0 && rng.below(3) == 0 {
                    seal_unknown_budget -= 1;
                    hstore.inject_times(Op::Put, &path, 1, 3, Fault::FailAfter);
                    hstore.inject_times(Op::Get, &path, 1, 3, Fault::FailBefore);
                }
                let res = h.seal_self(&mut run, 1).await;
                hstore.clear();
                match res {
                    Ok((next, acked)) => {
                        out.log
                            .push(format!("seal_self {}: acked {acked:?}", run.name()));
                        for (o, c) in acked {
                            out.acked.entry(o.to_string()).or_default().push(c);
                        }
                        run = next;
                    }
                    Err(Error::RunFenced { .. }) => {
                        fenced_run = true;
                        out.log.push("seal_self: fenced".to_string());
                    }
                    Err(e) => out.log.push(format!("seal_self: {e}")),
                }
            }
        }
    }
    // Drain: land and settle everything, seal if needed.
    for f in flights.drain(..) {
        let landing = match f.landing {
            Some(l) => l,
            None => h.land_batch(&f.batch).await,
        };
        let slot = f.batch.slot();
        match run.settle(f.batch, landing) {
            Ok(acked) => {
                out.log.push(format!("drain settle {slot}: {acked:?}"));
                for (o, c) in acked {
                    out.acked.entry(o.to_string()).or_default().push(c);
                }
            }
            Err(e) => {
                fenced_run = true;
                out.log.push(format!("drain settle {slot}: {e}"));
            }
        }
    }
    for _ in 0..3 {
        if !run.needs_seal() || fenced_run {
            break;
        }
        match h.seal_self(&mut run, 1).await {
            Ok((next, acked)) => {
                for (o, c) in acked {
                    out.acked.entry(o.to_string()).or_default().push(c);
                }
                run = next;
            }
            Err(Error::RunFenced { .. }) => fenced_run = true,
            Err(e) => out.log.push(format!("drain seal: {e}")),
        }
    }
    // Oracle (I7): every acknowledged commit is read by the walk.
    for o in [&acme, &beta] {
        let w = others.walk_runs(o, &run1, 1, tenure(1, 1)).await?;
        let newest = w.newest.as_ref().map_or(0, |(_, s)| s.commit);
        if let Some((listed, s)) = &w.newest {
            let body = others.read_journal_section(listed, s).await?;
            assert!(!body.is_empty(), "seed {seed}: section body");
        }
        let acked = out.acked.get(o.as_str()).cloned().unwrap_or_default();
        let max = acked.iter().copied().max().unwrap_or(0);
        if max > newest {
            return Err(format!(
                "seed {seed}: I7: {o} acknowledged commit {max} but the walk reads {newest} (end {:?}, tenure {:?})\n{}",
                w.end,
                w.tenure,
                out.log.join("\n")
            )
            .into());
        }
        if let Some(&at_fence) = served.get(o.as_str())
            && max > at_fence
        {
            return Err(format!(
                "seed {seed}: I7: {o} acknowledged commit {max} after a fence served at {at_fence}\n{}",
                out.log.join("\n")
            )
            .into());
        }
        // Acks in slot order: strictly increasing.
        if acked.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("seed {seed}: {o} acks out of order {acked:?}").into());
        }
    }
    Ok(out)
}

#[tokio::test]
async fn seeded_interleavings_keep_every_ack_readable() -> R {
    let seeds: u64 = std::env::var("JOURNAL_SCHEDULE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut failures = Vec::new();
    let mut acked_total = 0;
    let mut stats: BTreeMap<&str, usize> = BTreeMap::new();
    let mut errs: BTreeMap<String, usize> = BTreeMap::new();
    for seed in 0..seeds {
        match schedule(seed).await {
            Ok(out) => {
                acked_total += out.acked.values().map(Vec::len).sum::<usize>();
                for (k, pat) in [
                    ("serves", "Ok(Serves"),
                    ("voided", "Ok(Voided"),
                    ("adopt-sealed", "Ok(Sealed"),
                    ("adopted-by", "Ok(AdoptedBy"),
                    ("seal_self-ok", "seal_self 0"),
                    ("released", "seal_release 0"),
                    ("seal_self-err", "seal_self: "),
                    ("failed-landing", ": Failed("),
                    ("taken-landing", ": Taken("),
                    ("run-fenced", "RunFenced"),
                    ("fenced-settle", "fenced"),
                ] {
                    *stats.entry(k).or_insert(0usize) +=
                        out.log.iter().filter(|l| l.contains(pat)).count();
                }
                for l in out.log.iter().filter(|l| {
                    l.starts_with("seal_self: ") || l.starts_with("exclude") && l.contains("Err")
                }) {
                    *errs.entry(l.chars().take(90).collect()).or_insert(0) += 1;
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    eprintln!("acked {acked_total}; {stats:?}");
    for (e, n) in errs.iter().take(20) {
        eprintln!("{n} x {e}");
    }
    assert!(acked_total > 0, "the schedules acknowledged nothing");
    for kind in [
        "serves",
        "adopt-sealed",
        "seal_self-ok",
        "failed-landing",
        "taken-landing",
    ] {
        assert!(
            stats.get(kind).copied().unwrap_or(0) > 0,
            "no schedule reached {kind}: {stats:?}"
        );
    }
    if !failures.is_empty() {
        panic!(
            "{} of {seeds} seeds failed; first:\n{}",
            failures.len(),
            failures[0]
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Crafted objects: typed errors, never a panic (I10)
// ---------------------------------------------------------------------------------------

/// A header-only object at slot u64::MAX (a valid name: 20 digits): every walk of the run
/// computes `end_slot` = slot + 1.
#[tokio::test]
async fn crafted_object_at_the_highest_slot_is_an_error_not_a_panic() {
    let mem = memory();
    let r = open(mem.clone()).await;
    let run = run_of(1);
    let other = run_of(2);
    put_object(
        &mem,
        &header(&run, u64::MAX, 1, exclusion_obj("zeta", 1, 5, &other, 1)),
    )
    .await;
    let acme = org("acme");
    let r2 = r.clone();
    let run2 = run.clone();
    let walked = panics(async move {
        let _ = r2.walk_runs(&acme, &run2, 1, tenure(1, 1)).await;
    })
    .await;
    assert_eq!(walked, None, "walk_runs panicked on a crafted object");
}

/// A listed object whose `floor` is above its own slot (u64::MAX, or just far above any
/// slot a holder will write) is `Corrupt`: P would otherwise place the fence out of the
/// holder's reach and report an adoption that fences nothing, or overflow finding it.
#[tokio::test]
async fn a_floor_above_its_own_slot_is_corrupt_and_fences_nothing() {
    for floor in [u64::MAX, 1_000_000] {
        let mem = memory();
        let r = open(mem.clone()).await;
        let run = run_of(1);
        put_object(
            &mem,
            &header(&run, 1, floor, exclusion_obj("zeta", 1, 5, &run_of(2), 1)),
        )
        .await;
        let r2 = r.clone();
        let run2 = run.clone();
        let adopted = panics(async move {
            let res = r2.adopt_run(&run2, "d", &run_of(3), 1).await;
            assert!(
                matches!(res, Err(Error::Corrupt { .. })),
                "floor {floor}: adopt_run over a crafted floor: {res:?}"
            );
        })
        .await;
        assert_eq!(adopted, None, "adopt_run panicked on floor {floor}");
    }
}

/// An exclusion of round u64::MAX (the walk takes it: above the tenure) continues into a
/// run whose adopt seal gives round + 1.
#[tokio::test]
async fn crafted_round_at_u64_max_is_an_error_not_a_panic() {
    let mem = memory();
    let r = open(mem.clone()).await;
    let (run, next, last) = (run_of(1), run_of(2), run_of(3));
    put_object(
        &mem,
        &header(&run, 1, 1, exclusion_obj("acme", 7, u64::MAX, &next, 1)),
    )
    .await;
    put_object(
        &mem,
        &header(&next, 1, 1, seal_obj(SealKind::Adopt, Some(last), 1)),
    )
    .await;
    let r2 = r.clone();
    let walked = panics(async move {
        let _ = r2.walk_runs(&org("acme"), &run, 1, tenure(1, 1)).await;
    })
    .await;
    assert_eq!(walked, None, "walk_runs panicked on a crafted round");
}

/// A zero-byte object in a run (a crafted or half-written object) is `Corrupt` (I10), not a
/// store error a caller retries for ever; in the writer's own slot it stops the run.
#[tokio::test]
async fn a_zero_byte_object_is_corrupt() {
    let mem = memory();
    let r = open(mem.clone()).await;
    let run = run_of(1);
    mem.put(&jpath(&run, 1), PutPayload::from(Vec::<u8>::new()))
        .await
        .unwrap();
    let listed = r.list_run(&run, 1).await;
    eprintln!("list_run over a zero-byte object: {listed:?}");
    // The writer's create into that slot must not be taken for a landing, and should be a
    // typed Corrupt rather than an unknown outcome retried forever.
    let mut w = Run::new(run.clone(), "h", 4).unwrap();
    w.attach(&org("acme"), 1).unwrap();
    let b = r
        .issue_batch(&mut w, vec![section(&org("acme"), 1)], BatchMeta::new(1))
        .await
        .unwrap();
    let landing = r.land_batch(&b).await;
    assert!(
        matches!(listed, Err(Error::Corrupt { .. })),
        "list_run over a zero-byte object is not Corrupt: {listed:?}"
    );
    // The writer's create into that slot is never a landing: the damaged object is one it
    // never made, so the run stops (nothing acknowledged, no seal over damage, I10).
    assert!(
        matches!(landing, BatchLanding::Failed(Error::Corrupt { .. })),
        "{landing:?}"
    );
    assert!(matches!(
        w.settle(b, landing),
        Err(Error::RunFenced { slot: 1, .. })
    ));
    assert!(matches!(
        r.seal_self(&mut w, 1).await,
        Err(Error::RunFenced { .. })
    ));
}

/// A header claiming sections beyond the object, a huge header length, offsets out of
/// order: typed errors.
#[tokio::test]
async fn crafted_headers_are_typed_errors() {
    let mem = memory();
    let r = open(mem.clone()).await;
    let run = run_of(1);
    let acme = org("acme");
    // A real batch to take a section index from.
    let mut w = Run::new(run.clone(), "h", 4).unwrap();
    w.attach(&acme, 1).unwrap();
    let b = r
        .issue_batch(&mut w, vec![section(&acme, 1)], BatchMeta::new(1))
        .await
        .unwrap();
    assert!(matches!(r.land_batch(&b).await, BatchLanding::Landed));
    let real = r.list_run(&run, 1).await.unwrap();
    let listed = real.objects.get(&1).expect("slot 1 listed").clone();
    let JournalObject::Batch(batch) = &listed.header.object else {
        panic!()
    };
    let sec = batch.sections[0].clone();

    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // 1. A section whose len runs past the object's end.
    let mut h1 = listed.header.clone();
    h1.slot = 2;
    if let JournalObject::Batch(b) = &mut h1.object {
        b.sections[0].len = 1 << 40;
    }
    cases.push(("len past end", encode(&h1)));
    // 2. offset + len overflowing u64.
    let mut h2 = listed.header.clone();
    h2.slot = 3;
    if let JournalObject::Batch(b) = &mut h2.object {
        b.sections[0].offset = 0;
        b.sections[0].len = u64::MAX;
    }
    cases.push(("len u64::MAX", encode(&h2)));
    // 3. A huge header length with a short object.
    let mut h3 = encode(&header(&run, 4, 1, seal_obj(SealKind::Release, None, 1)));
    h3[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(("header len u32::MAX", h3));
    // 4. A header length just under the cap, the object short.
    let mut h4 = encode(&header(&run, 5, 1, seal_obj(SealKind::Release, None, 1)));
    h4[12..16].copy_from_slice(&((8u32 << 20) - 1).to_le_bytes());
    cases.push(("header len 8MiB-1, short object", h4));
    // 5. Two sections, the second starting at u64::MAX.
    let mut h6 = listed.header.clone();
    h6.slot = 6;
    if let JournalObject::Batch(b) = &mut h6.object {
        let mut s2 = sec.clone();
        s2.org = "beta".into();
        s2.offset = sec.len;
        s2.len = u64::MAX - sec.len + 5;
        b.sections.push(s2);
    }
    cases.push(("second section wraps", encode(&h6)));
    // 6. A run name of the wrong shape inside an exclusion's `continued` (hand-written JSON).
    let json = format!(
        r#"{{"run":"{run}","slot":7,"nonce":"n","floor":1,"object":{{"kind":"exclusion","org":"acme","claim":1,"round":9,"continued":"../../orgs/acme-00000000000000000001","from":1,"by":"x"}}}}"#
    );
    cases.push(("bad continued run name", frame(json.as_bytes())));

    for (slot, (what, bytes)) in (2u64..).zip(cases) {
        let slot = match what {
            "header len u32::MAX" => 4,
            "header len 8MiB-1, short object" => 5,
            "second section wraps" => 6,
            "bad continued run name" => 7,
            _ => slot,
        };
        mem.put(&jpath(&run, slot), PutPayload::from(bytes))
            .await
            .unwrap();
        let r2 = r.clone();
        let run2 = run.clone();
        let res = panics(async move {
            let got = r2.read_journal_header(&run2, slot).await;
            assert!(
                matches!(got, Err(Error::Corrupt { .. })),
                "slot {slot}: {got:?}"
            );
        })
        .await;
        assert_eq!(res, None, "{what}");
        mem.delete(&jpath(&run, slot)).await.unwrap();
    }
    // The section read of the real batch with a crafted index (offset past the object).
    let mut forged = (*listed).clone();
    let mut bad = sec.clone();
    bad.offset = u64::MAX - 10;
    if let JournalObject::Batch(b) = &mut forged.header.object {
        b.sections[0] = bad.clone();
    }
    let r2 = r.clone();
    let res = panics(async move {
        let got = r2.read_journal_section(&forged, &bad).await;
        assert!(got.is_err(), "{got:?}");
    })
    .await;
    assert_eq!(res, None, "read_journal_section with a forged offset");
}

// ---------------------------------------------------------------------------------------
// A fenced tenure re-attached: acknowledgement judged by the current tenure, not the
// section's
// ---------------------------------------------------------------------------------------

/// Holder: slot 1 acknowledged; slots 2, 3, 4 issued with acme and beta. Slot 2 lands but
/// its response is not yet settled; a claimant's exclusion of acme (round 2) goes at slot
/// 3 (the listing shows 2 occupied); the holder's slot 3 collides (acme fenced at 3), slot
/// 4 lands. The holder then starts a new tenure of acme (round 3: a claim of its own,
/// K1.5/K4; J2's remembered round 2 < 3 allows it) before slot 2's settle arrives. When
/// slot 2 settles, the prefix passes 2, 3, 4: acme's round-1 section at slot 4, above the
/// exclusion, must not be acknowledged (no walk reads it), whatever tenure acme holds now.
#[tokio::test]
async fn a_later_tenure_never_acknowledges_an_earlier_tenures_section_above_its_fence() -> R {
    let mem = memory();
    let h = open(mem.clone()).await;
    let c = open(mem.clone()).await;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut run = Run::new(run_of(1), "h", 4)?;
    run.attach(&acme, 1)?;
    run.attach(&beta, 1)?;
    let mut acked: Vec<(OrgId, u64)> = Vec::new();
    let b1 = h
        .issue_batch(
            &mut run,
            vec![section(&acme, 1), section(&beta, 1)],
            BatchMeta::new(1),
        )
        .await?;
    let l1 = h.land_batch(&b1).await;
    acked.extend(run.settle(b1, l1)?);
    let mut batches = Vec::new();
    for commit in 2..=4 {
        batches.push(
            h.issue_batch(
                &mut run,
                vec![section(&acme, commit), section(&beta, commit)],
                BatchMeta::new(1),
            )
            .await?,
        );
    }
    let b4 = batches.pop().unwrap();
    let b3 = batches.pop().unwrap();
    let b2 = batches.pop().unwrap();
    // Slot 2 lands; its settle is late.
    let l2 = h.land_batch(&b2).await;
    assert!(matches!(l2, BatchLanding::Landed));
    // The claimant walks acme and excludes it (round 2) from its listing.
    let walk = c.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    let (entry, listing) = walk.visited.last().unwrap().clone();
    let theirs = run_of(0xc1);
    let ex = c
        .exclude(&acme, 9, 2, &theirs, 1, "c", &listing, entry, &walk.tenure)
        .await?;
    let Excluded::Serves { slot: fence, .. } = ex else {
        panic!("not served: {ex:?}")
    };
    assert_eq!(fence, 3);
    let l3 = h.land_batch(&b3).await;
    assert!(matches!(l3, BatchLanding::Taken(_)));
    acked.extend(run.settle(b3, l3)?);
    let l4 = h.land_batch(&b4).await;
    acked.extend(run.settle(b4, l4)?);
    assert!(matches!(run.holds(&acme), Err(Error::Fenced { .. })));
    // A new tenure of acme, round 3, in the same run.
    run.attach(&acme, 3)?;
    acked.extend(run.settle(b2, l2)?);
    let acme_acked: Vec<u64> = acked
        .iter()
        .filter(|(o, _)| *o == acme)
        .map(|(_, c)| *c)
        .collect();
    let walk = c.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    let newest = walk.newest.as_ref().map_or(0, |(_, s)| s.commit);
    assert!(
        acme_acked.iter().all(|&a| a <= newest),
        "I7: acme acknowledged {acme_acked:?}, the walk reads commit {newest} (ends at {:?})",
        walk.end
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A seal of one kind retried as another
// ---------------------------------------------------------------------------------------

/// J4's release seal has an unknown outcome (the put landed, the re-read failed). A self
/// seal is then refused: it would reuse the slot, and a continued run after a release that
/// landed acknowledges commits no walk reads. Placed again, the release is found as ours.
#[tokio::test]
async fn an_undecided_release_seal_is_placed_again_never_turned_into_a_self_seal() -> R {
    let mem = memory();
    let fs = Arc::new(FaultStore::new(mem.clone()));
    let h = open(fs.clone()).await;
    let acme = org("acme");
    let run1 = run_of(1);
    let mut run = Run::new(run1.clone(), "h", 4)?;
    run.attach(&acme, 1)?;
    let b = h
        .issue_batch(&mut run, vec![section(&acme, 1)], BatchMeta::new(1))
        .await?;
    let l = h.land_batch(&b).await;
    assert_eq!(run.settle(b, l)?, vec![(acme.clone(), 1)]);
    // The release seal at slot 2: landed, every re-read fails (three tries).
    let path = format!("{run1}/{:020}.jnl", 2);
    fs.inject_times(Op::Put, &path, 1, 3, Fault::FailAfter);
    // Every re-read fails (a GET, and the HEAD that sizes a failed read).
    fs.inject_times(Op::Get, &path, 1, 100, Fault::FailBefore);
    let released = h.seal_release(&mut run, 1).await;
    assert!(released.is_err(), "{released:?}");
    fs.clear();
    // J3.2: the undecided release seal is the only seal this run may place: a self seal
    // (and a continued run whose commits no walk would read past the release) is refused.
    assert!(matches!(
        h.seal_self(&mut run, 1).await,
        Err(Error::InvalidSettings { .. })
    ));
    // Placed again with the same body, it is found as ours: the run ended as a release.
    assert_eq!(h.seal_release(&mut run, 1).await?, 2);
    let walk = h.walk_runs(&acme, &run1, 1, tenure(1, 1)).await?;
    assert_eq!(walk.end, ScanEnd::Released { slot: 2 });
    assert_eq!(walk.newest.map(|(_, s)| s.commit), Some(1));
    assert!(
        h.seal_self(&mut run, 1).await.is_err(),
        "a released run has no continuation"
    );
    Ok(())
}

/// The same when the release seal's put fails before reaching the store (StoreRefused):
/// a self seal is refused until the release is placed again.
#[tokio::test]
async fn a_refused_release_seal_blocks_a_self_seal_until_placed_again() -> R {
    let mem = memory();
    let fs = Arc::new(FaultStore::new(mem.clone()));
    let h = open(fs.clone()).await;
    let acme = org("acme");
    let run1 = run_of(1);
    let mut run = Run::new(run1.clone(), "h", 4)?;
    run.attach(&acme, 1)?;
    let b = h
        .issue_batch(&mut run, vec![section(&acme, 1)], BatchMeta::new(1))
        .await?;
    let l = h.land_batch(&b).await;
    run.settle(b, l)?;
    let path = format!("{run1}/{:020}.jnl", 2);
    fs.inject_times(Op::Put, &path, 1, 6, Fault::FailBefore);
    assert!(h.seal_release(&mut run, 1).await.is_err());
    fs.clear();
    assert!(
        h.seal_self(&mut run, 1).await.is_err(),
        "a release seal is undecided"
    );
    assert_eq!(h.seal_release(&mut run, 1).await?, 2);
    let listing = h.list_run(&run1, 1).await?;
    let seal = &listing
        .objects
        .get(&2)
        .expect("slot 2 listed")
        .header
        .object;
    assert!(
        matches!(
            seal,
            JournalObject::Seal(Seal {
                seal: SealKind::Release,
                ..
            })
        ),
        "seal_release placed {seal:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// An adopt seal of unknown outcome (K2.2: "retried in place until decided")
// ---------------------------------------------------------------------------------------

/// The adopter's seal lands but its re-read fails: the seal is retried in place, and an
/// adopter that still returns the error finds its own landed seal on the next call as its
/// adoption (`Sealed`), never as another's (`AdoptedBy`), which would strand every org in
/// its run with no writer.
#[tokio::test]
async fn an_adopt_seal_of_unknown_outcome_is_found_as_ours_on_the_next_call() -> R {
    let mem = memory();
    let h = open(mem.clone()).await;
    let fs = Arc::new(FaultStore::new(mem.clone()));
    let d = open(fs.clone()).await;
    let acme = org("acme");
    let run1 = run_of(1);
    let mut run = Run::new(run1.clone(), "h", 4)?;
    run.attach(&acme, 1)?;
    let b = h
        .issue_batch(&mut run, vec![section(&acme, 1)], BatchMeta::new(1))
        .await?;
    let l = h.land_batch(&b).await;
    run.settle(b, l)?;
    let path = format!("{run1}/{:020}.jnl", 2);
    // The first put lands and errs; every re-read of that slot fails for the whole call.
    fs.inject(Op::Put, &path, 1, Fault::FailAfter);
    fs.inject_times(Op::Get, &path, 1, 100, Fault::FailBefore);
    let ours = run_of(0xd1);
    let first = d.adopt_run(&run1, "d", &ours, 1).await;
    assert!(first.is_err(), "undecided, yet {first:?}");
    fs.clear();
    let second = d.adopt_run(&run1, "d", &ours, 1).await?;
    assert!(
        matches!(second, Adoption::Sealed { slot: 2, .. }),
        "the adopter's own landed seal is reported as {second:?}: it adopts nothing"
    );
    // Another adopter sees it as this one's adoption.
    let other = open(mem.clone()).await;
    let third = other.adopt_run(&run1, "e", &run_of(0xe1), 1).await?;
    assert!(
        matches!(third, Adoption::AdoptedBy { ref by, .. } if by == "d"),
        "{third:?}"
    );
    Ok(())
}
