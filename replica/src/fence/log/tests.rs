//! Unit tests of the log entry format.

use crate::format::entry::valid_blob_name;
use crate::format::entry::{BlobRef, EntryBody, EntryHeader, MAX_SHIP_WINDOW, Stored};
use crate::{Error, LogEntry};

/// Entries as the format's first writer stored them (a local store written by the code
/// before entries had a header and a body): claim, snapshot, delta, compacted delta (its
/// base is the snapshot, not the previous delta), release, and the next writer's claim.
const WIRE: [&str; 6] = [
    // claim
    r#"{"at_ms":1796090755856,"kind":"claim","nonce":"33c94828a811c6ba09d1dbc09da1467d","round":1,"seq":1,"v":1,"writer":"writer-a"}"#,
    // snapshot
    r#"{"at_ms":1796090755866,"blob":"00000000000000000002-1-f557f2fb407a665b29d4f5eed141d95d.db.zst","bytes":2048,"commit":1,"compressed_bytes":133,"kind":"snapshot","nonce":"56b9d82cc4a8f5cebd5fd1af8c361142","round":1,"seq":2,"sha256":"6403c18ffb9e8f06de732c8338317f8fc83ea21c0e1979f565ca5569304b904b","v":1,"writer":"writer-a"}"#,
    // delta
    r#"{"at_ms":1796090755869,"base":2,"base_checksum":"a97fde908c1e6161","blob":"00000000000000000003-1-c25eb95cc14c60ace4e64406e45c81ab.delta.zst","bytes":1041,"changed_pages":1,"checksum":"1e3f6e4fb83718b1","commit":2,"compressed_bytes":64,"db_pages":2,"kind":"delta","nonce":"62a048e07d4a17b79e52882066eddbca","page_size":1024,"round":1,"seq":3,"sha256":"ebb7d8d373421e8844ca960a90e101746316970a21a4e05d024bbdff71372529","v":1,"writer":"writer-a"}"#,
    // compacted delta
    r#"{"at_ms":1796090755872,"base":2,"base_checksum":"a97fde908c1e6161","blob":"00000000000000000004-1-332adad64b7e14aa6444c0d6c503f790.delta.zst","bytes":1041,"changed_pages":1,"checksum":"c0819f3a3a0d3af4","commit":3,"compressed_bytes":71,"db_pages":2,"kind":"delta","nonce":"b16d8f10f09a6f181c269ec819454033","page_size":1024,"round":1,"seq":4,"sha256":"5748dce7fc278861acffbdac05722103414531a5d8edd1af522a22f1ec1b1467","v":1,"writer":"writer-a"}"#,
    // release
    r#"{"at_ms":1796090755873,"kind":"release","nonce":"f59d2d9dddda6d9b5f11a9418e525786","round":1,"seq":5,"v":1,"writer":"writer-a"}"#,
    // claim of the next round
    r#"{"at_ms":1796090755875,"kind":"claim","nonce":"969e9a0d3074a997394db538557029ce","round":2,"seq":6,"v":1,"writer":"writer-b"}"#,
];

#[test]
fn entries_written_before_the_header_body_split_read_and_write_back_byte_for_byte()
-> Result<(), Error> {
    let kinds: Vec<&str> = WIRE
        .iter()
        .map(|text| LogEntry::decode("fixture", text.as_bytes(), None).map(|e| e.kind_name()))
        .collect::<Result<_, _>>()?;
    assert_eq!(
        kinds,
        ["claim", "snapshot", "delta", "delta", "release", "claim"]
    );
    for (seq, text) in (1..).zip(WIRE) {
        let entry = LogEntry::decode("fixture", text.as_bytes(), Some(seq))?;
        assert_eq!(entry.seq(), seq);
        let again = entry.encode()?;
        assert_eq!(String::from_utf8_lossy(&again), text, "entry {seq}");
    }
    let compacted = LogEntry::decode("fixture", WIRE[3].as_bytes(), None)?;
    assert_eq!(compacted.delta().map(|d| d.base), Some(2));
    assert_eq!(compacted.commit(), Some(3));
    Ok(())
}

fn snap() -> LogEntry {
    LogEntry {
        header: EntryHeader {
            seq: 7,
            round: 2,
            writer: "w".into(),
            nonce: "00".into(),
            at_ms: 5,
            pipeline: None,
            journal: None,
        },
        body: EntryBody::Snapshot(Stored {
            blob: "00000000000000000007-2-00.db.zst".into(),
            sha256: "ab".into(),
            bytes: 10,
            compressed_bytes: 4,
            commit: 3,
        }),
    }
}

#[test]
fn entry_round_trips_with_version() -> Result<(), Error> {
    let bytes = snap().encode()?;
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains("\"v\":1") && text.contains("\"kind\":\"snapshot\""),
        "{text}"
    );
    assert_eq!(LogEntry::decode("x", &bytes, Some(7))?, snap());
    Ok(())
}

#[test]
fn unknown_version_or_kind_is_refused() {
    let v6 = br#"{"v":6,"kind":"claim","seq":1,"round":1,"writer":"w","nonce":"n","at_ms":0}"#;
    assert!(matches!(
        LogEntry::decode("x", v6, None),
        Err(Error::UnknownFormat { .. })
    ));
    assert!(matches!(
        LogEntry::decode_journal("x", v6, None),
        Err(Error::UnknownFormat { .. })
    ));
    let future = br#"{"v":1,"kind":"compacted","seq":1}"#;
    assert!(matches!(
        LogEntry::decode("x", future, None),
        Err(Error::UnknownFormat { .. })
    ));
    assert!(matches!(
        LogEntry::decode("x", b"{nope", None),
        Err(Error::Corrupt { .. })
    ));
    let no_commit = br#"{"v":1,"kind":"snapshot","seq":1,"round":1,"writer":"w","nonce":"n","at_ms":0,"blob":"1.db.zst","sha256":"","bytes":1,"compressed_bytes":1}"#;
    assert!(matches!(
        LogEntry::decode("x", no_commit, None),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn entry_at_wrong_seq_or_with_bad_blob_name_is_corrupt() -> Result<(), Error> {
    let bytes = snap().encode()?;
    assert!(matches!(
        LogEntry::decode("x", &bytes, Some(8)),
        Err(Error::Corrupt { .. })
    ));
    let mut bad = snap();
    if let EntryBody::Snapshot(stored) = &mut bad.body {
        stored.blob = "../../acme2/snap/x.db.zst".into();
    }
    assert!(matches!(
        LogEntry::decode("x", &bad.encode()?, None),
        Err(Error::Corrupt { .. })
    ));
    assert!(valid_blob_name("00000000000000000007-2-00.delta.zst"));
    assert!(!valid_blob_name("7-2-00.db.zst/.."));
    Ok(())
}

/// An inline delta as this build writes it: `"v":2`, `"inline"` instead of `"blob"`.
const INLINE_WIRE: &str = r#"{"at_ms":1,"base":2,"base_checksum":"a97fde908c1e6161","bytes":5,"changed_pages":1,"checksum":"1e3f6e4fb83718b1","commit":2,"compressed_bytes":3,"db_pages":2,"inline":"AAEC","kind":"delta","nonce":"00","page_size":1024,"round":1,"seq":3,"sha256":"ab","v":2,"writer":"w"}"#;

#[test]
fn an_inline_entry_is_version_2_and_round_trips_byte_for_byte() -> Result<(), Error> {
    let entry = LogEntry::decode("fixture", INLINE_WIRE.as_bytes(), Some(3))?;
    assert!(entry.is_inline() && entry.is_delta());
    assert_eq!(entry.blob(), None);
    assert_eq!(entry.version(), crate::INLINE_ENTRY_VERSION);
    assert_eq!(String::from_utf8_lossy(&entry.encode()?), INLINE_WIRE);
    // Every entry without an inline body stays version 1.
    assert_eq!(snap().version(), crate::ENTRY_VERSION);
    Ok(())
}

/// Regression guard for the wire rule "version 2 is exactly the inline entries": an inline
/// body labelled version 1 would be misread by an older reader as a blob entry missing its
/// blob, and a version 2 entry without one is not what this build writes.
#[test]
fn an_inline_body_in_a_version_1_entry_or_a_version_2_entry_without_one_is_corrupt() {
    let as_v1 = INLINE_WIRE.replace(r#""v":2"#, r#""v":1"#);
    assert!(matches!(
        LogEntry::decode("x", as_v1.as_bytes(), None),
        Err(Error::Corrupt { .. })
    ));
    let v2_blob = WIRE[2].replace(r#""v":1"#, r#""v":2"#);
    assert!(matches!(
        LogEntry::decode("x", v2_blob.as_bytes(), None),
        Err(Error::Corrupt { .. })
    ));
    let v2_claim = WIRE[0].replace(r#""v":1"#, r#""v":2"#);
    assert!(matches!(
        LogEntry::decode("x", v2_claim.as_bytes(), None),
        Err(Error::Corrupt { .. })
    ));
    let both = INLINE_WIRE.replace(
        r#""inline":"AAEC","#,
        r#""blob":"00000000000000000003-1-00.delta.zst","inline":"AAEC","#,
    );
    assert!(LogEntry::decode("x", both.as_bytes(), None).is_err());
}

#[test]
fn a_segmented_snapshot_entry_is_version_3_and_names_only_a_manifest() -> Result<(), Error> {
    let name = format!("00000000000000000007-2-{}.manifest.json", "ab".repeat(32));
    let mut e = snap();
    if let EntryBody::Snapshot(s) = &mut e.body {
        s.blob = BlobRef::Manifest(name.clone());
    }
    let bytes = e.encode()?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert!(
        text.contains("\"v\":3") && text.contains("\"manifest\":"),
        "{text}"
    );
    let back = LogEntry::decode("x", &bytes, Some(7))?;
    assert_eq!(back.manifest(), Some(name.as_str()));
    for bad in [
        text.replace("\"v\":3", "\"v\":1"),
        text.replace(".manifest.json", ".db.zst"),
        text.replace("\"manifest\":", "\"blob\":\"x.db.zst\",\"manifest\":"),
        text.replace("\"kind\":\"snapshot\"", "\"kind\":\"delta\""),
    ] {
        assert!(
            matches!(
                LogEntry::decode("x", bad.as_bytes(), Some(7)),
                Err(Error::Corrupt { .. })
            ),
            "{bad}"
        );
    }
    Ok(())
}

#[test]
fn a_pipelined_entry_is_version_4_round_trips_and_checks_its_window_and_floor() -> Result<(), Error>
{
    let wire = br#"{"at_ms":0,"floor":5,"kind":"claim","nonce":"n","round":2,"seq":5,"v":4,"window":4,"writer":"w"}"#;
    let entry = LogEntry::decode("x", wire, Some(5))?;
    assert!(entry.is_pipelined() && entry.is_claim());
    assert_eq!((entry.ship_window(), entry.floor()), (4, 5));
    assert_eq!(entry.encode()?, wire.to_vec());
    // A window beyond the maximum reads clamped: a crafted one widens nothing (R1).
    let wide = br#"{"at_ms":0,"floor":5,"kind":"claim","nonce":"n","round":2,"seq":5,"v":4,"window":1000000,"writer":"w"}"#;
    assert_eq!(
        LogEntry::decode("x", wide, Some(5))?.ship_window(),
        MAX_SHIP_WINDOW
    );
    for bad in [
        // The pipelining keys in an entry of another version, or version 4 without them.
        &br#"{"at_ms":0,"floor":5,"kind":"claim","nonce":"n","round":2,"seq":5,"v":1,"window":4,"writer":"w"}"#[..],
        br#"{"at_ms":0,"kind":"claim","nonce":"n","round":2,"seq":5,"v":4,"writer":"w"}"#,
        // A window of one, a floor above the seq, a claim whose floor is not its own seq.
        br#"{"at_ms":0,"floor":5,"kind":"claim","nonce":"n","round":2,"seq":5,"v":4,"window":1,"writer":"w"}"#,
        br#"{"at_ms":0,"floor":6,"kind":"release","nonce":"n","round":2,"seq":5,"v":4,"window":4,"writer":"w"}"#,
        br#"{"at_ms":0,"floor":4,"kind":"claim","nonce":"n","round":2,"seq":5,"v":4,"window":4,"writer":"w"}"#,
    ] {
        assert!(
            matches!(LogEntry::decode("x", bad, Some(5)), Err(Error::Corrupt { .. })),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    Ok(())
}
