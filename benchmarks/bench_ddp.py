"""DDP training step time on hpccomm's torch.distributed backend against gloo, in the same run.

    mpiexec -n 2 python benchmarks/bench_ddp.py [--widths 256,1024,2048] [--steps 10] [--rounds 5]

One process group of each backend over the same ranks (hpccomm's is the default group, gloo's
a ``new_group``), an identical MLP (4 square layers of ``width``, float32) wrapped in DDP on
each, and the same batches. Each round times ``--steps`` steps (forward, backward with DDP's
bucketed all_reduce, SGD step) per backend, in rotating order after a barrier; a ``local``
column times the same step without DDP (the compute alone). Times: the slowest rank's mean step
time, median over rounds. At the end both DDP replicas must agree (same data, same steps):
the largest parameter difference is printed and a difference above 1e-4 fails the run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import hpccomm.torch


def mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def steps(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[torch.Tensor]) -> None:
    for x in batches:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="256,1024,2048")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    args = p.parse_args()

    world = hpccomm.torch.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    torch.set_num_threads(1)
    if rank == 0:
        print(
            f"# bench_ddp: {size} ranks, torch {torch.__version__}, {args.steps} steps per "
            f"round, median of {args.rounds} rounds, slowest rank; ratio = gloo / hpccomm"
        )
        print(
            f"# {'width':>6} {'params':>10} {'grads':>9} {'local':>9} {'hpccomm':>9} "
            f"{'gloo':>9} {'ratio':>6}   (ms per step)"
        )
    for width in (int(w) for w in args.widths.split(",")):
        gen = torch.Generator().manual_seed(1 + rank)
        batches = [torch.randn(args.batch, width, generator=gen) for _ in range(args.steps)]
        runs = {
            "local": mlp(width),
            "hpccomm": torch.nn.parallel.DistributedDataParallel(mlp(width)),
            "gloo": torch.nn.parallel.DistributedDataParallel(mlp(width), process_group=gloo),
        }
        opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in runs.items()}
        for k, m in runs.items():  # warm-up: buckets built, first-call costs paid
            steps(m, opts[k], batches[:2])
        times: dict[str, list[float]] = {k: [] for k in runs}
        order = list(runs)
        for r in range(args.rounds):
            for k in order[r % 3 :] + order[: r % 3]:
                dist.barrier()
                start = time.perf_counter()
                steps(runs[k], opts[k], batches)
                mine = (time.perf_counter() - start) / args.steps
                times[k].append(max(world.all_gather_object(mine)))
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(runs["hpccomm"].parameters(), runs["gloo"].parameters(), strict=True)
        )
        diff = max(world.all_gather_object(diff))
        params = sum(q.numel() for q in runs["local"].parameters())
        if rank == 0:
            print(
                f"  {width:>6} {params:>10,} {params * 4 / 2**20:>6.1f} MiB {ms['local']:>9.2f} "
                f"{ms['hpccomm']:>9.2f} {ms['gloo']:>9.2f} {ms['gloo'] / ms['hpccomm']:>6.2f}"
                f"   replicas differ by {diff:.1e}"
            )
        if diff > 1e-4:
            raise SystemExit(
                f"bench_ddp: hpccomm and gloo replicas differ by {diff} (width {width})"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
