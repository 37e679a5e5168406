//! The log sink: a bounded, lossy queue in front of stderr, written by one thread of its own.
//!
//! Invariant: logging is never on the acknowledgement path. A thread that logs (a tokio
//! worker, an org's writer thread) only appends the formatted line to the queue and returns:
//! it never waits for stderr. A line that does not fit (the reader stalled and the queue
//! holds [`QUEUE_BYTES`] already) is dropped and counted; a write that fails on the sink's
//! thread (EPIPE once the log shipper died, EAGAIN, EIO) drops that line and is counted.
//! Nothing here panics or blocks a caller, whatever happens to stderr.
//!
//! Own code rather than `tracing-appender`'s non-blocking writer: its guard prints to stdout
//! when it cannot stop its worker within 100 ms (a panic on a closed stdout, a hang on a full
//! one, at exit), its worker reports a failed flush with `eprintln!`, and it brings a date
//! and time crate and rolling files for nothing used here.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Bytes of formatted lines the queue holds at most (memory bounded by a constant, not by
/// how long the reader stalls).
pub(crate) const QUEUE_BYTES: usize = 1 << 20;

/// Counts of lines that never reached stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// Lines whose write failed (the reader is gone, or the descriptor refused it).
    pub write_failures: u64,
    /// Lines refused because the queue was full (the reader is alive but not reading).
    pub queue_full: u64,
}

/// A handle on the queue; cheap to clone, shared by every thread that logs.
#[derive(Clone)]
pub(crate) struct Sink(Arc<Shared>);

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a line is queued.
    work: Condvar,
    /// Signalled when the queue empties and nothing is being written.
    idle: Condvar,
    capacity: usize,
    write_failures: AtomicU64,
    queue_full: AtomicU64,
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    writing: bool,
}

impl Sink {
    /// Starts the sink's thread, which writes queued lines to `out` in order.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub(crate) fn start(out: impl Write + Send + 'static, capacity: usize) -> io::Result<Sink> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            capacity,
            write_failures: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("idem-log".into())
            .spawn(move || worker.run(out))?;
        Ok(Sink(shared))
    }

    /// Queues one line, or counts it as dropped when the queue is full. Never blocks on the
    /// output.
    pub(crate) fn push(&self, line: &[u8]) {
        let s = &self.0;
        let mut q = s.lock();
        if q.bytes + line.len() > s.capacity {
            drop(q);
            s.queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.bytes += line.len();
        q.lines.push_back(line.to_vec());
        drop(q);
        s.work.notify_one();
    }

    /// Waits, at most `within`, until every queued line was written (or failed): the last
    /// lines of a command reach stderr before it exits, and a stalled reader delays the exit
    /// by `within` at most.
    pub(crate) fn drain(&self, within: Duration) {
        let s = &self.0;
        let q = s.lock();
        let _ = s
            .idle
            .wait_timeout_while(q, within, |q| q.writing || !q.lines.is_empty());
    }

    /// Lines that never reached the output so far.
    pub(crate) fn dropped(&self) -> Dropped {
        Dropped {
            write_failures: self.0.write_failures.load(Ordering::Relaxed),
            queue_full: self.0.queue_full.load(Ordering::Relaxed),
        }
    }
}

impl Shared {
    /// A poisoned lock still holds a consistent queue (every critical section is a few
    /// field updates), so logging goes on after a panic elsewhere.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        idem_base::lock(&self.queue)
    }

    /// The sink's thread: one line at a time, written outside the lock.
    fn run(&self, mut out: impl Write) {
        let mut q = self.lock();
        loop {
            let line = match q.lines.pop_front() {
                Some(line) => line,
                None => {
                    self.idle.notify_all();
                    q = idem_base::lock::wait(&self.work, q);
                    continue;
                }
            };
            q.bytes -= line.len();
            q.writing = true;
            drop(q);
            if out.write_all(&line).and_then(|()| out.flush()).is_err() {
                self.write_failures.fetch_add(1, Ordering::Relaxed);
            }
            q = self.lock();
            q.writing = false;
        }
    }
}

/// `tracing_subscriber`'s fmt layer formats each event into one buffer and hands it over in
/// one `write_all`: one `write` here is one line.
impl Write for &Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = &'a Sink;

    fn make_writer(&'a self) -> &'a Sink {
        self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// An output that fails every write, as stderr does once its reader is gone.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// An output that blocks until the test lets it go, as a full pipe does.
    struct Gated {
        entered: mpsc::Sender<()>,
        gate: mpsc::Receiver<()>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.entered.send(());
            let _ = self.gate.recv();
            idem_base::lock(&self.got).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn failed_writes_are_counted_and_never_reach_the_caller() -> io::Result<()> {
        let sink = Sink::start(Broken, 1 << 10)?;
        for _ in 0..5 {
            (&sink).write_all(b"a line\n")?;
        }
        sink.drain(Duration::from_secs(10));
        assert_eq!(
            sink.dropped(),
            Dropped {
                write_failures: 5,
                queue_full: 0
            }
        );
        Ok(())
    }

    /// The output blocks on its first line: callers still return at once, lines past the
    /// bound are counted as dropped, and the lines that fit are written in order once the
    /// output moves again.
    #[test]
    fn a_stalled_output_drops_what_does_not_fit_and_blocks_nobody() -> io::Result<()> {
        let (entered_tx, entered) = mpsc::channel();
        let (open, gate) = mpsc::channel();
        let got = Arc::new(Mutex::new(Vec::new()));
        let out = Gated {
            entered: entered_tx,
            gate,
            got: got.clone(),
        };
        let sink = Sink::start(out, 10)?;
        sink.push(b"first\n");
        // The sink's thread holds "first" inside the blocked write: the queue is empty again.
        entered.recv().map_err(io::Error::other)?;
        sink.push(b"12345\n"); // 6 bytes: fits in 10
        sink.push(b"abcde\n"); // 12 bytes in all: dropped
        sink.push(b"xyz\n"); // 10 bytes in all: fits
        assert_eq!(sink.dropped().queue_full, 1);
        for _ in 0..3 {
            open.send(()).map_err(io::Error::other)?;
        }
        sink.drain(Duration::from_secs(10));
        let got = idem_base::lock(&got).clone();
        assert_eq!(got, b"first\n12345\nxyz\n");
        assert_eq!(sink.dropped().write_failures, 0);
        Ok(())
    }

    /// A drain gives up after its bound when the output never moves.
    #[test]
    fn drain_is_bounded_by_its_timeout() -> io::Result<()> {
        let (entered_tx, entered) = mpsc::channel();
        let (_open, gate) = mpsc::channel::<()>();
        let out = Gated {
            entered: entered_tx,
            gate,
            got: Arc::new(Mutex::new(Vec::new())),
        };
        let sink = Sink::start(out, 1 << 10)?;
        sink.push(b"stuck\n");
        entered.recv().map_err(io::Error::other)?;
        sink.drain(Duration::from_millis(50));
        Ok(())
    }
}
