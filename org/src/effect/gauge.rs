//! Open effects in `/metrics`: every RESERVED and AMBIGUOUS row of the orgs this process
//! serves, each judged by its own writer's rule at the moment of the scrape — so a
//! reservation whose lease lapsed is counted AMBIGUOUS though nobody wrote it so.
//!
//! Each writer keeps its org's open rows in memory, reloaded after every effect write (an
//! index read of the open rows only, `idem_effects_open`); a scrape reads them without a
//! writer round trip and without unparking anything. Orgs not open in this process are not
//! counted (`idem effects ORG --state ambiguous` lists them from the store).

use crate::Registry;

/// Effects open in the orgs a registry serves, as their writers judge them now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenEffects {
    /// RESERVED and still in progress.
    pub reserved: u64,
    /// AMBIGUOUS, or RESERVED with a lapsed lease: each needs a resolution.
    pub ambiguous: u64,
}

impl Registry {
    /// The open effects of every org open in this process, each judged by its writer's rule
    /// now (a lapsed reservation counts as ambiguous). No store request, no writer job.
    pub fn open_effects(&self) -> OpenEffects {
        let mut total = OpenEffects::default();
        for org in self.open_orgs() {
            let (reserved, ambiguous) = org.inner().effects.open_counts();
            total.reserved += reserved;
            total.ambiguous += ambiguous;
        }
        total
    }

    /// Sets the [`crate::metrics::EFFECTS_OPEN`] gauge from [`Registry::open_effects`]: call it
    /// before rendering a scrape (`idem serve` does, on `GET /metrics`).
    pub fn record_effect_gauges(&self) {
        let open = self.open_effects();
        metrics::gauge!(crate::metrics::EFFECTS_OPEN, "state" => "reserved")
            .set(open.reserved as f64);
        metrics::gauge!(crate::metrics::EFFECTS_OPEN, "state" => "ambiguous")
            .set(open.ambiguous as f64);
    }
}
