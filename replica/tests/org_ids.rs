//! Bad org ids are refused with a typed error before any path is formed (I12).

use idem_replica::{Error, ErrorKind, OrgId};

#[test]
fn bad_org_ids_are_refused_with_a_typed_error() {
    let kb = "a".repeat(1024);
    let long = "a".repeat(129);
    let cases = [
        "../x", "a/b", "", &kb, &long, "..", "a..b", "ácme", "日本", "acme\0", "acme\n", " acme",
        "/abs", "x\\y", ".", "_x",
    ];
    for s in cases {
        match OrgId::new(s) {
            Err(e @ Error::InvalidOrgId { .. }) => assert_eq!(e.kind(), ErrorKind::Input),
            other => panic!("{s:?} gave {other:?}"),
        }
    }
}

#[test]
fn good_org_ids_round_trip() -> Result<(), Error> {
    for s in ["acme", "acme2", "a-b_c.d", "9", &"z".repeat(128)] {
        let id: OrgId = s.parse()?;
        assert_eq!(id.to_string(), s);
    }
    Ok(())
}
