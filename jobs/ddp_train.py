"""DDP training over MPI with hpccomm's torch.distributed backend.

The one-line change from a torchrun script: ``hpccomm.torch.init_process_group()`` instead of
``torch.distributed.init_process_group(...)``; it reads rank, world size and local rank from
the launcher (mpiexec, mpirun, srun) and starts torch's store over MPI.

Run:  mpiexec -n 4 python jobs/ddp_train.py        (or: srun --mpi=pmix python jobs/ddp_train.py)
Options: --steps N, --batch B (global batch, default 240, a multiple of the number of
ranks), --width W (hidden units).

Each rank trains on its share of every batch; at the end rank 0 prints the final loss and a
checksum of the parameters, and every rank checks that its replica equals rank 0's.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import hpccomm.torch
from hpccomm.discovery import discover


def batch_error(batch: int, size: int) -> str | None:
    """Why ``--batch`` cannot be split evenly over ``size`` ranks (each trains on
    batch / size samples), or None."""
    if batch >= size and batch % size == 0:
        return None
    if batch < size:
        what, near = "a rank would train on 0 samples (loss nan)", f"{size}"
    else:
        per, left = divmod(batch, size)
        what = f"{left} sample{'s' * (left > 1)} of every batch would go unused"
        near = f"{per * size} or {(per + 1) * size}"
    return f"--batch {batch} at {size} ranks: {what}, expected a multiple of {size} (e.g. {near})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    # 240: a multiple of 1-6, 8, 10, 12, 15, 16, 20 and 24 ranks
    p.add_argument("--batch", type=int, default=240, help="global batch, a multiple of the ranks")
    p.add_argument("--width", type=int, default=256)
    args = p.parse_args()
    if args.steps < 1 or args.width < 1:  # (--steps 0 died of ZeroDivisionError on every rank)
        p.error(f"--steps {args.steps} --width {args.width}: expected both >= 1")
    known = discover().size  # from the launcher's variables: refused before MPI starts
    if known is not None and (why := batch_error(args.batch, known)):
        p.error(why)

    hpccomm.torch.init_process_group()  # the one line that differs from a torchrun script
    rank, size = dist.get_rank(), dist.get_world_size()
    if why := batch_error(args.batch, size):  # a launcher that did not say the size
        dist.destroy_process_group()
        p.error(why)

    torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    data = torch.Generator().manual_seed(1)  # every rank draws the same global batches
    target = torch.randn(32, 1, generator=data)
    per = args.batch // size
    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=data)
        y = x @ target + 0.01 * torch.randn(args.batch, 1, generator=data)
        mine = slice(rank * per, (rank + 1) * per)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x[mine]), y[mine])
        loss.backward()
        opt.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.6f}", flush=True)
    elapsed = time.perf_counter() - start

    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    if not torch.equal(flat, ref):
        raise SystemExit(f"rank {rank}: replica differs from rank 0's")
    if rank == 0:
        print(
            f"ddp_train: {size} ranks, {args.steps} steps, {elapsed / args.steps * 1e3:.2f} ms/step, "
            f"replicas equal, checksum {flat.double().sum().item():.9e}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
