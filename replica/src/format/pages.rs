//! Page 1 and page-size rules of the SQLite file format
//! (<https://sqlite.org/fileformat2.html#the_database_header>), in one place: every image
//! this crate ships, hydrates or hashes is read with them.

/// The first 16 bytes of every SQLite database file.
pub(crate) const MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Bytes of the database header at the start of page 1 (the B-tree page header follows it).
pub(crate) const HEADER_BYTES: usize = 100;

/// The smallest database image this crate accepts: one page of the smallest size.
pub(crate) const MIN_PAGE_SIZE: u32 = 512;

/// The largest page size SQLite supports.
pub(crate) const MAX_PAGE_SIZE: u32 = 65536;

/// True for a page size SQLite can use: a power of two in 512..=65536 bytes.
pub(crate) fn valid_page_size(page_size: u32) -> bool {
    (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) && page_size.is_power_of_two()
}

/// True when `image` starts with a database header (magic and the full 100 bytes).
pub(crate) fn has_header(image: &[u8]) -> bool {
    image.len() >= HEADER_BYTES && image[..16] == MAGIC[..]
}

/// Page size recorded in a database header (bytes 16–17, big-endian; 1 means 65536), or
/// `None` when it is not a valid page size.
pub(crate) fn image_page_size(image: &[u8]) -> Option<u32> {
    let raw = u32::from(u16::from_be_bytes([*image.get(16)?, *image.get(17)?]));
    let page_size = if raw == 1 { MAX_PAGE_SIZE } else { raw };
    valid_page_size(page_size).then_some(page_size)
}

/// Puts page 1 (or a whole image starting with it) in canonical form: the file format
/// read/write version bytes 18–19 set to 1, rollback-journal mode. Every image this crate
/// ships, hashes or installs is canonical, so a hydrated file never expects a `-wal` file it
/// does not have, and a page 1 hashes the same whatever journal mode the writer used. Bytes
/// that are not a database header are left alone.
pub(crate) fn canonical_page1(page: &mut [u8]) {
    if has_header(page) {
        page[18] = 1;
        page[19] = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_are_powers_of_two_from_512_to_65536() {
        for ok in [512, 1024, 4096, 65536] {
            assert!(valid_page_size(ok), "{ok}");
        }
        for bad in [0, 1, 256, 1000, 131072] {
            assert!(!valid_page_size(bad), "{bad}");
        }
    }

    #[test]
    fn header_page_size_one_means_65536_and_page1_is_made_rollback_mode() {
        let mut img = vec![0u8; 512];
        img[..16].copy_from_slice(MAGIC);
        img[16..18].copy_from_slice(&1u16.to_be_bytes());
        img[18] = 2;
        img[19] = 2;
        assert_eq!(image_page_size(&img), Some(65536));
        canonical_page1(&mut img);
        assert_eq!(&img[18..20], &[1, 1]);
        img[16..18].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(image_page_size(&img), None);
        let mut not_db = vec![7u8; 512];
        canonical_page1(&mut not_db);
        assert_eq!(not_db, vec![7u8; 512]);
    }
}
