//! Helpers shared by the CLI tests: run the `idem` binary, spawn servers, poll with deadlines.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use idem_base::Stopwatch;

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
        let mut cmd = serve_command(store, data, args);
        cmd.stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::spawn(cmd)
    }

    /// Spawns `cmd` (an `idem serve`, e.g. from [`serve_command`]) with stdout piped and
    /// reads the address it prints first.
    pub fn spawn(mut cmd: Command) -> TestResult<Server> {
        cmd.stdout(Stdio::piped());
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
        self.signal(nix::sys::signal::Signal::SIGTERM)
    }

    /// Sends `sig` and waits (bounded) for the exit status.
    pub fn signal(
        &mut self,
        sig: nix::sys::signal::Signal,
    ) -> TestResult<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, sig)?;
        let waited = Stopwatch::start();
        let limit = Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if waited.elapsed() > limit {
                return Err(format!("server did not exit within 30 s of {sig}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `idem serve --store STORE --listen 127.0.0.1:0 --data DATA ARGS...`, not yet spawned.
pub fn serve_command(store: &Path, data: &Path, args: &[&str]) -> Command {
    let mut cmd = idem();
    cmd.arg("serve")
        .arg("--store")
        .arg(store)
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(args);
    cmd
}

/// Polls `cond` until it holds or `secs` pass.
pub fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let waited = Stopwatch::start();
    let limit = Duration::from_secs(secs);
    while waited.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// An HTTP client with a 20 s timeout per request: a server that hangs fails the test.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The value of one sample line of the Prometheus text format, `name{labels} value`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// `GET {url}/metrics` as text.
pub async fn metrics_text(url: &str) -> TestResult<String> {
    Ok(client()
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .text()
        .await?)
}

/// A store under `dir` holding org `acme` with effects `sent` (committed), `lost-1` and
/// `lost-2` (ambiguous), released (no live lease); its path.
pub fn seeded_effects_store(dir: &Path) -> TestResult<String> {
    use idem_org::idem::effect;
    use idem_org::replica::{OrgId, Replica, Settings};
    let store = dir.join("store");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replica = Replica::open(Replica::local_store(&store)?, "", Settings::default()).await?;
        let registry = idem_org::Registry::builder(dir.join("data"), replica, "seed").build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        org.effect("sent", effect::Options::new(), || async {
            Ok(b"ok".to_vec())
        })
        .await?;
        for key in ["lost-1", "lost-2"] {
            let out = org
                .effect(key, effect::Options::new(), || async {
                    Err(effect::Error::ambiguous("connection reset"))
                })
                .await;
            assert!(out.is_err());
        }
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    Ok(store.display().to_string())
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

/// libfaketime's thread-safe build (the server is multi-threaded), from Debian's `faketime`
/// package; an error saying how to install it when it is missing.
pub fn libfaketime() -> TestResult<PathBuf> {
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten();
    multiarch
        .map(|e| e.path())
        .chain([PathBuf::from("/usr/lib"), PathBuf::from("/usr/local/lib")])
        .map(|dir| dir.join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.is_file())
        .ok_or_else(|| "libfaketime is missing: these tests need Debian's faketime (apt-get install -y faketime)".into())
}
