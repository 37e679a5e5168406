//! The writer's job vocabulary: the [`Job`] enum and the payload of every job, effect work
//! included. Jobs are queued by `Writer` (`super`) and run by `super::run`, one at a time per
//! org, in the order queued.

use std::sync::Arc;
use std::time::SystemTime;

use idem::effect::{
    self, Effect, Reservation, Reserved, Resolution, Settlement, State, Transition,
};
use idem::{BoxError, Options, Outcome, Record};
use idem_replica::sqlite::{CaptureError, CaptureRequest, Captured, OwnedFiles};
use rusqlite::{Connection, Transaction};
use tokio::sync::oneshot;

use crate::commit::Answer;
use crate::effect::holder::Holder;

/// The boxed `apply` closure of a request.
pub(crate) type ApplyFn =
    Box<dyn FnOnce(&Transaction<'_>) -> Result<Vec<u8>, BoxError> + Send + 'static>;

/// Where a job sends its answer.
pub(crate) type Reply<T> = oneshot::Sender<Result<Answer<T>, idem::Error>>;

/// A boxed read: runs on the writer connection between two jobs and sends its own typed
/// result (a panic drops the sender). A transaction it leaves open is rolled back.
pub(crate) type ReadFn = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

pub(crate) enum Job {
    Once {
        key: String,
        opts: Options,
        apply: ApplyFn,
        reply: Reply<Outcome>,
    },
    Applied {
        key: String,
        reply: Reply<Option<Record>>,
    },
    Prune {
        cutoff: SystemTime,
        reply: Reply<u64>,
    },
    /// `VACUUM` the database, then raise the commit sequence.
    Vacuum { reply: Reply<()> },
    /// External-effect work (`crate::effect`).
    Effect(EffectJob),
    /// Copy what the next ship publishes, between two transactions.
    Capture {
        request: CaptureRequest,
        reply: oneshot::Sender<Result<Captured, CaptureError>>,
    },
    /// A read on the writer connection (`Org::read`).
    Read { read: ReadFn, reply: Reply<()> },
    /// Answers once every job queued before it has run: the drain before a release.
    Drain { reply: oneshot::Sender<()> },
    /// Parks the writer (`crate::park`): when the database still holds commit `shipped`,
    /// checkpoints every frame into the file and closes the connection (before its
    /// descriptors, I13).
    Park {
        shipped: u64,
        reply: oneshot::Sender<Result<(), ParkRefused>>,
    },
    /// Reopens a parked writer's connection (`crate::park`) and answers with the
    /// descriptors the shipper checks the file through before anything is served.
    Unpark {
        reply: oneshot::Sender<Result<Arc<OwnedFiles>, String>>,
    },
}

/// Why a [`Job::Park`] left the writer open.
#[derive(Debug)]
pub(crate) enum ParkRefused {
    /// Something committed since the caller looked, or the checkpoint could not empty the
    /// WAL: the connection stays open and serves on.
    Busy(String),
    /// The files were changed outside the writer (I13): the org must stop.
    Foreign(String),
}

/// Effect work for the org's writer thread, for the handle `holder`.
pub(crate) struct EffectJob {
    pub(crate) holder: Arc<Holder>,
    pub(crate) work: Work,
}

/// What an [`EffectJob`] does. Every `opts` is the handle's ([`Holder::options`]): its holder
/// label, lapse rule and clock; the runner adds the commit-counter bump.
pub(crate) enum Work {
    Reserve {
        key: String,
        opts: effect::Options,
        reply: Reply<Reserved>,
    },
    Settle {
        reservation: Box<Reservation>,
        settlement: Settlement,
        opts: effect::Options,
        reply: Reply<Effect>,
    },
    Resolve {
        key: String,
        resolution: Resolution,
        by: String,
        opts: effect::Options,
        reply: Reply<Effect>,
    },
    /// Rows as the handle judges them (a lapsed reservation reads AMBIGUOUS).
    Read {
        key: Option<String>,
        state: Option<State>,
        opts: effect::Options,
        reply: Reply<Vec<Effect>>,
    },
    History {
        key: String,
        reply: Reply<Vec<Transition>>,
    },
}
