//! `idem`: the command line of idem — the HTTP ledger server and the operator commands. Every
//! command lives in the `idem_cli` library; this binary only hands it the arguments.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    idem_cli::main_from(std::env::args_os())
}
