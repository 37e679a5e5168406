//! The registry of a short-lived writer (`idem prune`, `idem resolve`): it claims one org at
//! a time, does its work, ships and releases, and keeps its local files in `--data` or, when
//! unset, in a temp dir that lives exactly as long as the registry.
//!
//! The local files are a cache, never an authority (I8): each claim hydrates from the store,
//! so a fresh temp dir per run loses nothing.

use std::path::{Path, PathBuf};

use idem_org::Registry;
use idem_org::replica::Replica;
use tempfile::TempDir;

/// A short-lived writer's registry and the data directory under it.
///
/// Field order is drop order: the registry (and its open databases) goes before the temp dir
/// that holds their files is deleted.
pub(crate) struct Scratch {
    /// The registry: one open org at a time.
    pub(crate) registry: Registry,
    /// The temp dir when no `--data` was given; deleted on drop.
    _dir: Option<TempDir>,
}

impl Scratch {
    /// Builds the registry of writer `writer` over `replica`, with its files in `data` or a new
    /// temp dir; `force` claims an org whose lease a live writer holds (fencing it, I7).
    ///
    /// # Errors
    /// The temp dir cannot be created, or the registry refuses the directory.
    pub(crate) fn open(
        data: Option<&Path>,
        replica: Replica,
        writer: String,
        force: bool,
    ) -> Result<Scratch, String> {
        let (dir, path): (Option<TempDir>, PathBuf) = match data {
            Some(d) => (None, d.to_owned()),
            None => {
                let t =
                    tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
                let p = t.path().to_owned();
                (Some(t), p)
            }
        };
        let registry = Registry::builder(&path, replica, writer)
            .settings(idem_org::RegistrySettings {
                force_claim: force,
                max_open_orgs: 1,
                ..idem_org::RegistrySettings::default()
            })
            .build()
            .map_err(|e| crate::chain(&e))?;
        Ok(Scratch {
            registry,
            _dir: dir,
        })
    }
}
