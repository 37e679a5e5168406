//! The demo application: a per-org ledger of transfers between accounts.
//!
//! A transfer inserts one `transfers` row keyed by its idempotency key and moves `cents`
//! between two accounts, inside the idem transaction, so "transfers rows == applied keys" and
//! "every balance = credits − debits of its transfers" check exactly-once.

use idem_org::rusqlite::{self, Connection, Transaction, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Tables of the ledger, created on every org's writer connection when it opens.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY NOT NULL, balance INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS transfers (
    key TEXT PRIMARY KEY NOT NULL, src TEXT NOT NULL, dst TEXT NOT NULL, cents INTEGER NOT NULL
);";

/// Creates the ledger tables (the registry's `on_open` hook).
///
/// # Errors
/// SQLite errors.
pub fn init(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)
}

/// A transfer request body: `{"from":"a","to":"b","cents":125}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transfer {
    /// Debited account id.
    pub from: String,
    /// Credited account id.
    pub to: String,
    /// Amount in cents, positive.
    pub cents: i64,
}

/// The stored (and replayed) response of an applied transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The idempotency key.
    pub key: String,
    /// The transfer applied.
    pub transfer: Transfer,
    /// Balance of `from` right after the transfer.
    pub from_balance: i64,
    /// Balance of `to` right after the transfer.
    pub to_balance: i64,
}

impl Transfer {
    /// Checks the fields: account ids 1–64 bytes, distinct, `cents` in 1..=10^12.
    ///
    /// # Errors
    /// Why the transfer is invalid.
    pub fn validate(&self) -> Result<(), String> {
        for id in [&self.from, &self.to] {
            if id.is_empty() || id.len() > 64 {
                return Err("account ids must be 1-64 bytes".into());
            }
        }
        if self.from == self.to {
            return Err("from and to must differ".into());
        }
        if !(1..=1_000_000_000_000).contains(&self.cents) {
            return Err("cents must be between 1 and 10^12".into());
        }
        Ok(())
    }

    /// sha256 of the canonical JSON of the transfer (fixed field order, no whitespace):
    /// the request fingerprint stored with the key (I4).
    pub fn fingerprint(&self) -> Vec<u8> {
        let canonical = serde_json::json!([self.from, self.to, self.cents]).to_string();
        Sha256::digest(canonical.as_bytes()).to_vec()
    }

    /// Applies the transfer inside the idem transaction and returns the receipt as JSON.
    ///
    /// # Errors
    /// [`ApplyError::Pruned`] when a transfer with this key exists but its idempotency key
    /// was pruned (a retry older than the retention window: the stored response is gone, and
    /// the transfer is not applied again); SQLite errors (the transaction then rolls back).
    pub fn apply(&self, key: &str, tx: &Transaction<'_>) -> Result<Vec<u8>, ApplyError> {
        let exists = tx
            .prepare_cached("SELECT 1 FROM transfers WHERE key = ?1")?
            .exists([key])?;
        if exists {
            return Err(ApplyError::Pruned(key.to_owned()));
        }
        tx.execute(
            "INSERT INTO transfers (key, src, dst, cents) VALUES (?1, ?2, ?3, ?4)",
            params![key, self.from, self.to, self.cents],
        )?;
        let mv = "INSERT INTO accounts (id, balance) VALUES (?1, ?2)
                  ON CONFLICT(id) DO UPDATE SET balance = balance + excluded.balance
                  RETURNING balance";
        let from_balance: i64 = tx.query_row(mv, params![self.from, -self.cents], |r| r.get(0))?;
        let to_balance: i64 = tx.query_row(mv, params![self.to, self.cents], |r| r.get(0))?;
        let receipt = Receipt {
            key: key.to_owned(),
            transfer: self.clone(),
            from_balance,
            to_balance,
        };
        serde_json::to_vec(&receipt)
            .map_err(|e| ApplyError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))
    }
}

/// Why a transfer was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The transfer was applied long ago and its idempotency key has since been pruned.
    #[error(
        "transfer {0} was applied earlier and its idempotency key has been pruned \
         (older than the retention window): it is not applied again and its response is gone"
    )]
    Pruned(String),
    /// SQLite failed.
    #[error("ledger")]
    Sqlite(#[from] rusqlite::Error),
}

/// Every account's balance, sorted by id.
///
/// # Errors
/// SQLite errors.
pub fn balances(conn: &Connection) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut stmt = conn.prepare("SELECT id, balance FROM accounts ORDER BY id")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a retry of a pruned key failed with SQLite's `UNIQUE constraint failed`.
    #[test]
    fn a_transfer_whose_key_was_pruned_is_refused_in_words()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut conn = Connection::open_in_memory()?;
        init(&conn)?;
        let t = Transfer {
            from: "alice".into(),
            to: "bob".into(),
            cents: 5,
        };
        let tx = conn.transaction()?;
        t.apply("k1", &tx)?;
        tx.commit()?;
        let tx = conn.transaction()?;
        let again = t.apply("k1", &tx);
        assert!(
            matches!(again, Err(ApplyError::Pruned(ref k)) if k == "k1"),
            "{again:?}"
        );
        let said = again.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            said.contains("pruned") && !said.contains("UNIQUE"),
            "{said}"
        );
        Ok(())
    }
}
