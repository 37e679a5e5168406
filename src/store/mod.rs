//! Store URLs, as the library parses them ([`StoreUrl`], `idem_replica::StoreUrl`): a plain
//! path or `file://` (a local directory, fsync'd), `memory://`, `s3://bucket/prefix`,
//! `gs://bucket/prefix`, `az://container/prefix`, so every command names the objects an
//! embedder's `Replica::open_url` names. Here: their errors as one line, the credentials hint,
//! and the hint a command gives when it finds no org under a store.
//! [`restored`] reads an org's acknowledged state back out of the store.

pub mod restored;

use idem_org::replica::{self, OrgId, Replica};

pub use idem_org::replica::StoreUrl;

/// Parses `text` into a store ([`StoreUrl::parse`]: a local directory is created if missing).
///
/// # Errors
/// A one-line message for a malformed URL, an unsupported scheme, or a store that cannot be
/// built from the environment.
pub fn parse(text: &str) -> Result<StoreUrl, String> {
    StoreUrl::parse(text).map_err(|e| crate::chain(&e))
}

/// [`parse`] for commands that only read: a local store directory must already exist.
///
/// # Errors
/// As [`parse`]; a local path that is not an existing directory.
pub fn parse_existing(text: &str) -> Result<StoreUrl, String> {
    StoreUrl::parse_existing(text).map_err(|e| crate::chain(&e))
}

/// Opens the replica over `url` (runs the create-only probe).
///
/// # Errors
/// The replica's open error, as one line, with the credentials hint when there is one.
pub async fn open(url: &StoreUrl, settings: replica::Settings) -> Result<Replica, String> {
    url.open(settings)
        .await
        .map_err(|e| match url.credentials_hint() {
            Some(hint) => format!("cannot open store: {hint} ({})", crate::chain(&e)),
            None => format!("cannot open store: {}", crate::chain(&e)),
        })
}

/// Opens the replica over `url` for reading only: no probe, no writes.
///
/// # Errors
/// The replica's error, as one line.
pub fn open_read_only(url: &StoreUrl, settings: replica::Settings) -> Result<Replica, String> {
    url.open_read_only(settings)
        .map_err(|e| format!("cannot open store: {}", crate::chain(&e)))
}

/// The message for `org` missing under `url`, with what the store does hold ([`org_hint`]).
pub async fn org_not_found(url: &StoreUrl, org: &OrgId) -> String {
    let hint = org_hint(url).await;
    if hint.is_empty() {
        format!("org {org} not found under {url}; `idem orgs {url}` lists the orgs it holds")
    } else {
        format!("org {org} not found under {url}{hint}")
    }
}

/// `"; this store holds orgs under prefixes: …"` naming the prefixes of `url`'s store, other
/// than its own, under which orgs are kept (one LIST per folder, at most
/// `MAX_PREFIX_LISTS`), each with the `--store` value that names it, so a prefix left out of
/// the URL is found at once; `"; this store holds no orgs under any prefix"` when there is
/// none; `""` when the only prefix holding orgs is `url`'s own.
pub async fn org_hint(url: &StoreUrl) -> String {
    let prefixes = match url.prefixes_with_orgs().await {
        Ok(p) => p,
        Err(e) => {
            return format!(
                " (listing the store for a hint failed: {})",
                crate::chain(&e)
            );
        }
    };
    let others: Vec<String> = prefixes
        .iter()
        .filter(|p| p.as_str() != url.prefix())
        .map(|p| {
            let name = if p.is_empty() {
                "(the root)"
            } else {
                p.as_str()
            };
            format!("{name} (--store {})", url.url_of(p))
        })
        .collect();
    let here = prefixes.iter().any(|p| p == url.prefix());
    match (others.is_empty(), here) {
        (true, true) => String::new(),
        (true, false) => "; this store holds no orgs under any prefix".to_owned(),
        (false, _) => format!(
            "; this store holds orgs under prefixes: {}",
            others.join(", ")
        ),
    }
}
