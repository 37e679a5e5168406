//! Demo clients: send transfers with idempotency keys to the current replica, retry every
//! unacknowledged one with the same key until it is acknowledged, and duplicate some on
//! purpose (concurrently, after the ack, and with a changed payload).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::sync::watch;

use crate::ledger::Transfer;

/// One request of the workload.
#[derive(Debug, Clone)]
pub struct Request {
    /// Org index.
    pub org: usize,
    /// Idempotency key.
    pub key: String,
    /// Payload.
    pub transfer: Transfer,
    /// 0: plain; 1: concurrent duplicate; 2: resend after ack; 3: changed payload after ack.
    pub dup: u8,
}

/// When one acknowledged request was first sent and first acknowledged.
#[derive(Debug, Clone, Copy)]
pub struct AckTime {
    /// Org index.
    pub org: usize,
    /// Its first send.
    pub sent: Instant,
    /// Its first acknowledgement (before any deliberate duplicate of it).
    pub acked: Instant,
}

/// What the clients observed.
#[derive(Debug, Default)]
pub struct Stats {
    /// Acknowledged requests: (request, receipt body).
    pub acked: Vec<(Request, Vec<u8>)>,
    /// Every acknowledged request's org and its timing (its latency is `acked - sent`).
    pub ack_times: Vec<AckTime>,
    /// HTTP sends, retries and duplicates included.
    pub sends: u64,
    /// Duplicate sends made on purpose.
    pub duplicates: u64,
    /// Responses with `Idempotent-Replayed: true`.
    pub replayed: u64,
    /// 409: the same key was in flight.
    pub conflicts: u64,
    /// 422 for a changed payload under an acknowledged key (expected).
    pub mismatches: u64,
    /// 503 responses by kind (retry = lease held / ship failed, fenced, reacquire).
    pub unavailable: BTreeMap<String, u64>,
    /// Connection errors (replica gone or draining).
    pub connection_errors: u64,
    /// Violations seen on the wire.
    pub violations: Vec<String>,
}

/// State shared by the clients and the controller.
#[derive(Debug)]
pub struct Shared {
    /// Base URL of the replica clients send to.
    pub target: RwLock<String>,
    /// Next request to take.
    pub next: AtomicUsize,
    /// Acknowledged count, watched by the controller.
    pub acked: watch::Sender<usize>,
    /// Phase gate: request `i` waits until the phase reaches `phase_of(i)`.
    pub phase: watch::Sender<u8>,
    /// Observations.
    pub stats: Mutex<Stats>,
    /// Org names.
    pub orgs: Vec<String>,
    /// The workload.
    pub requests: Vec<Request>,
}

impl Shared {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn target(&self) -> String {
        self.target
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Phase a request belongs to: thirds of the workload.
    pub fn phase_of(&self, index: usize) -> u8 {
        let n = self.requests.len().max(1);
        u8::try_from(index * 3 / n).unwrap_or(2).min(2)
    }
}

/// A deterministic workload generator (splitmix64).
pub fn workload(orgs: usize, requests: usize, accounts: usize, seed: u64) -> Vec<Request> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let pick = |r: u64, n: usize| usize::try_from(r % n.max(1) as u64).unwrap_or(0);
    (0..requests)
        .map(|index| {
            let org = pick(next(), orgs);
            let from = pick(next(), accounts);
            let to = (from + 1 + pick(next(), accounts.max(2) - 1)) % accounts.max(2);
            let cents = 1 + i64::try_from(next() % 500).unwrap_or(0);
            let dup = match next() % 20 {
                0 | 1 => 1,
                2 | 3 => 2,
                4 => 3,
                _ => 0,
            };
            Request {
                org,
                key: format!("transfer-{index:06}-{:08x}", next() as u32),
                transfer: Transfer {
                    from: format!("acct-{from}"),
                    to: format!("acct-{to}"),
                    cents,
                },
                dup,
            }
        })
        .collect()
}

/// Outcome of one send.
enum Sent {
    Ack { body: Vec<u8>, replayed: bool },
    Status(StatusCode),
    Again,
}

/// One HTTP send; counts what it saw.
async fn send_once(http: &reqwest::Client, sh: &Shared, r: &Request, t: &Transfer) -> Sent {
    let url = format!("{}/orgs/{}/transfers", sh.target(), sh.orgs[r.org]);
    sh.stats().sends += 1;
    let resp = http
        .post(url)
        .header("Idempotency-Key", &r.key)
        .json(t)
        .send()
        .await;
    let resp = match resp {
        Ok(resp) => resp,
        Err(_) => {
            sh.stats().connection_errors += 1;
            return Sent::Again;
        }
    };
    let status = resp.status();
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let Ok(body) = resp.bytes().await else {
        sh.stats().connection_errors += 1;
        return Sent::Again;
    };
    match status {
        StatusCode::CREATED => {
            if replayed {
                sh.stats().replayed += 1;
            }
            Sent::Ack {
                body: body.to_vec(),
                replayed,
            }
        }
        StatusCode::CONFLICT => {
            sh.stats().conflicts += 1;
            Sent::Again
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            let kind = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
                .unwrap_or_else(|| "unknown".into());
            *sh.stats().unavailable.entry(kind).or_default() += 1;
            Sent::Again
        }
        other => Sent::Status(other),
    }
}

/// Sends until acknowledged (or a definite status), retrying with the same key.
async fn until_done(
    http: &reqwest::Client,
    sh: &Shared,
    r: &Request,
    t: &Transfer,
) -> Result<Sent, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match send_once(http, sh, r, t).await {
            Sent::Again if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Sent::Again => return Err(format!("request {} abandoned after 60 s", r.key)),
            done => return Ok(done),
        }
    }
}

async fn run_request(http: &reqwest::Client, sh: &Shared, r: &Request) -> Result<(), String> {
    let start = Instant::now();
    let first = until_done(http, sh, r, &r.transfer);
    let (body, dup_body) = if r.dup == 1 {
        sh.stats().duplicates += 1;
        let (a, b) = tokio::join!(first, until_done(http, sh, r, &r.transfer));
        (a?, Some(b?))
    } else {
        (first.await?, None)
    };
    let Sent::Ack { body, .. } = body else {
        return Err(format!("request {} refused: {}", r.key, status_of(&body)));
    };
    let acked = Instant::now();
    match dup_body {
        Some(Sent::Ack { body: b, .. }) if b == body => {}
        Some(other) => {
            return Err(format!(
                "concurrent duplicate of {} got a different answer ({})",
                r.key,
                status_of(&other)
            ));
        }
        None => {}
    }
    if r.dup == 2 {
        sh.stats().duplicates += 1;
        match until_done(http, sh, r, &r.transfer).await? {
            Sent::Ack { body: b, replayed } if replayed && b == body => {}
            other => {
                return Err(format!(
                    "resend of acknowledged {} was not a byte-identical replay ({})",
                    r.key,
                    status_of(&other)
                ));
            }
        }
    }
    if r.dup == 3 {
        sh.stats().duplicates += 1;
        let mut changed = r.transfer.clone();
        changed.cents += 1;
        match until_done(http, sh, r, &changed).await? {
            Sent::Status(StatusCode::UNPROCESSABLE_ENTITY) => sh.stats().mismatches += 1,
            other => {
                return Err(format!(
                    "changed payload under acknowledged {} was not refused with 422 ({})",
                    r.key,
                    status_of(&other)
                ));
            }
        }
    }
    let mut st = sh.stats();
    st.acked.push((r.clone(), body));
    st.ack_times.push(AckTime {
        org: r.org,
        sent: start,
        acked,
    });
    drop(st);
    sh.acked.send_modify(|n| *n += 1);
    Ok(())
}

fn status_of(s: &Sent) -> String {
    match s {
        Sent::Ack { replayed, .. } => format!("201, replayed={replayed}"),
        Sent::Status(c) => c.to_string(),
        Sent::Again => "no answer".into(),
    }
}

/// One client: takes requests off the shared queue until none is left.
pub async fn client(sh: Arc<Shared>) {
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            sh.stats().violations.push(format!("http client: {e}"));
            return;
        }
    };
    loop {
        let i = sh.next.fetch_add(1, Ordering::SeqCst);
        let Some(r) = sh.requests.get(i) else { return };
        let mut phase = sh.phase.subscribe();
        let want = sh.phase_of(i);
        if phase.wait_for(|p| *p >= want).await.is_err() {
            return;
        }
        if let Err(v) = run_request(&http, &sh, r).await {
            sh.stats().violations.push(v);
            sh.acked.send_modify(|n| *n += 1);
        }
    }
}
