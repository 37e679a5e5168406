//! Reading and creating journal objects (`journals/<run>/<slot:020>.jnl`): the only code
//! that touches them. A create is settled by re-reading when its outcome is in doubt (I9);
//! a header is read by a range GET of the object's first bytes, a section by a range GET of
//! its frame, so a reader of one org never downloads the other orgs' pages.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStoreExt, PutMode, PutPayload};
use tracing::debug;

use super::slots::Slots;
use crate::format::journal::{
    self, JournalHeader, JournalObject, PREFIX, RunName, SectionIndex, parse_slot_name,
};
use crate::{Error, Replica};

/// Bytes fetched first when reading a header: a batch of a few hundred orgs' index fits.
const HEAD_READ: u64 = 64 << 10;

/// One object of a run as a reader saw it: its header and where its frames start.
#[derive(Clone, Debug)]
pub struct Listed {
    /// The header, checked against the object's name.
    pub header: JournalHeader,
    /// Length of the header JSON, bytes (frames start after the prefix and it).
    pub(crate) header_len: usize,
    /// The object's size, bytes.
    pub size: u64,
    /// The store's Last-Modified of the object, ms since the Unix epoch (0 when the store
    /// gave a time before the epoch): retention's age is the store's clock (I15).
    pub last_modified_ms: u64,
    /// A batch's sections by org, built at the first lookup: every org's walk looks up its
    /// own section in the same shared header (1,000 sections at 1,000 orgs).
    by_org: OnceLock<HashMap<String, Vec<usize>>>,
}

impl PartialEq for Listed {
    fn eq(&self, other: &Listed) -> bool {
        self.header == other.header
            && self.header_len == other.header_len
            && self.size == other.size
            && self.last_modified_ms == other.last_modified_ms
    }
}

impl Eq for Listed {}

/// Sections a batch holds at most before its lookups go through an index.
const LINEAR_SECTIONS: usize = 16;

impl Listed {
    /// A listed object: `header` of `header_len` bytes, in an object of `size` bytes
    /// the store last modified at `last_modified_ms` (ms since the Unix epoch).
    pub(crate) fn new(
        header: JournalHeader,
        header_len: usize,
        size: u64,
        last_modified_ms: u64,
    ) -> Listed {
        Listed {
            header,
            header_len,
            size,
            last_modified_ms,
            by_org: OnceLock::new(),
        }
    }

    /// The sections of `org` in this batch, in index order (none for other objects).
    pub fn sections_of<'a>(&'a self, org: &'a str) -> impl Iterator<Item = &'a SectionIndex> {
        let sections: &[SectionIndex] = match &self.header.object {
            JournalObject::Batch(b) => &b.sections,
            _ => &[],
        };
        // Either a linear search of a small batch or the index of a large one, never both.
        let (linear, indexed): (&[SectionIndex], &[usize]) = if sections.len() <= LINEAR_SECTIONS {
            (sections, &[])
        } else {
            let index = self.by_org.get_or_init(|| {
                let mut index: HashMap<String, Vec<usize>> = HashMap::new();
                for (i, s) in sections.iter().enumerate() {
                    index.entry(s.org.clone()).or_default().push(i);
                }
                index
            });
            (&[], index.get(org).map_or(&[][..], Vec::as_slice))
        };
        linear
            .iter()
            .filter(move |s| s.org == org)
            .chain(indexed.iter().filter_map(move |i| sections.get(*i)))
    }
}

/// The objects of one run from a slot up, in slot order, as one LIST saw them (P works from
/// exactly this, never from a fresh listing: `docs/design.md` 3g, J3-4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunListing {
    /// The run listed.
    pub run: RunName,
    /// The lowest slot listed.
    pub from: u64,
    /// Every object at or above `from`, by slot. Shared with the handle's header cache: a
    /// batch's header indexes every org's section (about 250 KB at 1,000 orgs), and the
    /// walks of a takeover list the same run once per org; a part of a listing shares its
    /// map ([`Slots`]).
    pub objects: Slots,
}

impl RunListing {
    /// The objects of this listing in `slots`, as a listing from `from` (the range's start).
    pub(crate) fn part(&self, from: u64, slots: impl std::ops::RangeBounds<u64>) -> RunListing {
        RunListing {
            run: self.run.clone(),
            from,
            objects: self.objects.part(slots),
        }
    }

    /// This listing in a slot map of its own ([`Slots::detached`]).
    pub(crate) fn detached(&self) -> RunListing {
        RunListing {
            run: self.run.clone(),
            from: self.from,
            objects: self.objects.detached(),
        }
    }

    /// Header bytes the listing holds (at least one per object): what keeping it costs.
    pub(crate) fn header_bytes(&self) -> usize {
        self.objects.values().map(|l| l.header_len.max(1)).sum()
    }

    /// The slot after the highest listed object (`from` for an empty listing): the run's end
    /// slot as this listing saw it.
    pub fn end_slot(&self) -> u64 {
        self.objects.keys().next_back().map_or(self.from, |s| s + 1)
    }

    /// The highest `floor` among the listed objects (0 for none): no writer creates below
    /// the highest floor it wrote (T1).
    pub fn highest_floor(&self) -> u64 {
        self.objects
            .values()
            .map(|o| o.header.floor)
            .max()
            .unwrap_or(0)
    }
}

/// The outcome of a create-only put of a journal object that did not fail.
#[derive(Debug)]
pub enum Created {
    /// Our object is in the slot (created now, or by an earlier try: the nonce matched).
    Landed,
    /// Another object holds the slot.
    Taken(Box<JournalHeader>),
}

impl Replica {
    /// Create-only put of a journal object at its run and slot, settled by re-reading the
    /// slot's header whenever the put does not plainly succeed (I9): our nonce read back is a
    /// landing, another's is [`Created::Taken`]; an empty slot is tried once more.
    ///
    /// # Errors
    /// [`Error::StoreRefused`] when the put failed twice and the slot read back empty both
    /// times; [`Error::PublishUnknown`] when the re-read fails (the object may have landed).
    pub(crate) async fn journal_create(
        &self,
        header: &JournalHeader,
        bytes: Bytes,
    ) -> Result<Created, Error> {
        let store = &self.inner.store;
        store.writable("journal create")?;
        let path = store.layout.journal(&header.run, header.slot);
        let mut retried = false;
        loop {
            let put = store
                .object
                .put_opts(
                    &path,
                    PutPayload::from(bytes.clone()),
                    PutMode::Create.into(),
                )
                .await;
            let cause = match put {
                Ok(_) => return Ok(Created::Landed),
                Err(e) => {
                    debug!(run = %header.run, slot = header.slot, error = %e, "journal create not plainly landed; re-reading");
                    e
                }
            };
            let unknown = |source: Error| Error::PublishUnknown {
                org: format!("journal {}", header.run),
                seq: header.slot,
                source: Box::new(source),
            };
            match self.read_journal_header(&header.run, header.slot).await {
                Ok(Some(found)) if found.header.nonce == header.nonce => {
                    return Ok(Created::Landed);
                }
                Ok(Some(found)) => return Ok(Created::Taken(Box::new(found.header))),
                Ok(None) if !retried => retried = true,
                Ok(None) => {
                    return Err(Error::StoreRefused {
                        org: format!("journal {}", header.run),
                        seq: header.slot,
                        source: Box::new(Error::store("put", &path, cause)),
                    });
                }
                // A damaged object in our slot is not ours: we never write one.
                Err(e @ Error::Corrupt { .. }) => return Err(e),
                Err(e) => return Err(unknown(e)),
            }
        }
    }

    /// The header of the object at `slot` of `run`; `None` when there is none. One range GET
    /// when the header fits in the first 64 KiB, two otherwise.
    ///
    /// # Errors
    /// [`Error::Corrupt`] / [`Error::UnknownFormat`] for a header that fails its checks;
    /// [`Error::Store`].
    pub async fn read_journal_header(
        &self,
        run: &RunName,
        slot: u64,
    ) -> Result<Option<Listed>, Error> {
        let store = &self.inner.store;
        let path = store.layout.journal(run, slot);
        let opts = GetOptions {
            range: Some(GetRange::Bounded(0..HEAD_READ)),
            ..GetOptions::default()
        };
        let got = match store.object.get_opts(&path, opts).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            // A store refuses a range that starts past an empty object's end (S3: 416):
            // the object's size tells a damaged object from a store that is down.
            Err(e) => {
                return match store.object.head(&path).await {
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Ok(meta) if meta.size < PREFIX as u64 => Err(Error::corrupt(
                        path.as_ref(),
                        "shorter than a journal object's prefix",
                    )),
                    _ => Err(Error::store("get", &path, e)),
                };
            }
        };
        let size = got.meta.size;
        let last_modified_ms =
            u64::try_from(got.meta.last_modified.timestamp_millis()).unwrap_or(0);
        let mut head = got
            .bytes()
            .await
            .map_err(|e| Error::store("get", &path, e))?
            .to_vec();
        let len = journal::header_len(path.as_ref(), &head)?;
        let want = (PREFIX + len) as u64;
        if want > size {
            return Err(Error::corrupt(
                path.as_ref(),
                "journal header past the object's end",
            ));
        }
        if (head.len() as u64) < want {
            let rest = store
                .object
                .get_range(&path, head.len() as u64..want)
                .await
                .map_err(|e| Error::store("get", &path, e))?;
            head.extend_from_slice(&rest);
        }
        let header = journal::parse_header(path.as_ref(), &head, run, slot, size)?;
        Ok(Some(Listed::new(header, len, size, last_modified_ms)))
    }

    /// Lists `run` from `from` up (S3's start-after, so the cost follows the objects above
    /// `from`) and reads every listed object's header, `header_concurrency` at a time.
    ///
    /// # Errors
    /// [`Error::MissingObject`] when a listed object is gone before its header is read (the
    /// caller re-plans, `docs/design.md` 3g "Readers"); [`Error::Corrupt`] for a name or
    /// header that fails its checks; [`Error::Store`].
    pub async fn list_run(&self, run: &RunName, from: u64) -> Result<RunListing, Error> {
        let store = &self.inner.store;
        let dir = store.layout.journal_dir(run);
        let from = from.max(1);
        let listed: Vec<object_store::ObjectMeta> = if from == 1 {
            store.list_all(&dir).await?
        } else {
            let offset = store.layout.journal(run, from - 1);
            store
                .object
                .list_with_offset(Some(&dir), &offset)
                .try_collect()
                .await
                .map_err(|e| Error::store("list", &dir, e))?
        };
        let mut slots = Vec::with_capacity(listed.len());
        let mut known = BTreeMap::new();
        for meta in &listed {
            let name = meta.location.filename().unwrap_or_default();
            match parse_slot_name(name) {
                Some(slot) if slot >= from => {
                    let modified =
                        u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
                    match self.inner.journal_headers.get(
                        meta.location.as_ref(),
                        meta.size,
                        modified,
                    ) {
                        Some(l) => {
                            known.insert(slot, l);
                        }
                        None => slots.push((slot, meta.size, modified)),
                    }
                }
                Some(_) => {}
                None => {
                    return Err(Error::corrupt(
                        meta.location.as_ref(),
                        "not a journal slot name",
                    ));
                }
            }
        }
        let reads = futures::stream::iter(slots)
            .map(|(slot, size, modified)| async move {
                match self.read_journal_header(run, slot).await? {
                    Some(l) => {
                        // Keyed by what the LIST said (a GET's Last-Modified may be coarser).
                        let name = self.inner.store.layout.journal(run, slot);
                        let l = Arc::new(l);
                        self.inner.journal_headers.insert(
                            name.as_ref(),
                            (size, modified),
                            l.clone(),
                        );
                        Ok((slot, l))
                    }
                    None => Err(Error::MissingObject {
                        path: self.inner.store.layout.journal(run, slot).to_string(),
                    }),
                }
            })
            .buffer_unordered(self.inner.settings.header_concurrency.max(1))
            .try_collect::<BTreeMap<u64, Arc<Listed>>>()
            .await?;
        let mut reads = reads;
        reads.append(&mut known);
        Ok(RunListing {
            run: run.clone(),
            from,
            objects: Slots::from(reads),
        })
    }

    /// The uncompressed delta body of `section` of the batch `listed` (one range GET of its
    /// frame), checked against the digest that binds it to its org, run and slot.
    ///
    /// # Errors
    /// [`Error::MissingObject`] when the object is gone; [`Error::Corrupt`] when the frame
    /// fails its checks or `listed` is not a batch holding `section`; [`Error::Store`].
    pub async fn read_journal_section(
        &self,
        listed: &Listed,
        section: &SectionIndex,
    ) -> Result<Vec<u8>, Error> {
        let store = &self.inner.store;
        let h = &listed.header;
        let path = store.layout.journal(&h.run, h.slot);
        let holds = matches!(&h.object, JournalObject::Batch(b) if b.sections.contains(section));
        if !holds {
            return Err(Error::corrupt(
                path.as_ref(),
                "the batch holds no such section",
            ));
        }
        let range = journal::frame_range(listed.header_len, section);
        if range.end > listed.size {
            return Err(Error::corrupt(
                path.as_ref(),
                "section frame past the object's end",
            ));
        }
        let frame = match store.object.get_range(&path, range).await {
            Ok(b) => b,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::MissingObject {
                    path: path.to_string(),
                });
            }
            Err(e) => return Err(Error::store("get", &path, e)),
        };
        let object = path.to_string();
        let (run, slot, section) = (h.run.clone(), h.slot, section.clone());
        crate::replica::blocking("journal section", move || {
            journal::section_body(&object, &run, slot, &section, &frame)
        })
        .await
    }
}
