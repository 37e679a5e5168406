//! The advisory lease in `orgs/<org>/lease.json`: liveness only, never fencing (the log
//! fences, I7). A claim respects another writer's live lease unless forced; a writer renews
//! its lease once past half its term, by a ship or a confirmation.

use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::log::entry::ENTRY_VERSION;
use crate::{Claim, Error, OrgId, Replica};

/// The advisory lease of an org (liveness only; fencing is the log's job).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Holder's writer id.
    pub writer: String,
    /// Holder's round.
    pub round: u64,
    /// Expiry, ms since the Unix epoch.
    pub expires_at_ms: u64,
    /// The holder's process instance (random per [`crate::Replica`] opened): two processes
    /// configured with one writer id are told apart by it. Empty in leases of older versions.
    #[serde(default)]
    pub instance: String,
    /// The holder's home: the id of the data directory it works in, if it gave one
    /// ([`crate::Replica::claim_from`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// Where the holder's clients reach it ([`crate::Settings::advertise`]), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

/// `lease.json` on the wire: `{"v":1,"writer":…,"round":…,"expires_at_ms":…,"instance":…}`
/// (`home` and `addr` only when set), in this order.
#[derive(Serialize, Deserialize)]
struct LeaseWire {
    v: u64,
    #[serde(flatten)]
    lease: Lease,
}

impl Lease {
    fn encode(&self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(&LeaseWire {
            v: ENTRY_VERSION,
            lease: self.clone(),
        })
        .map_err(|source| Error::Encode {
            what: "lease",
            source,
        })
    }

    fn decode(object: &str, bytes: &[u8]) -> Result<Lease, Error> {
        let wire: LeaseWire =
            serde_json::from_slice(bytes).map_err(|e| Error::corrupt(object, e))?;
        if wire.v != ENTRY_VERSION {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("lease version {}", wire.v),
            });
        }
        Ok(wire.lease)
    }
}

impl Replica {
    /// The advisory lease of `org`, if any.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease.
    pub async fn lease(&self, org: &OrgId) -> Result<Option<Lease>, Error> {
        let path = self.inner.layout.lease(org);
        match self.get_bytes(&path).await? {
            Some(b) => Lease::decode(path.as_ref(), &b).map(Some),
            None => Ok(None),
        }
    }

    /// Renews `claim`'s lease once more than half of `lease_ms` has passed since its last
    /// renewal; a failed write is logged and tried again next time.
    pub(crate) async fn renew_lease(&self, claim: &mut Claim) {
        let now = self.inner.clock.now_ms();
        if now.saturating_sub(claim.lease_renewed_ms) * 2 > self.inner.settings.lease_ms {
            let lease = Lease {
                writer: claim.writer().to_owned(),
                round: claim.round(),
                expires_at_ms: now + self.inner.settings.lease_ms,
                instance: self.inner.instance.clone(),
                home: claim.home.clone(),
                addr: self.inner.settings.advertise.clone(),
            };
            if self.put_lease(claim.org(), &lease).await {
                claim.lease_renewed_ms = now;
                metrics::counter!(crate::metrics::LEASE_RENEWALS).increment(1);
            }
        }
    }

    /// Writes the advisory lease; false (logged, never fatal) when the write fails: the log
    /// fences, not the lease.
    pub(crate) async fn put_lease(&self, org: &OrgId, lease: &Lease) -> bool {
        let path = self.inner.layout.lease(org);
        let body = match lease.encode() {
            Ok(b) => b,
            Err(_) => return false,
        };
        match self.inner.store.put(&path, PutPayload::from(body)).await {
            Ok(_) => true,
            Err(e) => {
                warn!(%org, round = lease.round, error = %e, "could not write lease");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_written_before_and_after_homes_read_and_write_back_byte_for_byte() -> Result<(), Error>
    {
        for text in [
            r#"{"v":1,"writer":"writer-b","round":2,"expires_at_ms":1796090785875,"instance":"0269a007f46e0ec5d8bce6b2d6d01284"}"#,
            r#"{"v":1,"writer":"w","round":3,"expires_at_ms":5,"instance":"ab","home":"h1"}"#,
        ] {
            let lease = Lease::decode("lease.json", text.as_bytes())?;
            assert_eq!(String::from_utf8_lossy(&lease.encode()?), text);
        }
        let old = Lease::decode(
            "lease.json",
            br#"{"v":1,"writer":"w","round":1,"expires_at_ms":5}"#,
        )?;
        assert_eq!((old.instance.as_str(), old.home), ("", None));
        assert!(matches!(
            Lease::decode(
                "lease.json",
                br#"{"v":2,"writer":"w","round":1,"expires_at_ms":5}"#
            ),
            Err(Error::UnknownFormat { .. })
        ));
        Ok(())
    }
}
