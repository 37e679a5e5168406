//! Where a full snapshot's pages come from while it streams out: an image in memory, a file,
//! or the writer's database file with the WAL frames a capture read over it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::Error;
use crate::format::pages::{has_header, image_page_size};
use crate::live::{CaptureError, DbState, OwnedFiles};

/// A database image read a range of pages at a time (synchronous: a blocking thread).
pub(crate) trait PageSource: Send {
    /// Page size in bytes.
    fn page_size(&self) -> u32;
    /// Pages in the image.
    fn pages(&self) -> u32;
    /// Fills `buf` (a whole number of pages, within the image) with the pages from `first`
    /// (numbered from 1), as they are in the source (page 1 not yet canonical).
    ///
    /// # Errors
    /// [`Error::Io`]; [`Error::FilesChanged`]-like errors of the source.
    fn read(&mut self, first: u32, buf: &mut [u8]) -> Result<(), Error>;
    /// Called after the last read: fails when the source changed while it was read.
    ///
    /// # Errors
    /// As [`PageSource::read`].
    fn finish(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// The page size and page count of an image whose first bytes are `head`, `len` bytes long.
fn shape(org: &str, head: &[u8], len: u64) -> Result<(u32, u32), Error> {
    let invalid = |reason: &str| Error::InvalidSnapshot {
        org: org.into(),
        reason: reason.into(),
    };
    if !has_header(head) {
        return Err(invalid("not an sqlite database image"));
    }
    let ps = image_page_size(head).ok_or_else(|| invalid("no valid page size in the header"))?;
    if len == 0 || !len.is_multiple_of(u64::from(ps)) {
        return Err(invalid("not a whole number of pages"));
    }
    let pages = u32::try_from(len / u64::from(ps)).map_err(|_| invalid("too many pages"))?;
    Ok((ps, pages))
}

/// An image in memory.
pub(crate) struct MemSource {
    bytes: Arc<Vec<u8>>,
    page_size: u32,
    pages: u32,
}

impl MemSource {
    /// # Errors
    /// [`Error::InvalidSnapshot`] for bytes that are not a database image.
    pub(crate) fn new(org: &str, bytes: Arc<Vec<u8>>) -> Result<MemSource, Error> {
        let (page_size, pages) = shape(org, &bytes, bytes.len() as u64)?;
        Ok(MemSource {
            bytes,
            page_size,
            pages,
        })
    }
}

impl PageSource for MemSource {
    fn page_size(&self) -> u32 {
        self.page_size
    }
    fn pages(&self) -> u32 {
        self.pages
    }
    fn read(&mut self, first: u32, buf: &mut [u8]) -> Result<(), Error> {
        let at = (first as usize - 1) * self.page_size as usize;
        buf.copy_from_slice(&self.bytes[at..at + buf.len()]);
        Ok(())
    }
}

/// A database file nobody writes while it is read (an import's copy, a file being verified).
pub(crate) struct FileSource {
    file: File,
    path: PathBuf,
    page_size: u32,
    pages: u32,
}

impl FileSource {
    /// # Errors
    /// [`Error::Io`]; [`Error::InvalidSnapshot`] for a file that is not a database.
    pub(crate) fn open(org: &str, path: &Path) -> Result<FileSource, Error> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut head = vec![0u8; 100.min(len as usize)];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| Error::io(path, e))?;
        let (page_size, pages) = shape(org, &head, len)?;
        Ok(FileSource {
            file,
            path: path.to_path_buf(),
            page_size,
            pages,
        })
    }
}

impl PageSource for FileSource {
    fn page_size(&self) -> u32 {
        self.page_size
    }
    fn pages(&self) -> u32 {
        self.pages
    }
    fn read(&mut self, first: u32, buf: &mut [u8]) -> Result<(), Error> {
        let at = u64::from(first - 1) * u64::from(self.page_size);
        self.file
            .read_exact_at(buf, at)
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// The writer's database file as a capture left it (`db`), with the committed WAL frames
/// the capture read laid over it: what a full ship publishes, read through the writer's own
/// descriptor, checked unchanged before the first read and after the last (I13).
pub(crate) struct OwnedSource {
    files: Arc<OwnedFiles>,
    db: DbState,
    page_size: u32,
    pages: u32,
    frames: BTreeMap<u32, Vec<u8>>,
    checked: bool,
    org: crate::OrgId,
    round: u64,
}

impl OwnedSource {
    /// `pages` is the database's size in pages after the frames (the file's when the WAL
    /// was empty); `org` and `round` name the writer in errors.
    pub(crate) fn new(
        (files, db): (Arc<OwnedFiles>, DbState),
        (page_size, pages): (u32, u32),
        frames: BTreeMap<u32, Vec<u8>>,
        (org, round): (crate::OrgId, u64),
    ) -> OwnedSource {
        OwnedSource {
            files,
            db,
            page_size,
            pages,
            frames,
            checked: false,
            org,
            round,
        }
    }

    fn changed(&self, e: CaptureError) -> Error {
        match e {
            CaptureError::Io(e) => Error::io(self.files.db_path(), e),
            CaptureError::Foreign(f) => Error::FilesChanged {
                org: self.org.clone(),
                round: self.round,
                reason: f.to_string(),
            },
        }
    }
}

impl PageSource for OwnedSource {
    fn page_size(&self) -> u32 {
        self.page_size
    }
    fn pages(&self) -> u32 {
        self.pages
    }
    fn read(&mut self, first: u32, buf: &mut [u8]) -> Result<(), Error> {
        if !self.checked {
            self.files
                .check_db(self.db)
                .map_err(|f| self.changed(f.into()))?;
            self.checked = true;
        }
        let ps = u64::from(self.page_size);
        let from = u64::from(first - 1) * ps;
        let to = from + buf.len() as u64;
        // Pages past the file's end (grown in the WAL, not checkpointed) read as zeros until
        // a frame gives them content.
        let file_end = self.db.len().min(to);
        buf.fill(0);
        if from < file_end {
            let got = self
                .files
                .read_db(from, file_end)
                .map_err(|e| self.changed(e.into()))?;
            buf[..got.len()].copy_from_slice(&got);
        }
        let last = first + (buf.len() as u64 / ps) as u32;
        for (pgno, page) in self.frames.range(first..last) {
            let at = (u64::from(*pgno - first) * ps) as usize;
            buf[at..at + page.len()].copy_from_slice(page);
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<(), Error> {
        self.files
            .check_db(self.db)
            .map_err(|f| self.changed(f.into()))
    }
}
