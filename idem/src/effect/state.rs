//! The state of an effect key: a plain value that the row, the error type and the history all
//! name, so it depends on none of them.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

/// The state of an effect key, stored in `idem_effects.state` as its [`State::as_str`] name.
///
/// Each word means one thing: COMMITTED = executed, FAILED = proved not executed, AMBIGUOUS =
/// outcome unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// An attempt holds the key until its lease expires; its executor may be running.
    Reserved,
    /// The executor executed and its result is stored; every later call replays it.
    Committed,
    /// The executor proved it did not execute (or an operator resolved it so); the only state
    /// that may be reserved again.
    Failed,
    /// Nobody knows whether the executor ran (an error that proves nothing, a panic, a lapsed
    /// lease). No retry clears it: an operator or a reconcile hook resolves it.
    Ambiguous,
}

impl State {
    /// The stored (and printed) name: `reserved`, `committed`, `failed`, `ambiguous`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Reserved => "reserved",
            State::Committed => "committed",
            State::Failed => "failed",
            State::Ambiguous => "ambiguous",
        }
    }

    /// Parses a name as printed by [`State::as_str`] (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        [
            State::Reserved,
            State::Committed,
            State::Failed,
            State::Ambiguous,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ToSql for State {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for State {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        State::parse(text).ok_or_else(|| FromSqlError::Other(text.into()))
    }
}
