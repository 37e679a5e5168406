use super::*;
use crate::ErrorKind;

#[test]
fn malformed_and_unsupported_urls_are_input_errors() {
    for bad in ["", "  ", "s3://", "ftp://host/x", "file://relative/path"] {
        match StoreUrl::parse(bad) {
            Err(e @ Error::InvalidStoreUrl { .. }) => assert_eq!(e.kind(), ErrorKind::Input),
            other => panic!("{bad:?} parsed as {other:?}"),
        }
    }
}

#[test]
fn memory_url_keeps_its_path_as_prefix() -> Result<(), Error> {
    let s = StoreUrl::parse("memory:///prod/eu/")?;
    assert_eq!(s.prefix(), "prod/eu");
    assert_eq!(s.local_root(), None);
    Ok(())
}

#[test]
fn a_local_path_is_its_own_root_and_join_goes_inside_it() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("store");
    let s = StoreUrl::parse(&root.display().to_string())?;
    assert_eq!(s.prefix(), "");
    assert_eq!(s.local_root(), Some(root.as_path()));
    let inner = s.join("prod");
    assert_eq!(inner.prefix(), "prod");
    assert_eq!(inner.as_str(), root.join("prod").display().to_string());
    let file = StoreUrl::parse(&format!("file://{}", root.display()))?;
    assert_eq!(file.local_root(), Some(root.as_path()));
    Ok(())
}

#[test]
fn parse_existing_refuses_a_missing_directory_and_creates_nothing()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("nope");
    let err = StoreUrl::parse_existing(&missing.display().to_string())
        .err()
        .ok_or("a missing directory parsed")?;
    assert!(matches!(err, Error::InvalidStoreUrl { .. }), "{err}");
    assert!(!missing.exists());
    let err = StoreUrl::parse_existing(&format!("file://{}", missing.display()))
        .err()
        .ok_or("a missing file URL parsed")?;
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert!(!missing.exists());
    Ok(())
}

#[test]
fn cloud_urls_name_the_bucket_and_the_prefix() -> Result<(), Error> {
    let s = StoreUrl::parse("s3://bucket/prod/eu")?;
    assert_eq!(s.prefix(), "prod/eu");
    assert_eq!(s.url_of("staging"), "s3://bucket/staging");
    assert_eq!(s.join("x").as_str(), "s3://bucket/prod/eu/x");
    Ok(())
}
