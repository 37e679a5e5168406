//! The one path to the terminal for everything that is not a log line: command output on
//! stdout (`outln!`) and the final error line on stderr (`errln!`).
//!
//! Invariant: a write to stdout or stderr never panics and never changes what a command did.
//! `println!` panics when its write fails (EPIPE once `| head` has exited; Rust ignores
//! SIGPIPE, so the write returns the error instead of killing the process), which turned a
//! closed pipe into exit 101. Here:
//! - a **closed stdout** (`BrokenPipe`) means the reader wants nothing more: later output is
//!   dropped without a word and the command ends with the exit code of its work;
//! - **any other stdout failure** (a full disk behind `> file`) drops later output, prints
//!   one line on stderr, and turns a successful exit into 1, since the output is lost;
//! - **stderr** is best effort: a line goes through the log sink (`crate::log`), so it keeps
//!   its place among the log lines and never blocks; a failed write is dropped, since there
//!   is nowhere left to report it.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

/// stdout state: `OPEN`, `CLOSED` (the reader left), `FAILED` (another write error).
static STDOUT: AtomicU8 = AtomicU8::new(OPEN);
const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const FAILED: u8 = 2;

/// Writes one line (`args` and a newline) to stdout, unless stdout is closed or failed.
/// Used through `outln!`.
pub fn line(args: fmt::Arguments<'_>) {
    if STDOUT.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = io::stdout().lock();
    // stdout is line-buffered: the newline flushes, so the error surfaces here, not at exit.
    let written = out.write_fmt(args).and_then(|()| out.write_all(b"\n"));
    if let Err(e) = written {
        if e.kind() == io::ErrorKind::BrokenPipe {
            STDOUT.store(CLOSED, Ordering::Relaxed);
        } else {
            STDOUT.store(FAILED, Ordering::Relaxed);
            err_line(format_args!("idem: cannot write to stdout: {e}"));
        }
    }
}

/// Writes one line to stderr, behind the log lines queued before it (`crate::log`: never
/// blocked by a stalled reader), or directly before logging starts; a failed write drops it.
/// Used through `errln!`.
pub fn err_line(args: fmt::Arguments<'_>) {
    let mut line = args.to_string().into_bytes();
    line.push(b'\n');
    if !crate::log::line(&line) {
        let _ = io::stderr().lock().write_all(&line);
    }
}

/// True when some stdout output was lost to an error other than a closed pipe: the command
/// must not report success.
pub(crate) fn stdout_failed() -> bool {
    STDOUT.load(Ordering::Relaxed) == FAILED
}

/// `println!` that never panics: one line to stdout through [`line`](fn@line).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: one line to stderr through [`err_line`](fn@err_line).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::err_line(format_args!($($arg)*))
    };
}
