"""Training on the hpccomm backend gives what one process gives on the whole batch, and what
torch's gloo gives in the same processes: DDP (buckets, no_sync, unused parameters), FSDP2
(fully_shard) and a DTensor redistribution. float64, so only the summation order differs."""

import pytest
import torch
import torch.distributed as dist

STEPS = 12
BATCH = 24  # split over the ranks unevenly when it does not divide


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(9, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5)
    ).double()


def data(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, 9, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, 5, generator=g, dtype=torch.float64)
    return x, y


def shard(t, r, n):
    """This rank's rows: equal shares, so the mean of the ranks' means is the whole mean."""
    per = BATCH // n
    return t[r * per : (r + 1) * per]


def reference(steps=STEPS, lr=0.05):
    """One process, the rows every rank uses together."""
    n = dist.get_world_size()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = data()
    rows = (BATCH // n) * n
    for _ in range(steps):
        opt.zero_grad()
        ((model(x[:rows]) - y[:rows]) ** 2).mean().backward()
        opt.step()
    return model


def train_ddp(group, steps=STEPS, lr=0.05, **ddp_kwargs):
    r, n = dist.get_rank(), dist.get_world_size()
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    x, y = data()
    for _ in range(steps):
        opt.zero_grad()
        ((ddp(shard(x, r, n)) - shard(y, r, n)) ** 2).mean().backward()
        opt.step()
    return model


def max_diff(a, b):
    return max(
        (p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"bucket_cap_mb": 0.001}, {"gradient_as_bucket_view": True}],
    ids=["default", "tiny-buckets", "bucket-view"],
)
def test_ddp_matches_one_process_and_gloo(tdist, kwargs):
    ours = train_ddp(None, **kwargs)
    assert max_diff(ours, reference()) < 1e-12
    gloo = tdist.new_group(backend="gloo")
    theirs = train_ddp(gloo, **kwargs)
    assert max_diff(ours, theirs) < 1e-12
    # the replicas agree bit for bit across ranks (broadcast at construction, same averages)
    flat = torch.cat([p.detach().flatten() for p in ours.parameters()])
    first = flat.clone()
    tdist.broadcast(first, 0)
    assert torch.equal(flat, first)


def test_ddp_no_sync_accumulates_like_a_larger_batch(tdist):
    r, n = tdist.get_rank(), tdist.get_world_size()
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    x, y = data()
    mine_x, mine_y = shard(x, r, n), shard(y, r, n)
    half = len(mine_x) // 2
    for _ in range(4):
        opt.zero_grad()
        with ddp.no_sync():  # first half: gradients stay local
            (((ddp(mine_x[:half]) - mine_y[:half]) ** 2).sum() / len(mine_x) / 5).backward()
        (((ddp(mine_x[half:]) - mine_y[half:]) ** 2).sum() / len(mine_x) / 5).backward()
        opt.step()
    ref = make_model()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05)
    rows = (BATCH // n) * n
    for _ in range(4):
        ropt.zero_grad()
        ((ref(x[:rows]) - y[:rows]) ** 2).mean().backward()
        ropt.step()
    assert max_diff(model, ref) < 1e-12


def test_ddp_with_unused_parameters(tdist):
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 4).double()
            self.used = torch.nn.Linear(4, 1).double()
            self.unused = torch.nn.Linear(4, 1).double()

        def forward(self, x):
            return self.used(self.body(x))

    torch.manual_seed(3)
    model = TwoHeads()
    before = model.unused.weight.detach().clone()
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = torch.full((3, 4), float(tdist.get_rank() + 1), dtype=torch.float64)
    for _ in range(3):
        opt.zero_grad()
        ddp(x).sum().backward()
        opt.step()
    assert torch.equal(model.unused.weight, before)
    w = model.used.weight.detach().clone()
    tdist.broadcast(w, 0)
    assert torch.equal(w, model.used.weight)


def test_fsdp2_matches_one_process(tdist):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    r, n = tdist.get_rank(), tdist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = data()
    for _ in range(STEPS):
        opt.zero_grad()
        ((model(shard(x, r, n)) - shard(y, r, n)) ** 2).mean().backward()
        opt.step()
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    ref = reference().state_dict()
    assert max((full[k] - v).abs().max().item() for k, v in ref.items()) < 1e-12


def test_dtensor_redistribute(tdist):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    n = tdist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    big = torch.arange(n * 6 * 7, dtype=torch.float64).reshape(n * 6, 7)
    d = distribute_tensor(big, mesh, [Shard(0)])
    assert d.to_local().shape == (6, 7)
    assert torch.equal(d.redistribute(mesh, [Replicate()]).to_local(), big)  # all_gather
    assert torch.equal(d.redistribute(mesh, [Shard(1)]).full_tensor(), big)  # all_to_all
    summed = (d * 2).sum()  # a partial sum reduced across the mesh
    assert summed.full_tensor().item() == pytest.approx(2 * big.sum().item())


def test_fsdp2_loads_a_full_state_dict_broadcast_from_rank0(tdist):
    # torch looks up the group's devices (pg._device_types[0]): the hpccomm group reported
    # none, and this raised IndexError where gloo works
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    base = make_model()
    full = {k: v.clone() * 2 for k, v in base.state_dict().items()}
    model = make_model()
    fully_shard(model)
    given = {k: v.clone() for k, v in full.items()} if tdist.get_rank() == 0 else {}
    set_model_state_dict(
        model, given, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    got = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    assert all(torch.equal(got[k], full[k]) for k in full)


def test_the_groups_device_is_cpu(tdist):
    c10d = tdist.distributed_c10d
    assert c10d._device_capability() == ["cpu"]
    assert c10d._get_object_coll_device() == "cpu"
    pg = c10d._get_default_group()
    assert pg._device_types == [torch.device("cpu")]
    assert pg._get_backend(torch.device("cpu")) is pg
    with pytest.raises(RuntimeError, match="device type cuda: hpccomm's torch backend serves CPU"):
        pg._get_backend(torch.device("cuda"))


def test_dcp_async_save_then_load(tdist, tmp_path_factory):
    # dcp.async_save asserts a CPU backend on the default group ("A CPU backend must be
    # enabled for async save; try ... 'cpu:gloo,cuda:nccl'") and failed on hpccomm
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    path = [str(tmp_path_factory.mktemp("dcp")) if tdist.get_rank() == 0 else None]
    tdist.broadcast_object_list(path, 0)
    model = make_model()
    fully_shard(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    saved = {k: v.full_tensor() for k, v in model.state_dict().items()}
    dcp.async_save({"model": model.state_dict()}, checkpoint_id=path[0]).result()
    other = make_model(seed=5)
    fully_shard(other)
    state = {"model": other.state_dict()}
    dcp.load(state, checkpoint_id=path[0])
    other.load_state_dict(state["model"])
    loaded = {k: v.full_tensor() for k, v in other.state_dict().items()}
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_a_future_callback_may_run_a_collective_and_wait_for_it(tdist):
    # A Future's callbacks ran on the group's worker thread: a callback that starts another
    # collective of the group and waits for it (torch's PowerSGD DDP hook does) waited
    # behind itself until the group's timeout (CommTimeoutError "some rank of the group has
    # not joined it"); gloo returns at once
    n = tdist.get_world_size()
    a = torch.ones(4) * (tdist.get_rank() + 1)
    b = torch.ones(4) * (tdist.get_rank() + 1)

    def then(fut):
        inner = tdist.all_reduce(b, async_op=True).get_future().wait()[0]
        return fut.value()[0] + inner

    got = tdist.all_reduce(a, async_op=True).get_future().then(then).wait()
    total = n * (n + 1) / 2
    assert torch.equal(got, torch.full((4,), 2 * total))


def test_ddp_with_the_powersgd_hook(tdist):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    r, n = tdist.get_rank(), tdist.get_world_size()
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2)  # fmt: skip
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    x, y = data()
    for _ in range(4):  # two plain all_reduce steps, then compressed ones
        opt.zero_grad()
        ((ddp(shard(x, r, n)) - shard(y, r, n)) ** 2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    first = flat.clone()
    tdist.broadcast(first, 0)
    assert torch.isfinite(flat).all() and torch.equal(flat, first)
