"""Large reductions inside one node: hpccomm against Open MPI as shipped and as tuned, and
against the memory's floor, in one table per operation.

    python benchmarks/bench_large.py [-n 2] [-b 4M] [-e 256M] [-f 4] [--json FILE]

(`make bench-large`.) It runs ``hpccomm bench`` (median of 5 rounds, hpccomm and raw mpi4py
alternating on the same arrays, every result checked) under mpiexec three times, and a floor
pass once:

- ``HPCCOMM_REUSE_MEMORY=0``: raw mpi4py there is Open MPI as shipped ("Open MPI default":
  glibc maps and unmaps the reduction's temporary on every call, see README "reuse_memory");
- the defaults: raw mpi4py is the fault-free Open MPI (hpccomm's ``init`` sets
  ``reuse_memory`` process-wide), and hpccomm runs as a user gets it (ordinary arrays);
- ``--symmetric``: hpccomm on symmetric buffers (``comm.zeros``; raw mpi4py on the same
  arrays);
- the floor: every rank at once makes one pass over an array of the size that reads and
  writes what the operation must at least read and write in memory (all_reduce: read n and
  write n bytes per rank, ``np.multiply(x, 1, out=x)``; reduce_scatter: read n and write n/p,
  ``np.add.reduce`` over the p blocks). No implementation that keeps its working set in the
  caches can beat it: it is the memory-bound estimate, measured rather than assumed.

Ratios are times of the same size in the same run (a run takes every size in turn), so
"hpccomm vs default" compares two different runs of the machine: the VM this project runs
on varies by up to 2x between runs (README, Benchmark); read the ratios of several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
RUNS = (  # (name, extra environment, extra bench arguments)
    ("shipped", {"HPCCOMM_REUSE_MEMORY": "0"}, []),
    ("defaults", {}, []),
    ("symmetric", {}, ["--symmetric"]),
)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.upper().removesuffix("B")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out = []
    n = lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def floor(lo: int, hi: int, factor: int, ops: list[str], out: str) -> None:
    """Under mpiexec: the floor pass per op and size, every rank at once (median of 7
    rounds of the ranks' average time, as ``hpccomm bench`` averages), written by rank 0 as
    JSON {op: [us per size, in order]}."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    result: dict[str, list[float]] = {op: [] for op in ops}
    for n in sizes(lo, hi, factor):
        count = n // 4 // p * p
        x = np.ones(count, np.float32)
        blocks = x.reshape(p, -1)
        part = np.empty(count // p, np.float32)
        passes = {
            "all_reduce": lambda x=x: np.multiply(x, 1, out=x),
            "reduce_scatter": lambda b=blocks, o=part: np.add.reduce(b, axis=0, out=o),
        }
        for op in ops:
            fn = passes[op]
            reps = max(3, min(200, (64 << 20) // n))
            fn()
            rounds = []
            for _ in range(7):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                mine = (time.perf_counter() - t0) / reps
                rounds.append(comm.allreduce(mine) / p)  # the mean over ranks, as the bench
            result[op].append(statistics.median(rounds) * 1e6)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps(result))


def launch(n: int, cmd: list[str], env: dict[str, str]) -> None:
    full = [str(BIN / "mpiexec"), "--oversubscribe", "-n", str(n), *cmd]
    subprocess.run(
        full, env={**os.environ, **ENV, **env}, check=True, timeout=1800, stdout=subprocess.DEVNULL
    )


def times(path: Path) -> dict[str, list[tuple[int, float, float]]]:
    """{op: [(bytes, hpccomm us, mpi4py us) per size, in order]} from an ``hpccomm bench
    --json`` file (the bench may round a size to the op's granularity: rows go by order)."""
    data = json.loads(path.read_text())
    out: dict[str, list[tuple[int, float, float]]] = {}
    for row in data["groups"][0]["rows"]:
        peer = row["peers"]["mpi4py"]["time_us"]
        out.setdefault(row["op"], []).append((row["bytes"], row["time_us"], peer))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("-b", "--minbytes", default="4M")
    ap.add_argument("-e", "--maxbytes", default="256M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-o", "--ops", default="all_reduce,reduce_scatter")
    ap.add_argument("--json", help="write every figure as JSON")
    ap.add_argument("--floor-out", help=argparse.SUPPRESS)  # (the floor pass, under mpiexec)
    a = ap.parse_args(argv)
    lo, hi = parse_size(a.minbytes), parse_size(a.maxbytes)
    ops = a.ops.split(",")
    if a.floor_out:
        floor(lo, hi, a.stepfactor, ops, a.floor_out)
        return 0
    bench = [str(BIN / "hpccomm"), "bench", "-o", a.ops, "-b", str(lo), "-e", str(hi),
             "-f", str(a.stepfactor), "--peer", "mpi4py", "-q"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        got = {}
        for name, env, extra in RUNS:
            out = Path(tmp) / f"{name}.json"
            print(f"# run '{name}' ...", file=sys.stderr, flush=True)
            launch(a.ranks, [*bench, *extra, "--json", str(out)], env)
            got[name] = times(out)
        print("# floor pass ...", file=sys.stderr, flush=True)
        fl = Path(tmp) / "floor.json"
        launch(a.ranks, [sys.executable, __file__, "-b", str(lo), "-e", str(hi), "-f",
                         str(a.stepfactor), "-o", a.ops, "--floor-out", str(fl)], {})  # fmt: skip
        floors = json.loads(fl.read_text())
    table = []
    print(f"# {a.ranks} ranks, float32 SUM; times in us (median of 5 rounds); ratio = the other's "
          f"time / hpccomm's (> 1: hpccomm faster); 'fault-free*': Open MPI in the symmetric "
          f"run, on the same (shared) arrays, slower than on ordinary ones")  # fmt: skip
    for op in ops:
        print(f"\n{op}")
        print(f"{'bytes':>11} {'floor':>9} {'OMPI dflt':>10} {'fault-free':>10} {'hpccomm':>9} "
              f"{'fault-free*':>11} {'symmetric':>9} | {'vs dflt':>7} {'vs f-free':>9} "
              f"{'sym vs f-free':>13} {'sym vs f-free*':>14}")  # fmt: skip
        rows = zip(got["shipped"][op], got["defaults"][op], got["symmetric"][op], floors[op],
                   strict=True)  # fmt: skip
        for (n, _, shipped), (_, hpc, tuned), (_, sym, sym_peer), fl_us in rows:
            row = {"op": op, "bytes": n, "floor_us": fl_us, "ompi_default_us": shipped,
                   "ompi_tuned_us": tuned, "hpccomm_us": hpc, "symmetric_us": sym,
                   "symmetric_run_ompi_tuned_us": sym_peer}  # fmt: skip
            table.append(row)
            print(f"{n:>11} {fl_us:>9.0f} {shipped:>10.0f} {tuned:>10.0f} {hpc:>9.0f} "
                  f"{sym_peer:>11.0f} {sym:>9.0f} | {shipped / hpc:>7.2f} {tuned / hpc:>9.2f} "
                  f"{tuned / sym:>13.2f} {sym_peer / sym:>14.2f}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"ranks": a.ranks, "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
