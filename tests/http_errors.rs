//! Safe errors by default: a handler's SQL failure reaches a real HTTP client as a generic
//! 500 with an error id, and the log (a tracing subscriber, as an embedder installs one)
//! carries that id with the SQL text.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use idem_org::Registry;
use idem_org::http::{Idempotency, IdempotentRequest, StoredResponse};
use idem_org::replica::{OrgId, Replica, Settings};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Everything the subscriber writes, for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// Writes into a table that does not exist: `?` turns the SQL error into a `Refusal`.
async fn write_missing(State(idem): State<Idempotency>, req: IdempotentRequest) -> Response {
    let org = OrgId::new("acme").unwrap_or_else(|_| unreachable!("a valid id"));
    idem.run(&org, req, |tx, _req| {
        tx.execute("INSERT INTO secret_ledger (ssn) VALUES ('123-45-6789')", [])?;
        Ok(StoredResponse::new(StatusCode::CREATED, "never"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sql_error_reaches_the_client_as_an_id_and_the_log_as_its_text() -> R {
    let log = Captured::default();
    let writer = log.clone();
    // The one subscriber of this test binary: the handler runs on the registry's writer
    // threads, which a thread-local default would not reach.
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .try_init()
        .map_err(|e| format!("subscriber: {e}"))?;

    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = Replica::open(store, "", Settings::default()).await?;
    let registry = Registry::builder(dir.path().join("data"), replica, "w").build()?;
    let app = Router::new()
        .route("/write", post(write_missing))
        .with_state(Idempotency::new(registry.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/write"))
        .header("Idempotency-Key", "k-1")
        .body("x")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 500);
    let body = resp.text().await?;
    for secret in [
        "secret_ledger",
        "ssn",
        "123-45-6789",
        "no such table",
        "INSERT",
    ] {
        assert!(!body.contains(secret), "the body leaks {secret:?}: {body}");
    }
    let json: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(json["kind"], "internal", "{body}");
    let id = json["error_id"].as_str().ok_or("no error_id")?;
    assert_eq!(json["error"], format!("internal error (id {id})"));

    let logged = log.text();
    let line = logged
        .lines()
        .find(|l| l.contains(id))
        .ok_or_else(|| format!("no log line carries the id {id}: {logged}"))?;
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("no such table: secret_ledger"), "{line}");
    assert!(line.contains("acme"), "the line names the org: {line}");

    registry.shutdown().await;
    server.abort();
    Ok(())
}
