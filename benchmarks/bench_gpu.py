"""Device-array bandwidth sweep: hpccomm's NCCL path against raw cupy.cuda.nccl calls, and
hpccomm's MPI path (direct or staged), in the same job. Times are CUDA-event medians.

    mpiexec -n 2 python benchmarks/bench_gpu.py [--max-bytes N] [--max-iters N]

Columns follow nccl-tests: size (bytes per rank), time (us), algbw and busbw (GB/s);
busbw factors: all_reduce 2(n-1)/n, all_gather/reduce_scatter/all_to_all (n-1)/n, broadcast 1.
"""

from __future__ import annotations

import argparse
import statistics

import cupy as cp

import hpccomm
from hpccomm import GpuBindingError

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}  # fmt: skip


def time_us(fn, iters, warmup=3, rounds=5):
    for _ in range(warmup):
        fn()
    s = cp.cuda.get_current_stream()
    times = []
    for _ in range(rounds):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(s)
        for _ in range(iters):
            fn()
        b.record(s)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / iters)
    return statistics.median(times)


def device_cases(comm, x, big, out_big, blk, size, n):
    """(op, callable, bytes S for algbw) on one communicator, for preallocated buffers."""
    return {
        "all_reduce": (lambda: comm.all_reduce(x), size),
        "all_gather": (lambda: comm.all_gather(x, out=out_big), size * n),
        "reduce_scatter": (lambda: comm.reduce_scatter(big, out=blk), size * n),
        "all_to_all": (lambda: comm.all_to_all(big, out=out_big), size * n),
        "broadcast": (lambda: comm.broadcast(x, src=0), size),
    }


def raw_all_reduce(raw, x, nccl):
    """The same all-reduce straight through cupy.cuda.nccl (no hpccomm in between)."""
    return lambda: raw.allReduce(
        x.data.ptr,
        x.data.ptr,
        x.size,
        nccl.NCCL_FLOAT32,
        nccl.NCCL_SUM,
        cp.cuda.get_current_stream().ptr,
    )


def nccl_path(world):
    """({"nccl": communicator} or {}, the raw NcclCommunicator or None, why NCCL is skipped).
    Collective. NCCL refuses ranks sharing a GPU (unless NCCL_MULTI_RANK_GPU_ENABLE=1 with
    NCCL >= 2.30): the sweep then measures the MPI path only, and says why."""
    if world.device.mode != "nccl":
        return {}, None, "CuPy has no usable NCCL here (device_backend is mpi)"
    comm = world.dup(device_backend="nccl")
    try:
        comm.enable_nccl()
    except GpuBindingError as exc:  # raised on every rank alike
        comm.free()
        return {}, None, str(exc)
    return {"nccl": comm}, comm.nccl, None


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--mpi-max-bytes", type=int, default=16 << 20)
    p.add_argument("--max-iters", type=int, default=200, help="calls per timed round, at most")
    args = p.parse_args(argv)
    world = hpccomm.init(gpu=True)
    n = world.size
    paths, raw, skipped = nccl_path(world)
    paths["mpi"] = world.dup(device_backend="mpi")

    rows = []
    size = 1024
    while size <= args.max_bytes:
        count = size // 4
        x = cp.ones(count, dtype=cp.float32)
        big = cp.ones(count * n, dtype=cp.float32)
        out_big = cp.empty(count * n, dtype=cp.float32)
        blk = cp.empty(count, dtype=cp.float32)
        iters = max(5, min(args.max_iters, (1 << 30) // max(size * n, 1) // 8))
        for path, comm in paths.items():
            if path == "mpi" and size > args.mpi_max_bytes:
                continue
            for op, (fn, S) in device_cases(comm, x, big, out_big, blk, size, n).items():
                t = time_us(fn, iters)
                world.barrier()
                rows.append((op, path, size, t, S / t / 1e3, S / t / 1e3 * FACTORS[op](n)))
        if raw is None:
            size *= 4
            continue
        from cupy.cuda import nccl

        t = time_us(raw_all_reduce(raw, x, nccl), iters)
        rows.append(
            (
                "all_reduce",
                "raw-nccl",
                size,
                t,
                size / t / 1e3,
                size / t / 1e3 * FACTORS["all_reduce"](n),
            )
        )
        size *= 4
    if world.rank == 0:
        print(f"# device sweep, {n} ranks, {world.device.describe()}")
        if skipped:
            print(f"# NCCL path skipped: {skipped}")
        print(f"{'op':<15}{'path':<10}{'size(B)':>11}{'time(us)':>11}{'algbw':>9}{'busbw':>9}")
        for op, path, size, t, alg, bus in rows:
            print(f"{op:<15}{path:<10}{size:>11}{t:>11.1f}{alg:>9.2f}{bus:>9.2f}")
    for c in paths.values():
        c.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
