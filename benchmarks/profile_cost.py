"""What the profiler costs per call: raw mpi4py, hpccomm with no listener (the profiler off:
the dispatch's inline path), hpccomm with an empty listener (the observed path alone) and
hpccomm under ``hpccomm.profile`` (the observed path plus the profiler's bookkeeping), in
the same job, alternating in rounds; each figure is the median over rounds of the slowest
rank's mean time per call.

    mpiexec -n 2 python benchmarks/profile_cost.py [--sizes 8,1M] [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpccomm
from hpccomm import bench, record


def _nothing(event, rec):
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,1M")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    comm = hpccomm.init()
    raw = comm.mpi.Dup()
    prof = hpccomm.profile(comm)
    modes = ["raw mpi4py", "hpccomm, profiler off", "hpccomm, empty listener", "hpccomm, profiled"]
    rows = []
    for size in (bench.parse_size(s) for s in args.sizes.split(",")):
        x = np.zeros(max(1, size // 4), np.float32)
        iters = max(20, min(5000, (64 << 20) // max(size, 1)))
        calls = {
            modes[0]: lambda x=x: raw.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM),
            modes[1]: lambda x=x: comm.all_reduce(x),
            modes[2]: lambda x=x: comm.all_reduce(x),
            modes[3]: lambda x=x: comm.all_reduce(x),
        }
        times = {m: [] for m in modes}
        for i in range(args.rounds):
            order = modes[i % 4 :] + modes[: i % 4]
            for m in order:
                if m == modes[2]:
                    record.add_listener(_nothing)
                elif m == modes[3]:
                    prof.start()
                for _ in range(5):
                    calls[m]()
                raw.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    calls[m]()
                dt = (time.perf_counter() - t0) / iters
                if m == modes[2]:
                    record.remove_listener(_nothing)
                elif m == modes[3]:
                    prof.stop()
                assert not record.listeners
                times[m].append(raw.allreduce(dt, op=MPI.MAX))
        rows.append((size, {m: statistics.median(t) * 1e6 for m, t in times.items()}))
    if comm.rank == 0:
        print(f"# all_reduce float32, {comm.size} ranks: median of {args.rounds} rounds of the "
              f"slowest rank's mean (us per call); diff = vs profiler off")  # fmt: skip
        print(f"{'size (B)':>10} " + " ".join(f"{m:>24}" for m in modes))
        for size, t in rows:
            off = t[modes[1]]
            cells = [f"{t[modes[0]]:>24.2f}", f"{off:>24.2f}"] + [
                f"{t[m]:>12.2f} ({t[m] - off:+6.2f})".rjust(24) for m in modes[2:]
            ]
            print(f"{size:>10} " + " ".join(cells))
    raw.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
