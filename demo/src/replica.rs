//! A replica of the demo: this very binary re-run as `idem serve` in its own OS process
//! (`idem-demo idem serve …`, dispatched to the `idem_cli` library): each replica runs exactly
//! the serve code the demo was built with, and `cargo run -p idem-demo` needs no other binary
//! built or found on PATH.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running `idem serve` child process.
#[derive(Debug)]
pub struct ReplicaProc {
    /// Short name (`A`, `B`, `C`).
    pub name: String,
    /// Base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    child: Child,
}

impl ReplicaProc {
    /// Starts `idem serve` on `127.0.0.1:0` over `store` (with `--journal` when `journal`),
    /// logging to `<dir>/replica-<name>.log`, and waits for the address it prints.
    ///
    /// # Errors
    /// Spawn failure, or the child exits or stays silent for 20 s before listening.
    pub async fn start(
        name: &str,
        store: &Path,
        data: &Path,
        dir: &Path,
        lease_ms: u64,
        journal: bool,
    ) -> Result<ReplicaProc, String> {
        let log_path = dir.join(format!("replica-{}.log", name.to_lowercase()));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let serve =
            idem_cli::own_idem_command().map_err(|e| format!("cannot find own binary: {e}"))?;
        let mut child = Command::from(serve)
            .arg("serve")
            .arg("--store")
            .arg(store)
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(["--writer", &format!("replica-{}", name.to_lowercase())])
            .args(["--lease-ms", &lease_ms.to_string()])
            .args(journal.then_some("--journal"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start replica {name}: {e}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| format!("replica {name}: no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
        let url = match first {
            Ok(Ok(Some(line))) => line
                .strip_prefix("listening on ")
                .map(str::to_owned)
                .ok_or_else(|| format!("replica {name} printed {line:?}"))?,
            _ => {
                return Err(format!(
                    "replica {name} did not start; see {}",
                    log_path.display()
                ));
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(ReplicaProc {
            name: name.to_owned(),
            url,
            child,
        })
    }

    fn signal(&self, sig: Signal) -> Result<(), String> {
        let pid = self
            .child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| format!("replica {} already exited", self.name))?;
        kill(Pid::from_raw(pid), sig)
            .map_err(|e| format!("cannot signal replica {}: {e}", self.name))
    }

    /// Sends SIGTERM (graceful: the replica releases every org) and waits for the exit.
    ///
    /// # Errors
    /// Signal failure, no exit within 30 s, or a non-zero exit status.
    pub async fn terminate(mut self) -> Result<(), String> {
        self.signal(Signal::SIGTERM)?;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .map_err(|_| format!("replica {} did not exit within 30 s of SIGTERM", self.name))?
            .map_err(|e| format!("waiting for replica {}: {e}", self.name))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("replica {} exited with {status}", self.name))
        }
    }

    /// Sends SIGKILL (a crash: nothing is released) and reaps the process.
    ///
    /// # Errors
    /// Signal failure.
    pub async fn kill(mut self) -> Result<(), String> {
        self.signal(Signal::SIGKILL)?;
        let _ = self.child.wait().await;
        Ok(())
    }
}
