//! Helpers shared by the CLI tests: run the `idem` binary, spawn servers, poll with deadlines.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Result type of the tests.
pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The binary under test.
pub fn idem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem"))
}

/// Runs `idem args...` and returns its output.
pub fn run(args: &[&str]) -> Output {
    idem().args(args).output().unwrap()
}

/// Asserts a failed run: non-zero exit, one non-empty stderr line, no panic.
pub fn assert_clean_failure(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(!err.contains("RUST_BACKTRACE"), "backtrace hint: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no error line");
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "stderr {err:?} lacks {needle:?}"
    );
}

/// A running `idem serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `idem serve` on 127.0.0.1:0 and reads the address it prints.
    pub fn start(
        store: &Path,
        data: &Path,
        writer: &str,
        env: &[(&str, &Path)],
    ) -> TestResult<Server> {
        Self::start_with(store, data, &["--writer", writer], env)
    }

    /// [`Server::start`] with other flags instead of `--writer`.
    pub fn start_with(
        store: &Path,
        data: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> TestResult<Server> {
        let mut cmd = idem();
        cmd.arg("serve")
            .arg("--store")
            .arg(store)
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {line:?}"))?
            .to_owned();
        Ok(Server { child, url })
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(&mut self) -> TestResult<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err("server did not exit within 30 s of SIGTERM".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Polls `cond` until it holds or `secs` pass.
pub fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Runs `idem restore ORG --store STORE --to TO`; an error carries its stderr.
pub fn restore(org: &str, store: &str, to: &Path) -> TestResult {
    let out = run(&[
        "restore",
        org,
        "--store",
        store,
        "--to",
        &to.display().to_string(),
    ]);
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "idem restore {org}: {}",
        String::from_utf8_lossy(&out.stderr)
    )
    .into())
}
