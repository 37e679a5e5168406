//! Unit tests of delta encoding, the body format and applying bodies.

use std::collections::BTreeMap;

use super::Delta;
use crate::Error;
use crate::format::body::{DeltaBody, PATCH, RUNS, XOR};
use crate::format::checksum::PageHashes;
use crate::format::pages::{MAGIC, canonical_page1};

fn image(pages: u32, fill: u8) -> Vec<u8> {
    let mut img = vec![fill; pages as usize * 512];
    img[..16].copy_from_slice(MAGIC);
    img[16..18].copy_from_slice(&512u16.to_be_bytes());
    canonical_page1(&mut img[..512]);
    img
}

/// Applies `d` as hydrate does (encoded, parsed, growth-checked) and as a ship does
/// (`change` then `apply_change`); both must equal hashing the result from scratch.
fn apply_both_ways(d: &Delta, img: &mut Vec<u8>, hashes: &mut PageHashes) -> Result<(), Error> {
    let mut shipped = hashes.clone();
    shipped.apply_change(d.hash_change(&shipped));
    let body = d.body();
    DeltaBody::parse("t", &body)?.apply(img, hashes)?;
    assert_eq!(*hashes, PageHashes::of_image("t", img)?);
    assert_eq!(shipped, *hashes);
    Ok(())
}

#[test]
fn incremental_checksum_equals_recomputed_after_grow_change_and_shrink() -> Result<(), Error> {
    let mut img = image(4, 7);
    let mut hashes = PageHashes::of_image("t", &img)?;
    let mut pages = BTreeMap::new();
    pages.insert(2, vec![9u8; 512]);
    pages.insert(6, vec![3u8; 512]);
    // Grows to 6 pages; page 5 is carried as the zeros SQLite reads there.
    let mut d = Delta::new(512, 6, pages, 1)?;
    d.fill_growth(4);
    apply_both_ways(&d, &mut img, &mut hashes)?;
    assert_eq!(img.len(), 6 * 512);
    let shrink = Delta::new(512, 3, BTreeMap::new(), 2)?;
    apply_both_ways(&shrink, &mut img, &mut hashes)?;
    assert_eq!(img.len(), 3 * 512);
    Ok(())
}

#[test]
fn a_delta_that_grows_without_carrying_the_pages_is_refused() -> Result<(), Error> {
    let img = image(2, 7);
    let hashes = PageHashes::of_image("t", &img)?;
    let body = Delta::new(512, 4, BTreeMap::from([(4, vec![1u8; 512])]), 1)?.body();
    let (mut img2, mut hashes2) = (img.clone(), hashes.clone());
    let applied = DeltaBody::parse("t", &body)?.apply(&mut img2, &mut hashes2);
    assert!(matches!(applied, Err(Error::Corrupt { .. })), "{applied:?}");
    // Refused before anything changed.
    assert_eq!((img2, hashes2), (img, hashes));
    Ok(())
}

/// Deterministic pseudo-random bytes, so pages do not compress on their own.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = idem_base::SeededRng::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// A canonical 3-page image of noise.
fn noisy_image(seed: u64) -> Vec<u8> {
    let mut img = noise(seed, 3 * 512);
    img[..16].copy_from_slice(MAGIC);
    img[16..18].copy_from_slice(&512u16.to_be_bytes());
    canonical_page1(&mut img[..512]);
    img
}

/// Parses `body` and applies it to `img`, as hydrate does.
fn apply_body(body: &[u8], img: &[u8]) -> Result<Vec<u8>, Error> {
    let (mut img, mut hashes) = (img.to_vec(), PageHashes::of_image("x", img)?);
    DeltaBody::parse("x", body)?.apply(&mut img, &mut hashes)?;
    assert_eq!(hashes, PageHashes::of_image("x", &img)?);
    Ok(img)
}

#[test]
fn patch_pages_decode_against_the_base_image_even_when_content_moved() -> Result<(), Error> {
    let base = noisy_image(7);
    // Page 3: 40 new bytes inserted in the middle, shifting the rest (a B-tree insert).
    let mut new3 = base[1024..1224].to_vec();
    new3.extend_from_slice(&noise(99, 40));
    new3.extend_from_slice(&base[1224..1536 - 40]);
    let mut new1 = base[..512].to_vec();
    new1[200] = 9;
    let pages = BTreeMap::from([(1, new1.clone()), (3, new3.clone())]);
    let d = Delta::new(512, 3, pages, 2)?.encode_against(|p| {
        let at = (p as usize - 1) * 512;
        base.get(at..at + 512)
    });
    // One byte changed in place: runs. Content shifted: a patch, about the 40 new bytes
    // (a XOR of the shifted page would be noise).
    assert_eq!(d.encoded.get(&1).map(|e| e.kind), Some(RUNS));
    assert_eq!(d.wrong_base(&PageHashes::of_image("x", &base)?), None);
    assert_eq!(
        d.wrong_base(&PageHashes::of_image("x", &noisy_image(8))?),
        Some(1)
    );
    assert_eq!(d.encoded.get(&3).map(|e| e.kind), Some(PATCH));
    let body = d.body();
    let stored = zstd::bulk::compress(&body, 3).map_err(|e| Error::corrupt("x", e))?;
    assert!(stored.len() < 200, "{} bytes stored", stored.len());
    let back = apply_body(&body, &base)?;
    assert_eq!(&back[1024..], &new3[..]);
    assert_eq!(&back[..512], &new1[..]);
    // Against another base the result differs (or does not decode); the checksum after
    // the delta catches the first case.
    match apply_body(&body, &noisy_image(8)) {
        Ok(other) => assert_ne!(&other[1024..], &new3[..]),
        Err(e) => assert!(matches!(e, Error::Corrupt { .. }), "{e}"),
    }
    Ok(())
}

#[test]
fn runs_round_trip_sparse_dense_and_page_long_changes() -> Result<(), Error> {
    // 64 KiB pages: a change longer than a u16 run, sparse bytes, a rewritten value.
    let ps = 65536usize;
    let mut base = noise(11, 2 * ps);
    base[..16].copy_from_slice(MAGIC);
    base[16..18].copy_from_slice(&1u16.to_be_bytes());
    canonical_page1(&mut base[..ps]);
    let mut new2 = base[ps..].to_vec();
    for (i, b) in new2.iter_mut().enumerate() {
        if i % 9 == 0 || (1000..1512).contains(&i) {
            *b ^= 0x33;
        }
    }
    let mut new1 = base[..ps].to_vec();
    new1[100..100 + 65000].iter_mut().for_each(|b| *b = !*b);
    let pages = BTreeMap::from([(1, new1.clone()), (2, new2.clone())]);
    let d = Delta::new(65536, 2, pages, 2)?.encode_against(|p| {
        let at = (p as usize - 1) * ps;
        base.get(at..at + ps)
    });
    let back = apply_body(&d.body(), &base)?;
    assert_eq!(&back[..ps], &new1[..]);
    assert_eq!(&back[ps..], &new2[..]);
    // A one-byte change costs a run, not a page.
    let mut small = base[ps..].to_vec();
    small[5] ^= 1;
    let d = Delta::new(65536, 2, BTreeMap::from([(2, small.clone())]), 3)?.encode_against(|p| {
        let at = (p as usize - 1) * ps;
        base.get(at..at + ps)
    });
    assert_eq!(
        d.encoded.get(&2).map(|e| (e.kind, e.bytes.len())),
        Some((RUNS, 5))
    );
    assert_eq!(&apply_body(&d.body(), &base)?[ps..], &small[..]);
    Ok(())
}

#[test]
fn crafted_runs_are_corrupt_not_panics() -> Result<(), Error> {
    let base = noisy_image(4);
    let record = |runs: &[u8]| {
        let mut body = Vec::new();
        for v in [512u32, 3, 1, 2] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.push(RUNS);
        body.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        body.extend_from_slice(runs);
        body
    };
    // Past the page's end, a length past the record, a header cut short, a run as long
    // as the page (the record would not be shorter than a page).
    let past = [0xff, 0x01, 2, 0, 1, 1];
    let long = [0, 0, 200, 0, 1, 2, 3];
    let mut full = vec![0, 0, 0, 2];
    full.extend_from_slice(&[1; 512]);
    for runs in [&past[..], &long[..], &[1, 2, 3][..], &full[..]] {
        match apply_body(&record(runs), &base) {
            Err(Error::Corrupt { .. }) => {}
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn xor_bodies_from_earlier_versions_still_decode() -> Result<(), Error> {
    let base = noisy_image(3);
    let mut new2 = base[512..1024].to_vec();
    new2[10] ^= 0xff;
    let mut body = Vec::new();
    for v in [512u32, 3, 1, 2] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.push(XOR);
    body.extend(new2.iter().zip(&base[512..1024]).map(|(n, o)| n ^ o));
    let back = apply_body(&body, &base)?;
    assert_eq!(&back[512..1024], &new2[..]);
    Ok(())
}

#[test]
fn crafted_patches_are_corrupt_not_panics() -> Result<(), Error> {
    let base = noisy_image(5);
    let record = |len: u32, frame: &[u8]| {
        let mut body = Vec::new();
        for v in [512u32, 3, 1, 2] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.push(PATCH);
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(frame);
        body
    };
    // A length past the body, u32::MAX, a patch as long as a page, garbage, an empty
    // frame, and a frame of a page too big: each a typed error.
    let big = zstd::bulk::compress(&noise(1, 1024), 3).map_err(|e| Error::corrupt("x", e))?;
    let short = zstd::bulk::compress(&noise(1, 100), 3).map_err(|e| Error::corrupt("x", e))?;
    for body in [
        record(100, &[1, 2, 3]),
        record(u32::MAX, &[1, 2, 3]),
        record(512, &[0; 512]),
        record(3, &[1, 2, 3]),
        record(0, &[]),
        record(big.len() as u32, &big),
        record(short.len() as u32, &short),
    ] {
        match apply_body(&body, &base) {
            Err(Error::Corrupt { .. }) => {}
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    // Input the zstd decoder takes but the encoder never writes, here decoding to exactly
    // the right page: two concatenated frames, a skippable frame before a real one.
    let mut want = noise(9, 64);
    want.resize(512, 0);
    let half = |r: std::ops::Range<usize>| zstd::bulk::compress(&want[r], 3);
    let mut two = half(0..256).map_err(|e| Error::corrupt("x", e))?;
    two.extend(half(256..512).map_err(|e| Error::corrupt("x", e))?);
    let mut skippable = 0x184D_2A50u32.to_le_bytes().to_vec();
    skippable.extend_from_slice(&4u32.to_le_bytes());
    skippable.extend_from_slice(&[0; 4]);
    skippable.extend(zstd::bulk::compress(&want, 3).map_err(|e| Error::corrupt("x", e))?);
    for frames in [two, skippable] {
        match apply_body(&record(frames.len() as u32, &frames), &base) {
            Err(Error::Corrupt { .. }) => {}
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn a_grown_page_must_be_carried_whole() -> Result<(), Error> {
    // A 9-byte patch against the zeros past the end would stand for a whole page: the
    // body must pay for the pages it adds.
    let base = noisy_image(6);
    let zeros = zstd::bulk::compress(&[0u8; 512], 1).map_err(|e| Error::corrupt("x", e))?;
    let mut body = Vec::new();
    for v in [512u32, 4, 1, 4] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.push(PATCH);
    body.extend_from_slice(&(zeros.len() as u32).to_le_bytes());
    body.extend_from_slice(&zeros);
    assert!(matches!(
        apply_body(&body, &base),
        Err(Error::Corrupt { .. })
    ));
    Ok(())
}

#[test]
fn body_round_trips_and_rejects_bad_shapes() -> Result<(), Error> {
    let mut pages = BTreeMap::new();
    pages.insert(1, image(1, 5));
    pages.insert(3, vec![4u8; 512]);
    let d = Delta::new(512, 3, pages, 9)?;
    let body = d.body();
    let parsed = DeltaBody::parse("x", &body)?;
    assert_eq!(
        (
            parsed.page_size(),
            parsed.db_pages(),
            parsed.changed_pages()
        ),
        (512, 3, 2)
    );
    assert!(DeltaBody::parse("x", &body[..body.len() - 1]).is_err());
    let mut swapped = body.clone();
    swapped[12..16].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(
        DeltaBody::parse("x", &swapped),
        Err(Error::Corrupt { .. })
    ));
    let mut encoding = body.clone();
    encoding[16] = 7;
    assert!(matches!(
        DeltaBody::parse("x", &encoding),
        Err(Error::Corrupt { .. })
    ));
    assert!(Delta::new(512, 2, BTreeMap::from([(3, vec![0; 512])]), 1).is_err());
    assert!(Delta::new(500, 2, BTreeMap::new(), 1).is_err());
    Ok(())
}
