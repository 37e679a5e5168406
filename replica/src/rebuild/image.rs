//! A database image being rebuilt: in memory (a `Vec<u8>`, for small images and tests) or in
//! a file (hydrate, restore, verify), so that memory is bounded by settings, not by the
//! database. Deltas apply through [`PageImage`] page by page whichever it is.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::Error;
use crate::live::Durability;

/// Bytes of an image addressed by offset: what a delta reads and writes when it applies.
pub(crate) trait PageImage {
    /// Sets the image's length in bytes (a grown tail reads as zeros).
    ///
    /// # Errors
    /// [`Error::Io`] for a file.
    fn set_len(&mut self, bytes: u64) -> Result<(), Error>;
    /// Reads `buf.len()` bytes at `at`, which must lie within the image.
    ///
    /// # Errors
    /// [`Error::Io`] for a file; [`Error::Corrupt`] naming `object` outside the image.
    fn read_at(&mut self, object: &str, at: u64, buf: &mut [u8]) -> Result<(), Error>;
    /// Writes `buf` at `at`, which must lie within the image.
    ///
    /// # Errors
    /// As [`PageImage::read_at`].
    fn write_at(&mut self, object: &str, at: u64, buf: &[u8]) -> Result<(), Error>;
}

fn outside(object: &str, at: u64, len: usize) -> Error {
    Error::corrupt(object, format!("{len} bytes at {at} lie outside the image"))
}

impl PageImage for Vec<u8> {
    fn set_len(&mut self, bytes: u64) -> Result<(), Error> {
        let n = usize::try_from(bytes).map_err(|_| outside("image", bytes, 0))?;
        self.resize(n, 0);
        Ok(())
    }

    fn read_at(&mut self, object: &str, at: u64, buf: &mut [u8]) -> Result<(), Error> {
        let range = range(object, at, buf.len(), self.len())?;
        buf.copy_from_slice(&self[range]);
        Ok(())
    }

    fn write_at(&mut self, object: &str, at: u64, buf: &[u8]) -> Result<(), Error> {
        let range = range(object, at, buf.len(), self.len())?;
        self[range].copy_from_slice(buf);
        Ok(())
    }
}

fn range(object: &str, at: u64, len: usize, size: usize) -> Result<std::ops::Range<usize>, Error> {
    let start = usize::try_from(at).map_err(|_| outside(object, at, len))?;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start..end),
        _ => Err(outside(object, at, len)),
    }
}

/// Bytes of small writes (pages) a [`FileImage`] holds before writing them to its file.
const DIRTY_LIMIT: usize = 16 << 20;

/// Writes at most this long are held as pages; longer ones (segments) go to the file.
const PAGE_WRITE_MAX: usize = 64 << 10;

/// An image in a file of its own (a temp file beside an install's destination, or in a
/// scratch directory): written through positioned I/O, so the OS page cache, not this
/// process, holds what is not being changed. Page writes (a delta chain's) are held in a
/// bounded map until [`FileImage::sync`] or [`DIRTY_LIMIT`], so a page rewritten by many
/// deltas reaches the file once. Read it through another handle only after `sync`.
#[derive(Debug)]
pub(crate) struct FileImage {
    file: File,
    path: PathBuf,
    len: u64,
    dirty: BTreeMap<u64, Vec<u8>>,
    dirty_bytes: usize,
}

impl FileImage {
    /// Creates the file at `path`, which must not exist.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(crate) fn create(path: &Path) -> Result<FileImage, Error> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(FileImage {
            file,
            path: path.to_path_buf(),
            len: 0,
            dirty: BTreeMap::new(),
            dirty_bytes: 0,
        })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the held pages and flushes the file to stable storage.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(crate) fn sync(&mut self) -> Result<(), Error> {
        self.finish(Durability::Synced)
    }

    /// Writes the held pages; with [`Durability::Synced`], flushes the file to stable
    /// storage too (a [`Durability::Volatile`] install needs its bytes in the page cache
    /// only).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(crate) fn finish(&mut self, durability: Durability) -> Result<(), Error> {
        self.flush()?;
        match durability {
            Durability::Synced => self.file.sync_all().map_err(|e| Error::io(&self.path, e)),
            Durability::Volatile => Ok(()),
        }
    }

    /// Writes the held pages to the file, in offset order.
    fn flush(&mut self) -> Result<(), Error> {
        for (at, page) in std::mem::take(&mut self.dirty) {
            self.file
                .write_all_at(&page, at)
                .map_err(|e| Error::io(&self.path, e))?;
        }
        self.dirty_bytes = 0;
        Ok(())
    }

    /// True when a held write overlaps `at..at + len` other than exactly at `at` with `len`.
    fn overlaps_unaligned(&self, at: u64, len: usize) -> bool {
        let end = at + len as u64;
        self.dirty
            .range(..end)
            .next_back()
            .is_some_and(|(k, p)| (*k != at || p.len() != len) && k + p.len() as u64 > at)
            || self
                .dirty
                .range(at.saturating_sub(PAGE_WRITE_MAX as u64)..at)
                .any(|(k, p)| k + p.len() as u64 > at)
    }

    /// Closes and deletes the file (a scratch image no longer needed).
    pub(crate) fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    fn check(&self, object: &str, at: u64, len: usize) -> Result<(), Error> {
        match at.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(outside(object, at, len)),
        }
    }
}

impl PageImage for FileImage {
    fn set_len(&mut self, bytes: u64) -> Result<(), Error> {
        // Every delta sets the size it leads to, usually the same: a truncate to the same
        // size still costs the file system a journal transaction.
        if bytes == self.len {
            return Ok(());
        }
        self.flush()?;
        self.file
            .set_len(bytes)
            .map_err(|e| Error::io(&self.path, e))?;
        self.len = bytes;
        Ok(())
    }

    fn read_at(&mut self, object: &str, at: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.check(object, at, buf.len())?;
        if let Some(page) = self.dirty.get(&at).filter(|p| p.len() == buf.len()) {
            buf.copy_from_slice(page);
            return Ok(());
        }
        if self.overlaps_unaligned(at, buf.len()) {
            self.flush()?;
        }
        self.file
            .read_exact_at(buf, at)
            .map_err(|e| Error::io(&self.path, e))
    }

    fn write_at(&mut self, object: &str, at: u64, buf: &[u8]) -> Result<(), Error> {
        self.check(object, at, buf.len())?;
        if self.overlaps_unaligned(at, buf.len()) {
            self.flush()?;
        }
        if buf.len() > PAGE_WRITE_MAX {
            return self
                .file
                .write_all_at(buf, at)
                .map_err(|e| Error::io(&self.path, e));
        }
        match self.dirty.get_mut(&at) {
            Some(page) => page.copy_from_slice(buf),
            None => {
                self.dirty.insert(at, buf.to_vec());
                self.dirty_bytes += buf.len();
            }
        }
        if self.dirty_bytes > DIRTY_LIMIT {
            self.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_and_a_vec_read_and_write_alike_and_refuse_outside_ranges() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(|e| Error::io(Path::new("tmp"), e))?;
        let mut file = FileImage::create(&dir.path().join("img"))?;
        let mut mem: Vec<u8> = Vec::new();
        let images: [&mut dyn PageImage; 2] = [&mut file, &mut mem];
        for img in images {
            img.set_len(8)?;
            img.write_at("x", 2, b"abc")?;
            let mut buf = [0u8; 6];
            img.read_at("x", 1, &mut buf)?;
            assert_eq!(&buf, b"\0abc\0\0");
            assert!(matches!(
                img.write_at("x", 6, b"abc"),
                Err(Error::Corrupt { .. })
            ));
            assert!(matches!(
                img.read_at("x", u64::MAX, &mut buf),
                Err(Error::Corrupt { .. })
            ));
        }
        Ok(())
    }

    #[test]
    fn held_page_writes_reach_the_file_at_sync_and_overlapping_reads_see_them() -> Result<(), Error>
    {
        let dir = tempfile::tempdir().map_err(|e| Error::io(Path::new("tmp"), e))?;
        let path = dir.path().join("img");
        let mut file = FileImage::create(&path)?;
        file.set_len(4 * 512)?;
        file.write_at("x", 512, &[1u8; 512])?;
        file.write_at("x", 512, &[2u8; 512])?;
        file.write_at("x", 1024, &[3u8; 512])?;
        // A read straddling two held pages sees both.
        let mut buf = vec![0u8; 1024];
        file.read_at("x", 512, &mut buf)?;
        assert!(buf[..512].iter().all(|b| *b == 2) && buf[512..].iter().all(|b| *b == 3));
        // A long write over a held page replaces it.
        file.write_at("x", 0, &vec![9u8; 2048])?;
        file.read_at("x", 512, &mut buf[..512])?;
        assert!(buf[..512].iter().all(|b| *b == 9));
        file.write_at("x", 1536, &[4u8; 512])?;
        file.sync()?;
        let on_disk = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        assert!(on_disk[..1536].iter().all(|b| *b == 9) && on_disk[1536..].iter().all(|b| *b == 4));
        Ok(())
    }
}
