"""Choose this rank's GPU from the visible devices and its place on the node.

:func:`choose_gpu` predicts from the environment alone (launch discovery: the count of
``CUDA_VISIBLE_DEVICES`` and the local rank). :func:`choose_on_node` is what ``init`` binds
with: every rank of the node reports the identities (UUIDs) of the devices it sees, so tasks
that each see their own GPUs (``srun --gpus-per-task=N``, one container per GPU) are told
apart from tasks that see the same ones, and two ranks are never put on one GPU silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .errors import GpuBindingError
from .switches import switch

__all__ = [
    "parse_visible_devices",
    "choose_gpu",
    "choose_on_node",
    "format_uuid",
    "sharing_allowed",
    "ALLOW_SHARING_ENV",
    "PREDICTED",
]

ALLOW_SHARING_ENV = "HPCCOMM_ALLOW_GPU_SHARING"
# how choose_gpu's warnings start: a prediction from this rank's environment alone, which
# init's binding replaces with its own verdict
PREDICTED = "GPU choice predicted"


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """Parse ``CUDA_VISIBLE_DEVICES``: None when unset (unknown), () when it hides every GPU.

    As CUDA reads it (CUDA C++ Programming Guide, "CUDA Environment Variables"; the rules
    below are those PyTorch's ``torch.cuda._parse_visible_devices`` mirrors): a list of
    UUIDs when it starts with ``GPU-`` or ``MIG-`` (up to the first entry without that
    prefix), else of indices, each read as C's ``strtoul`` reads it (``1gpu`` is 1, ``0 1``
    is 0), up to the first entry that is empty, negative or not a number (``0,2,-1,1``:
    devices 0 and 2); an index or UUID repeated hides every device (``0,0``). Indices are
    returned in their plain form (``01`` -> ``"1"``).

    (Entries after an invalid one predicted GPUs the process would never see, ``0,-1,1``;
    ``1e`` or ``0 1`` read as no device at all; ``0,0`` as two: outside hunts.)"""
    if value is None:
        return None
    if value.startswith(("GPU-", "MIG-")):  # (as given: " GPU-a" is read as an index list)
        prefix = value[:4]
        uuids: list[str] = []
        for item in value.split(","):
            if not item.startswith(prefix):
                break
            if item in uuids:
                return ()
            uuids.append(item)
        return tuple(uuids)
    indices: list[str] = []
    for item in value.split(","):
        index = _strtoul(item.strip())
        if index is None:
            break
        if str(index) in indices:
            return ()
        indices.append(str(index))
    return tuple(indices)


def _strtoul(text: str) -> int | None:
    """The number a CUDA_VISIBLE_DEVICES entry starts with (an optional sign, then ASCII
    digits; what follows is ignored); None where there is none or it is negative."""
    start = 1 if text[:1] in ("+", "-") else 0
    end = start
    while end < len(text) and text[end] in "0123456789":
        end += 1
    if end == start:
        return None
    number = int(text[start:end])
    return None if text[:1] == "-" and number else number


def format_uuid(raw: object) -> str:
    """A GPU UUID (the 16 bytes of ``cudaDeviceProp.uuid``) as nvidia-smi prints it,
    ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``; "" when missing, cut short or all zeros (the
    callers then identify the GPU by its PCI bus id). A string is returned as it is.

    CuPy 14.2's ``getDeviceProperties`` reads the field as a C string (runtime.pyx:
    ``props.uuid.bytes``, a ``char[16]``): it stops at the first zero byte (about 6% of UUIDs
    have one) or, without one, runs on into the next field (``luid``). The first 16 bytes of
    a longer value are the UUID; a shorter one is cut at the same byte in every process that
    sees that GPU, so the bus id fallback names it alike everywhere."""
    if isinstance(raw, str):
        return raw
    data = bytes(raw)[:16] if isinstance(raw, (bytes, bytearray, memoryview)) else b""
    if len(data) != 16 or not any(data):
        return ""
    h = data.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def sharing_allowed(environ: Mapping[str, str], strict: bool = False) -> bool:
    """True when the job explicitly lets several ranks share one GPU (an on/off switch,
    :mod:`hpccomm.switches`). A value that is neither counts as off; ``strict`` refuses it
    instead (init, where every rank hears of it)."""
    return switch(environ, ALLOW_SHARING_ENV, default=False, where="init", lenient=not strict)


def choose_gpu(
    visible: int, local_rank: int, local_size: int, *, allow_sharing: bool = False
) -> int | None:
    """Return the CUDA device index this rank should use, or None for a CPU-only rank.

    Rules: no visible device -> None; one visible device -> 0 (per-task isolation, e.g.
    ``--gpus-per-task=1``); at least ``local_size`` visible -> ``local_rank``; fewer -> error,
    unless sharing is allowed, in which case ``local_rank % visible``.

    Raises:
        GpuBindingError: naming which local ranks would share a GPU and how to fix the job.
    """
    if visible <= 0:
        return None
    if visible == 1:
        return 0
    if visible >= local_size:
        return local_rank
    if allow_sharing:
        return local_rank % visible
    mine = local_rank % visible
    shared = [r for r in range(local_size) if r % visible == mine]
    if len(shared) < 2:  # this rank would be alone on its GPU; name a pair that is not
        mine = 0
        shared = [r for r in range(local_size) if r % visible == 0]
    raise GpuBindingError(
        f"{PREDICTED} (local rank {local_rank} of {local_size}): this rank sees {visible} GPUs "
        f"and the node has {local_size} ranks: if they all see these GPUs, local ranks "
        f"{shared} would share GPU {mine}; give each task its own GPU (srun "
        f"--gpus-per-task=1, or --ntasks-per-node={visible}), or allow sharing explicitly "
        f"with {ALLOW_SHARING_ENV}=1 (NCCL also needs NCCL_MULTI_RANK_GPU_ENABLE=1). "
        f"init binds by the GPUs' UUIDs across the node's ranks instead (tasks that each see "
        f"their own GPUs share none)"
    )


def choose_on_node(
    views: Sequence[Sequence[str]], me: int, *, allow_sharing: bool = False
) -> int | None:
    """This rank's device index, from what every rank of its node sees.

    Args:
        views: for every rank of the node (in rank order), the identities of the devices it
            sees, in its own device order (UUIDs; a device seen by two ranks has the same
            identity in both views). An empty view: a rank without GPU.
        me: this rank's position in ``views``.
        allow_sharing: several ranks may use one GPU (``HPCCOMM_ALLOW_GPU_SHARING=1``).

    Rules: ranks that see the same devices share them out in rank order (the k-th such rank
    takes device k); a rank that sees devices no other rank sees takes its first one
    (``--gpus-per-task=2``: each task sees its own two). Two ranks that would end on one
    GPU raise GpuBindingError (on each of them), unless sharing is allowed, in which case
    the k-th rank takes device k modulo their number.

    Returns:
        The device index (in this rank's own numbering), or None when it sees no device.

    Raises:
        GpuBindingError: naming the ranks that would share a GPU and how to fix the job.
    """

    def choice(r: int) -> int | None:
        view = tuple(views[r])
        if not view:
            return None
        same = [q for q, v in enumerate(views) if tuple(v) == view]
        return same.index(r) % len(view)

    mine = choice(me)
    if mine is None or allow_sharing:
        return mine
    target = views[me][mine]
    users = [r for r in range(len(views)) if (c := choice(r)) is not None and views[r][c] == target]
    if len(users) > 1:
        seeing = sum(1 for v in views if tuple(v) == tuple(views[me]))
        raise GpuBindingError(
            f"GPU choice (local rank {me} of {len(views)}): local ranks {users} would share GPU "
            f"{target} ({len(views[me])} GPU(s) visible to {seeing} rank(s) of this node); give "
            f"each task its own GPU (srun --gpus-per-task=1, or --ntasks-per-node=<GPUs per "
            f"node>), or allow sharing explicitly with {ALLOW_SHARING_ENV}=1 (NCCL also needs "
            f"NCCL_MULTI_RANK_GPU_ENABLE=1)"
        )
    return mine
