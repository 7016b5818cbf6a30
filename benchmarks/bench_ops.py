"""hpccomm versus raw mpi4py, in the same job: latency and throughput per op and size.

Raw mpi4py means the uppercase methods on preallocated NumPy buffers (the fastest way to use
mpi4py). hpccomm runs the same operation through its dispatch (resolve, validate, record,
backend) with ``out=`` preallocated too. The two alternate in rounds (and which one goes first
alternates too) so drift and order hit both; each figure is the median over rounds of the
slowest rank's mean time per call.

    mpiexec -n 4 python benchmarks/bench_ops.py [--ops all_reduce,send_recv] [--max-bytes 16M]

Columns follow nccl-tests: size (bytes per rank's buffer), time (us), and algbw (GB/s) with
S as nccl-tests defines it; ratio = raw time / hpccomm time (1.00 = as fast as raw).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpccomm


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def cases(comm, bounded, debugs, raw, nbytes):
    """(name, raw callable, hpccomm callable, bytes S for algbw) for one size.

    Plain names repeat the call on the same arrays (a training loop's buffers); "fresh" cases
    make a new array for every call on both sides (``comm.all_reduce(np.array([loss]))``);
    "timeout" runs on a communicator with a time bound (collectives then go through its worker
    thread); "async" asks for a Work and waits for it at once; "check" and "detail" run with
    those debug levels (a fingerprint exchange before every collective)."""
    n = comm.size
    count = max(1, nbytes // 8)
    x = np.ones(count)
    y = np.ones(count)
    big = np.ones(count * n)
    big_out = np.empty(count * n)
    blk = np.empty(count)
    dt = MPI.DOUBLE
    s1, sn = count * 8, count * 8 * n
    out = {
        "all_reduce": (
            lambda: raw.Allreduce(MPI.IN_PLACE, [x, dt], MPI.SUM),
            lambda: comm.all_reduce(y),
            s1,
        ),
        "all_reduce fresh": (
            lambda: raw.Allreduce(MPI.IN_PLACE, [np.ones(count), dt], MPI.SUM),
            lambda: comm.all_reduce(np.ones(count)),
            s1,
        ),
        "all_reduce timeout": (
            lambda: raw.Allreduce(MPI.IN_PLACE, [x, dt], MPI.SUM),
            lambda: bounded.all_reduce(y),
            s1,
        ),
        "all_reduce async": (
            lambda: raw.Allreduce(MPI.IN_PLACE, [x, dt], MPI.SUM),
            lambda: comm.all_reduce(y, async_op=True).wait(),
            s1,
        ),
        "all_reduce check": (
            lambda: raw.Allreduce(MPI.IN_PLACE, [x, dt], MPI.SUM),
            lambda: debugs["check"].all_reduce(y),
            s1,
        ),
        "all_reduce detail": (
            lambda: raw.Allreduce(MPI.IN_PLACE, [x, dt], MPI.SUM),
            lambda: debugs["detail"].all_reduce(y),
            s1,
        ),
        "all_gather fresh": (
            lambda: raw.Allgather([np.ones(count), dt], [np.empty(count * n), dt]),
            lambda: comm.all_gather(np.ones(count)),
            sn,
        ),
        "all_gather": (
            lambda: raw.Allgather([x, dt], [big_out, dt]),
            lambda: comm.all_gather(x, out=big_out),
            sn,
        ),
        "reduce_scatter": (
            lambda: raw.Reduce_scatter_block([big, dt], [blk, dt], MPI.SUM),
            lambda: comm.reduce_scatter(big, out=blk),
            sn,
        ),
        "broadcast": (lambda: raw.Bcast([x, dt], 0), lambda: comm.broadcast(x, src=0), s1),
        "all_to_all": (
            lambda: raw.Alltoall([big, dt], [big_out, dt]),
            lambda: comm.all_to_all(big, out=big_out),
            sn,
        ),
    }
    if n >= 2:
        r = comm.rank

        def raw_pp():
            if r == 0:
                raw.Send([x, dt], 1, 0)
                raw.Recv([y, dt], 1, 0)
            elif r == 1:
                raw.Recv([y, dt], 0, 0)
                raw.Send([x, dt], 0, 0)

        def hp_pp():
            if r == 0:
                comm.send(x, 1)
                comm.recv(y, 1)
            elif r == 1:
                comm.recv(y, 0)
                comm.send(x, 0)

        out["send_recv"] = (raw_pp, hp_pp, s1)
    return out


def time_block(comm_mpi, fn, iters):
    comm_mpi.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return comm_mpi.allreduce(dt, op=MPI.MAX)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--ops",
        default="all_reduce,all_reduce fresh,all_reduce timeout,all_reduce async,"
        "all_reduce check,all_reduce detail,all_gather,all_gather fresh,reduce_scatter,"
        "broadcast,all_to_all,send_recv",
    )
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="16M")
    p.add_argument("--factor", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", help="also write the rows to this file (rank 0)")
    args = p.parse_args(argv)
    comm = hpccomm.init()
    bounded = comm.dup()
    bounded.timeout = 600
    debugs = {level: comm.dup() for level in ("check", "detail")}
    for level, c in debugs.items():
        c.debug = level
    raw = comm.mpi.Dup()  # raw mpi4py on its own communicator, same ranks
    sizes = []
    s = parse_bytes(args.min_bytes)
    while s <= parse_bytes(args.max_bytes):
        sizes.append(s)
        s *= args.factor
    rows = []
    wanted = args.ops.split(",")
    for nbytes in sizes:
        iters = max(20, min(2000, (64 << 20) // max(nbytes * comm.size, 1)))
        for name, (raw_fn, hp_fn, S) in cases(comm, bounded, debugs, raw, nbytes).items():
            if name not in wanted:
                continue
            for fn in (raw_fn, hp_fn):
                for _ in range(3):
                    fn()
            t_raw, t_hp = [], []
            for i in range(args.rounds):  # alternate which goes first, so order bias cancels
                if i % 2:
                    t_hp.append(time_block(raw, hp_fn, iters))
                    t_raw.append(time_block(raw, raw_fn, iters))
                else:
                    t_raw.append(time_block(raw, raw_fn, iters))
                    t_hp.append(time_block(raw, hp_fn, iters))
            tr, th = statistics.median(t_raw), statistics.median(t_hp)
            if name == "send_recv":  # ping-pong: one-way time is half the round trip
                tr, th = tr / 2, th / 2
            rows.append(
                {
                    "op": name,
                    "ranks": comm.size,
                    "bytes": max(8, nbytes // 8 * 8),
                    "raw_us": tr * 1e6,
                    "hpccomm_us": th * 1e6,
                    "overhead_us": (th - tr) * 1e6,
                    "ratio": tr / th,
                    "raw_algbw": S / tr / 1e9,
                    "hpccomm_algbw": S / th / 1e9,
                }
            )
    if comm.rank == 0:
        print(
            f"# hpccomm vs raw mpi4py, {comm.size} ranks, {MPI.Get_library_version().splitlines()[0].strip()}"
        )
        print(
            f"{'op':<20}{'size(B)':>10}{'raw(us)':>11}{'hpccomm(us)':>13}{'diff(us)':>10}{'ratio':>8}{'algbw raw':>11}{'algbw hpc':>11}"
        )
        for r in rows:
            print(
                f"{r['op']:<20}{r['bytes']:>10}{r['raw_us']:>11.2f}{r['hpccomm_us']:>13.2f}{r['overhead_us']:>10.2f}"
                f"{r['ratio']:>8.3f}{r['raw_algbw']:>11.3f}{r['hpccomm_algbw']:>11.3f}"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    raw.Free()
    bounded.free()
    for c in debugs.values():
        c.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
