//! How a reader sees an effect row now: a RESERVED row whose lease lapsed reads as AMBIGUOUS.
//! Apart from the row so the row does not depend on the options that judge it.

use super::options::Options;
use super::row::{Effect, State, lapse_reason};

impl Effect {
    /// The row as `opts` sees it now: a RESERVED row whose lease lapsed
    /// ([`Options::is_lapsed`]) reads as AMBIGUOUS, with why in `error` — exactly the
    /// row a contender would write — so every reader and command treats it alike. Any other
    /// row is returned as stored.
    pub fn as_judged(&self, opts: &Options) -> Effect {
        self.judged_at(opts, opts.now())
    }

    /// [`Effect::as_judged`] at `now_ms` (ms of the caller's clock).
    pub fn judged_at(&self, opts: &Options, now_ms: u64) -> Effect {
        if !opts.is_lapsed_at(self, now_ms) {
            return self.clone();
        }
        Effect {
            state: State::Ambiguous,
            error: Some(lapse_reason(self, opts.lapses_at(self))),
            ..self.clone()
        }
    }
}
