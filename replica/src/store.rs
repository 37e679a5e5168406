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

    /// The bytes of the object at `path`, at most `max` of them; `None` when it does not
    /// exist. A body above `max` is refused as it streams in, so a store that lies about an
    /// object (or an object crafted to be huge) cannot make this process hold more than
    /// `max` bytes for it.
    ///
    /// # Errors
    /// [`Error::Corrupt`] above `max`; [`Error::Store`].
    pub(crate) async fn get_bytes(&self, path: &Path, max: u64) -> Result<Option<Bytes>, Error> {
        Ok(self.get_capped(path, max).await?.map(|(bytes, _)| bytes))
    }

    /// [`Store::get_bytes`] with the object's metadata (size, ETag) as the store gave it.
    ///
    /// # Errors
    /// As [`Store::get_bytes`].
    pub(crate) async fn get_capped(
        &self,
        path: &Path,
        max: u64,
    ) -> Result<Option<(Bytes, object_store::ObjectMeta)>, Error> {
        use futures::StreamExt;
        let too_big = |what: String| Error::corrupt(path.as_ref(), what);
        let got = match self.object.get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store("get", path, e)),
        };
        if got.meta.size > max {
            return Err(too_big(format!(
                "{} bytes, at most {max} expected",
                got.meta.size
            )));
        }
        let meta = got.meta.clone();
        let mut stream = got.into_stream();
        // The size the store gave, already under `max`: one allocation for an honest store.
        let mut out = Vec::with_capacity(usize::try_from(meta.size).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(Error::store("get", path, e)),
            };
            if (out.len() + chunk.len()) as u64 > max {
                return Err(too_big(format!("more than the {max} bytes expected")));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Some((Bytes::from(out), meta)))
    }
}
