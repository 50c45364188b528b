"""Horovod's timeline: HOROVOD_TIMELINE at launch (`hvdd run
--timeline-filename`) and start_timeline/stop_timeline at run time. The
daemon writes the files; the test parses them as chrome://tracing would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

WORKERS = os.path.join(ROOT, "clients", "python", "tests", "workers.py")


def _rows(path: str) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Parses a timeline: per tensor row, its (phase, name) events; and the
    global marks. Fails on a row named twice."""
    with open(path) as f:
        events = json.load(f)
    assert isinstance(events, list)
    names: dict[int, str] = {}
    rows: dict[str, list[tuple[str, str]]] = {}
    marks: list[str] = []
    for e in events:
        if e["ph"] == "M":
            if e["name"] == "process_name" and e["pid"] > 0:
                assert e["args"]["name"] not in rows, f"two rows for {e['args']['name']}"
                names[e["pid"]] = e["args"]["name"]
                rows[e["args"]["name"]] = []
            continue
        assert isinstance(e["ts"], int)
        if e["ph"] == "i":
            marks.append(e["name"])
            continue
        rows[names[e["pid"]]].append((e["ph"], e.get("name", "")))
    # The worker's barrier, around the switch of files, falls in either.
    rows = {k: v for k, v in rows.items() if not k.startswith("barrier.")}
    return rows, marks


def _collective(events: list[tuple[str, str]], op: str, n: int) -> None:
    """Checks one run of a collective on its row: the negotiation with a tick
    per rank, then the collective and hvdd's execution phase inside it."""
    ticks = sorted(name for ph, name in events if ph == "X")
    assert ticks == [str(r) for r in range(n)], events
    assert events[0] == ("B", f"NEGOTIATE_{op}"), events
    assert [e for e in events if e[0] != "X"][1:] == [
        ("E", ""),
        ("B", op),
        ("B", f"SHM_{op}"),
        ("E", ""),
        ("E", ""),
    ], events


def test_timeline(hvdd_bin, tmp_path):
    launch = tmp_path / "launch.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HVDD_SOCKET": str(tmp_path / "hvdd.sock")}
    env.pop("HOROVOD_TIMELINE", None)
    # A relative path each: hvdd run and the client make them absolute for
    # the daemon, which runs elsewhere.
    p = subprocess.run(
        [hvdd_bin, "run", "-np", "2", "--timeline-filename", "launch.json", "--"]
        + [sys.executable, WORKERS, "timeline", "dyn.json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out

    rows, marks = _rows(str(launch))
    assert set(rows) == {"allreduce.launch.grad", "broadcast.launch.bcast"}, rows
    _collective(rows["allreduce.launch.grad"], "ALLREDUCE", 2)
    _collective(rows["broadcast.launch.bcast"], "BROADCAST", 2)
    assert marks == [], "marks without --timeline-mark-cycles"

    rows, marks = _rows(str(tmp_path / "dyn.json"))
    assert set(rows) == {"allreduce.dyn.grad", "allgather.dyn.gather"}, rows
    _collective(rows["allreduce.dyn.grad"], "ALLREDUCE", 2)
    _collective(rows["allgather.dyn.gather"], "ALLGATHER", 2)
    assert marks and set(marks) == {"CYCLE_START"}, marks
