//! Store URLs: one text names a store and the prefix inside it, the same for the library and
//! every `idem` command, so both name the same objects.
//!
//! | URL | store | prefix |
//! |---|---|---|
//! | `DIR`, `file:///DIR` | local directory `DIR` (created if missing), fsync'd | `""` |
//! | `memory://` , `memory:///p` | a new in-process store (gone with the process) | `p` |
//! | `s3://bucket/p` | S3 or S3-compatible, from the `AWS_*` environment variables | `p` |
//! | `gs://bucket/p` | Google Cloud Storage, from the `GOOGLE_*` variables (an emulator: `GOOGLE_BASE_URL`) | `p` |
//! | `az://container/p` | Azure Blob, from the `AZURE_*` variables (Azurite: `AZURE_STORAGE_USE_EMULATOR=true`, `AZURITE_BLOB_STORAGE_URL`) | `p` |
//!
//! A local directory is its own root: `DIR/prod` names the objects a store rooted at `DIR`
//! keeps under the prefix `prod`, so `Replica::open(Replica::local_store(DIR)?, "prod", ..)`
//! and `--store DIR/prod` name the same objects, as `s3://bucket/prod` names those of the
//! bucket under `prod`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreScheme};
use url::Url;

use crate::{Error, Replica, Settings};

/// At most this many folders are listed by [`StoreUrl::prefixes_with_orgs`] (one LIST
/// each), so a hint about a store with many top-level folders stays cheap.
pub const MAX_PREFIX_LISTS: usize = 64;

/// A store and the prefix inside it under which idem keeps its objects, parsed from a URL
/// ([`StoreUrl::parse`]); cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreUrl {
    text: String,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    local_root: Option<PathBuf>,
    scheme: ObjectStoreScheme,
}

impl StoreUrl {
    /// Parses `text`: a string without `://` is a local directory path (created if missing);
    /// otherwise a `file`, `memory`, `s3`, `gs` or `az` URL whose path is the prefix. Cloud
    /// stores take credentials, region and endpoint from their standard environment
    /// variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, …; `GOOGLE_SERVICE_ACCOUNT`, …;
    /// `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, …), read by object_store's
    /// `from_env()`. An emulator is reached the same way: Azurite with
    /// `AZURE_STORAGE_USE_EMULATOR=true` and `AZURITE_BLOB_STORAGE_URL`; a GCS emulator with
    /// `GOOGLE_BASE_URL`, `GOOGLE_ALLOW_HTTP=true` and `GOOGLE_BEARER_TOKEN` (docs/stores.md).
    /// Nothing is read from or written to the store.
    ///
    /// # Errors
    /// [`Error::InvalidStoreUrl`] for an empty or malformed URL, an unsupported scheme, or a
    /// store that cannot be built from the environment (the builder's error as its source);
    /// [`Error::Io`] when a local directory cannot be created.
    ///
    /// # Examples
    /// ```
    /// # fn main() -> Result<(), idem_replica::Error> {
    /// let s = idem_replica::StoreUrl::parse("memory:///prod/eu")?;
    /// assert_eq!(s.prefix(), "prod/eu");
    /// # Ok(())
    /// # }
    /// ```
    pub fn parse(text: &str) -> Result<StoreUrl, Error> {
        let invalid = |reason: String| Error::InvalidStoreUrl {
            url: text.to_owned(),
            reason,
            source: None,
        };
        if text.trim().is_empty() {
            return Err(invalid("empty".into()));
        }
        if !text.contains("://") {
            return Self::local(text, PathBuf::from(text));
        }
        let url = Url::parse(text).map_err(|e| invalid(format!("malformed: {e}")))?;
        let (scheme, path) = ObjectStoreScheme::parse(&url).map_err(|e| {
            invalid(format!(
                "unsupported scheme (use a path, file://, memory://, s3://, gs:// or az://): {e}"
            ))
        })?;
        let prefix = path.as_ref().trim_matches('/').to_owned();
        let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
            ObjectStoreScheme::Local => {
                let dir = url
                    .to_file_path()
                    .map_err(|()| invalid("a file URL needs an absolute path".into()))?;
                return Self::local(text, dir);
            }
            ObjectStoreScheme::Memory => Ok(Arc::new(object_store::memory::InMemory::new())),
            ObjectStoreScheme::AmazonS3 => object_store::aws::AmazonS3Builder::from_env()
                .with_url(text)
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            ObjectStoreScheme::GoogleCloudStorage => {
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(text)
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }
            ObjectStoreScheme::MicrosoftAzure => {
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(text)
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }
            other => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?} (use a path, file://, memory://, s3://, gs:// or az://)"
                )));
            }
        };
        let store = built.map_err(|source| Error::InvalidStoreUrl {
            url: text.to_owned(),
            reason: "cannot build the store".into(),
            source: Some(source),
        })?;
        Ok(StoreUrl {
            text: text.to_owned(),
            store,
            prefix,
            local_root: None,
            scheme,
        })
    }

    /// [`StoreUrl::parse`] for a store that must already exist: a local directory is never
    /// created, so a mistyped path is an error, not an empty store (for reading only).
    ///
    /// # Errors
    /// As [`StoreUrl::parse`]; [`Error::InvalidStoreUrl`] for a local path that is not an
    /// existing directory.
    pub fn parse_existing(text: &str) -> Result<StoreUrl, Error> {
        let dir = if text.contains("://") {
            Url::parse(text)
                .ok()
                .filter(|u| u.scheme() == "file")
                .and_then(|u| u.to_file_path().ok())
        } else {
            Some(PathBuf::from(text))
        };
        if let Some(dir) = dir
            && !dir.is_dir()
        {
            return Err(Error::InvalidStoreUrl {
                url: text.to_owned(),
                reason: format!("no store at {}: not a directory", dir.display()),
                source: None,
            });
        }
        Self::parse(text)
    }

    fn local(text: &str, dir: PathBuf) -> Result<StoreUrl, Error> {
        Ok(StoreUrl {
            text: text.to_owned(),
            store: Replica::local_store(&dir)?,
            prefix: String::new(),
            local_root: Some(dir),
            scheme: ObjectStoreScheme::Local,
        })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The store (for a local directory, rooted at it).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix inside the store: the URL's path without its slashes at either end; `""`
    /// for a local directory, which is its own root.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The directory of a local store (its deletes leave empty folders behind).
    pub fn local_root(&self) -> Option<&Path> {
        self.local_root.as_deref()
    }

    /// This URL with `name` appended to its prefix: the same store, a folder inside it.
    pub fn join(&self, name: &str) -> StoreUrl {
        let prefix = [self.prefix.as_str(), name.trim_matches('/')]
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        StoreUrl {
            text: self.url_of(&prefix),
            store: self.store.clone(),
            prefix,
            local_root: self.local_root.clone(),
            scheme: self.scheme.clone(),
        }
    }

    /// The URL that names `prefix` of this store: `DIR/prefix` for a local directory,
    /// `scheme://bucket/prefix` otherwise.
    pub fn url_of(&self, prefix: &str) -> String {
        if let Some(root) = &self.local_root {
            return root.join(prefix).display().to_string();
        }
        match Url::parse(&self.text) {
            Ok(url) => {
                let host = url.host_str().unwrap_or("");
                format!("{}://{host}/{prefix}", url.scheme())
            }
            Err(_) => self.text.clone(),
        }
    }

    /// What to tell a user when this store cannot be reached and the reason may be missing
    /// credentials: an S3 URL with no credentials in the environment. `None` otherwise.
    pub fn credentials_hint(&self) -> Option<&'static str> {
        let missing = self.scheme == ObjectStoreScheme::AmazonS3
            && std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
            && std::env::var_os("AWS_PROFILE").is_none()
            && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none();
        missing.then_some(
            "no S3 credentials in the environment: set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY \
             and AWS_REGION (and AWS_ENDPOINT, AWS_ALLOW_HTTP=true for an S3-compatible \
             server), or run where instance metadata provides credentials",
        )
    }

    /// Opens a [`Replica`] over this store and prefix ([`Replica::open`]: runs the
    /// create-only probe).
    ///
    /// # Errors
    /// As [`Replica::open`].
    pub async fn open(&self, settings: Settings) -> Result<Replica, Error> {
        Replica::open(self.store.clone(), &self.prefix, settings).await
    }

    /// Opens a [`Replica`] for reading only ([`Replica::open_read_only`]: no probe, no
    /// writes).
    ///
    /// # Errors
    /// As [`Replica::open_read_only`].
    pub fn open_read_only(&self, settings: Settings) -> Result<Replica, Error> {
        Replica::open_read_only(self.store.clone(), &self.prefix, settings)
    }

    /// The prefixes of this store (from its root, whatever this URL's prefix) under which
    /// orgs are kept (a folder `orgs/` beside nothing else required), sorted; `""` is the
    /// root. Looks two folders deep, with at most [`MAX_PREFIX_LISTS`] LISTs: what a
    /// command that found no org under this URL's prefix names as a hint.
    ///
    /// # Errors
    /// [`Error::Store`] when a LIST fails.
    pub async fn prefixes_with_orgs(&self) -> Result<Vec<String>, Error> {
        let mut found = Vec::new();
        let mut lists = 0usize;
        let mut level: Vec<Option<object_store::path::Path>> = vec![None];
        for _depth in 0..3 {
            let mut next = Vec::new();
            for dir in level {
                if lists >= MAX_PREFIX_LISTS {
                    break;
                }
                lists += 1;
                let listed = self
                    .store
                    .list_with_delimiter(dir.as_ref())
                    .await
                    .map_err(|e| Error::Store {
                        op: "list",
                        path: dir.as_ref().map(|d| d.to_string()).unwrap_or_default(),
                        source: e,
                    })?;
                for p in listed.common_prefixes {
                    if p.filename() == Some("orgs") {
                        found.push(dir.as_ref().map(|d| d.to_string()).unwrap_or_default());
                    } else if p.filename() != Some("processes") {
                        next.push(Some(p));
                    }
                }
            }
            level = next;
        }
        found.sort();
        found.dedup();
        Ok(found)
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Replica {
    /// Opens over the store `url` names, prefix included ([`StoreUrl::parse`] then
    /// [`Replica::open`]): the URL an `idem --store` flag takes names the same objects.
    ///
    /// # Errors
    /// As [`StoreUrl::parse`] and [`Replica::open`].
    ///
    /// # Examples
    /// ```
    /// # use idem_replica::{Replica, Settings};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// // `DIR/prod` (or `s3://bucket/prod`): the prefix is part of the URL.
    /// let url = dir.path().join("prod").display().to_string();
    /// let replica = Replica::open_url(&url, Settings::default()).await?;
    /// assert!(replica.orgs().await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open_url(url: &str, settings: Settings) -> Result<Replica, Error> {
        StoreUrl::parse(url)?.open(settings).await
    }
}

#[cfg(test)]
mod tests;
