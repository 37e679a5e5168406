//! Point-in-time restore by wall-clock time: which published position `Replica::restore`
//! installs for a moment an operator names.

use crate::chain;
use crate::{Error, OrgId, Replica};

impl Replica {
    /// The log position to restore for the moment `at_ms` (ms since the Unix epoch): the
    /// newest kept position (a snapshot or delta entry on a chain, never a stray, 3e's R1;
    /// or a level file's section, `docs/design.md` 2d) whose `at_ms` is at or before it. `at_ms` is the publishing writer's clock, as `idem snapshots` shows it:
    /// an operator's lookup, no fencing or deletion depends on it (I15). When writers' clocks
    /// disagree, the log's order decides: the newest seq whose time qualifies.
    ///
    /// # Errors
    /// [`Error::BeforeWindow`] when the org has positions but every one kept was published
    /// after `at_ms` (retention removed older ones, or the org was younger), naming the
    /// oldest; [`Error::NoSuchSnapshot`] (seq 0) when it has none; [`Error::Store`];
    /// [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable entry;
    /// [`Error::ChainBroken`] for a damaged chain under a candidate.
    pub async fn position_at_time(&self, org: &OrgId, at_ms: u64) -> Result<u64, Error> {
        let log = self.history(org).await?;
        let positions: Vec<_> = log
            .iter()
            .filter(|e| e.is_snapshot() || e.is_delta())
            .collect();
        let mut levels = None;
        for e in positions.iter().rev().filter(|e| e.at_ms() <= at_ms) {
            let seq = e.seq();
            let on_chain = match chain::newest(org, &log, seq.saturating_add(1)) {
                Ok(c) => c,
                // An entry left above a gap thinning made in a closed chain (a late create
                // in a freed slot): no position; the chain's level file answers for it.
                Err(e @ Error::ChainBroken { .. }) => {
                    if levels.is_none() {
                        levels = Some(self.level_names(org).await?);
                    }
                    let covered = levels
                        .iter()
                        .flatten()
                        .any(|l| l.snapshot < seq && seq <= l.end);
                    if covered {
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            if on_chain.as_ref().map(chain::Chain::position) == Some(seq) {
                // A closed chain whose deltas retention thinned keeps a position per
                // bucket in its level file (2d): the last one at or before the moment.
                let level = self.level_position_at(org, seq, at_ms).await?;
                return Ok(level.unwrap_or(seq));
            }
        }
        match positions.iter().min_by_key(|e| e.at_ms()) {
            Some(oldest) => Err(Error::BeforeWindow {
                org: org.to_string(),
                at_ms,
                oldest_seq: oldest.seq(),
                oldest_ms: oldest.at_ms(),
            }),
            None => Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: 0,
            }),
        }
    }
}
