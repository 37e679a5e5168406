//! Reading the commit sequence out of captured pages (I13): a capture proves from its own
//! bytes which commits it holds, instead of trusting the writer's word.
//!
//! The sequence lives in a one-row table `(id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER)`
//! (the embedder names it; `idem-org` uses `idem_org_commit`), so its root page is a table B-tree leaf with one cell
//! (<https://sqlite.org/fileformat2.html#b_tree_pages>): the row's `id` is the rowid (0) and
//! its record is `(NULL, n)` — `id INTEGER PRIMARY KEY` is stored as NULL in the record.

/// Reads `n` from the root page `page` (number `pgno`, so page 1 skips the file header).
///
/// # Errors
/// A description of what in the page is not the counter row.
pub(crate) fn commit_counter(page: &[u8], pgno: u32) -> Result<u64, String> {
    let h = if pgno == 1 {
        crate::format::pages::HEADER_BYTES
    } else {
        0
    };
    let byte = |i: usize| page.get(i).copied().ok_or("page too short");
    let be16 = |i: usize| -> Result<usize, &str> {
        Ok(usize::from(byte(i)?) << 8 | usize::from(byte(i + 1)?))
    };
    if byte(h)? != 0x0d {
        return Err(format!("page {pgno} is not a table leaf"));
    }
    if be16(h + 3)? != 1 {
        return Err(format!("page {pgno} does not hold exactly one row"));
    }
    let mut at = be16(h + 8)?;
    let (_payload, n) = varint(page, at)?;
    at += n;
    let (rowid, n) = varint(page, at)?;
    at += n;
    if rowid != 0 {
        return Err(format!(
            "page {pgno} holds row {rowid}, not the counter row"
        ));
    }
    let (header_len, n) = varint(page, at)?;
    let mut types = at + n;
    let body = at + usize::try_from(header_len).map_err(|e| e.to_string())?;
    let (id_type, n) = varint(page, types)?;
    types += n;
    if id_type != 0 {
        return Err(format!(
            "page {pgno}: the counter row's id is not its rowid"
        ));
    }
    let (n_type, _) = varint(page, types)?;
    let width = match n_type {
        8 => return Ok(0),
        9 => return Ok(1),
        1..=4 => n_type as usize,
        5 => 6,
        6 => 8,
        t => return Err(format!("page {pgno}: the counter has serial type {t}")),
    };
    let bytes = page
        .get(body..body + width)
        .ok_or("page too short for the counter")?;
    // Big-endian two's complement of `width` bytes.
    let mut v: i64 = if bytes[0] & 0x80 != 0 { -1 } else { 0 };
    for b in bytes {
        v = (v << 8) | i64::from(*b);
    }
    u64::try_from(v).map_err(|_| format!("page {pgno}: negative commit counter {v}"))
}

/// SQLite's varint: 1-9 bytes, big-endian, 7 bits per byte, all 8 bits in the ninth.
fn varint(page: &[u8], at: usize) -> Result<(u64, usize), String> {
    let mut v = 0u64;
    for i in 0..9 {
        let b = *page.get(at + i).ok_or("varint past the page end")?;
        if i == 8 {
            return Ok(((v << 8) | u64::from(b), 9));
        }
        v = (v << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err("varint".into())
}

#[cfg(test)]
mod tests {
    use super::commit_counter;
    use rusqlite::{Connection, MAIN_DB};

    fn counter_page(n: i64) -> Result<(Vec<u8>, u32), Box<dyn std::error::Error>> {
        let mut conn = Connection::open_in_memory()?;
        conn.execute_batch(
            "CREATE TABLE idem_org_commit (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
             INSERT INTO idem_org_commit (id, n) VALUES (0, 0);",
        )?;
        conn.execute("UPDATE idem_org_commit SET n = ?1", [n])?;
        let root: u32 = conn.query_row(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'idem_org_commit'",
            [],
            |r| r.get(0),
        )?;
        let image = conn.serialize(MAIN_DB)?;
        let ps = 4096usize;
        let at = (root as usize - 1) * ps;
        Ok((image[at..at + ps].to_vec(), root))
    }

    #[test]
    fn reads_every_width_of_the_counter() -> Result<(), Box<dyn std::error::Error>> {
        for n in [
            0i64,
            1,
            2,
            127,
            128,
            40_000,
            1 << 23,
            1 << 31,
            1 << 40,
            i64::MAX,
        ] {
            let (page, root) = counter_page(n)?;
            assert_eq!(commit_counter(&page, root)?, n as u64, "n = {n}");
        }
        Ok(())
    }

    #[test]
    fn refuses_a_page_that_is_not_the_counter() -> Result<(), Box<dyn std::error::Error>> {
        let (mut page, root) = counter_page(7)?;
        assert!(commit_counter(&vec![0u8; 4096], root).is_err());
        page[0] = 0x05; // an interior page
        assert!(commit_counter(&page, root).is_err());
        Ok(())
    }
}
