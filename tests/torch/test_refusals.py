"""0-d tensors in every list collective, and tensors the backend refuses before MPI: the
error names the torch operation, the rank and the group, and expected versus actual; every
rank refusing alike leaves the group usable."""

import re

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

HEAD = r"on torch:0 \(default_pg\) \(rank {r} of {n}\): "


def test_zero_dim_tensors_in_every_list_collective(tdist):
    # one row of the gathered array is a NumPy scalar for 0-d outputs: all_gather and gather
    # raised "expected np.ndarray (got numpy.float32)"; gloo returns [tensor(0.), tensor(1.)]
    n, r = tdist.get_world_size(), tdist.get_rank()
    scalars = [torch.tensor(float(j)) for j in range(n)]
    outs = [torch.zeros(()) for _ in range(n)]
    tdist.all_gather(outs, torch.tensor(float(r)))
    assert outs == scalars and all(o.dim() == 0 for o in outs)
    got = [torch.zeros(()) for _ in range(n)] if r == 0 else None
    tdist.gather(torch.tensor(float(r)), got, dst=0)
    if r == 0:
        assert got == scalars
    out = torch.zeros(())
    tdist.scatter(out, [torch.tensor(10.0 + j) for j in range(n)] if r == 0 else None, src=0)
    assert out.item() == 10.0 + r
    outs = [torch.zeros(()) for _ in range(n)]
    tdist.all_to_all(outs, [torch.tensor(float(10 * r + j)) for j in range(n)])
    assert [o.item() for o in outs] == [float(10 * j + r) for j in range(n)]
    out = torch.zeros(())
    tdist.reduce_scatter(out, [torch.tensor(float(10 * r + j)) for j in range(n)])
    assert out.item() == sum(10.0 * j + r for j in range(n))
    flat = torch.zeros(n)
    tdist.all_gather_into_tensor(flat, torch.tensor(float(r)))
    assert flat.tolist() == [float(j) for j in range(n)]


def test_negative_views_are_read_through_a_copy_or_refused(tdist):
    # a negative view's memory holds the negated values: where the backend copies (a list
    # of inputs, a list of outputs) it reads and writes through torch; a tensor handed to
    # MPI as it is is refused by name (it was torch's "Can't call numpy() on Tensor that has
    # negative bit set")
    n, r = tdist.get_world_size(), tdist.get_rank()
    outs = [torch.zeros(2)._neg_view() for _ in range(n)]
    tdist.all_gather(outs, torch.full((2,), float(r + 1))._neg_view())
    assert [o.tolist() for o in outs] == [[-(j + 1.0)] * 2 for j in range(n)]
    head = HEAD.format(r=r, n=n)
    with pytest.raises(
        Exception,
        match=r"^all_reduce " + head + r"tensor is a negative view \(is_neg\(\)\), whose memory "
        r"holds the negated values; pass t.resolve_neg\(\)$",
    ):
        tdist.all_reduce(torch.ones(3)._neg_view())
    t = torch.ones(2)
    tdist.all_reduce(t)  # the group goes on
    assert t.tolist() == [float(n)] * 2


@pytest.mark.parametrize(
    "case",
    [
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
        "all_to_all_single",
        "all_to_all_single_rows",
        "avg_on_int8",
        "float8",
    ],
)
def test_refusals_name_the_torch_operation_the_group_and_the_sizes(tdist, case):
    # each was refused unnamed (NumPy's "cannot reshape array of size 7 into shape (6,)"),
    # by hpccomm's names ("reduce_scatter (rank 0 of 2): ... pass sizes="), without the
    # group ("DtypeError: all_reduce (rank 0 of 2)"), by NumPy ("Got unsupported ScalarType
    # Float8_e4m3fn") or by MPI after the call (all_to_all_single: MPI_ERR_TRUNCATE)
    n, r = tdist.get_world_size(), tdist.get_rank()
    if case == "all_to_all_single_rows" and n == 1:
        pytest.skip("every row count divides by 1 rank")
    pg = dist.distributed_c10d._get_default_group()
    opts = dist.ReduceScatterOptions()
    calls = {
        "all_gather_into_tensor": (
            lambda: tdist.all_gather_into_tensor(torch.zeros(3 * n + 1), torch.ones(3)),
            "all_gather_into_tensor",
            rf"output has {3 * n + 1} elements, expected {3 * n} \({n} ranks x 3 input elements\)",
        ),
        "all_gather_into_tensor_coalesced": (
            lambda: pg.allgather_into_tensor_coalesced(
                [torch.zeros(2 * n), torch.zeros(n, dtype=torch.float64)],
                [torch.ones(2), torch.ones(1)],
            ).wait(),
            "all_gather_into_tensor_coalesced",
            r"output is torch.float64, expected the input's dtype \(torch.float32\)",
        ),
        "reduce_scatter_tensor": (
            lambda: tdist.reduce_scatter_tensor(torch.zeros(3), torch.ones(3 * n + 1)),
            "reduce_scatter_tensor",
            rf"input has {3 * n + 1} elements, expected {3 * n} \({n} ranks x 3 output elements\)",
        ),
        "reduce_scatter_tensor_coalesced": (
            lambda: pg.reduce_scatter_tensor_coalesced(
                [torch.zeros(2), torch.zeros(2)], [torch.ones(2 * n), torch.ones(2 * n + 1)], opts
            ).wait(),
            "reduce_scatter_tensor_coalesced",
            rf"input has {2 * n + 1} elements, expected {2 * n} \({n} ranks x 2 output elements\)",
        ),
        "all_to_all_single": (
            lambda: tdist.all_to_all_single(torch.zeros(2 * n + 2), torch.ones(2 * n)),
            "all_to_all_single",
            rf"output has {2 * n + 2} elements, expected {2 * n} \(the input's: without split "
            r"sizes every rank sends and receives equal blocks\)",
        ),
        "all_to_all_single_rows": (
            lambda: tdist.all_to_all_single(
                torch.zeros(2 * n + 1), torch.ones(n), input_split_sizes=[1] * n
            ),
            "all_to_all_single",
            rf"output has {2 * n + 1} rows \(dim 0 of shape \({2 * n + 1},\)\), expected a "
            rf"multiple of {n} \(one equal block per rank without output_split_sizes\)",
        ),
        "avg_on_int8": (
            lambda: tdist.all_reduce(torch.ones(3, dtype=torch.int8), op=dist.ReduceOp.AVG),
            "all_reduce",
            r"op AVG is not defined for dtype int8: AVG is defined for floating",
        ),
        "float8": (
            lambda: tdist.broadcast(torch.zeros(4, dtype=torch.float8_e4m3fn), src=0),
            "broadcast",
            r"tensor has dtype torch.float8_e4m3fn, expected one of bool, uint8, .*complex128 "
            r"\(hpccomm has no torch.float8_e4m3fn; .* takes t.view\(torch.uint8\)\)",
        ),
    }
    call, op, said = calls[case]
    with pytest.raises(Exception, match="^" + re.escape(op + " ") + HEAD.format(r=r, n=n) + said):
        call()
    t = torch.ones(2)
    tdist.all_reduce(t)  # every rank refused it alike: the group goes on
    assert t.tolist() == [float(n)] * 2
