"""Choose this rank's GPU from the visible devices and its place on the node, without CUDA."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import GpuBindingError

__all__ = ["parse_visible_devices", "choose_gpu", "sharing_allowed", "ALLOW_SHARING_ENV"]

ALLOW_SHARING_ENV = "HPCCOMM_ALLOW_GPU_SHARING"
_NO_DEVICE = {"", "-1", "NoDevFiles", "none"}


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """Parse ``CUDA_VISIBLE_DEVICES``: None when unset (unknown), () when it hides every GPU."""
    if value is None:
        return None
    value = value.strip()
    if value in _NO_DEVICE:
        return ()
    return tuple(item.strip() for item in value.split(",") if item.strip())


def sharing_allowed(environ: Mapping[str, str]) -> bool:
    """True when the job explicitly lets several ranks share one GPU."""
    return environ.get(ALLOW_SHARING_ENV, "").lower() in {"1", "true", "yes", "on"}


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
        f"GPU choice (local rank {local_rank} of {local_size}): {visible} GPUs are visible for "
        f"{local_size} ranks on this node, so local ranks {shared} would share GPU "
        f"{mine}; give each task its own GPU (srun --gpus-per-task=1, or "
        f"--ntasks-per-node={visible}), or allow sharing explicitly with "
        f"{ALLOW_SHARING_ENV}=1 (NCCL also needs NCCL_MULTI_RANK_GPU_ENABLE=1)"
    )
