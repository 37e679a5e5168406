//! Store URLs: a plain path or `file://` (a local directory, fsync'd), `memory://`,
//! `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`.
//!
//! The URL's path part becomes the replica prefix; cloud credentials, region, endpoint and
//! `AWS_ALLOW_HTTP` come from the standard environment variables of each provider.
//! [`restored`] reads an org's acknowledged state back out of the store.

pub mod restored;

use std::path::PathBuf;
use std::sync::Arc;

use idem_org::object_store::{ObjectStore, ObjectStoreScheme};
use idem_org::{object_store, replica};
use url::Url;

/// An object store and the prefix inside it under which idem keeps its objects.
#[derive(Debug, Clone)]
pub struct StoreUrl {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// Prefix inside the store ("" for the root).
    pub prefix: String,
    /// The directory of a local store (deletes there leave empty folders behind).
    pub local_root: Option<PathBuf>,
    /// What to tell the user when the store cannot be reached (missing credentials).
    pub hint: Option<String>,
}

/// Parses `text` into a store. A string without `://` is a local directory path.
///
/// # Errors
/// A one-line message for a malformed URL, an unsupported scheme, or a store that cannot be
/// built from the environment.
pub fn parse(text: &str) -> Result<StoreUrl, String> {
    if text.trim().is_empty() {
        return Err("store URL is empty".into());
    }
    if !text.contains("://") {
        return local(PathBuf::from(text));
    }
    let url = Url::parse(text).map_err(|e| format!("malformed store URL {text:?}: {e}"))?;
    let (scheme, path) = ObjectStoreScheme::parse(&url)
        .map_err(|e| format!("unsupported store URL {text:?}: {e}"))?;
    let prefix = path.as_ref().trim_matches('/').to_owned();
    let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
        ObjectStoreScheme::Local => {
            let dir = url
                .to_file_path()
                .map_err(|()| format!("malformed file URL {text:?}: not an absolute path"))?;
            return local(dir);
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
        ObjectStoreScheme::MicrosoftAzure => object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_url(text)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        other => {
            return Err(format!(
                "unsupported store scheme {:?} in {text:?} (use a path, file://, memory://, s3://, gs:// or az://)",
                format!("{other:?}")
            ));
        }
    };
    let store = built.map_err(|e| format!("cannot build store {text:?}: {e}"))?;
    let hint = (scheme == ObjectStoreScheme::AmazonS3
        && std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
        && std::env::var_os("AWS_PROFILE").is_none()
        && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none())
    .then(|| {
        "no S3 credentials in the environment: set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY \
         and AWS_REGION (and AWS_ENDPOINT, AWS_ALLOW_HTTP=true for an S3-compatible server), \
         or run where instance metadata provides credentials"
            .to_owned()
    });
    Ok(StoreUrl {
        store,
        prefix,
        local_root: None,
        hint,
    })
}

/// [`parse`] for commands that only read: a local store directory must already exist.
///
/// # Errors
/// As [`parse`]; a local path that is not an existing directory.
pub fn parse_existing(text: &str) -> Result<StoreUrl, String> {
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
        return Err(format!("no store at {}: not a directory", dir.display()));
    }
    parse(text)
}

fn local(dir: PathBuf) -> Result<StoreUrl, String> {
    let store = replica::Replica::local_store(&dir)
        .map_err(|e| format!("cannot open local store {}: {e}", dir.display()))?;
    Ok(StoreUrl {
        store,
        prefix: String::new(),
        local_root: Some(dir),
        hint: None,
    })
}

impl StoreUrl {
    /// Opens the replica for reading only: no probe, no writes.
    ///
    /// # Errors
    /// The replica's error, as one line.
    pub fn open_read_only(&self, settings: replica::Settings) -> Result<replica::Replica, String> {
        replica::Replica::open_read_only(self.store.clone(), &self.prefix, settings)
            .map_err(|e| format!("cannot open store: {}", crate::chain(&e)))
    }

    /// Opens the replica over this store (runs the create-only probe).
    ///
    /// # Errors
    /// The replica's open error, as one line.
    pub async fn open(&self, settings: replica::Settings) -> Result<replica::Replica, String> {
        replica::Replica::open(self.store.clone(), &self.prefix, settings)
            .await
            .map_err(|e| match &self.hint {
                Some(hint) => format!("cannot open store: {hint} ({})", crate::chain(&e)),
                None => format!("cannot open store: {}", crate::chain(&e)),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_and_unsupported_urls_are_refused() {
        assert!(parse("").is_err());
        assert!(parse("s3://").is_err());
        assert!(parse("ftp://host/x").is_err());
    }

    #[test]
    fn memory_url_keeps_its_path_as_prefix() -> Result<(), String> {
        let s = parse("memory:///prod/eu")?;
        assert_eq!(s.prefix, "prod/eu");
        Ok(())
    }
}
