//! Databases the delta cases build, and deltas between their images.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::ObjectStore;
use rusqlite::{Connection, MAIN_DB};

use crate::format::pages::{canonical_page1, image_page_size};
use crate::{Claim, Delta, Error, OrgId, Replica, Shipped, Snapshot};

/// An in-memory database of 1 KiB pages whose exact image is read with `serialize`.
pub(super) struct Db(pub(super) Connection);

impl Db {
    /// Table `t(id INTEGER PRIMARY KEY, v BLOB)`, empty.
    pub(super) fn new() -> rusqlite::Result<Db> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(
            "PRAGMA page_size = 1024; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);",
        )?;
        Ok(Db(conn))
    }

    /// A database holding exactly `image`.
    pub(super) fn from_image(image: &[u8]) -> rusqlite::Result<Db> {
        let mut conn = Connection::open_in_memory()?;
        conn.deserialize_read_exact(MAIN_DB, image, image.len(), false)?;
        Ok(Db(conn))
    }

    pub(super) fn exec(&self, q: &str) -> rusqlite::Result<()> {
        self.0.execute_batch(q)
    }

    /// The canonical image (page 1 in rollback-journal form, as installed files are).
    pub(super) fn image(&mut self) -> rusqlite::Result<Vec<u8>> {
        let mut img = self.0.serialize(MAIN_DB)?.to_vec();
        canonical_page1(&mut img);
        Ok(img)
    }
}

/// The pages of `next` that differ from `prev`, as a delta to `next`'s size.
///
/// # Errors
/// [`Error::InvalidDelta`] when `next` is not an image.
pub(super) fn diff(prev: &[u8], next: &[u8], commit: u64) -> Result<Delta, Error> {
    diff_keeping(prev, next, commit, |_| true)
}

/// As [`diff`], keeping only the changed pages `keep` accepts (a caller that misses pages).
///
/// # Errors
/// [`Error::InvalidDelta`] when `next` is not an image.
pub(super) fn diff_keeping(
    prev: &[u8],
    next: &[u8],
    commit: u64,
    keep: impl Fn(u32) -> bool,
) -> Result<Delta, Error> {
    let ps = image_page_size(next).ok_or_else(|| Error::InvalidDelta {
        reason: "the new image has no page size".into(),
    })? as usize;
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(ps).enumerate() {
        let pgno = i as u32 + 1;
        if prev.get(i * ps..(i + 1) * ps) != Some(page) && keep(pgno) {
            pages.insert(pgno, page.to_vec());
        }
    }
    Delta::new(ps as u32, (next.len() / ps) as u32, pages, commit)
}

/// The page of `image` numbered `pgno` (1 KiB pages), if it has one: a base for
/// [`Delta::encode_against`].
pub(super) fn page(image: &[u8], pgno: u32) -> Option<&[u8]> {
    let at = (pgno as usize).checked_sub(1)? * 1024;
    image.get(at..at + 1024)
}

/// A writer of org `acme` under a fresh prefix of a store, whose chain starts with a full
/// snapshot of its database: the start of most delta cases.
pub(super) struct Writer {
    pub(super) prefix: String,
    pub(super) replica: Replica,
    pub(super) org: OrgId,
    pub(super) claim: Claim,
    pub(super) db: Db,
    /// The image last shipped.
    pub(super) image: Vec<u8>,
}

impl Writer {
    /// Claims `acme` as writer `writer`, runs `sql` on a fresh [`Db`] and ships its image
    /// as a full snapshot at commit 1.
    pub(super) async fn start(
        store: Arc<dyn ObjectStore>,
        writer: &str,
        sql: &str,
    ) -> Result<Writer, Box<dyn std::error::Error + Send + Sync>> {
        Self::start_with(store, writer, sql, crate::Settings::default()).await
    }

    /// [`Writer::start`] on a replica opened with `settings`.
    pub(super) async fn start_with(
        store: Arc<dyn ObjectStore>,
        writer: &str,
        sql: &str,
        settings: crate::Settings,
    ) -> Result<Writer, Box<dyn std::error::Error + Send + Sync>> {
        let prefix = super::prefix()?;
        let replica = crate::Replica::open(store, &prefix, settings).await?;
        let org = super::org("acme");
        let mut claim = replica.claim(&org, writer, false).await?;
        let mut db = Db::new()?;
        db.exec(sql)?;
        let image = db.image()?;
        replica
            .ship(&mut claim, Snapshot::from_bytes(image.clone(), 1))
            .await?;
        Ok(Writer {
            prefix,
            replica,
            org,
            claim,
            db,
            image,
        })
    }

    /// Runs `sql` and ships the pages it changed as a delta at `commit`.
    pub(super) async fn ship_change(
        &mut self,
        sql: &str,
        commit: u64,
    ) -> Result<Shipped, Box<dyn std::error::Error + Send + Sync>> {
        self.db.exec(sql)?;
        let next = self.db.image()?;
        let shipped = self
            .replica
            .ship_delta(&mut self.claim, diff(&self.image, &next, commit)?)
            .await?;
        self.image = next;
        Ok(shipped)
    }
}
