//! `idem orgs STORE`: the orgs a store holds under its prefix, each with the head of its log
//! (newest seq, what it records, the round and writer) and, unless that head is a release,
//! the holder's advertised address.

use std::process::ExitCode;

use serde_json::{Value, json};

use super::{OrgsArgs, print_json, rfc3339};

/// Lists the orgs under the store's prefix. One LIST for the orgs, then per org one LIST and
/// one GET for the head of its log, and a read of its lease when the head is no release.
/// An empty listing says which prefixes of the store do hold orgs.
///
/// # Errors
/// Bad store URL (a local path that is no directory included), store unreachable.
pub async fn orgs(a: OrgsArgs) -> Result<ExitCode, String> {
    let url = crate::store::parse_existing(&a.store)?;
    let replica = crate::store::open_read_only(&url, idem_org::replica::Settings::default())?;
    let orgs = replica.orgs().await.map_err(|e| crate::chain(&e))?;
    let mut rows = Vec::with_capacity(orgs.len());
    for org in &orgs {
        let head = replica
            .newest_entry(org)
            .await
            .map_err(|e| super::about(org, &crate::chain(&e)))?;
        let Some(head) = head else {
            // Folders left by a deleted org: nothing in its log.
            continue;
        };
        let released = head.kind_name() == "release";
        let addr = if released {
            None
        } else {
            replica
                .lease(org)
                .await
                .map_err(|e| super::about(org, &crate::chain(&e)))?
                .and_then(|l| l.addr)
        };
        rows.push(json!({
            "org": org.to_string(), "seq": head.seq(), "head": head.kind_name(),
            "round": head.round(), "writer": head.writer(), "at": rfc3339(head.at_ms()),
            "released": released, "holder_addr": addr,
        }));
    }
    if a.json {
        print_json(&Value::Array(rows));
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        let hint = crate::store::org_hint(&url).await;
        outln!("no orgs under {url}{hint}");
        return Ok(ExitCode::SUCCESS);
    }
    outln!("org\tseq\thead\tround\twriter\tholder");
    for r in &rows {
        let holder = if r["released"] == true {
            "released".to_owned()
        } else {
            let writer = r["writer"].as_str().unwrap_or("");
            match r["holder_addr"].as_str() {
                Some(addr) => format!("{writer} at {addr}"),
                None => writer.to_owned(),
            }
        };
        outln!(
            "{}\t{}\t{}\t{}\t{}\t{holder}",
            r["org"].as_str().unwrap_or(""),
            r["seq"],
            r["head"].as_str().unwrap_or(""),
            r["round"],
            r["writer"].as_str().unwrap_or(""),
        );
    }
    Ok(ExitCode::SUCCESS)
}
