//! Retention of a run (`docs/design.md` 3g, T1-T3): a prefix of the run's batches, below
//! every walk's entry, once older than `keep_ms` by the store's clock; never a hole a walk
//! scans, never a seal, never an exclusion, never anything at or above the run's highest
//! floor while a writer may still create there.
//!
//! `m` = the run's `retain_below` (its seal's, else its newest batch's: the lowest walk
//! entry its writer knew of), capped:
//! - unsealed or adopt-sealed: by the highest floor (T1: every slot a paused writer may still
//!   fill is at or above it, where objects are kept and its create collides);
//! - self- or release-sealed: by the seal (nothing above it is read);
//! - unsealed or self-sealed: by the newest roster batch (T2: K2.3 reads it and after).
//!
//! Exclusions are kept whole: T1 keeps one while its org's newest checkpoint is of a lower
//! round, and this layer does not read org logs (conservative: they cost a few hundred
//! bytes each).

use futures::StreamExt;
use object_store::ObjectStoreExt;
use tracing::debug;

use crate::format::journal::{JournalObject, RunName, SealKind};
use crate::{Error, Replica};

/// What [`Replica::retain_run`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunRetention {
    /// Slots deleted, ascending.
    pub deleted: Vec<u64>,
    /// The slot below which batches may go (`m`).
    pub retain_below: u64,
    /// Batches below `m` kept because they are younger than `keep_ms` by the store's clock.
    pub young: usize,
}

impl Replica {
    /// T1-T3 over `run`: deletes its batches below `m` (module doc) whose store
    /// Last-Modified is at least `keep_ms` before the store's time as this process measures
    /// it (2c), never by a writer's stamp (I15). One LIST, the headers, one store-time read
    /// when anything is old enough by this host's clock, one DELETE per batch.
    ///
    /// # Errors
    /// [`Error::ReadOnly`]; [`Error::ClockSkew`] when this host's clock disagrees with the
    /// store's beyond `max_clock_skew_ms` (nothing is deleted); the listing's and the
    /// store's errors.
    pub async fn retain_run(&self, run: &RunName, keep_ms: u64) -> Result<RunRetention, Error> {
        let store = &self.inner.store;
        store.writable("journal retention")?;
        let listing = self.list_run(run, 1).await?;
        let seal = listing
            .objects
            .iter()
            .find_map(|(&s, l)| match &l.header.object {
                JournalObject::Seal(seal) => Some((s, seal.clone())),
                _ => None,
            });
        let below_seal = seal.as_ref().map_or(u64::MAX, |(s, _)| *s);
        let batches: Vec<(u64, u64, bool, u64)> = listing
            .objects
            .range(..below_seal)
            .filter_map(|(&slot, l)| match &l.header.object {
                JournalObject::Batch(b) => {
                    Some((slot, b.retain_below, b.roster.is_some(), l.last_modified_ms))
                }
                _ => None,
            })
            .collect();
        let value = match &seal {
            Some((_, s)) => s.retain_below,
            None => batches.last().map_or(0, |b| b.1),
        };
        let newest_roster = batches.iter().rev().find(|b| b.2).map(|b| b.0);
        let mut m = value;
        match seal.as_ref().map(|(s, seal)| (*s, seal.seal)) {
            None | Some((_, SealKind::Adopt)) => m = m.min(listing.highest_floor()),
            Some((slot, SealKind::SelfSeal | SealKind::Release)) => m = m.min(slot),
        }
        if matches!(
            seal.as_ref().map(|(_, s)| s.seal),
            None | Some(SealKind::SelfSeal)
        ) && let Some(r) = newest_roster
        {
            m = m.min(r);
        }
        let candidates: Vec<(u64, u64)> = batches
            .iter()
            .filter(|b| b.0 < m)
            .map(|b| (b.0, b.3))
            .collect();
        let mut out = RunRetention {
            retain_below: m,
            ..RunRetention::default()
        };
        if candidates.is_empty() {
            return Ok(out);
        }
        let host = self.inner.clock.now_ms();
        let now = if candidates
            .iter()
            .any(|(_, at)| host.saturating_sub(*at) >= keep_ms)
        {
            self.store_time("journal retention").await?.now_ms()
        } else {
            host
        };
        let (old, young): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|(_, at)| now.saturating_sub(*at) >= keep_ms);
        out.young = young.len();
        let deletes = futures::stream::iter(old)
            .map(|(slot, _)| async move {
                let path = store.layout.journal(run, slot);
                match store.object.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(slot),
                    Err(e) => Err(Error::store("delete", &path, e)),
                }
            })
            .buffer_unordered(self.inner.settings.read_concurrency.max(1))
            .collect::<Vec<_>>()
            .await;
        for d in deletes {
            out.deleted.push(d?);
        }
        out.deleted.sort_unstable();
        debug!(%run, m, deleted = out.deleted.len(), young = out.young, "journal retention ran");
        Ok(out)
    }
}
