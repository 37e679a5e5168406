//! `idem_org::http` in an application's own axum router, driven by a real HTTP client:
//! tenant isolation at the edge (I12), byte-for-byte replay with the stored headers (I3),
//! refusals that are not stored, and the extractor's 400 and 413.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_org::Registry;
use idem_org::http::{Idempotency, IdempotentRequest, Refusal, StoredResponse};
use idem_org::replica::{OrgId, Replica, Settings};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[derive(Clone)]
struct App {
    idem: Idempotency,
    tokens: Arc<HashMap<&'static str, OrgId>>,
}

struct Tenant(OrgId);

impl FromRequestParts<App> for Tenant {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        token
            .and_then(|t| app.tokens.get(t))
            .map(|org| Tenant(org.clone()))
            .ok_or_else(|| StatusCode::UNAUTHORIZED.into_response())
    }
}

/// Stores a note; the body `refuse` is refused without storing, `teapot` stores a 418.
async fn note(State(app): State<App>, Tenant(org): Tenant, req: IdempotentRequest) -> Response {
    let tenant = org.to_string();
    app.idem
        .run(&org, req, move |tx, req| {
            let text = String::from_utf8_lossy(req.body()).into_owned();
            if text == "refuse" {
                return Err(Refusal::new(
                    StatusCode::PAYMENT_REQUIRED,
                    "try again later",
                ));
            }
            tx.execute("INSERT INTO notes (text) VALUES (?1)", [&text])?;
            let status = if text == "teapot" {
                StatusCode::IM_A_TEAPOT
            } else {
                StatusCode::CREATED
            };
            Ok(StoredResponse::new(
                status,
                format!("{tenant} note {} {text}", tx.last_insert_rowid()),
            )
            .header(
                header::HeaderName::from_static("x-tenant"),
                HeaderValue::from_str(&tenant).map_err(Refusal::internal)?,
            ))
        })
        .await
}

/// The tenant's own notes, read through its writer.
async fn notes(State(app): State<App>, Tenant(org): Tenant) -> Response {
    let org = match app.idem.registry().acquire(&org).await {
        Ok(o) => o,
        Err(e) => return idem_org::http::error_response(&e),
    };
    match org
        .read(|c| c.query_row("SELECT count(*) FROM notes", [], |r| r.get::<_, i64>(0)))
        .await
    {
        Ok(n) => n.to_string().into_response(),
        Err(e) => idem_org::http::error_response(&e),
    }
}

async fn serve(
    dir: &std::path::Path,
) -> Result<(String, Registry), Box<dyn std::error::Error + Send + Sync>> {
    let store = Replica::local_store(&dir.join("store"))?;
    let replica = Replica::open(store, "", Settings::default()).await?;
    let registry = Registry::builder(dir.join("data"), replica, "w")
        .on_open(|c| {
            c.execute_batch("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT)")
        })
        .build()?;
    let app = App {
        idem: Idempotency::new(registry.clone()),
        tokens: Arc::new(HashMap::from([
            ("t-acme", OrgId::new("acme")?),
            ("t-globex", OrgId::new("globex")?),
        ])),
    };
    let router = Router::new()
        .route("/notes", post(note).get(notes))
        // A path naming another tenant changes nothing: the org is the token's.
        .route("/orgs/{org}/notes", post(note))
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(1024))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((url, registry))
}

struct Answer {
    status: u16,
    replayed: bool,
    tenant: Option<String>,
    body: String,
}

async fn send(
    url: &str,
    path: &str,
    token: &str,
    key: Option<&str>,
    body: &str,
) -> Result<Answer, reqwest::Error> {
    let mut req = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .bearer_auth(token)
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await?;
    let h = resp.headers();
    Ok(Answer {
        status: resp.status().as_u16(),
        replayed: h.get("idempotent-replayed").is_some_and(|v| v == "true"),
        tenant: h
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: resp.text().await?,
    })
}

async fn count(url: &str, token: &str) -> Result<String, reqwest::Error> {
    reqwest::Client::new()
        .get(format!("{url}/notes"))
        .bearer_auth(token)
        .send()
        .await?
        .text()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_read_replay_or_write_another_tenants_keys() -> R {
    let dir = tempfile::tempdir()?;
    let (url, registry) = serve(dir.path()).await?;
    let a = send(&url, "/notes", "t-acme", Some("k1"), "hello").await?;
    assert_eq!((a.status, a.replayed), (201, false));
    // globex sends acme's key, acme's body, even acme's path: it is globex's own request.
    let g = send(&url, "/orgs/acme/notes", "t-globex", Some("k1"), "hello").await?;
    assert_eq!((g.status, g.replayed), (201, false), "{}", g.body);
    assert_eq!(g.tenant.as_deref(), Some("globex"));
    assert!(g.body.starts_with("globex note 1"), "{}", g.body);
    // acme's replay is acme's stored response, untouched by globex's request.
    let again = send(&url, "/notes", "t-acme", Some("k1"), "hello").await?;
    assert!(again.replayed);
    assert_eq!(
        (again.body.as_str(), again.tenant.as_deref()),
        (a.body.as_str(), Some("acme"))
    );
    assert_eq!(
        (count(&url, "t-acme").await?, count(&url, "t-globex").await?),
        ("1".into(), "1".into())
    );
    // No token, no tenant: nothing runs.
    let anon = reqwest::Client::new()
        .post(format!("{url}/notes"))
        .header("Idempotency-Key", "k9")
        .body("x")
        .send()
        .await?;
    assert_eq!(anon.status().as_u16(), 401);
    assert_eq!(count(&url, "t-acme").await?, "1");
    registry.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_status_headers_and_body_replay_and_refusals_are_not_stored() -> R {
    let dir = tempfile::tempdir()?;
    let (url, registry) = serve(dir.path()).await?;
    // A non-2xx answer the handler stored replays like any other.
    let tea = send(&url, "/notes", "t-acme", Some("tea"), "teapot").await?;
    let again = send(&url, "/notes", "t-acme", Some("tea"), "teapot").await?;
    assert_eq!((tea.status, again.status, again.replayed), (418, 418, true));
    assert_eq!(again.body, tea.body);
    // A refusal rolls back and is answered, not stored: the retry runs again.
    let refused = send(&url, "/notes", "t-acme", Some("r"), "refuse").await?;
    assert_eq!(refused.status, 402, "{}", refused.body);
    let json: serde_json::Value = serde_json::from_str(&refused.body)?;
    assert_eq!(json["kind"], "refused");
    let changed = send(&url, "/notes", "t-acme", Some("r"), "refuse").await?;
    assert_eq!(
        changed.status, 402,
        "a refusal is not a stored answer: it runs again"
    );
    // A changed payload under an applied key: 422.
    let mismatch = send(&url, "/notes", "t-acme", Some("tea"), "coffee").await?;
    assert_eq!(mismatch.status, 422);
    // The extractor: no key, a list of keys, an oversized body.
    assert_eq!(send(&url, "/notes", "t-acme", None, "x").await?.status, 400);
    assert_eq!(
        send(&url, "/notes", "t-acme", Some("a, b"), "x")
            .await?
            .status,
        400
    );
    let big = send(&url, "/notes", "t-acme", Some("big"), &"x".repeat(4096)).await?;
    assert_eq!(big.status, 413);
    let json: serde_json::Value = serde_json::from_str(&big.body)?;
    assert_eq!(json["kind"], "input");
    assert_eq!(
        count(&url, "t-acme").await?,
        "1",
        "only the teapot was stored"
    );
    registry.shutdown().await;
    Ok(())
}
