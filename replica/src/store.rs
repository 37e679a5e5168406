//! The shared store handle every layer does its I/O through: the counted object store, the
//! object names under the prefix, the injected failpoints and the read-only switch. Layers
//! hold it by value (it is cheap to clone); it holds no layer.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::format::layout::Layout;
use crate::{Error, FailPoint, Failpoints, OrgId};

/// The object store as every layer sees it; cheap to clone (every field is shared).
#[derive(Clone, Debug)]
pub(crate) struct Store {
    /// The caller's store wrapped in a [`crate::CountedStore`].
    pub(crate) object: Arc<dyn ObjectStore>,
    /// What `object` has counted.
    pub(crate) requests: Arc<crate::counted::Counts>,
    /// Object names under the prefix.
    pub(crate) layout: Layout,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    /// Opened read-only: nothing through this handle writes to the store.
    pub(crate) read_only: bool,
}

impl Store {
    /// Refuses `op` on a read-only handle.
    ///
    /// # Errors
    /// [`Error::ReadOnly`] when the handle was opened read-only.
    pub(crate) fn writable(&self, op: &'static str) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly { op });
        }
        Ok(())
    }

    /// Calls the injected failpoints, if any, at `point` for `org`.
    ///
    /// # Errors
    /// [`Error::Injected`] when the failpoint says so.
    pub(crate) async fn failpoint(&self, point: FailPoint, org: &OrgId) -> Result<(), Error> {
        match &self.failpoints {
            Some(fp) => fp.hit(point, org).await.map_err(|message| Error::Injected {
                point,
                org: org.to_string(),
                message,
            }),
            None => Ok(()),
        }
    }

    /// Every object below `dir` (one LIST, paged by the store).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn list_all(
        &self,
        dir: &Path,
    ) -> Result<Vec<object_store::ObjectMeta>, Error> {
        use futures::TryStreamExt;
        self.object
            .list(Some(dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("list", dir, e))
    }

    /// The bytes of the object at `path`; `None` when it does not exist.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn get_bytes(&self, path: &Path) -> Result<Option<Bytes>, Error> {
        let got = match self.object.get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store("get", path, e)),
        };
        match got.bytes().await {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store("get", path, e)),
        }
    }
}
