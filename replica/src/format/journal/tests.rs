use super::*;

const INSTANCE: &str = "0123456789abcdef0123456789abcdef";

fn run() -> RunName {
    RunName::new(INSTANCE, 3).expect("a valid run name")
}

fn index(org: &str) -> SectionIndex {
    SectionIndex {
        org: org.into(),
        round: 2,
        via: Via::Claim { seq: 7 },
        base: Base {
            seq: 6,
            checksum: "00".into(),
        },
        checksum: "11".into(),
        commit: 9,
        released: false,
        offset: 0,
        len: 0,
        bytes: 0,
        sha256: String::new(),
    }
}

fn frame(org: &str, body: &[u8]) -> SectionFrame {
    SectionFrame {
        index: index(org),
        frame: zstd::bulk::compress(body, 3).expect("zstd compresses"),
        bytes: body.len() as u64,
    }
}

fn batch(slot: u64) -> Result<Vec<u8>, Error> {
    encode(
        JournalHeader {
            run: run(),
            slot,
            nonce: "n".into(),
            floor: 1,
            object: JournalObject::Batch(Batch {
                window: 4,
                retain_below: 1,
                ..Batch::default()
            }),
        },
        vec![frame("acme", &[1u8; 300]), frame("beta", &[2u8; 500])],
    )
}

fn body_of(bytes: &[u8], slot: u64, i: usize) -> Result<Vec<u8>, Error> {
    let header = parse_header("x", bytes, &run(), slot, bytes.len() as u64)?;
    let len = header_len("x", bytes)?;
    let JournalObject::Batch(b) = &header.object else {
        return Err(Error::corrupt("x", "not a batch"));
    };
    let s = &b.sections[i];
    let r = frame_range(len, s);
    section_body(
        "x",
        &run(),
        slot,
        s,
        &bytes[r.start as usize..r.end as usize],
    )
}

#[test]
fn a_batch_reads_back_one_section_at_a_time_only_at_its_own_run_and_slot() -> Result<(), Error> {
    let bytes = batch(5)?;
    assert_eq!(body_of(&bytes, 5, 0)?, vec![1u8; 300]);
    assert_eq!(body_of(&bytes, 5, 1)?, vec![2u8; 500]);
    let other = RunName::new(INSTANCE, 4)?;
    for (run, slot) in [(&other, 5), (&run(), 6)] {
        assert!(matches!(
            parse_header("x", &bytes, run, slot, bytes.len() as u64),
            Err(Error::Corrupt { .. })
        ));
    }
    Ok(())
}

#[test]
fn any_flipped_byte_is_corrupt_or_caught_by_a_section_digest() -> Result<(), Error> {
    let good = batch(5)?;
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x40;
        let caught = body_of(&bad, 5, 0).is_err() || body_of(&bad, 5, 1).is_err();
        assert!(caught, "a flip at byte {i} went unnoticed");
    }
    Ok(())
}

#[test]
fn a_frame_moved_to_another_org_fails_its_digest() -> Result<(), Error> {
    let bytes = batch(5)?;
    let header = parse_header("x", &bytes, &run(), 5, bytes.len() as u64)?;
    let len = header_len("x", &bytes)?;
    let JournalObject::Batch(b) = header.object else {
        return Err(Error::corrupt("x", "not a batch"));
    };
    let r = frame_range(len, &b.sections[0]);
    let frame = &bytes[r.start as usize..r.end as usize];
    let mut moved = b.sections[0].clone();
    moved.org = "beta".into();
    assert!(section_body("x", &run(), 5, &moved, frame).is_err());
    assert!(section_body("x", &run(), 6, &b.sections[0], frame).is_err());
    Ok(())
}

#[test]
fn seals_and_exclusions_carry_no_bytes_after_their_header() -> Result<(), Error> {
    let seal = JournalHeader {
        run: run(),
        slot: 9,
        nonce: "n".into(),
        floor: 8,
        object: JournalObject::Seal(Seal {
            by: "w".into(),
            instance: INSTANCE.into(),
            seal: SealKind::SelfSeal,
            continued: Some(run().next()),
            from: 1,
            retain_below: 4,
        }),
    };
    let mut bytes = encode(seal.clone(), Vec::new())?;
    assert_eq!(
        parse_header("x", &bytes, &run(), 9, bytes.len() as u64)?,
        seal
    );
    bytes.push(0);
    assert!(parse_header("x", &bytes, &run(), 9, bytes.len() as u64).is_err());
    assert!(encode(seal, vec![frame("acme", &[1])]).is_err());
    Ok(())
}

#[test]
fn run_and_slot_names_parse_only_in_their_own_shape() -> Result<(), Error> {
    let name = run().to_string();
    assert_eq!(RunName::parse(&name)?, run());
    assert_eq!(run().next().number(), 4);
    for bad in [
        "0123456789abcdef0123456789abcdef-3",
        "0123456789ABCDEF0123456789abcdef-00000000000000000003",
        "../3456789abcdef0123456789abcdef-00000000000000000003",
        "0123456789abcdef0123456789abcdef00000000000000000003",
    ] {
        assert!(RunName::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_slot_name("00000000000000000012.jnl"), Some(12));
    for bad in [
        "12.jnl",
        "00000000000000000012.json",
        "../0000000000000000012.jnl",
    ] {
        assert_eq!(parse_slot_name(bad), None, "{bad}");
    }
    Ok(())
}

#[test]
fn a_header_claiming_huge_sections_is_refused_before_any_decompression() -> Result<(), Error> {
    let mut header = JournalHeader {
        run: run(),
        slot: 2,
        nonce: "n".into(),
        floor: 1,
        object: JournalObject::Batch(Batch::default()),
    };
    let mut f = frame("acme", &[1u8; 10]);
    f.bytes = MAX_SECTION_BYTES + 1;
    header.object = JournalObject::Batch(Batch::default());
    let bytes = encode(header, vec![f])?;
    assert!(matches!(
        parse_header("x", &bytes, &run(), 2, bytes.len() as u64),
        Err(Error::Corrupt { .. })
    ));
    Ok(())
}
