//! The exactly-once oracle every kill and fault test ends with (I1, I2, I3, I6, I10).

use std::collections::BTreeMap;
use std::path::Path;

use idem_org::RegistrySettings;
use idem_replica::{OrgId, Replica};

use super::{BoxErr, R, effect, registry};

/// What must hold once the writers under test are gone, for `org` in `replica`:
/// 1. the newest published state passes `integrity_check`, holds the effect of every
///    acknowledged key exactly once, no effect twice, one applied key row per effect, and
///    none of the keys in `forbidden` (writes that must never reach the store);
/// 2. `verify` finds every snapshot and delta sound;
/// 3. a successor (a new registry, force-claiming) replays every acknowledged key with its
///    first result (`effect` returns the key) and never runs `apply` again.
///
/// `work` is a scratch directory for the restore and the successor's data.
pub async fn exactly_once(
    replica: &Replica,
    org: &str,
    acked: &[String],
    forbidden: &[&str],
    work: &Path,
) -> R {
    let id = OrgId::new(org)?;
    let newest = newest_effects(replica, &id, work).await?;
    each_once(org, &newest.effects, newest.applied_keys, acked, forbidden);
    let report = replica.verify(&id).await?;
    assert!(report.failed.is_empty(), "verify: {:?}", report.failed);

    let successor = registry(
        &work.join(format!("oracle-successor-{}", std::process::id())),
        replica.clone(),
        "oracle-successor",
        RegistrySettings {
            force_claim: true,
            ..RegistrySettings::default()
        },
    )?;
    let handle = successor.acquire(&id).await?;
    for key in acked {
        let out = handle.once(key, effect(org, "ran-again")).await?;
        assert!(!out.applied, "acknowledged {key} ran again on a successor");
        assert_eq!(out.result, key.as_bytes(), "{key} replays its first result");
    }
    successor.shutdown().await;
    Ok(())
}

/// The counts of point 1 of [`exactly_once`] (all but `integrity_check`), on a state already
/// read (`effects`: effect rows per key; `applied_keys`: applied key rows): the effect of
/// every acknowledged key exactly once, no effect twice, one applied key row per effect, and
/// none of the keys in `forbidden`.
pub fn each_once(
    org: &str,
    effects: &BTreeMap<String, i64>,
    applied_keys: i64,
    acked: &[String],
    forbidden: &[&str],
) {
    for key in acked {
        assert_eq!(
            effects.get(key),
            Some(&1),
            "{org}: acknowledged key {key} in the store exactly once: {effects:?}"
        );
    }
    assert!(
        effects.values().all(|n| *n == 1),
        "{org}: an effect ran twice: {effects:?}"
    );
    assert_eq!(
        effects.len() as i64,
        applied_keys,
        "{org}: every effect has its key row: {effects:?}"
    );
    for key in forbidden {
        assert!(
            !effects.contains_key(*key),
            "{org}: {key} reached the store"
        );
    }
}

struct Newest {
    effects: BTreeMap<String, i64>,
    applied_keys: i64,
}

async fn newest_effects(replica: &Replica, org: &OrgId, work: &Path) -> Result<Newest, BoxErr> {
    let dest = work.join(format!("oracle-{org}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&dest);
    replica.restore(org, None, &dest).await?;
    let conn = rusqlite::Connection::open(&dest)?;
    let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    assert_eq!(ok, "ok", "the newest published state is sound");
    let effects = conn
        .prepare("SELECT key, count(*) FROM effects GROUP BY key")?
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .collect::<Result<_, _>>()?;
    let applied_keys = conn.query_row(
        "SELECT count(*) FROM idem_keys WHERE applied = 1",
        [],
        |r| r.get(0),
    )?;
    drop(conn);
    let _ = std::fs::remove_file(&dest);
    Ok(Newest {
        effects,
        applied_keys,
    })
}
