"""The table of scripts/gpu-bench.sh (issue 26): reads the figures its steps
left in a directory and writes DIR/summary.md, one row per measure:

    measure | hvdd | peer/limit | ratio | target | result

result is PASS or FAIL where the issue sets a target, INFO where the row is
for comparison only, and n/a where a figure is missing (the step that makes
it was skipped or failed: steps.txt, under the table, says which and why).

    python3 clients/python/tests/gpu/bench_summary.py DIR [--title TEXT]

Standard library only; the files it reads (all optional):
  B.json                       peer_bench.py copy
  nccl1.json                   peer_bench.py nccl1
  gloo-np{2,4}.json            peer_bench.py gloo
  hvdd-bench-np{1,2,4}[-mps].jsonl  hvdd bench --json rows
  latency-np{1,2}[-mps].json   bench_latency.py --json
  train-{hvdd,noallreduce,ddp-gloo}[-mps].json  train_resnet.py --json
  steps.txt                    gpu-bench.sh's PASS / FAIL / SKIP line per step
"""

from __future__ import annotations

import argparse
import json
import os
import sys

KIB4 = 4096
MIB64 = 64 << 20
MIB256 = 256 << 20
HVDD_CUDA = "hvdd (CUDA IPC)"
NCCL = "torch.distributed nccl"


def _load(d: str, name: str):
    p = os.path.join(d, name)
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _rows(d: str, name: str) -> list[dict] | None:
    p = os.path.join(d, name)
    try:
        with open(p) as f:
            out = []
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
            return out or None
    except OSError:
        return None


def _bench(d: str, np: int, mps: bool, nbytes: int, key: str):
    rows = _rows(d, f"hvdd-bench-np{np}{'-mps' if mps else ''}.jsonl")
    for r in rows or []:
        if r.get("op", "allreduce") == "allreduce" and r.get("bytes") == nbytes and not r.get("profile"):
            v = r.get(key)
            if v is None and key == "busbw_gbps" and np == 1:
                v = 0.0
            return v
    return None


def _lat(d: str, np: int, mps: bool, which: str = HVDD_CUDA, mode: str = ""):
    j = _load(d, f"latency-np{np}{'-mps' if mps else ''}{mode}.json")
    try:
        return j["results"][which]["median_us"]
    except (TypeError, KeyError):
        return None


def _train(d: str, mode: str, mps: bool):
    return _load(d, f"train-{mode}{'-mps' if mps else ''}.json")


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if abs(v) >= 100:
        s = f"{v:.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.2f}"
    return f"{s} {unit}".strip()


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str, str]] = []

    def add(self, measure, hvdd, peer, unit, target=None, info=False, ratio=None, judge=None):
        """hvdd and peer are figures (or None); ratio defaults to hvdd/peer;
        judge(ratio) -> bool decides PASS/FAIL where target is set."""
        if ratio is None and hvdd is not None and peer:
            ratio = hvdd / peer
        if hvdd is None or peer is None or ratio is None:
            res = "n/a"
        elif info or judge is None:
            res = "INFO"
        else:
            res = "PASS" if judge(ratio) else "FAIL"
        self.rows.append(
            (
                measure,
                _fmt(hvdd, unit),
                _fmt(peer, unit) if not isinstance(peer, str) else peer,
                "—" if ratio is None else f"{ratio:.2f}",
                target or "—",
                res,
            )
        )

    def value(self, measure: str, v, unit: str) -> None:
        """A figure of the record (a peer's or the limit's), in the peer column."""
        self.rows.append((measure, "—", _fmt(v, unit), "—", "—", "INFO" if v is not None else "n/a"))

    def markdown(self) -> str:
        head = ("measure", "hvdd", "peer/limit", "ratio", "target", "result")
        out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        for r in self.rows:
            out.append("| " + " | ".join(x.replace("|", "/") for x in r) + " |")
        return "\n".join(out)


def build(d: str) -> Table:
    t = Table()
    bj = _load(d, "B.json")
    B = bj.get("B_GBps") if bj else None
    t.value(
        "B: device-to-device copy_ of %s, bytes read + written (GB/s)"
        % (f"{bj['bytes'] >> 20} MiB" if bj else "1 GiB"),
        B,
        "GB/s",
    )

    nj = _load(d, "nccl1.json")
    nccl = nj.get("small_median_us") if nj else None
    nccl_src = "NCCL world 1"
    if nccl is None:  # bench_latency.py's own, at 1 rank
        nccl = _lat(d, 1, False, NCCL)
        nccl_src = "NCCL world 1 (bench_latency.py)"
    ok2 = lambda r: r <= 2.0  # noqa: E731
    ok3 = lambda r: r <= 3.0  # noqa: E731
    t.add(
        f"4 KiB allreduce_, hvdd.torch 1 rank vs torch {nccl_src} (median µs)",
        _lat(d, 1, False),
        nccl,
        "µs",
        "≤ 2x",
        judge=ok2,
    )
    t.add(
        f"4 KiB allreduce_, hvdd.torch 2 ranks on the GPU vs torch {nccl_src} (µs)",
        _lat(d, 2, False),
        nccl,
        "µs",
        "≤ 3x",
        judge=ok3,
    )
    t.add(f"↳ the same under MPS vs {nccl_src} (µs)", _lat(d, 2, True), nccl, "µs", "≤ 3x", judge=ok3)
    t.add("↳ MPS effect: 2 ranks with MPS / without (µs)", _lat(d, 2, True), _lat(d, 2, False), "µs", info=True)
    for np, mps, ok in ((1, False, ok2), (2, False, ok3), (2, True, ok3)):
        where = f"{np} rank{'s on the GPU' if np > 1 else ''}{' under MPS' if mps else ''}"
        t.add(
            f"4 KiB allreduce_, hvdd.torch {where}, completion ordered on the GPU (--gpu-completion stream) vs {nccl_src} (µs)",
            _lat(d, np, mps, mode="-stream"),
            nccl,
            "µs",
            "≤ 3x" if np > 1 else "≤ 2x",
            judge=ok,
        )
        t.add(
            f"↳ {where}: ordered on the GPU / host-synchronised (µs)",
            _lat(d, np, mps, mode="-stream"),
            _lat(d, np, mps),
            "µs",
            info=True,
        )
        t.add(
            f"↳ {where}: ordered, the client's event waited for on the daemon's host (HVDD_GPU_INPUT_WAIT=host) vs {nccl_src} (µs)",
            _lat(d, np, mps, mode="-inhost"),
            nccl,
            "µs",
            info=True,
        )
    t.add(
        "↳ hvdd.torch 1 rank vs NCCL world 1 in the same process (bench_latency.py, µs)",
        _lat(d, 1, False),
        _lat(d, 1, False, NCCL),
        "µs",
        info=True,
    )

    for mps in (False, True):
        v = _bench(d, 2, mps, 4, "median_us")
        t.add(
            f"4 B allreduce, hvdd bench --np 2 --device cuda{' under MPS' if mps else ''} (median µs)",
            v,
            30.0,
            "µs",
            "≤ 30 µs",
            judge=lambda r: r <= 1.0,
        )
    for np in (1, 4):
        v = _bench(d, np, False, 4, "median_us")
        t.add(
            f"↳ 4 B allreduce, hvdd bench --np {np} (µs; vs --np 2)",
            v,
            _bench(d, 2, False, 4, "median_us"),
            "µs",
            info=True,
        )

    for np, mps in ((2, False), (4, False), (2, True)):
        lim = B * (np - 1) / np**2 if B else None
        t.add(
            f"256 MiB allreduce busbw, hvdd bench --np {np}{' under MPS' if mps else ''} vs B(N−1)/N² (GB/s)",
            _bench(d, np, mps, MIB256, "busbw_gbps"),
            lim,
            "GB/s",
            "≥ 0.8",
            judge=lambda r: r >= 0.8,
        )
    v1 = _bench(d, 1, False, MIB256, "algbw_gbps")
    t.add(
        "↳ 256 MiB allreduce algbw, hvdd bench --np 1 vs B/2 (a copy in and out; GB/s)",
        v1,
        B / 2 if B else None,
        "GB/s",
        info=True,
    )

    for np in (2, 4):
        g = _load(d, f"gloo-np{np}.json")
        t.add(
            f"64 MiB allreduce busbw, {np} ranks: hvdd bench vs torch gloo, CUDA tensors (GB/s)",
            _bench(d, np, False, MIB64, "busbw_gbps"),
            g.get("large_busbw_GBps") if g else None,
            "GB/s",
            info=True,
        )
    g2 = _load(d, "gloo-np2.json")
    t.add(
        "4 KiB allreduce, 2 ranks: hvdd.torch vs torch gloo, CUDA tensors (µs)",
        _lat(d, 2, False),
        g2.get("small_median_us") if g2 else None,
        "µs",
        info=True,
    )
    g4 = _load(d, "gloo-np4.json")
    t.add(
        "4 KiB allreduce, 4 ranks: hvdd bench (Go client) vs torch gloo, CUDA tensors (µs)",
        _bench(d, 4, False, KIB4, "median_us"),
        g4.get("small_median_us") if g4 else None,
        "µs",
        info=True,
    )
    t.value("64 MiB allreduce, torch NCCL world 1: algbw (GB/s)", nj.get("large_algbw_GBps") if nj else None, "GB/s")

    for mps in (False, True):
        h, na, dg = _train(d, "hvdd", mps), _train(d, "noallreduce", mps), _train(d, "ddp-gloo", mps)
        model = next((x["model"] for x in (h, na, dg) if x), "ResNet-50")
        label = "ResNet-50" if any(x and x.get("resnet50") for x in (h, na, dg)) else model
        sfx = " under MPS" if mps else ""
        hv = h.get("total_img_per_s") if h else None
        t.add(
            f"training, {label}, 2 ranks{sfx}: hvdd vs the same without allreduce (img/s, total)",
            hv,
            na.get("total_img_per_s") if na else None,
            "img/s",
            "≥ 0.9",
            judge=lambda r: r >= 0.9,
        )
        t.add(
            f"training, {label}, 2 ranks{sfx}: hvdd vs DDP on gloo, CUDA tensors (img/s)",
            hv,
            dg.get("total_img_per_s") if dg else None,
            "img/s",
            "> 1",
            judge=lambda r: r > 1.0,
        )
    na0, na1 = _train(d, "noallreduce", False), _train(d, "noallreduce", True)
    t.add(
        "↳ training without allreduce, 2 ranks: with MPS / without (img/s)",
        na1.get("total_img_per_s") if na1 else None,
        na0.get("total_img_per_s") if na0 else None,
        "img/s",
        info=True,
    )
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--title", default="hvdd GPU figures (scripts/gpu-bench.sh)")
    a = ap.parse_args(argv)
    t = build(a.dir)
    table = t.markdown()
    parts = [f"# {a.title}", ""]
    bj = _load(a.dir, "B.json")
    if bj:
        parts += [f"GPU: {bj.get('device')}; torch {bj.get('torch')}", ""]
    parts += [table, ""]
    n = {k: sum(1 for r in t.rows if r[5] == k) for k in ("PASS", "FAIL", "INFO", "n/a")}
    parts += [
        f"targets: {n['PASS']} met, {n['FAIL']} missed; {n['n/a']} rows without figures; {n['INFO']} for comparison",
        "",
    ]
    parts += [
        "Definitions: latency rows are medians of blocking ops (µs); hvdd bench's are the median over iterations "
        "of the slowest rank's time (nccl-tests' way); busbw = algbw·2(N−1)/N. B counts the bytes one copy_ reads "
        "and writes, so B(N−1)/N² is the busbw of N ranks sharing the GPU when their allreduce moves the least "
        "possible through HBM (2N·S: each input read once, each output written once). Training totals sum the "
        "ranks' img/s, warm-up excluded. ↳ rows qualify the row above.",
        "",
    ]
    steps = os.path.join(a.dir, "steps.txt")
    if os.path.exists(steps):
        with open(steps) as f:
            parts += ["## Steps", "", "```", f.read().rstrip(), "```", ""]
    with open(os.path.join(a.dir, "summary.md"), "w") as f:
        f.write("\n".join(parts))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
