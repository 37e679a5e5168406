#!/usr/bin/env python3
"""A tenant's application for `idem import`'s tests (tests/cli_import_live.rs).

usage: tenant_writer.py DB CONTROL_DIR BASELINE_COMMITS AFTER_COMMITS PAUSE_SECONDS

Commits transfers to DB (a WAL database the test created: accounts, transfers, meta, filler)
with the settings an application normally has: WAL, synchronous=NORMAL and SQLite's default
autocheckpoint (1000 pages). Each transaction moves cents between two accounts, appends the
transfer, bumps meta.n and rewrites one filler row, so every committed state has
sum(accounts.cents) unchanged and count(transfers) == max(transfers.seq) == meta.n. It pauses
PAUSE_SECONDS after each commit: the pace of a busy application, not an ordering device.

After every commit it records the size of DB-wal and the log's checkpoint sequence (bytes
12..16 of the WAL header, which SQLite bumps each time a checkpoint completes and the log
restarts from its beginning). Phases, coordinated through files in CONTROL_DIR (each written
whole, then renamed into place):

  baseline  the first BASELINE_COMMITS commits, then baseline.json is written;
  import    until CONTROL_DIR/import-done exists (the test runs `idem import` meanwhile);
  after     AFTER_COMMITS more, then report.json (all three phases) is written and it exits.

A phase reports its commits, the largest -wal seen, how many times the log restarted, and its
longest commit in milliseconds. It exits by itself if the test that started it is gone.
"""
import json
import os
import random
import sqlite3
import struct
import sys
import time

db, ctl = sys.argv[1], sys.argv[2]
baseline_commits, after_commits = int(sys.argv[3]), int(sys.argv[4])
pause = float(sys.argv[5])
wal = db + "-wal"
parent = os.getppid()

conn = sqlite3.connect(db, isolation_level=None)
conn.execute("PRAGMA busy_timeout = 10000")
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("PRAGMA synchronous = NORMAL")
accounts = conn.execute("SELECT count(*) FROM accounts").fetchone()[0]
fillers = conn.execute("SELECT max(id) FROM filler").fetchone()[0]


def checkpoint_seq():
    try:
        with open(wal, "rb") as f:
            header = f.read(16)
    except FileNotFoundError:
        return None
    return struct.unpack(">I", header[12:16])[0] if len(header) == 16 else None


def wal_size():
    try:
        return os.stat(wal).st_size
    except FileNotFoundError:
        return 0


def publish(name, value):
    tmp = os.path.join(ctl, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.rename(tmp, os.path.join(ctl, name))


def fresh():
    return {"commits": 0, "max_wal": 0, "restarts": 0, "max_commit_ms": 0.0}


rng = random.Random(25)
done = os.path.join(ctl, "import-done")
phases = {"baseline": fresh()}
name = "baseline"
seq = checkpoint_seq()
while os.getppid() == parent:
    a, b = rng.randrange(1, accounts + 1), rng.randrange(1, accounts + 1)
    cents = rng.randrange(1, 100)
    started = time.monotonic()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE accounts SET cents = cents - ? WHERE id = ?", (cents, a))
    conn.execute("UPDATE accounts SET cents = cents + ? WHERE id = ?", (cents, b))
    conn.execute("UPDATE meta SET n = n + 1")
    n = conn.execute("SELECT n FROM meta").fetchone()[0]
    conn.execute(
        "INSERT INTO transfers (seq, src, dst, cents) VALUES (?, ?, ?, ?)", (n, a, b, cents)
    )
    conn.execute(
        "UPDATE filler SET b = randomblob(length(b)) WHERE id = ?",
        (rng.randrange(1, fillers + 1),),
    )
    conn.execute("COMMIT")
    took = (time.monotonic() - started) * 1000.0
    phase = phases[name]
    phase["commits"] += 1
    phase["max_wal"] = max(phase["max_wal"], wal_size())
    phase["max_commit_ms"] = max(phase["max_commit_ms"], took)
    now = checkpoint_seq()
    if now != seq:
        phase["restarts"] += 1
        seq = now
    if name == "baseline" and phase["commits"] >= baseline_commits:
        publish("baseline.json", {"n": n, **phase})
        name = "import"
        phases[name] = fresh()
    elif name == "import" and os.path.exists(done):
        name = "after"
        phases[name] = fresh()
    elif name == "after" and phase["commits"] >= after_commits:
        publish("report.json", {"n": n, **phases})
        break
    time.sleep(pause)
conn.close()
