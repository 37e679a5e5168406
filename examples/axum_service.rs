//! An orders service on axum with exactly-once `POST /orders`, in one file: the application
//! writes its routes and its authentication; `idem_org::http` does the `Idempotency-Key`
//! work (400 / 409 / 422, replay with `Idempotent-Replayed: true`, 503 by error kind).
//!
//! Run: `cargo run --example axum_service` — it starts two replicas of the service on one
//! store and walks a real HTTP client through a first request, a replay, a changed payload
//! (422), a concurrent duplicate (409), a tenant that tries another tenant's key, and a
//! replay on the second replica after the first hands its orgs over. Every step is checked;
//! the process exits non-zero if one fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_org::http::{Idempotency, IdempotentRequest, Refusal, StoredResponse};
use idem_org::object_store::ObjectStore;
use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::{Registry, rusqlite};
use tokio::sync::oneshot;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reports "inside the transaction", then waits for a go.
type SlowHook = Arc<Mutex<Option<(oneshot::Sender<()>, std::sync::mpsc::Receiver<()>)>>>;

#[derive(Clone)]
struct App {
    idem: Idempotency,
    /// Bearer token → tenant: the application's own authentication.
    tokens: Arc<HashMap<&'static str, OrgId>>,
    /// Test hook of this walk-through: a request whose key starts with `slow-` reports that
    /// it is inside its transaction, then waits for a go.
    slow: SlowHook,
}

/// The authenticated tenant: from the application's token table, never from the path.
struct Tenant(OrgId);

impl FromRequestParts<App> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match token.and_then(|t| app.tokens.get(t)) {
            Some(org) => Ok(Tenant(org.clone())),
            None => Err((StatusCode::UNAUTHORIZED, "unknown token").into_response()),
        }
    }
}

#[derive(serde::Deserialize)]
struct NewOrder {
    sku: String,
    qty: u32,
}

/// `POST /orders`: inserts the order in the tenant's database and stores the 201 with it.
async fn create_order(
    State(app): State<App>,
    Tenant(org): Tenant,
    req: IdempotentRequest,
) -> Response {
    let slow = req.key().starts_with("slow-").then(|| app.slow.clone());
    app.idem
        .run(&org, req, move |tx, req| {
            let hook = slow.and_then(|s| s.lock().ok().and_then(|mut s| s.take()));
            if let Some((entered, go)) = hook {
                let _ = entered.send(());
                let _ = go.recv();
            }
            let order: NewOrder = serde_json::from_slice(req.body())
                .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("bad order: {e}")))?;
            // `?` on an SQL error: a 500 "internal error (id …)"; the SQL text goes to the log.
            tx.execute(
                "INSERT INTO orders (sku, qty) VALUES (?1, ?2)",
                rusqlite::params![order.sku, order.qty],
            )?;
            let id = tx.last_insert_rowid();
            let receipt = serde_json::json!({ "order": id, "sku": order.sku, "qty": order.qty });
            Ok(StoredResponse::json(StatusCode::CREATED, &receipt)
                .map_err(Refusal::internal)?
                .header(
                    header::LOCATION,
                    HeaderValue::from_str(&format!("/orders/{id}")).map_err(Refusal::internal)?,
                ))
        })
        .await
}

/// One replica of the service: a registry on the shared store, served on a free port.
async fn replica(
    name: &str,
    store: Arc<dyn ObjectStore>,
    data: &std::path::Path,
) -> Result<(Registry, String, App), BoxError> {
    let replica = Replica::open(store, "prod", Settings::default()).await?;
    let registry = Registry::builder(data, replica, name)
        .on_open(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, sku TEXT, qty INT)",
            )
        })
        .build()?;
    let tokens = HashMap::from([
        ("token-acme", OrgId::new("acme")?),
        ("token-globex", OrgId::new("globex")?),
    ]);
    let app = App {
        idem: Idempotency::new(registry.clone()),
        tokens: Arc::new(tokens),
        slow: Arc::new(Mutex::new(None)),
    };
    let router = Router::new()
        .route("/orders", post(create_order))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((registry, url, app))
}

async fn post_order(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    key: &str,
    body: &str,
) -> Result<(StatusCode, bool, String), BoxError> {
    let resp = http
        .post(format!("{url}/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .body(body.to_owned())
        .send()
        .await?;
    let status = StatusCode::from_u16(resp.status().as_u16())?;
    let replayed = resp.headers().get("idempotent-replayed").is_some();
    if status == StatusCode::CREATED {
        let types: Vec<_> = resp
            .headers()
            .get_all(header::CONTENT_TYPE)
            .iter()
            .collect();
        check(
            types == ["application/json"],
            "a 201 carries the one Content-Type the handler stored",
        )?;
    }
    Ok((status, replayed, resp.text().await?))
}

fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        println!("ok  {what}");
        Ok(())
    } else {
        Err(format!("FAILED: {what}").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let (reg_a, a, app_a) = replica("replica-a", store.clone(), &dir.path().join("a")).await?;
    let (reg_b, b, _) = replica("replica-b", store, &dir.path().join("b")).await?;
    let http = reqwest::Client::new();
    let order = r#"{"sku":"anvil","qty":1}"#;

    let first = post_order(&http, &a, "token-acme", "order-1", order).await?;
    check(
        first.0 == StatusCode::CREATED && !first.1,
        "first request: 201, applied",
    )?;
    let again = post_order(&http, &a, "token-acme", "order-1", order).await?;
    check(
        again.0 == StatusCode::CREATED && again.1 && again.2 == first.2,
        "retry: the stored 201 replayed byte for byte, Idempotent-Replayed: true",
    )?;
    let changed = post_order(
        &http,
        &a,
        "token-acme",
        "order-1",
        r#"{"sku":"anvil","qty":9}"#,
    )
    .await?;
    check(
        changed.0 == StatusCode::UNPROCESSABLE_ENTITY,
        "same key, other payload: 422",
    )?;
    let other_tenant = post_order(&http, &a, "token-globex", "order-1", order).await?;
    check(
        other_tenant.0 == StatusCode::CREATED && !other_tenant.1,
        "another tenant's token under the same key is its own request in its own org",
    )?;

    // A duplicate while the first is still in its transaction: 409, decided without waiting.
    let (entered_tx, entered) = oneshot::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    *app_a.slow.lock().map_err(|_| "poisoned")? = Some((entered_tx, go_rx));
    let slow = {
        let (http, a) = (http.clone(), a.clone());
        tokio::spawn(async move { post_order(&http, &a, "token-acme", "slow-1", order).await })
    };
    entered.await?;
    let dup = post_order(&http, &a, "token-acme", "slow-1", order).await?;
    check(
        dup.0 == StatusCode::CONFLICT,
        "same key while the first is in flight: 409",
    )?;
    go.send(())?;
    let slow = slow.await??;
    check(
        slow.0 == StatusCode::CREATED,
        "the first of the two then completes: 201",
    )?;

    // Replica A hands its orgs over (what SIGTERM does in a rolling upgrade); B claims on
    // the next request, hydrates, and replays what A acknowledged.
    reg_a.shutdown().await;
    let on_b = post_order(&http, &b, "token-acme", "order-1", order).await?;
    check(
        on_b.0 == StatusCode::CREATED && on_b.1 && on_b.2 == first.2,
        "after the handoff, replica B replays A's stored 201",
    )?;
    let missing = post_order(&http, &b, "token-acme", "", order).await?;
    check(
        missing.0 == StatusCode::BAD_REQUEST,
        "an empty Idempotency-Key: 400",
    )?;
    reg_b.shutdown().await;
    println!("axum_service: every step checked");
    Ok(())
}
