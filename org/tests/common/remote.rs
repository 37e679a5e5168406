//! A fake remote that records every charge (the exactly-once oracle of external effects), and
//! a gate failpoint that holds the org's writer at one idem failpoint until the test opens it.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use idem::failpoint::{FailPoint, Failpoints};

/// Records every charge made through it, in order.
#[derive(Debug, Default)]
pub struct Remote {
    charges: Mutex<Vec<String>>,
}

impl Remote {
    /// Charges for `key` once more and returns the charge id (`ch_<key>_<n>`, n counting every
    /// charge this remote made).
    pub fn charge(&self, key: &str) -> Vec<u8> {
        let mut charges = self.charges.lock().unwrap_or_else(|p| p.into_inner());
        let id = format!("ch_{key}_{}", charges.len());
        charges.push(key.to_owned());
        id.into_bytes()
    }

    /// Charges per key.
    pub fn per_key(&self) -> BTreeMap<String, usize> {
        let charges = self.charges.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = BTreeMap::new();
        for k in charges.iter() {
            *out.entry(k.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Charges made for `key`.
    pub fn charges(&self, key: &str) -> usize {
        self.per_key().get(key).copied().unwrap_or(0)
    }
}

/// Holds the writer thread at `point` (the first time it is hit) until [`Gate::open`]: sends
/// on `reached` when it gets there. A seam that orders "the caller is dropped while the
/// protocol is at this step" without a sleep.
#[derive(Debug)]
pub struct Gate {
    point: FailPoint,
    reached: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    go: Mutex<Option<mpsc::Receiver<()>>>,
}

/// The test's side of a [`Gate`].
pub struct GateKeys {
    /// Fires when the writer reaches the point.
    pub reached: tokio::sync::oneshot::Receiver<()>,
    /// Opens the gate.
    pub open: mpsc::Sender<()>,
}

impl Gate {
    pub fn at(point: FailPoint) -> (Arc<Gate>, GateKeys) {
        let (reached_tx, reached) = tokio::sync::oneshot::channel();
        let (open, go) = mpsc::channel();
        let gate = Arc::new(Gate {
            point,
            reached: Mutex::new(Some(reached_tx)),
            go: Mutex::new(Some(go)),
        });
        (gate, GateKeys { reached, open })
    }
}

impl Failpoints for Gate {
    fn hit(&self, point: FailPoint) -> Result<(), String> {
        if point != self.point {
            return Ok(());
        }
        let go = self.go.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(go) = go {
            if let Some(r) = self
                .reached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                let _ = r.send(());
            }
            let _ = go.recv(); // the test opens it (or drops its sender)
        }
        Ok(())
    }
}
