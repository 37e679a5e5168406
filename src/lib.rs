//! `idem_cli`: the command line of idem as a library — the HTTP ledger server and the operator
//! commands — under the thin `idem` binary (`src/bin/idem.rs`), and what the tools beside the
//! product (`idem-demo`, `idem-bench`, their own crates) need from it.
//!
//! Layout: `cli` (the command list), `serve/` (the request path, through `idem-org` only),
//! `ledger` (the application `idem serve` runs and the demo audits), `ops/` (operator commands
//! that read the replica log directly, like `litestream restore`) and `store/` (store URLs,
//! restoring an org's published state), which both use. Nothing here uses the tools. The
//! library depends on `idem-org` alone and reaches idem, the replica and SQLite through its
//! re-exports.
//!
//! Entry points: [`main_from`] runs the command line on given arguments; [`main_with`] is the
//! process setup every binary of the workspace shares; a tool whose first argument is
//! [`AS_IDEM`] runs as the `idem` command line ([`run_as_idem`], [`own_idem_command`]), which
//! is how the tools start servers and operator commands as child processes.
//!
//! Every failure ends as one line on stderr and a non-zero exit code; nothing panics on
//! user or environment input. Output goes through `out` (a closed stdout ends a command
//! quietly) and logs through `log` (a dead or stalled stderr reader blocks nothing): neither
//! `println!` nor `eprintln!` is used, since both panic when their write fails.
#![forbid(unsafe_code)]
// Output goes through `out` and `log`: `println!` and `eprintln!` panic on a failed write.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
pub mod out;

mod cli;
pub mod ledger;
mod log;
mod ops;
mod serve;
pub mod store;

pub use serve::lease_ms_arg;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

/// Renders an error and its sources on one line: `outer: inner: root`.
pub fn chain(e: &dyn std::error::Error) -> String {
    idem_base::ErrorChain::new(e).to_string().replace('\n', " ")
}

/// The first argument that makes a tool binary (`idem-demo`, `idem-bench`) run as the `idem`
/// command line: `idem-demo idem serve …` is `idem serve …`. The tools start their servers and
/// operator commands as children of their own binary this way, so a child always runs the
/// very library the tool was built with, and no second binary has to be built or found.
pub const AS_IDEM: &str = "idem";

/// Runs the `idem` command line on `args` (the first is the program name) and returns its
/// exit code: 2 for a command line that does not parse, 1 for a failure (one line on
/// stderr), the command's own code otherwise.
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    main_with("idem", cli.default_log(), cli.run())
}

/// In a tool binary: when its first argument is [`AS_IDEM`], runs the rest as the `idem`
/// command line and returns that exit code; `None` otherwise (the tool runs its own command).
pub fn run_as_idem() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != AS_IDEM {
        return None;
    }
    Some(main_from(
        std::iter::once(OsString::from("idem")).chain(args),
    ))
}

/// A command that runs this very binary as the `idem` command line (`<exe> idem …`): how a
/// tool binary starts `idem serve` and the operator commands as child processes.
///
/// # Errors
/// The path of the running binary is unknown.
pub fn own_idem_command() -> std::io::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(AS_IDEM);
    Ok(cmd)
}

/// Runs `work` the way every binary of the workspace runs its command: the `IDEM_LOG` filter
/// (`default_log` when unset; one that does not parse exits 2 before anything runs), the
/// non-blocking log sink, a multi-threaded runtime, and one `{name}: why` line on stderr for a
/// failure (exit 1). Lost stdout output (not a closed pipe) turns success into exit 1.
pub fn main_with<F>(name: &str, default_log: &str, work: F) -> ExitCode
where
    F: Future<Output = Result<ExitCode, String>>,
{
    // A filter that does not parse is refused before the command does anything.
    let filter = match log::filter(default_log) {
        Ok(f) => f,
        Err(msg) => {
            errln!("{name}: {msg}");
            return ExitCode::from(2);
        }
    };
    if let Err(msg) = log::init(filter) {
        errln!("{name}: {msg}");
        return ExitCode::FAILURE;
    }
    // Blocking work (hydrate, compression, opening a connection, local store I/O) queues for
    // at most 32 threads instead of tokio's 512: with writers on the registry's pool
    // (`Settings::writer_threads`), thousands of open orgs stay within a few dozen threads.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(32)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            errln!("{name}: cannot start the async runtime: {e}");
            log::finish();
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(work) {
        // Output lost to a write error (not a closed pipe: `out`) is a failure.
        Ok(_) if out::stdout_failed() => ExitCode::FAILURE,
        Ok(code) => code,
        Err(msg) => {
            errln!("{name}: {msg}");
            ExitCode::FAILURE
        }
    };
    report_peak_rss();
    log::finish();
    code
}

/// The environment variable that makes every subcommand print its peak resident memory.
pub const PEAK_RSS_ENV: &str = "IDEM_REPORT_PEAK_RSS";

/// The stderr line prefix of that report, followed by the kibibytes: `idem-bench` runs
/// subcommands as child processes and parses it.
pub const PEAK_RSS_LINE: &str = "idem: peak RSS KiB ";

/// With `IDEM_REPORT_PEAK_RSS=1`, prints the process's peak resident set size (`VmHWM` of
/// `/proc/self/status`, which the kernel keeps) on stderr: measured, never estimated, and
/// read by the process itself so nothing races its exit.
fn report_peak_rss() {
    if std::env::var_os(PEAK_RSS_ENV).is_none_or(|v| v != "1") {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    match status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        Some(kib) => errln!("{PEAK_RSS_LINE}{kib}"),
        None => errln!("idem: peak RSS unknown (no VmHWM in /proc/self/status)"),
    }
}
