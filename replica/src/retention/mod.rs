//! Retention: delete old snapshots, entries and orphan blobs, never what a reader needs to
//! reach the newest snapshot (I11).

pub(crate) mod clones;
pub(crate) mod refs;

use object_store::ObjectStoreExt;
use tracing::{info, warn};

use crate::chain;
use crate::format::layout::parse_blob_seq;
use crate::format::manifest::segment_sha;
use crate::replica::blocking;
use crate::{Error, LogEntry, OrgId, Replica, Retention};

/// Result of [`crate::Replica::retain`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    /// Log positions deleted.
    pub deleted_entries: Vec<u64>,
    /// Blob object paths deleted (expired snapshots and orphans).
    pub deleted_blobs: Vec<String>,
    /// Snapshot entries kept.
    pub kept_snapshots: usize,
    /// Deletions by age were skipped: this host's clock would have deleted a snapshot by age
    /// and disagreed with the store's beyond [`crate::Settings::max_clock_skew_ms`] (I15).
    /// Counted in `idem_clock_refusals_total{op="retention"}`; what does not depend on age
    /// (unreachable deltas, orphans) was still deleted.
    pub age_skipped: bool,
}

impl Replica {
    /// Applies `policy` to `org`. For a journal org (its log holds format-5 entries) it
    /// applies T4 instead (`docs/design.md` 3g, "T4 as built"): what K0 reads stays, with
    /// every entry younger than `keep_ms`, the newest `keep_snapshots` snapshots, and
    /// everything a kept delta is rebuilt from; the rest goes, and the objects no kept
    /// entry names.
    ///
    /// Never deletes the newest snapshot entry, its manifest or segments, or any entry after
    /// it (its delta chain), nor any claim or release entry (so no slot a zombie writer would
    /// publish into is ever freed). Deletes older snapshot entries (and then their objects)
    /// that are beyond `keep_snapshots` AND older than `keep_ms` (by this host's clock and,
    /// when that would delete one, by the store's too: [`Replica::store_time`], I15), with the
    /// deltas chained to them; deltas below the newest snapshot that no kept snapshot's chain reaches; and
    /// orphan objects — a blob, manifest or segment that no kept entry names, directly or
    /// through a kept snapshot's manifest, whose seq is below the newest snapshot or is the
    /// seq of an entry that does not name it. An object of an empty slot above the newest
    /// snapshot may belong to a ship in flight (a zombie's uploads are orphans once its slot
    /// holds the entry that fenced it). A segment shared by a deleted snapshot and a kept one
    /// stays.
    ///
    /// Reads only the log entries this handle has not published or read before (checked
    /// against the listing's size and ETag; see [`crate::Settings::known_entries`]). A run
    /// that finds a listed entry gone when it reads it (another run deleted it) deletes no
    /// object: its view of the log is not one state of it.
    ///
    /// When this host's clock would delete a snapshot by age and disagrees with the store's
    /// beyond [`crate::Settings::max_clock_skew_ms`], no snapshot is deleted by age this run
    /// ([`RetentionReport::age_skipped`], one warning per run), and the rest runs: the
    /// deletions that do not depend on age keep the store from growing on a skewed host.
    ///
    /// # Errors
    /// [`Error::Store`]; an unreadable log; the store's errors while reading its clock. A
    /// partial run is safe to repeat.
    pub async fn retain(&self, org: &OrgId, policy: &Retention) -> Result<RetentionReport, Error> {
        self.writable("retention")?;
        // Entries this handle published or read before are not read again: a run costs two
        // LISTs, a GET per entry it has not seen, and its deletions (I14).
        let (log, listed) = match self.inner.log.history_known(org).await {
            // A journal org's log: T4 (`docs/design.md` 3g, "T4 as built").
            Err(Error::JournalRequired { .. }) => {
                return self.retain_journal_org(org, policy).await;
            }
            other => other?,
        };
        let mut report = RetentionReport::default();
        let Some(head) = log.last().map(LogEntry::seq) else {
            return Ok(report);
        };
        let snaps: Vec<&LogEntry> = log.iter().filter(|e| e.is_snapshot()).collect();
        let Some(newest) = snaps.last().map(|e| e.seq()) else {
            return Ok(report);
        };
        let keep = policy.keep_snapshots.max(1);
        let beyond_count: Vec<&LogEntry> = snaps
            .iter()
            .enumerate()
            .filter(|(i, e)| i + keep < snaps.len() && e.seq() < newest)
            .map(|(_, e)| *e)
            .collect();
        // Closed chains (below the newest snapshot) whose level file covers them: their
        // deltas go once the newest is `keep_ms` old (2d). Snapshots beyond the count go
        // once older than the window.
        // One LIST a run, whatever the log's length (I16): level files of kept closed
        // chains, and any whose snapshot is gone (a compactor that raced a deletion).
        let levels = self.level_names(org).await?;
        let thinnable = self.thinnable(org, &log, newest, &levels).await?;
        let mut ages: Vec<(u64, u64)> = beyond_count
            .iter()
            .map(|e| (e.at_ms(), policy.snapshot_age_ms()))
            .collect();
        ages.extend(
            thinnable
                .iter()
                .map(|(newest_ms, _)| (*newest_ms, policy.keep_ms)),
        );
        let now = self.age_now_or_skip(org, &ages, &mut report).await?;
        let old_enough =
            |at_ms: u64, age: u64| now.is_some_and(|now| now.saturating_sub(at_ms) >= age);
        let mut doomed: Vec<&LogEntry> = beyond_count
            .into_iter()
            .filter(|e| old_enough(e.at_ms(), policy.snapshot_age_ms()))
            .collect();
        let thinned: std::collections::HashSet<u64> = thinnable
            .iter()
            .filter(|(newest_ms, _)| old_enough(*newest_ms, policy.keep_ms))
            .flat_map(|(_, seqs)| seqs.iter().copied())
            .collect();
        // Deltas stay while the snapshot they chain from stays (point-in-time restore);
        // deltas no kept snapshot reaches (a fenced writer's orphans) go. Claims and releases
        // always stay: the entry after any writer's last entry is its own release or the next
        // writer's claim, so keeping them means no slot a zombie writer would publish into is
        // ever freed, and a zombie's create always collides (I7, I11). They cost one entry per
        // handoff.
        let mut reachable = std::collections::HashSet::new();
        for (i, e) in log.iter().enumerate() {
            if e.is_snapshot() && !doomed.iter().any(|d| d.seq() == e.seq()) {
                reachable.extend(chain::after(e, &log[i + 1..]).iter().map(LogEntry::seq));
            }
        }
        // Strays (a fenced pipelined writer's ships above the claim that fenced it) on a
        // kept snapshot's chain stay: deleting one would leave a hole the chain rules call
        // damage (R3). There are fewer than a window of them per handoff.
        let mut strays = std::collections::HashSet::new();
        for (i, e) in log.iter().enumerate() {
            if e.is_snapshot() && !doomed.iter().any(|d| d.seq() == e.seq()) {
                strays.extend(chain::strays(e, &log[i + 1..]));
            }
        }
        doomed.extend(log.iter().filter(|e| {
            e.is_delta()
                && e.seq() < newest
                && ((!reachable.contains(&e.seq()) && !strays.contains(&e.seq()))
                    || thinned.contains(&e.seq()))
        }));
        report.kept_snapshots = snaps.len() - doomed.iter().filter(|e| e.is_snapshot()).count();
        // Entries first, then blobs: a reader never finds an entry whose blob is gone. Deltas
        // go newest first and before their snapshot, so an interrupted run leaves a snapshot
        // with a prefix of its chain, never deltas without their snapshot.
        doomed.sort_by_key(|e| (e.is_snapshot(), std::cmp::Reverse(e.seq())));
        for e in &doomed {
            self.inner.log.delete(org, e.seq()).await?;
            report.deleted_entries.push(e.seq());
        }
        report.deleted_entries.sort_unstable();
        self.inner.log.forget(org, &report.deleted_entries, &listed);
        // A listed entry that was gone when read was deleted by another run meanwhile, so
        // this view is not one state of the log: it can lack the snapshot S that a newer
        // snapshot reuses segments of while holding an entry above S, which makes the
        // segments S uploaded (named with S's seq, at most the head read here) look like
        // orphans. Such a run judges no object; the next run does (`docs/design.md`,
        // "Segments and retention", rule 2). Its entry deletions stand: they are a subset of
        // what the newer run that deleted the missing entry retires.
        if log.len() < listed.len() {
            info!(%org, entries = report.deleted_entries.len(), vanished = listed.len() - log.len(),
                  "retention ran; the log changed under its read, so no object was judged");
            return Ok(report);
        }
        // Objects named by a kept entry, and (read below, only if a segment could go) the
        // segments every kept snapshot's manifest names. A snapshot landing after this run read
        // the log names only segments of the newest snapshot read here (kept) or segments it
        // uploaded under its own position, above `head`: `docs/design.md`, "Segments and
        // retention".
        let kept: Vec<&LogEntry> = log
            .iter()
            .filter(|e| !doomed.iter().any(|d| d.seq() == e.seq()))
            .collect();
        let occupied: std::collections::BTreeSet<u64> = log.iter().map(LogEntry::seq).collect();
        self.judge_objects(org, &kept, &occupied, newest, head, &mut report)
            .await?;
        // Level files go with their snapshot: one whose snapshot is not kept (deleted now,
        // or before a late compactor wrote it) is named by no reader.
        let kept_snaps: std::collections::HashSet<u64> = kept
            .iter()
            .filter(|e| e.is_snapshot())
            .map(|e| e.seq())
            .collect();
        for level in levels {
            if level.snapshot < newest && !kept_snaps.contains(&level.snapshot) {
                let path = self.inner.store.layout.level(org, &level.name);
                self.delete(&path).await?;
                report.deleted_blobs.push(path.to_string());
            }
        }
        info!(%org, entries = report.deleted_entries.len(), blobs = report.deleted_blobs.len(),
              age_skipped = report.age_skipped, "retention ran");
        Ok(report)
    }

    /// Deletes the objects of `org`'s `snap/` that no entry of `kept` names, directly or
    /// through a kept snapshot's manifest (nor a clone, 2e), and whose position the log
    /// has settled: below `newest` (the newest snapshot, or a journal org's newest
    /// checkpoint), or at most `head` where `occupied` holds an entry that does not name
    /// it. Records them in `report`.
    ///
    /// # Errors
    /// The store's errors; an unreadable clone reference list.
    pub(crate) async fn judge_objects(
        &self,
        org: &OrgId,
        kept: &[&LogEntry],
        occupied: &std::collections::BTreeSet<u64>,
        newest: u64,
        head: u64,
        report: &mut RetentionReport,
    ) -> Result<(), Error> {
        let mut referenced: std::collections::HashSet<String> = kept
            .iter()
            .filter_map(|e| e.blob())
            .map(str::to_owned)
            .collect();
        let dir = self.inner.store.layout.snap_dir(org);
        let blobs = self.inner.store.list_all(&dir).await?;
        // Only objects uploaded for a position the log has settled can be orphans (R4,
        // `docs/design.md` 3e): one below the newest snapshot (no ship of its claim was in
        // flight when it was issued, and nobody else's can land there), or one whose slot
        // holds an entry that does not name it. An empty slot above the newest snapshot may
        // be a ship in flight, even below the head: strays of a fenced pipelined writer can
        // stand above it.
        let candidates: Vec<_> = blobs
            .into_iter()
            .filter(|m| {
                m.location.filename().is_some_and(|name| {
                    !referenced.contains(name)
                        && parse_blob_seq(name).is_some_and(|seq| {
                            seq < newest || (seq <= head && occupied.contains(&seq))
                        })
                })
            })
            .collect();
        // A clone whose snapshots are all gone lets go of its origins' segments (2e). The
        // origins come from the manifests about to go as orphans (those of the snapshots
        // deleted now, or by an earlier run that stopped before it got here): they stay
        // until this returns, so a run that fails or stops before releasing leaves them to
        // the next (docs/clone-attack.md, ATK-4).
        let orphan_manifests: Vec<&str> = candidates
            .iter()
            .filter_map(|m| m.location.filename())
            .filter(|n| n.ends_with(".manifest.json"))
            .collect();
        self.release_clone_refs(org, &orphan_manifests, kept)
            .await?;
        let segments_at_stake = candidates
            .iter()
            .any(|m| m.location.filename().and_then(segment_sha).is_some());
        if segments_at_stake {
            for e in kept.iter().filter(|e| e.is_snapshot()) {
                let (Some(name), Some(stored)) = (e.manifest(), e.stored()) else {
                    continue;
                };
                // A kept manifest that cannot be read leaves its segments unknown: no segment
                // is deleted this run (verify reports the damage).
                match self.segment_names(org, name, stored.bytes).await {
                    Ok(names) => referenced.extend(names.iter().cloned()),
                    Err(Error::MissingObject { .. } | Error::Corrupt { .. }) => {
                        referenced.extend(
                            candidates
                                .iter()
                                .filter_map(|m| m.location.filename())
                                .filter(|n| segment_sha(n).is_some())
                                .map(str::to_owned),
                        );
                    }
                    Err(e) => return Err(e),
                }
            }
            // Segments a clone names stay. Listed after this run's entry deletions (2e), and
            // only when a segment could still go once the kept manifests are counted: the
            // newest snapshot's own segments are candidates on every run until then, and an
            // org's run costs no LIST of `refs/` for them (docs/clone-attack.md, ATK-8).
            let unnamed = candidates.iter().any(|m| {
                m.location
                    .filename()
                    .is_some_and(|n| segment_sha(n).is_some() && !referenced.contains(n))
            });
            if unnamed {
                match self.cloned_segments(org).await? {
                    Some(names) => referenced.extend(names),
                    None => referenced.extend(
                        candidates
                            .iter()
                            .filter_map(|m| m.location.filename())
                            .filter(|n| segment_sha(n).is_some())
                            .map(str::to_owned),
                    ),
                }
            }
        }
        for meta in candidates {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            if referenced.contains(name) {
                continue;
            }
            self.delete(&meta.location).await?;
            report.deleted_blobs.push(meta.location.to_string());
        }
        Ok(())
    }

    /// [`Replica::age_now`], or `None` when this host's clock disagrees with the store's:
    /// a clock the store contradicts decides no age (I15; `refuse` counted it), which
    /// `report` records, and the run goes on with what does not depend on age.
    ///
    /// # Errors
    /// The store's errors while reading its clock.
    pub(crate) async fn age_now_or_skip(
        &self,
        org: &OrgId,
        candidates: &[(u64, u64)],
        report: &mut RetentionReport,
    ) -> Result<Option<u64>, Error> {
        match self.age_now(candidates).await {
            Ok(now) => Ok(Some(now)),
            Err(e @ Error::ClockSkew { .. }) => {
                warn!(%org, error = %e, "retention skipped deletions by age");
                report.age_skipped = true;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The now snapshot ages are judged by (ms since the Unix epoch). Only when this host's
    /// clock would delete one of `candidates` by age is the store's clock asked: then the
    /// earlier of the two is used, so no snapshot goes younger than `keep_ms` by either, and a
    /// host whose clock disagrees with the store's beyond the bound gets `ClockSkew`, and
    /// [`Replica::retain`] then deletes nothing by age (I15).
    ///
    /// # Errors
    /// [`Error::ClockSkew`] and the other errors of [`Replica::store_time`].
    async fn age_now(&self, candidates: &[(u64, u64)]) -> Result<u64, Error> {
        let host = self.inner.clock.now_ms();
        let by_host = |(at_ms, age): &(u64, u64)| *age > 0 && host.saturating_sub(*at_ms) >= *age;
        if !candidates.iter().any(by_host) {
            return Ok(host);
        }
        Ok(self.store_time("retention").await?.now_ms())
    }

    /// The closed chains of `log` (below the snapshot `newest`) that a level file covers
    /// and that still hold deltas: for each, its newest delta's `at_ms` and its deltas'
    /// seqs. A level file covers a chain when it parses under its name and its sections
    /// are positions of the chain ending at the chain's end; each is read once per handle.
    async fn thinnable(
        &self,
        org: &OrgId,
        log: &[LogEntry],
        newest: u64,
        levels: &[crate::levels::LevelName],
    ) -> Result<Vec<(u64, Vec<u64>)>, Error> {
        let mut out = Vec::new();
        for (i, s) in log.iter().enumerate() {
            if !s.is_snapshot() || s.seq() >= newest {
                continue;
            }
            let deltas = chain::after(s, &log[i + 1..]);
            let Some(last) = deltas.last() else { continue };
            let Some(level) = levels.iter().find(|l| l.snapshot == s.seq()) else {
                continue;
            };
            // An interrupted run leaves a prefix of the chain: the file ends above it.
            if level.end < last.seq() {
                continue;
            }
            if !self.level_covers(org, level, &deltas).await? {
                continue;
            }
            let newest_ms = deltas.iter().map(LogEntry::at_ms).max().unwrap_or(0);
            // A stray in the chain (a fenced pipelined ship, never acknowledged, 3e's R1)
            // goes with it: once the deltas around it are gone it would stand alone in a
            // gap the chain rules call damage.
            let strays = chain::strays(s, &log[i + 1..]);
            out.push((
                newest_ms,
                deltas.iter().map(LogEntry::seq).chain(strays).collect(),
            ));
        }
        Ok(out)
    }

    /// True when `level` reads back and every section is a position of `deltas` or above
    /// them (an earlier run deleted the rest, newest first), ending at `level.end`.
    async fn level_covers(
        &self,
        org: &OrgId,
        level: &crate::levels::LevelName,
        deltas: &[LogEntry],
    ) -> Result<bool, Error> {
        let path = self.inner.store.layout.level(org, &level.name).to_string();
        if self.inner.segment_refs.get(&path).is_some() {
            return Ok(true);
        }
        let file = match self.read_level(org, level).await {
            Ok(f) => f,
            // Damaged or gone: the deltas stay (verify reports the file).
            Err(
                Error::Corrupt { .. } | Error::MissingObject { .. } | Error::UnknownFormat { .. },
            ) => {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        // Every section must read back (size and sha256) before the deltas it stands for go.
        let file = blocking("checking a level file", move || {
            for i in 0..file.header.sections.len() {
                file.body(i)?;
            }
            Ok(file)
        })
        .await;
        let file = match file {
            Ok(f) => f,
            Err(Error::Corrupt { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let top = deltas.last().map_or(0, LogEntry::seq);
        // Every section below the log's top is a position of the chain, with the checksum
        // the log records there.
        let on_chain = file.header.sections.iter().all(|s| {
            s.seq > top
                || deltas.iter().any(|d| {
                    d.seq() == s.seq && d.delta().is_some_and(|l| l.checksum == s.checksum)
                })
        });
        if on_chain {
            self.inner
                .segment_refs
                .insert(&path, std::sync::Arc::new(Vec::new()));
        }
        Ok(on_chain)
    }

    /// The segment names of the manifest `name` of `org` (for an image of `image_bytes`),
    /// read once per handle.
    pub(crate) async fn segment_names(
        &self,
        org: &OrgId,
        name: &str,
        image_bytes: u64,
    ) -> Result<std::sync::Arc<Vec<String>>, Error> {
        let path = self.inner.store.layout.blob(org, name).to_string();
        if let Some(names) = self.inner.segment_refs.get(&path) {
            return Ok(names);
        }
        let manifest = self.read_manifest(org, name, image_bytes).await?;
        let names: std::sync::Arc<Vec<String>> =
            std::sync::Arc::new(manifest.segments.into_iter().map(|s| s.0).collect());
        self.inner.segment_refs.insert(&path, names.clone());
        Ok(names)
    }

    /// Deletes the object at `path`; an object already gone is fine (a repeated run).
    pub(crate) async fn delete(&self, path: &object_store::path::Path) -> Result<(), Error> {
        match self.inner.store.object.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store("delete", path, e)),
        }
    }
}
