//! A bounded pool of writer threads shared by every org of a registry.
//!
//! Each org keeps its own FIFO of jobs and its own connection ([`crate::writer::Writer`]);
//! this module only decides which org runs where. An org with queued jobs is *scheduled*:
//! it sits once in the pool's run queue (never twice), a free worker takes it, runs up to
//! [`BATCH`] of its jobs in order, and puts it back at the end of the run queue if more
//! remain. So one org's jobs never run concurrently or out of order (SQLite has one writer,
//! and a capture must fall between two of its transactions), and a busy org cannot starve
//! the others: after a batch, every other scheduled org runs before it again.
//!
//! ```text
//!   request ─► org FIFO ─► (not scheduled?) run queue ─► worker k: run ≤ BATCH jobs
//!                                   ▲                               │ more queued?
//!                                   └───────────────────────────────┘
//! ```
//!
//! Workers start on demand, up to the pool's width ([`crate::RegistrySettings::writer_threads`]), and
//! live until the last handle on the pool is dropped: the registry and every open org hold
//! one, so an org handle that outlives its registry still has workers to run and close it.
//!
//! The trade-off: a job holds its worker until it returns. A long job (a `VACUUM`, a slow
//! `apply`, a read that scans) delays only its own org while other workers are free; with
//! `writer_threads` long jobs running at once, every other org waits for one to end. Width
//! is the knob: threads cost memory and scheduling, not correctness.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::sync::lock;

/// Jobs a worker runs for one org before it moves on to the next scheduled org.
pub(crate) const BATCH: usize = 16;

/// Something the pool can run: an org's writer with queued jobs.
pub(crate) trait Task: Send + Sync + 'static {
    /// Runs at most `budget` queued jobs, in order. Returns true when jobs remain: the pool
    /// then schedules the task again. The task itself guarantees it is scheduled at most
    /// once at a time (see [`Scheduled`]).
    fn run_batch(&self, budget: usize) -> bool;
}

/// The pool: a handle that keeps its workers alive. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    handle: Arc<Handle>,
}

/// Dropped with the last [`Pool`] clone: tells the workers to finish the run queue and exit.
struct Handle {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    width: usize,
    /// Workers ever started (for tests and metrics).
    started: AtomicUsize,
}

struct State {
    queue: VecDeque<Arc<dyn Task>>,
    workers: usize,
    idle: usize,
    stopping: bool,
}

impl Pool {
    /// A pool of at most `width` worker threads (at least one); none start before work.
    pub(crate) fn new(width: usize) -> Pool {
        Pool {
            handle: Arc::new(Handle {
                shared: Arc::new(Shared {
                    state: Mutex::new(State {
                        queue: VecDeque::new(),
                        workers: 0,
                        idle: 0,
                        stopping: false,
                    }),
                    ready: Condvar::new(),
                    width: width.max(1),
                    started: AtomicUsize::new(0),
                }),
            }),
        }
    }

    /// Worker threads started so far.
    pub(crate) fn threads(&self) -> usize {
        self.handle.shared.started.load(Ordering::Relaxed)
    }

    /// Makes sure at least one worker runs, so work handed to the pool is never stranded.
    ///
    /// # Errors
    /// The I/O error of starting the first worker thread.
    pub(crate) fn ensure_worker(&self) -> std::io::Result<()> {
        let shared = &self.handle.shared;
        let mut st = lock(&shared.state);
        if st.workers == 0 {
            spawn_worker(shared, &mut st)?;
        }
        Ok(())
    }

    /// Puts `task` on the run queue. The caller makes sure a task is queued at most once at a
    /// time. Starts a worker when none is idle and the pool is below its width.
    pub(crate) fn schedule(&self, task: Arc<dyn Task>) {
        let shared = &self.handle.shared;
        let mut st = lock(&shared.state);
        st.queue.push_back(task);
        if st.idle == 0 && st.workers < shared.width {
            // Failing to start one more worker is not fatal: the ones running (there is at
            // least one, see `ensure_worker`) take the task in turn.
            if let Err(e) = spawn_worker(shared, &mut st) {
                tracing::warn!(error = %e, workers = st.workers, "could not start a writer thread");
            }
        }
        drop(st);
        shared.ready.notify_one();
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        lock(&self.shared.state).stopping = true;
        self.shared.ready.notify_all();
    }
}

fn spawn_worker(shared: &Arc<Shared>, st: &mut State) -> std::io::Result<()> {
    let n = shared.started.fetch_add(1, Ordering::Relaxed);
    let me = shared.clone();
    std::thread::Builder::new()
        .name(format!("idem-writer-{n}"))
        .spawn(move || work(&me))?;
    st.workers += 1;
    Ok(())
}

/// A worker: takes the next scheduled task, runs a batch of it, reschedules it if jobs
/// remain; exits once the pool is dropped and the run queue is empty.
fn work(shared: &Shared) {
    loop {
        let task = {
            let mut st = lock(&shared.state);
            loop {
                if let Some(t) = st.queue.pop_front() {
                    break t;
                }
                if st.stopping {
                    st.workers -= 1;
                    return;
                }
                st.idle += 1;
                st = crate::sync::wait(&shared.ready, st);
                st.idle -= 1;
            }
        };
        // A task catches its own jobs' panics; this one guards the worker against a bug in
        // the task's bookkeeping, and drops the task (its org stops being scheduled).
        let more = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run_batch(BATCH)))
            .unwrap_or(false);
        if more {
            lock(&shared.state).queue.push_back(task);
            // No notify: this worker loops and takes the queue's head itself.
        }
    }
}

/// The flag that keeps a task in the run queue at most once: set by whoever queues the
/// first job of an idle org, cleared by the worker that finds the org's FIFO empty — both
/// under the org's own queue lock.
#[derive(Debug, Default)]
pub(crate) struct Scheduled(bool);

impl Scheduled {
    /// Marks the task scheduled; true when it was not (the caller must then schedule it).
    pub(crate) fn claim(&mut self) -> bool {
        !std::mem::replace(&mut self.0, true)
    }

    /// True while the task is in the run queue or a worker runs it.
    pub(crate) fn is_set(&self) -> bool {
        self.0
    }

    /// Marks the task idle: its FIFO is empty and no worker holds it.
    pub(crate) fn release(&mut self) {
        self.0 = false;
    }
}
