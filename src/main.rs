//! `idem`: the command-line tool of idem — the HTTP ledger server and the operator commands,
//! plus a rolling-upgrade demo and a benchmark harness.
//!
//! Layout: the product is `cli` (the command list), `serve/` (the request path, through
//! `idem-org` only), `ops/` (operator commands that read the replica log directly, like
//! `litestream restore`) and `store/` (store URLs, restoring an org's published state), which
//! both use. `demo/` (`idem demo`) and `bench/` (`idem bench`) are tools beside the product:
//! each is reached through one entry point (`Args` + `run`) and nothing in the product uses
//! them. The binary depends on `idem-org` alone and reaches idem, the replica and SQLite
//! through its re-exports.
//!
//! Every failure ends as one line on stderr and a non-zero exit code; nothing panics on
//! user or environment input. Output goes through `out` (a closed stdout ends a command
//! quietly) and logs through `log` (a dead or stalled stderr reader blocks nothing): neither
//! `println!` nor `eprintln!` is used, since both panic when their write fails.
#![forbid(unsafe_code)]
// Output goes through `out` and `log`: `println!` and `eprintln!` panic on a failed write.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
mod out;

mod cli;
mod log;
mod ops;
mod serve;
mod store;

// `bench/` and `demo/` still read the host's clock directly; they follow the workspace's
// clock rule (clippy.toml: time through `idem_base`) when they move to their own crates.
#[allow(clippy::disallowed_methods)]
mod bench;
#[allow(clippy::disallowed_methods)]
mod demo;

use std::process::ExitCode;

use clap::Parser;

/// Renders an error and its sources on one line (`outer: inner: root`, by
/// [`idem_base::ErrorChain`]), a line break in a message turned into a space so every failure
/// stays one line on stderr.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    idem_base::ErrorChain::new(e).to_string().replace('\n', " ")
}

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // A filter that does not parse is refused before the command does anything.
    let filter = match log::filter(cli.default_log()) {
        Ok(f) => f,
        Err(msg) => {
            errln!("idem: {msg}");
            return ExitCode::from(2);
        }
    };
    if let Err(msg) = log::init(filter) {
        errln!("idem: {msg}");
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
            errln!("idem: cannot start the async runtime: {e}");
            log::finish();
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(cli.run()) {
        // Output lost to a write error (not a closed pipe: `out`) is a failure.
        Ok(_) if out::stdout_failed() => ExitCode::FAILURE,
        Ok(code) => code,
        Err(msg) => {
            errln!("idem: {msg}");
            ExitCode::FAILURE
        }
    };
    report_peak_rss();
    log::finish();
    code
}

/// The environment variable that makes every subcommand print its peak resident memory.
pub(crate) const PEAK_RSS_ENV: &str = "IDEM_REPORT_PEAK_RSS";

/// The stderr line prefix of that report, followed by the kibibytes: `idem bench` runs
/// subcommands as child processes and parses it.
pub(crate) const PEAK_RSS_LINE: &str = "idem: peak RSS KiB ";

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
