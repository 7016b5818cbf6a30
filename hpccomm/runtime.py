"""``init()``: the one place that initializes MPI, checks launch discovery against it and
binds the GPU (before CUDA or NCCL are touched)."""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import os
import re
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

from . import arena, flight, memory, profiler
from . import debug as debug_mod
from . import work as work_mod
from .backends.shm import settings as shm_settings
from .comm import Communicator, NodeInfo, member_gid
from .cuda_aware import DeviceConfig, decide
from .debug import EAGER_ENV, by_rank, fingerprint, level_from, ranks_by_text, ranks_text
from .discovery import LaunchInfo, discover
from .errors import (
    ClosedError,
    GpuBindingError,
    HpccommError,
    InvalidArgumentError,
    LaunchMismatchError,
)
from .gpuselect import PREDICTED, choose_on_node, format_uuid, sharing_allowed
from .notices import ASK_MAX_RANKS, ASK_WAIT, NoticeBoard, Unchecked
from .ops import check_timeout
from .switches import switch
from .work import wait_bounded

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["init", "world", "is_initialized", "verify_launch"]

_world: Communicator | None = None
_board: NoticeBoard | None = None  # the process's notice board (see init)
_worlds = 0  # the worlds init made in this process (each has a group id of its own)


def _mismatch(
    what: str, env_value: object, source: str | None, mpi_value: object, mpi_source: str
) -> str:
    return f"{what} is {env_value} from {source} but {mpi_value} from {mpi_source}"


def _not_one_each(
    keys: list[tuple[int, int]],
    size: int,
    source: str | None,
    host: str | None,
    missing: bool = True,
) -> str:
    """The node's local ranks (``keys``: (local rank, world rank) of its ranks) that are not
    0..size-1 once each: the values given twice or out of range (and by which ranks), and
    (``missing``: ``keys`` holds every rank of the node) those missing."""
    given: dict[int, list[int]] = {}
    for value, who in sorted(keys, key=lambda k: k[1]):
        given.setdefault(value, []).append(who)
    twice = [f"{v} on ranks {who}" for v, who in sorted(given.items()) if len(who) > 1]
    beyond = [f"{v} on rank(s) {who}" for v, who in sorted(given.items()) if not 0 <= v < size]
    absent = [v for v in range(size) if v not in given] if missing else []
    parts = [f"given more than once: {'; '.join(twice)}"] if twice else []
    if beyond:
        parts.append(f"out of range: {'; '.join(beyond)}")
    if absent:
        parts.append(f"missing: {absent}")
    return (
        f"local ranks from {source} on this node ({host}: world ranks "
        f"{sorted(who for _, who in keys)}, by {_SPLIT}) are not 0..{size - 1} once each: "
        f"{', '.join(parts)}"
    )


_SPLIT = "the MPI COMM_TYPE_SHARED split"

# Filled in by verify_launch: {found} what the launcher variables claim, {cause} how a real
# launch ends up with every rank alone.
_SINGLETON_HINT = (
    "; {found}, yet this process is in its own 1-rank MPI world: either {cause}, or it was not "
    "started by that launcher but inherited its variables (python run by hand in a job's shell "
    "or inside a step, variables copied into a container): unset them, or start it with srun or "
    "mpiexec"
)
_STALE_HINT = (
    "; the process was not started the way these variables say: another launcher started it "
    "(e.g. mpirun inside srun), or it inherited them (python run by hand in a job's shell, "
    "variables copied into a container)"
)


def verify_launch(info: LaunchInfo, comm: MPI.Intracomm) -> tuple[LaunchInfo, MPI.Comm, NodeInfo]:
    """Check ``info`` against ``comm`` (COMM_WORLD) and fill the fields only MPI knows.

    Rank/size are compared with ``comm``; the local size with the COMM_TYPE_SHARED split,
    and the node's local ranks must be 0..n-1 once each (else every rank of the node names
    the values given more than once and those missing; where some ranks have none, only a
    value given twice). Node index, node count and the node list come from the node
    leaders.

    Returns:
        The completed LaunchInfo, the node (shared-memory) communicator, ordered by rank,
        and this rank's NodeInfo as MPI sees it (the world communicator's local rank & co:
        the launcher's numbering).

    Raises:
        LaunchMismatchError: naming both values and the variables they came from (the
            node's local ranks: alike on every rank of the node), on every rank whose view
            disagrees; the other ranks name those ranks and quote the first's error.
    """
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    src = info.sources
    errors = []
    if info.rank is not None and info.rank != rank:
        errors.append(_mismatch("rank", info.rank, src.get("rank"), rank, "MPI COMM_WORLD"))
    if info.size is not None and info.size != size:
        errors.append(_mismatch("size", info.size, src.get("size"), size, "MPI COMM_WORLD"))
    # The node communicator is ordered by rank (comm.node() promises it); the launcher's
    # local rank is checked against this rank's place among the node's ranks ordered by the
    # discovered local rank (ties by rank): what a split keyed by it would give (one was the
    # node communicator, and node() of the world followed the launcher's order: 0, 2, 1, 3
    # for ranks 0..3 under Open MPI 5 oversubscribed).
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    mine = info.local_rank
    keys = node.allgather((mine, rank))  # (None: that rank's launcher said none, or failed)
    order = sorted((r if lr is None else lr, r) for lr, r in keys)
    local_rank, local_size = order.index((rank if mine is None else mine, rank)), node.Get_size()
    split = _SPLIT
    if info.local_size is not None and info.local_size != local_size:
        errors.append(
            _mismatch("local size", info.local_size, src.get("local_size"), local_size, split)
        )
    given = [lr for lr, _ in keys]
    if mine is not None and None not in given and sorted(given) != list(range(local_size)):
        # the node's local ranks are no permutation: said alike on every rank of the node
        # (each rank whose place differed said only its own two numbers, and the ranks
        # holding valid values after a duplicate were blamed: an outside hunt)
        errors.append(_not_one_each(keys, local_size, src.get("local_rank"), info.hostname))
    elif mine is not None and None in given:  # some ranks of the node have none (their
        # discovery failed: said later, alike): only a value given twice contradicts MPI.
        # (Their places were filled in by world rank, and a number MPI never gave was
        # quoted: a review)
        have = [(lr, r) for lr, r in keys if lr is not None]
        if len({lr for lr, _ in have}) < len(have):
            lack = sorted(r for lr, r in keys if lr is None)
            twice = _not_one_each(
                have, local_size, src.get("local_rank"), info.hostname, missing=False
            )
            errors.append(f"{twice}; world rank(s) {lack} of this node have none")
    # Every rank learns which ranks failed and why, so no rank walks on into a hang and
    # each names them.
    heard = comm.allgather(errors[0] if errors else None)
    failed = [(r, e) for r, e in enumerate(heard) if e is not None]
    if errors:
        hint = _STALE_HINT
        if size == 1 and (info.size or 1) > 1:
            if info.launcher == "slurm":
                found = "SLURM_STEP_ID and SLURM_STEP_NUM_TASKS say srun started it as a task"
                cause = (
                    "srun started every task alone, without an MPI plug-in: launch with "
                    "`srun --mpi=pmix` (Open MPI; --mpi=pmi2 for MPICH)"
                )
            else:
                found = f"the {info.launcher} variables say it is one of {info.size} ranks"
                cause = (
                    "that launcher started every rank alone (it starts no MPI, or another MPI "
                    "library than the one mpi4py loads): launch with that MPI's mpiexec or "
                    "`srun --mpi=pmix`"
                )
            hint = _SINGLETON_HINT.format(found=found, cause=cause)
        raise LaunchMismatchError(
            f"init (rank {rank} of {size}): broken launch: {'; '.join(errors)}{hint}"
        )
    if failed:
        raise LaunchMismatchError(
            f"init (rank {rank} of {size}): broken launch: rank(s) {[r for r, _ in failed]} "
            f"found the environment disagreeing with MPI; rank {failed[0][0]}: {failed[0][1]}"
        )

    first = node.allreduce(rank, op=MPI.MIN)
    # the launcher's number for this node, where every rank of the node has the same (-1:
    # none, or they differ)
    said = set(node.allgather(-1 if info.node_index is None else info.node_index))
    env_index = said.pop() if len(said) == 1 else -1
    lead = node.Get_rank() == 0  # the node's lowest rank: the root of the bcast below
    leaders = comm.Split(0 if lead else MPI.UNDEFINED, first)
    layout = None
    if lead:
        seen = leaders.allgather((info.hostname, env_index))
        layout = (leaders.Get_rank(), leaders.Get_size(), tuple(h for h, _ in seen),
                  [i for _, i in seen])  # fmt: skip
        leaders.Free()
    node_index, num_nodes, hosts, env_indices = node.bcast(layout, root=0)
    # the launcher numbers the nodes in another order than hpccomm (by lowest rank), each
    # once: not a contradiction (Slurm's arbitrary distribution puts rank 0 on node 1)
    renumbered = sorted(env_indices) == list(range(num_nodes))

    sources = dict(src)
    changes: dict[str, object] = {}
    notes = list(info.warnings)
    for field, value, how in (
        ("rank", rank, "MPI COMM_WORLD"),
        ("size", size, "MPI COMM_WORLD"),
        ("local_rank", local_rank, split),
        ("local_size", local_size, split),
        ("node_index", node_index, "MPI node leaders"),
        ("num_nodes", num_nodes, "MPI node leaders"),
        ("nodelist", hosts, "MPI allgather of hostnames"),
    ):
        current = getattr(info, field)
        if current is None:
            changes[field] = value
            sources[field] = how
        elif field == "node_index" and current != value and renumbered:
            changes[field] = value  # what comm.node_index says, named as such
            sources[field] = f"{how} (by lowest rank; {src.get(field)} numbers it {current})"
        elif field in ("node_index", "num_nodes") and current != value:
            notes.append(f"{field} is {current} from {src.get(field)} but {value} from {how}")
    nodes = NodeInfo(local_rank, local_size, node_index, num_nodes)
    return info.replace(**changes, sources=sources, warnings=tuple(notes)), node, nodes


def _start_mpi_bounded(info: LaunchInfo, timeout: float) -> None:
    """Start MPI with a deadline: MPI_Init waits for every rank the launcher started, so a
    rank that died or exited before init would hang the others forever. MPI_Init holds the
    GIL, so no Python thread can watch it: a forked watchdog process does. Past the deadline
    it says why on stderr and kills this process (the launcher then ends the job); once MPI
    is up it is told to exit."""
    import mpi4py

    mpi4py.rc.initialize = False  # hpccomm initializes (and mpi4py finalizes at exit)
    mpi4py.rc.finalize = True
    from mpi4py import MPI

    who = f"rank {info.rank} of {info.size}" if info.rank is not None else "this process"
    message = (
        f"hpccomm init ({who}, {info.launcher} launch): MPI_Init did not complete within "
        f"{timeout:g} s: not every rank the launcher started has reached MPI_Init (one exited "
        f"or failed before init, or is still starting); ending this process\n"
    )
    disarm = _watchdog(timeout, message)
    try:
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    finally:
        # A Ctrl-C that came while MPI_Init held the GIL is raised at some Python step
        # after it, maybe inside disarm() (whose steps run once each): retried until done,
        # then raised (left armed, the watchdog SIGKILLed a retried init 60 s later)
        # (no call before the try: Python raises a pending signal at a call)
        interrupted: BaseException | None = None
        while True:
            try:
                disarm()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


_THREAD_LEVELS = ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED")


def _thread_level(mpi: Any, info: LaunchInfo) -> None:
    """MPI must run at MPI_THREAD_MULTIPLE: a communicator's worker thread, the failure
    notices and the caller's own threads call MPI at once. hpccomm asks for it when it
    starts MPI; where mpi4py started it first with a lower level (``mpi4py.rc.thread_level``)
    the job hung now and then (an outside review: 3 of 6 runs with two threads), silently."""
    provided = mpi.Query_thread()
    if provided < mpi.THREAD_MULTIPLE:
        raise InvalidArgumentError(
            f"init (rank {info.rank} of {info.size}): MPI runs at thread level "
            f"{_THREAD_LEVELS[provided] if 0 <= provided < 3 else provided}, expected "
            f"MPI_THREAD_MULTIPLE (hpccomm's worker threads call MPI beside the caller's); "
            f"MPI was started before hpccomm.init with a lower level: leave "
            f"mpi4py.rc.thread_level at 'multiple', or call hpccomm.init before importing "
            f"mpi4py.MPI"
        )


def _watchdog(timeout: float, message: str) -> Callable[[], None]:
    """Fork a process that kills this one after ``timeout`` seconds unless disarmed (by the
    returned function, or by this process ending)."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    # Ctrl-C (SIGINT to the whole process group) must neither end the watchdog nor make
    # its Python run on: blocked across the fork (the watchdog keeps it blocked)
    held = _block_sigint()
    pid = os.fork()
    if pid == 0:  # the watchdog: no Python state of the parent is used past this point
        try:
            os.close(write_end)
            ready, _, _ = select.select([read_end], [], [], timeout)
            if not ready:
                os.write(2, message.encode())
                os.kill(parent, signal.SIGKILL)
        finally:
            os._exit(0)
    _unblock(held)
    os.close(read_end)

    done: list[str] = []

    def step() -> None:  # disarm: each step once, however often it is interrupted
        if "write" not in done:
            try:
                os.write(write_end, b"x")
            except OSError:  # (it has ended)
                pass
            done.append("write")
        if "close" not in done:
            os.close(write_end)
            done.append("close")
        if "wait" not in done:
            os.waitpid(pid, 0)
            done.append("wait")

    return step


def _block_sigint() -> set[int] | None:
    """Block SIGINT in this thread; returns the previous mask (None where not possible)."""
    try:
        return set(signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not POSIX threads
        return None


def _unblock(previous: set[int] | None) -> None:
    if previous is not None and signal.SIGINT not in previous:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


SM_EAGER_LIMIT = 32768


def tune_open_mpi(environ: Any = os.environ) -> None:
    """Before MPI starts, unless the user set them: keep Open MPI's op/avx component out (it
    saturates 8- and 16-bit integer sums instead of wrapping, as NumPy, torch and NCCL do),
    and raise the eager limit between ranks of a node from 4 KiB to 32 KiB (its largest
    fragment, ``btl_sm_max_send_size``): messages up to it are copied through shared memory
    instead of by the single-copy transport, measured here 2.3x faster for 4-16 KiB sends,
    and cut cleanly when longer than the receive buffer (see :mod:`hpccomm.debug`, level
    "large"). No effect once MPI runs, nor on other MPI libraries; the MPI backend probes the
    integer ops either way (``backends.mpi.probe_integer_ops``)."""
    if "mpi4py.MPI" in sys.modules:
        return
    if "OMPI_MCA_op" not in environ:
        environ["OMPI_MCA_op"] = "^avx"
    if not any(name in environ for name in EAGER_ENV):
        fragment = environ.get("OMPI_MCA_btl_sm_max_send_size", "")
        limit = SM_EAGER_LIMIT
        if fragment.strip().isdigit():
            limit = min(limit, int(fragment))
        environ["OMPI_MCA_btl_sm_eager_limit"] = str(limit)


_NO_CUPY = "CuPy is not installed"


def _no_cupy(info: LaunchInfo, note: str = "") -> HpccommError:
    return HpccommError(
        f"init (rank {info.rank} of {info.size}): gpu=True but {_NO_CUPY} (pip install "
        f"'hpccomm[gpu-cuda13]' or 'hpccomm[gpu-cuda12]', as the driver allows){note}"
    )


_CUDA_NO_DEVICE = 100  # cudaErrorNoDevice
_NOT_VISIBLE = ("CUDA_VISIBLE_DEVICES hides", "CUDA finds no device")
_CUDA_INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver


def _cuda_version(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}" if value > 0 else "none"


def _cuda_problem(cupy: Any, exc: BaseException) -> str:
    """Why CUDA cannot be used, from the error a device query raised: the driver missing or
    too old for this CuPy (naming both CUDA versions), no device, or the error itself."""
    rt = cupy.cuda.runtime
    status = getattr(exc, "status", None)
    if status == _CUDA_NO_DEVICE:
        return f"CUDA finds no device ({exc})"
    if status == _CUDA_INSUFFICIENT_DRIVER:
        try:
            driver = int(rt.driverGetVersion())
        except Exception:
            driver = 0
        try:
            built = _cuda_version(int(rt.runtimeGetVersion()))
        except Exception:
            built = "?"
        if driver <= 0:
            return (
                f"no usable NVIDIA driver (CuPy {cupy.__version__} runs CUDA {built}; the driver "
                f"reports no CUDA version): {exc}"
            )
        return (
            f"the NVIDIA driver supports CUDA {_cuda_version(driver)}, older than the CUDA "
            f"{built} that CuPy {cupy.__version__} runs: install the CuPy for the driver's CUDA "
            f"major (hpccomm[gpu-cuda12] or [gpu-cuda13]) or update the driver ({exc})"
        )
    return f"CUDA error: {exc}"


def _local_gpus(info: LaunchInfo) -> tuple[Any, tuple[str, ...], str | None, bool]:
    """What this rank could bind: (cupy, the identities of the devices it sees, why it can
    use none, whether a GPU was expected here). Only device queries run (no context is
    created). A device's identity is its UUID (the same in every rank that sees it)."""
    env_visible = info.visible_gpus
    expected = bool(env_visible) or os.path.exists("/dev/nvidiactl")
    if env_visible == ():
        return None, (), "CUDA_VISIBLE_DEVICES hides every GPU", False
    try:
        import cupy
    except ImportError:  # the launcher's list may tell whether ranks would share one
        return None, env_visible or (), _NO_CUPY, expected
    except Exception as exc:  # a CUDA library that fails to load
        return None, (), f"CuPy failed to import: {type(exc).__name__}: {exc}", True
    rt = cupy.cuda.runtime
    try:
        count = int(rt.getDeviceCount())
        ids = []
        for i in range(count):
            uuid = format_uuid(rt.getDeviceProperties(i).get("uuid"))
            ids.append(uuid or f"{info.hostname}:{rt.deviceGetPCIBusId(i)}")
    except Exception as exc:  # CUDARuntimeError: no driver, driver too old, ...
        return cupy, (), _cuda_problem(cupy, exc), expected
    if not ids:
        return cupy, (), "CUDA finds no device", expected
    return cupy, tuple(ids), None, expected


def _bind_gpu(
    info: LaunchInfo,
    want_gpu: bool | None,
    allgather: Callable[[Any], list[Any]] | None = None,
) -> LaunchInfo:
    """Choose and select this rank's GPU before CUDA work starts (only device queries run
    first); CPU-only when none, saying why.

    Collective over COMM_WORLD (``allgather``; tests pass their own): every rank reports the
    devices it sees, so tasks that each see their own GPUs are told apart from tasks that
    share them (:func:`~hpccomm.gpuselect.choose_on_node`); and when a rank asked for a GPU
    (``gpu=True``) and could not get one, every rank raises, naming it and why.

    ``gpu=None`` never fails over a GPU: it stays CPU-only, with the reason in
    ``info.sources["gpu"]`` (and ``comm.device.describe()``), and a RuntimeWarning when a GPU
    was expected (``CUDA_VISIBLE_DEVICES`` names devices or an NVIDIA driver is present) or
    the ranks would have to share one.
    """
    if allgather is None:
        from mpi4py import MPI

        allgather = MPI.COMM_WORLD.allgather
    cupy: Any = None
    ids: tuple[str, ...] = ()
    expected = False
    if want_gpu is False:
        why: str | None = "gpu=False"
    else:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        cupy, ids, why, expected = _local_gpus(info)
    views = allgather((info.hostname, ids))
    rank = info.rank if info.rank is not None else 0
    node = [v for h, v in views if h == info.hostname]
    me = sum(1 for h, _ in views[:rank] if h == info.hostname)
    gpu: int | None = None
    failure: HpccommError | None = None
    note = ""
    if ids:
        try:
            gpu = choose_on_node(node, me, allow_sharing=sharing_allowed(os.environ))
        except GpuBindingError as exc:
            if cupy is None:  # CuPy missing: ids are CUDA_VISIBLE_DEVICES's entries, not
                # identities. Under cgroups (srun --gpus-per-task=1) every task numbers its
                # own GPU 0, so equal lists prove no sharing: the missing CuPy is the cause
                # (it was named only as ranks sharing GPU 0, an outside hunt)
                note = (
                    f"; and where CUDA_VISIBLE_DEVICES names the same devices on these ranks "
                    f"(no per-task isolation): {exc}"
                )
                why = f"{why}{note}"
            else:
                why, expected = str(exc), True
                if want_gpu:
                    failure = exc
    if why is None and gpu is not None:
        try:
            cupy.cuda.Device(gpu).use()
        except Exception as exc:
            why, expected, gpu = (
                f"selecting GPU {gpu} failed: {_cuda_problem(cupy, exc)}",
                True,
                None,
            )
    if why is not None and want_gpu and failure is None:
        failure = (
            _no_cupy(info, note)
            if why.startswith(_NO_CUPY)
            else HpccommError(
                f"init (rank {info.rank} of {info.size}): gpu=True but no GPU is "
                f"{'visible' if why.startswith(_NOT_VISIBLE) else 'usable'}: {why}"
            )
        )
    # Every rank learns whether a rank that required a GPU failed, so none walks on alone.
    failed = allgather(None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is not None:
        raise failure
    others = [(r, f) for r, f in enumerate(failed) if f is not None]
    if others:
        raise HpccommError(
            f"init (rank {info.rank} of {info.size}): rank(s) {[r for r, _ in others]} "
            f"required a GPU (gpu=True) and could not bind one: {others[0][1]}"
        )
    sources = dict(info.sources)
    # the environment's prediction goes: this binding's verdict replaces it
    info = info.replace(warnings=tuple(w for w in info.warnings if not w.startswith(PREDICTED)))
    visible = info.visible_gpus
    if visible is None and ids and cupy is not None:
        visible = tuple(str(i) for i in range(len(ids)))
        sources["visible_gpus"] = "CUDA device count"
    if why is not None:
        if want_gpu is None and expected:
            warnings.warn(
                f"hpccomm: staying CPU-only: {why} (init(gpu=False): a CPU-only job, no warning)",
                RuntimeWarning,
                stacklevel=4,  # (the user's line: init, its _one_at_a_time wrapper)
            )
        sources["gpu"] = f"CPU-only: {why}"
        return info.replace(visible_gpus=visible, gpu=None, sources=sources)
    sources["gpu"] = "the node's ranks and the GPUs each sees (by UUID)"
    return info.replace(visible_gpus=visible, gpu=gpu, sources=sources)


def _device_config(
    info: LaunchInfo, device_backend: str, cuda_aware_mpi: bool | None
) -> DeviceConfig:
    """Pick the device-collective backend and decide the MPI device path (no CUDA calls
    beyond what binding made)."""
    if device_backend not in ("auto", "nccl", "mpi"):
        raise InvalidArgumentError(
            f"init: device_backend is {device_backend!r}, expected 'auto', 'nccl' or 'mpi'"
        )
    path = decide(cuda_aware_mpi)
    if info.gpu is None:
        note = info.sources.get("gpu", "")
        return DeviceConfig(None, "mpi", path, note=note.removeprefix("CPU-only: "))
    mode = device_backend
    if mode != "mpi":
        try:
            from cupy.cuda import nccl

            nccl.get_version()
            mode = "nccl"
        except Exception as exc:  # CuPy built without NCCL, or the library failed to load
            if device_backend == "nccl":
                raise HpccommError(
                    f"init: device_backend='nccl' but NCCL is unavailable: {exc}"
                ) from exc
            mode = "mpi"
    return DeviceConfig(info.gpu, mode, path, auto=device_backend == "auto")


_P = ParamSpec("_P")
_R = TypeVar("_R")
_init_lock = threading.RLock()


def _one_at_a_time(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """init from several threads at once: one runs, the others then get its world (both
    ran MPI_Init and init's collectives at once: a hang, or a bare MPI_ERR_OTHER)."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _init_lock:
            return fn(*args, **kwargs)

    return run


@_one_at_a_time
def init(
    *,
    timeout: float | None = None,
    gpu: bool | None = None,
    device_backend: str = "auto",
    cuda_aware_mpi: bool | None = None,
    nccl: bool = False,
    init_timeout: float | None = None,
    debug: str | None = None,
    trace_dir: str | None = None,
    reuse_memory: bool | None = None,
) -> Communicator:
    """Initialize MPI (once), verify the launch and return the world Communicator.

    Idempotent: later calls return the same communicator; they must pass the same arguments
    (or none), else InvalidArgumentError says which differ.

    Args:
        timeout: seconds after which blocking operations raise CommTimeoutError (None: no
            bound, as in MPI); finite and > 0.
        gpu: True to require a GPU, False to stay CPU-only, None to use one if CuPy and a
            visible GPU are there.
        device_backend: for device (CuPy) arrays: "nccl", "mpi", or "auto" (NCCL when CuPy
            has it). Host arrays always go through MPI.
        cuda_aware_mpi: True/False to state whether MPI takes device pointers; None asks
            ``HPCCOMM_CUDA_AWARE_MPI`` and then the library (see :mod:`hpccomm.cuda_aware`).
        nccl: create the world's NCCL communicator now instead of on the first device
            collective.
        init_timeout: seconds MPI_Init may take before this process gives up and ends
            itself (a rank that never starts would otherwise hang the others in MPI_Init);
            default: with a ``timeout``, the larger of it and 60 s; without one, no bound.
            Applies only when hpccomm starts MPI (mpi4py.MPI not imported before).
        debug: "off", "large", "check" or "detail" (see :mod:`hpccomm.debug`); None reads
            ``HPCCOMM_DEBUG`` (default "large": collectives above the eager limit are
            compared across ranks). Every rank must use the same level.
        trace_dir: enable the flight recorder (:mod:`hpccomm.flight`), writing each rank's
            last calls to this directory on errors, SIGTERM, SIGUSR1 and ``hpccomm.dump()``;
            None reads ``HPCCOMM_TRACE_DIR`` (default: off).
        reuse_memory: keep memory the process frees mapped, so MPI's per-call temporaries of
            large reductions reuse pages instead of faulting them in on every call (see
            :mod:`hpccomm.memory`; glibc only); None reads ``HPCCOMM_REUSE_MEMORY`` (default
            on: "0" turns it off). Process-wide, and kept once set.

    ``HPCCOMM_PROFILE=DIR`` starts the profiler (:mod:`hpccomm.profiler`) over the world
    here and stops it at exit, rank 0 writing its files to DIR.

    Returns:
        The world Communicator (a duplicate of COMM_WORLD, so hpccomm's traffic never mixes
        with the application's own COMM_WORLD messages).

    Raises:
        LaunchMismatchError: the environment's rank/size/local rank disagree with MPI.
        GpuBindingError: ranks on a node would share a GPU without permission.
        InvalidArgumentError: a bad timeout, or arguments that differ from the first init.
        HpccommError: MPI was already finalized in this process.
    """
    global _world, _init_args, _init_failed
    # Bad settings are told to every rank once MPI is up, not raised here: a rank leaving
    # before MPI_Init left the others waiting in it (Open MPI's launcher then hung or
    # crashed), one leaving after it let them wait in their first collective.
    problems: list[HpccommError] = []
    timeout_s = _checked(problems, check_timeout, timeout, "init")
    level = _checked(problems, level_from, debug, "init") or "large"
    init_bound = _checked(problems, check_timeout, init_timeout, "init (init_timeout)")
    if init_bound is None and timeout_s is not None:
        init_bound = max(timeout_s, 60.0)
    if _world is not None and not _world.freed and problems:  # (named with the rank, as
        # the first init's errors are)
        first = problems[0]
        raise type(first)(
            f"init (rank {_world.rank} of {_world.size}): {_unprefixed(str(first))}"
        ) from None
    args: dict[str, object] = {
        "timeout": timeout_s,
        "gpu": gpu,
        "device_backend": device_backend,
        "cuda_aware_mpi": cuda_aware_mpi,
        "nccl": nccl,
        "debug": level,
        "reuse_memory": reuse_memory,
        "trace_dir": None if trace_dir is None else os.fspath(trace_dir),
        "init_timeout": init_timeout,
    }
    if _world is not None and not _world.freed:
        if "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_finalized():
            raise HpccommError(  # (its world's calls then aborted the job inside MPI)
                f"init (rank {_world.rank} of {_world.size}): MPI was finalized in this "
                f"process (MPI.Finalize() called by the program), and MPI can be initialized "
                f"only once per process; start a new process"
            )
        differ = [
            f"{k}={v!r} (first init: {_init_args[k]!r})"
            for k, v in args.items()
            if v != _init_args[k] and v != _INIT_DEFAULTS[k]
        ]
        if differ:
            raise InvalidArgumentError(
                f"init (rank {_world.rank} of {_world.size}): hpccomm is already initialized "
                f"with other settings: {', '.join(differ)}; set comm.timeout to change the "
                f"timeout, or free() the world first"
            )
        return _world
    if _init_pid and os.getpid() != _init_pid:  # a fork() child of a rank whose world was
        # freed: a new world's collectives went out as the parent's (an outside review)
        raise ClosedError(
            f"init: this process is a fork() child of a rank (pid {_init_pid}), where MPI "
            f"cannot be used (its messages would go out as the parent's); communicate from "
            f"the parent, or start workers with the 'spawn' method"
        )
    try:
        info = discover()
    except Exception as exc:  # noqa: BLE001 - (a rank leaving here left the others waiting
        # in MPI_Init for good under srun without --kill-on-bad-exit: an outside hunt)
        problems.append(
            exc
            if isinstance(exc, HpccommError)
            else InvalidArgumentError(f"launch discovery failed: {type(exc).__name__}: {exc}")
        )
        info = discover({})  # nothing known from the environment: MPI fills every field
    for note in info.warnings:
        if note.startswith(PREDICTED):  # the binding below decides by UUID, and says so
            # (tasks that each see their own GPUs were warned that they would share one)
            continue
        warnings.warn(f"hpccomm: {note}", RuntimeWarning, stacklevel=3)  # (the user's line:
        # init is wrapped by _one_at_a_time)
    tune_open_mpi()
    reuse = _checked(problems, _reuse_memory, reuse_memory)
    if reuse:  # (None: refused, below)
        memory.keep_freed_memory()
    _checked(problems, shm_settings)  # HPCCOMM_SHM* (read once per process)
    _checked(problems, arena.check_env)
    _checked(problems, _abort_on_exception, True)
    _checked(problems, sharing_allowed, os.environ, True)
    trace = trace_dir if trace_dir is not None else os.environ.get(flight.ENV)
    if trace:
        _checked(problems, flight.check_directory, trace)
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(  # (Python takes signal handlers on the main thread only)
                f"hpccomm: init(trace_dir={trace!r}) runs outside the main thread: the flight "
                f"recorder writes its dumps on errors and hpccomm.dump(), but not on SIGTERM "
                f"or SIGUSR1 (call init on the main thread for those)",
                RuntimeWarning,
                stacklevel=3,
            )
    profile_dir = os.environ.get(profiler.ENV, "").strip()
    if profile_dir:
        _checked(problems, profiler.check_directory, profile_dir)
    if init_bound is not None and "mpi4py.MPI" not in sys.modules:
        _start_mpi_bounded(info, init_bound)
    from mpi4py import MPI

    if MPI.Is_finalized():
        raise HpccommError(
            "init: MPI was already finalized in this process, and MPI can be initialized "
            "only once per process; start a new process"
        )
    from .backends.mpi import MPIBackend
    from .backends.mpi_device import DeviceBackends

    if not MPI.Is_initialized():  # (mpi4py.rc.initialize = False: MPI left to hpccomm)
        MPI.Init_thread()
        # mpi4py finalizes only an MPI it started: at exit, after hpccomm's own handler
        # (registered below, so it runs first); the job ended with status 1 ("called init
        # but exited without calling finalize") after a correct run (an outside hunt)
        atexit.register(_finalize_what_init_started)
    _register_exit()  # an error on one rank only in the rest of init ends the job at exit
    said_before = len(info.warnings)
    info, node, nodes = verify_launch(info, MPI.COMM_WORLD)
    for note in info.warnings[said_before:]:  # what only MPI's view showed (a node index
        # the launcher's variables contradict): it was kept in comm.launch, never said
        warnings.warn(f"hpccomm: {note}", RuntimeWarning, stacklevel=3)
    _checked(problems, _thread_level, MPI, info)
    # Every rank's bad settings, raised alike on every rank (then it is safe to exit):
    # before binding a GPU (a mistyped HPCCOMM_ALLOW_GPU_SHARING is named, not taken for off)
    _refuse_alike(problems, MPI.COMM_WORLD)
    info = _bind_gpu(info, gpu)  # (collective: raises on every rank alike)
    device = _checked(problems, _device_config, info, device_backend, cuda_aware_mpi)
    _refuse_alike(problems, MPI.COMM_WORLD)
    # The debug level is the job's: with headers on one rank only, a receive took the
    # sender's header for data (a confusing size error, then the next receive silently got
    # the previous payload), and a checking rank's collective waited for a peer that was
    # not checking. One allgather, every rank raising alike.
    shm = shm_settings()  # (refused above where unreadable: read alike on every rank)
    said = MPI.COMM_WORLD.allgather(
        (level, (shm.enabled, shm.threshold, shm.chunk, shm.cma), bool(profile_dir),
         debug_mod.large_bytes(os.environ))
    )  # fmt: skip
    levels = [lv for lv, _, _, _ in said]
    _same_shm_settings([s for _, s, _, _ in said], MPI.COMM_WORLD)
    profiled = [p for _, _, p, _ in said]
    debug_mod.agree_large(min(b for _, _, _, b in said))  # (eager limits set on some ranks)
    if any(p != profiled[0] for p in profiled):  # (its start is collective over the world:
        # set on one rank only, that rank waited in it and its peers in their first call)
        held = ", ".join(by_rank(enumerate("set" if p else "unset" for p in profiled)))
        raise InvalidArgumentError(
            f"init (rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}): "
            f"{profiler.ENV} is {held}; set it on every rank (the profiler runs over the "
            f"world) or on none"
        )
    if any(lv != levels[0] for lv in levels):
        held = ", ".join(by_rank(enumerate(map(repr, levels))))
        raise InvalidArgumentError(
            f"init (rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}): the "
            f"debug level differs across ranks ({held}); set the same init(debug=...) or "
            f"HPCCOMM_DEBUG on every rank"
        )
    # up to here every check raised on every rank alike; an error from here on is this
    # rank's own, and its peers may wait for it in init's next steps or their first call
    _init_failed = True
    backend = MPIBackend(MPI.COMM_WORLD.Dup())
    # One notice board per process, kept over init / free() / init: a board made per init
    # and never freed cost a communicator per cycle (with the node group's four, Open MPI
    # ran out of ids after about 12,000 cycles: a bare MPI_ERR_INTERN in init, an outside
    # hunt); freed, a peer's late notice on it would reach the next init's board (the
    # freed id is given again). Each world has a group id of its own, so a late notice of
    # an earlier world concerns no group of this one.
    global _board, _worlds
    if _board is None:
        _board = NoticeBoard(
            MPI.COMM_WORLD.Dup(),
            MPI.ANY_SOURCE,
            (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING),
        )
    notices = _board
    _worlds += 1
    _world = Communicator(
        backend,
        DeviceBackends(backend, device),
        name="world",
        timeout=timeout_s,
        launch=info,
        nodes=nodes,
        node_key=nodes.node_index,
        device=device,
        node=MPIBackend(node),
        notices=notices,
        gid="world" if _worlds == 1 else f"world~{_worlds}",
        debug=level,
    )
    notices.locate = _locate
    notices.progress = _progress
    _watch_finalize(MPI)
    _init_args = args
    _init_failed = False
    # large NumPy arrays allocated from here on (on this thread) in memory the node's peers
    # map: the fast path reads and writes them in place (see hpccomm.arena)
    arena.start(nodes.local_size, keep=bool(reuse), shm=shm.enabled, single_copy=shm.cma)
    if trace:
        rec = flight.start(trace, _world.rank, _world.size)
        rec.departed = lambda: {w: why for w, (_, why) in list(notices.departed.items())}
    profiler.uncaught_exception = _uncaught_name
    profiler.depart = _depart_early
    profiler.start_from_env(_world)  # HPCCOMM_PROFILE=DIR: profile until exit
    if nccl:
        _world.enable_nccl()
    return _world


ABORT_ENV = "HPCCOMM_ABORT_ON_EXCEPTION"


def _abort_on_exception(strict: bool = False) -> bool:
    """``HPCCOMM_ABORT_ON_EXCEPTION`` (an on/off switch, default on; ``strict``: a value
    that is neither is refused, else it counts as on)."""
    return switch(os.environ, ABORT_ENV, default=True, where="init", lenient=not strict)


def _progress(gid: str) -> tuple[int, int] | None:
    """This rank's group rank and the number of its last collective call on the group with
    id ``gid`` (NoticeBoard.progress); None where it has no such group."""
    world = _world
    for c in [] if world is None else world._tree():
        if c._dispatcher.gid == gid and not c.freed:
            return c.rank, c._group.seq
    return None


def _same_shm_settings(said: list[tuple[Any, ...]], comm: Any) -> None:
    """Every rank's HPCCOMM_SHM* settings (on, threshold, chunk, single copy) must be the
    same: with the path off on one rank, or another threshold, one rank took the shared
    memory and its peer MPI (both waited for good); with another chunk the ranks read each
    other's headers at other offsets (garbage in the error, or an mmap failure). Raised on
    every rank alike."""
    if all(s == said[0] for s in said):
        return
    names: tuple[tuple[str, Callable[[Any], str]], ...] = (
        ("HPCCOMM_SHM", lambda v: "1" if v else "0"),
        ("HPCCOMM_SHM_THRESHOLD", lambda v: "unset" if v is None else str(v)),
        ("HPCCOMM_SHM_CHUNK", str),
        ("HPCCOMM_SHM_CMA", lambda v: "1" if v else "0"),
    )
    differ = []
    for i, (name, show) in enumerate(names):
        bits = by_rank((r, show(s[i])) for r, s in enumerate(said))  # "1 on rank 0", ...
        if len(bits) > 1:
            differ.append(f"{name} is {', '.join(bits[:-1])} but {bits[-1]}")
    raise InvalidArgumentError(
        f"init (rank {comm.Get_rank()} of {comm.Get_size()}): the shared-memory settings "
        f"differ across ranks: {'; '.join(differ)}; set them alike on every rank (or leave "
        f"them unset)"
    )


def _refuse_alike(problems: list[HpccommError], comm: Any) -> None:
    """Collective over ``comm`` (COMM_WORLD): when any rank has a problem, every rank
    raises InvalidArgumentError naming the ranks and their problems (one allgather)."""
    said = comm.allgather(_unprefixed(str(problems[0])) if problems else "")
    if not any(said):
        return
    here = f"init (rank {comm.Get_rank()} of {comm.Get_size()})"
    if all(t == said[0] for t in said):
        raise InvalidArgumentError(f"{here}: {said[0]}")
    by_text = ranks_by_text((r, t) for r, t in enumerate(said) if t)
    refused = "; ".join(f"on {ranks_text(rs)}: {t}" for t, rs in by_text.items())
    raise InvalidArgumentError(f"{here}: refused {refused}")


def _unprefixed(text: str) -> str:
    """A setting's message without its own ``init: ``, ``init (rank 1 of 2): `` or
    ``hpccomm: `` start (init's prefix with the rank replaces it; the rank left in, every
    rank's text differed and the message said the same thing once per rank)."""
    for start in ("init: ", "hpccomm: "):
        text = text.removeprefix(start)
    return re.sub(r"^init \(rank \d+ of \d+\): ", "", text)


def _checked(problems: list[HpccommError], check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``; its HpccommError goes to ``problems`` (None returned), to be
    raised on every rank once MPI is up."""
    try:
        return check(*args)
    except HpccommError as exc:
        problems.append(exc)
        return None


def _reuse_memory(value: bool | None) -> bool:
    if value is not None:
        if not isinstance(value, bool):
            raise InvalidArgumentError(
                f"init: reuse_memory is {value!r}, expected True, False or None"
            )
        return value
    return switch(
        os.environ,
        memory.ENV,
        default=True,
        where="init",
        meaning=" (keep freed memory mapped or not)",
    )


_INIT_DEFAULTS: dict[str, object] = {
    "timeout": None,
    "debug": "large",
    "gpu": None,
    "device_backend": "auto",
    "cuda_aware_mpi": None,
    "nccl": False,
    "reuse_memory": None,
    "trace_dir": None,
    "init_timeout": None,
}
_init_args: dict[str, object] = dict(_INIT_DEFAULTS)
_exit_registered = False


def _register_exit() -> None:
    """At exit, before mpi4py finalizes MPI: stop every worker thread; if a call is stuck in
    one (a collective a peer never joined), finalizing would hang or crash, so say which and
    abort the job instead (every rank ends, with a non-zero status). A fork() child is told
    apart (see _after_fork)."""
    global _exit_registered, _init_pid
    if not _exit_registered:
        _init_pid = os.getpid()
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork)
        _install_excepthook(abort=_abort_on_exception())
        _exit_registered = True


_init_pid = 0  # the process that started MPI (a fork() child has another pid)
_child_status: list[int] = []  # a fork() child's sys.exit() status, for its exit


def _after_fork() -> None:
    """In a fork() child of a rank (multiprocessing's default start method on Linux, e.g.
    a DataLoader worker): MPI cannot be used there (the child's messages go out as the
    parent's: a collective in the child gave the parent's next all_reduce 101 instead of 1),
    so every group refuses calls, naming the cause; its exit tells nobody that the rank has
    left (it did: the peers got a false PeerError and the job aborted) and skips MPI_Finalize
    (which hung in the child); the flight recorder's SIGTERM/SIGUSR1 handling is undone (a
    SIGTERM to the child, e.g. Pool.terminate(), went through the shared pipe to the
    parent's watcher thread, which ended the training rank)."""
    world = _world
    why = (
        f"the group is unusable: this process is a fork() child of "
        f"{'a rank' if world is None else f'rank {world.rank} of {world.size}'} (pid "
        f"{_init_pid}), where MPI cannot be used (its messages would go out as the parent's); "
        f"communicate from the parent, or start workers with the 'spawn' method"
    )
    me = threading.get_ident()
    for c in [] if world is None else world._tree():
        d = c._dispatcher
        # the parent's threads inside calls are not here: free() was refused for good, "all_reduce
        # on world (thread ...) still running" (an outside review)
        for ident in [i for i in d._threads if i != me]:
            del d._threads[ident]
        if d._inside is not None and d._inside[0] != me:
            d._inside = None  # (its next collective was refused as "another thread inside")
        d.notices = None  # nothing goes out as the parent: no failure notices either
        c._notices = None
        if d.broken is None:
            d.broken = why
            d._update_slow()
    work_mod.fork_child = why  # Works pending at the fork never complete here
    flight.undo_signals()  # and no dumps over the parent's rank file
    real_exit = sys.exit

    def child_exit(status: Any = None) -> NoReturn:  # the status the child's exit keeps
        _child_status[:] = [0 if status is None else status if isinstance(status, int) else 1]
        real_exit(status)

    sys.exit = child_exit


_uncaught: str | None = None  # the exception nobody caught, if one ends this rank
_uncaught_text = ""  # and its message, for the flight recorder's dump
_uncaught_kept: str | None = None  # the same with HPCCOMM_ABORT_ON_EXCEPTION=0 (no abort)
_thread_uncaught: str | None = None  # the first thread (not the main one) that an uncaught
# exception ended: named in this rank's departure notice
_init_failed = False  # init raised on this rank alone, with MPI up (see _abort_failed_init)


def _uncaught_name() -> str | None:
    """The exception nobody caught that ends this rank (its class name), or None."""
    return _uncaught


def _install_excepthook(abort: bool = True) -> None:
    """An exception nobody caught ends the whole job, as ``python -m mpi4py`` does: the
    usual traceback, then MPI_Abort at exit (:func:`_at_exit`, after other hooks such as
    torch's have printed). Otherwise this rank would finalize MPI while its peers wait for
    it in their next collective, forever (``HPCCOMM_ABORT_ON_EXCEPTION=0``, ``abort``
    False, keeps Python's plain exit: the exception is only named in the departure notice,
    which said "a normal exit or sys.exit")."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        global _uncaught, _uncaught_text, _uncaught_kept
        if abort:
            _uncaught = kind.__name__  # a KeyboardInterrupt too: it may have reached one rank
            _uncaught_text = f"{kind.__name__}: {value}" if str(value) else kind.__name__
        else:
            _uncaught_kept = kind.__name__
        previous(kind, value, tb)

    sys.excepthook = hook
    previous_thread = threading.excepthook

    def thread_hook(args: Any) -> None:
        # A thread's uncaught exception ends that thread only (Python's rule, kept): its
        # peers, waiting for its next collective, were told at this rank's exit "a normal
        # exit or sys.exit", not why (an outside hunt)
        global _thread_uncaught
        if _thread_uncaught is None and args.exc_type is not SystemExit:
            name = "?" if args.thread is None else args.thread.name
            text = f"{args.exc_type.__name__}: {args.exc_value}" if str(args.exc_value) \
                else args.exc_type.__name__  # fmt: skip
            _thread_uncaught = f"its thread {name} had ended with an uncaught {text[:300]}"
        previous_thread(args)

    threading.excepthook = thread_hook


def _at_exit() -> None:
    """At interpreter exit (registered by init): leave as :func:`_exit_steps` says; if
    those steps fail (a defect of hpccomm's), say so and abort the job rather than leave the
    other ranks waiting for this one's departure (up to EXIT_WAIT each)."""
    try:
        _exit_steps()
    except Exception as exc:  # noqa: BLE001 - reported, then the job ends
        from mpi4py import MPI

        if MPI.Is_finalized():
            raise
        sys.stderr.write(
            f"hpccomm (rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}): "
            f"its exit steps failed ({type(exc).__name__}: {exc}); aborting the job instead "
            f"of finalizing MPI (the other ranks would wait for this one)\n"
        )
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def _exit_steps() -> None:
    if _init_pid and os.getpid() != _init_pid:  # a fork() child (see _after_fork): leave
        # with its status, after the other atexit handlers, without MPI_Finalize
        _exit_before_finalize(_child_status[0] if _child_status else 1 if _uncaught else 0)
        return
    if _init_failed:  # (also on a second init after free(): _world is the freed one)
        _abort_failed_init()
        return
    world = _world
    if world is None:
        return
    from mpi4py import MPI

    if MPI.Is_finalized():
        return
    from .backends import mpi as mpi_backend

    failed = mpi_backend.failed_in(MPI.COMM_WORLD) or []  # (ULFM; [] without it)
    known = bool(failed) or mpi_backend.peer_failure_seen
    bound = (None if world.freed else world.timeout) or _SURVIVOR_WAIT
    # (a freed world may hold a group freed with its call stuck inside MPI: see free)
    stuck = [] if known else _stuck_calls(world)
    if known or (world.freed and not stuck and (_uncaught is None or world.size == 1)):
        # also after free() (``with hpccomm.init() as c:``), and on a rank that only saw a
        # peer's revoke (MPI may not have told it which rank failed): MPI_Finalize would
        # wait, MPI_Abort may leave the launcher stuck. Under ULFM every rank that does not
        # abort agrees first (_failure_agreed), so that the ranks that never heard of the
        # failure leave as survivors too
        differed = False
        if not known and world.size > 1:
            # (the ranks that did not free the world wait for this one)
            differed = _depart(world)
        if _failure_agreed(known) or known:
            _leave_after_failure(bound)
        elif differed:
            _exit_with_status(1)
        return
    if not stuck and (_uncaught is None or world.size == 1):
        if world.size > 1:
            # (first: a peer waiting for this rank in a call hears it now)
            differed = _depart(world)
            if _failure_agreed(False):
                _leave_after_failure(bound)
            elif differed:
                _exit_with_status(1)
        return
    listed = "; ".join(stuck[:3]) + (f"; and {len(stuck) - 3} more" if len(stuck) > 3 else "")
    why = f"exiting while {listed} never completed" if stuck else f"{_uncaught} not caught"
    # (folded: 300 stuck groups made one line of 15,000 characters, in an outside hunt)
    if _uncaught is not None and flight.recorder is not None:
        # the rank with the root cause left no dump: the analysis took it for killed hard
        flight.recorder.try_dump(f"{flight.UNCAUGHT} {_uncaught_text}")
    sys.stderr.write(
        f"hpccomm (rank {world.rank} of {world.size}): {why}; aborting the job instead of "
        f"finalizing MPI (its other ranks would wait for this one forever)\n"
    )
    sys.stderr.flush()
    notices = world._notices
    if stuck and notices is not None:  # peers timing out in its calls ask where it is:
        # answer them for a while (until every peer of those calls has asked, and a while
        # after the last question), so that they raise their errors (and the flight
        # recorder writes its dump) before the abort
        notices.leaving = True  # (askers do not wait on for its call: see NoticeBoard.ask)
        end = time.monotonic() + EXIT_ANSWERING
        while (time.monotonic() < end and _unasked(world, notices)) or (
            time.monotonic() < min(notices.last_question, end) + EXIT_AFTER_QUESTION
        ):
            try:
                notices.poll(force=True)
            except Exception:  # noqa: BLE001 - aborting anyway
                break
            time.sleep(0.005)
    MPI.COMM_WORLD.Abort(1)


def _unasked(world: Communicator, notices: NoticeBoard) -> bool:
    """Whether some member of a group with a call still running here has not yet asked this
    rank where it is (NoticeBoard.ask: it may still time out in that call and ask)."""
    for c in world._tree():
        d = c._dispatcher
        ex = d.executor
        if c.freed or ex is None or ex.running is None or len(d.members) > ASK_MAX_RANKS:
            continue  # (nobody asks in groups above ASK_MAX_RANKS)
        heard = notices.heard.get(d.gid, {})
        if any(w != notices.world_rank and not (w in heard and heard[w][2]) for w in d.members):
            return True
    return False


# seconds a rank that exits with a call stuck answers its peers' questions (NoticeBoard.ask)
# before it aborts the job: a peer that timed out in the same call asks and raises within
# ASK_WAIT
EXIT_ANSWERING = ASK_WAIT + 0.5
EXIT_AFTER_QUESTION = 1.0  # and the time an asking peer has after its answers, to raise

# Departure notices go from every leaving rank to every other: size^2 small messages at
# exit, and across nodes a connection to every rank; above this size they are not sent
# (a waiting peer then learns of the departure at its timeout, as before).
DEPART_MAX_RANKS = 64
# seconds at least a leaving rank waits for the others' departures (see NoticeBoard.depart;
# the world's timeout where longer)
EXIT_WAIT = 120.0


def _locate(gid: str) -> tuple[int, str, Any] | None:
    """Where this rank is on the group with id ``gid`` (NoticeBoard.locate, for a peer that
    timed out and asks): the number of its last collective call, what the group's worker
    runs now ("" for nothing) and its latest bounded or async collective (its number and
    fingerprint); None where this rank has no such group."""
    world = _world
    for c in [] if world is None else world._tree():
        d = c._dispatcher
        if d.gid == gid and not c.freed:
            ex = d.executor
            running = None if ex is None else ex.running
            current = d.current
            call = None
            if current is not None:
                seq, made = current
                try:
                    call = (seq, fingerprint(made, made.spec.name, seq))
                except Exception:  # noqa: BLE001 - the rest of the answer still holds
                    pass
            return c._group.seq, "" if running is None else running.what, call
    return None


_departed = False  # this rank's departure went out (see _depart)
_finalize_watched = False


def _watch_finalize(MPI: Any) -> None:
    """Have the program's own ``MPI.Finalize()`` send this rank's departure first (MPI frees
    MPI_COMM_SELF's attributes at the start of MPI_Finalize): hpccomm's exit comes after it,
    finds MPI finalized and sends nothing, and a peer waiting at its exit for this rank's
    departure waited until its bound (an outside review)."""
    global _finalize_watched
    if _finalize_watched:
        return
    keyval = MPI.Comm.Create_keyval(delete_fn=_on_finalize)
    MPI.COMM_SELF.Set_attr(keyval, "hpccomm")
    _finalize_watched = True


def _on_finalize(comm: Any, keyval: int, value: Any) -> None:
    world = _world
    if world is None or _departed or os.getpid() != _init_pid or world.size == 1:
        return  # (at hpccomm's own exit it departed already; a fork child never does)
    try:
        if not _stuck_calls(world):
            # (a difference is said; the status stays the program's: it goes on after
            # MPI_Finalize, and a rank ending with status 1 then got the others killed in
            # their own work after it, an outside review)
            _depart(world, finalizing=True)
    except BaseException:  # noqa: BLE001 - never raised into MPI_Finalize
        pass


def _depart_early() -> None:
    """A normal exit's departure notice, sent before an exit step that waits for the other
    ranks (HPCCOMM_PROFILE's stop, an atexit handler run before :func:`_at_exit`): as
    _exit_steps would send it, only where no call of this rank is stuck and no failure or
    uncaught exception is known (those leave by their own ways)."""
    world = _world
    if world is None or _departed or os.getpid() != _init_pid or world.size == 1:
        return
    if _uncaught is not None or _init_failed:
        return
    from mpi4py import MPI

    from .backends import mpi as mpi_backend

    if MPI.Is_finalized() or mpi_backend.peer_failure_seen or mpi_backend.failed_in(MPI.COMM_WORLD):
        return
    if not _stuck_calls(world):
        _depart(world, wait=False)  # (the wait for the others comes at hpccomm's exit)


def _depart(world: Communicator, *, wait: bool = True, finalizing: bool = False) -> bool:
    """A normal exit: tell the other ranks this one is gone (NoticeBoard.depart), with the
    last call number it reached on every group it has or had, so that a peer waiting for it
    in a later call (one rank ran fewer steps than the others) hears it at once, where
    it waited out its timeout (torch's default: 30 min); MPI_Finalize here then waits for
    them as before. ``wait`` False: only send the notice (see _depart_early).

    The notice also carries the calls of each group that no comparison took (the "large"
    level compares a small call with the group's next compared call, which never came:
    the group's last calls before the end or free()); once every rank has said it leaves,
    each compares them (:func:`_uncompared_differences`, alike on every rank: each has
    every notice) and says what differed. True where something did: the job then ends
    with status 1 (see :func:`_exit_with_status`), not 0 over results that differ;
    ``finalizing``: sent from the program's own MPI_Finalize, where the program goes on (a
    difference is said, the status left to the program)."""
    global _departed
    notices = world._notices
    if notices is None or world.size > DEPART_MAX_RANKS or _departed:
        return False
    _departed = wait
    seqs = dict(notices.freed_seqs)
    unchecked = dict(notices.freed_unchecked)
    for c in world._tree():
        if not c.freed:
            d = c._dispatcher
            seqs[d.gid] = c._group.seq
            calls = d.unchecked()
            if calls is not None:
                unchecked[d.gid] = calls
    node = world._node_backend  # the world's node group, made at init, if never adopted
    if node is not None:  # (no step of the world made it: listed with no call, as node()
        # would name it) so that a peer waiting in its first call hears of this departure
        first = node.translate([0], world._backend)
        seqs.setdefault(member_gid(world._node_gid(), first), 0)
    rank, size = world.rank, world.size

    def say(text: str) -> None:
        sys.stderr.write(f"hpccomm (rank {rank} of {size}): {text}\n")
        sys.stderr.flush()

    for stream in (sys.stdout, sys.stderr):  # (before the wait: a peer's abort ends it,
        try:  # and this rank's buffered output was lost with it, an outside review)
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream
            pass
    try:
        notices.depart(
            seqs,
            (
                f"its program ended: an uncaught {_uncaught_kept} (HPCCOMM_ABORT_ON_EXCEPTION=0)"
                if _uncaught_kept
                else "its program ended: a normal exit or sys.exit"
            )
            + ("" if _thread_uncaught is None else f"; {_thread_uncaught}"),
            say,
            max(world.timeout or 0.0, EXIT_WAIT),
            wait=wait,
            unchecked=unchecked,
        )
    except BaseException:  # noqa: BLE001 - leaving anyway (a failure MPI reported: ULFM;
        return False  # a Ctrl-C during the wait)
    if not wait:
        return False
    try:
        said = _uncompared_differences(
            notices,
            seqs,
            unchecked,
            debug_mod.large_bytes(),
            finalizing,
        )
    except Exception as exc:  # noqa: BLE001 - a defect of this comparison: said, not raised
        say(f"at exit: the comparison of the groups' uncompared calls failed ({exc!r})")
        return False
    for text in said:
        say(text)
    if said and flight.recorder is not None:  # an hpccomm error of its own: its dump, as a
        # raised one's (the trace folder was empty, and its analysis said there was nothing
        # to analyze, though the job ended with status 1: an outside hunt)
        flight.recorder.try_dump(said[0])
    return bool(said)


def _uncompared_differences(
    notices: NoticeBoard,
    seqs: dict[str, int],
    unchecked: dict[str, Unchecked],
    large: int,
    finalizing: bool = False,
) -> list[str]:
    """What differed among the calls no comparison took, on every group whose members all
    said they leave (``seqs`` and ``unchecked``: this rank's own, as its notice told them):
    a message per group of which this rank is a member, naming the first call that differed
    (:func:`debug.exit_difference`); one line for the other groups that differed. A group
    some member did not list (it left without hpccomm's exit, or freed it long ago) is not
    judged. ``finalizing``: compared at the program's own MPI_Finalize (see _depart)."""
    when, outcome = (
        ("at MPI_Finalize", "the exit status is the program's")
        if finalizing
        else ("at exit", "the job ends with status 1")
    )
    me = notices.world_rank
    every = {me: unchecked, **notices.unchecked_of}
    gids = [g for by in every.values() for g in by]
    said: list[str] = []
    elsewhere: list[str] = []
    for gid in dict.fromkeys(gids):  # (each once, in the order met)
        name, members, _ = next(by[gid] for by in every.values() if gid in by)
        rows = []
        for w in members:
            last = seqs.get(gid) if w == me else notices.departed.get(w, ({}, ""))[0].get(gid)
            if last is None:
                break
            got = every.get(w, {}).get(gid)
            rows.append((last, {} if got is None else got[2]))
        else:
            text = debug_mod.exit_difference(rows, large)
            if text is None:
                continue
            if me in members:
                said.append(
                    f"{when}: on group {name} (world ranks {list(members)}; this rank is its "
                    f"rank {members.index(me)}) {text}; {outcome}"
                )
            else:
                elsewhere.append(f"{name} (world ranks {list(members)})")
    if elsewhere and not said:
        said.append(
            f"{when}: calls on group(s) {', '.join(elsewhere[:4])} that were never compared "
            f"differed across their ranks (said there); {outcome}"
        )
    return said


def _exit_with_status(status: int) -> None:
    """End the process with ``status`` once MPI_Finalize and the other atexit handlers have
    run (:class:`_ExitWhenCollected`): MPI is finalized here (every rank of the job comes
    here alike, after the departures), so a rank leaving first with a non-zero status does
    not get the others killed before they have said why."""
    from mpi4py import MPI

    if not MPI.Is_finalized():
        MPI.Finalize()
    gc.disable()  # first: no automatic collection between the two lines
    _ExitWhenCollected(status)


def _abort_failed_init() -> None:
    """init raised on this rank after MPI was up and its checks had passed on every rank (an
    error its peers did not share): they may wait for this rank in init's next steps or in
    their first call, so end the job instead of finalizing MPI."""
    from mpi4py import MPI

    if MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    sys.stderr.write(
        f"hpccomm (rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}): init "
        f"failed on this rank ({_uncaught or 'its error was caught'}); aborting the job "
        f"instead of finalizing MPI (its other ranks would wait for this one forever)\n"
    )
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


_ulfm: bool | None = None  # whether ULFM is on (_ulfm_on), once read


def _ulfm_on() -> bool:
    """Whether MPI runs with ULFM's fault tolerance (``mpiexec --with-ft ulfm``, or Open
    MPI's ``mpi_ft_enable`` set otherwise), where a failed rank does not end the job: Open
    MPI's own setting (``ompi_ftmpi_enabled``, read from the loaded library: Open MPI 5.0 has
    no call that says it), else the launcher's variable. Read once, at exit."""
    global _ulfm
    if _ulfm is None:
        from mpi4py import MPI

        try:  # (the symbol is looked up in mpi4py's module and the libraries it loaded)
            lib = ctypes.CDLL(MPI.__file__, mode=os.RTLD_NOLOAD)
            _ulfm = bool(ctypes.c_bool.in_dll(lib, "ompi_ftmpi_enabled").value)
        except (OSError, ValueError):  # another MPI, or an Open MPI built without ULFM
            value = os.environ.get("OMPI_MCA_mpi_ft_enable", "")
            _ulfm = value.strip().lower() in ("1", "true", "yes", "on", "enabled")
    return _ulfm


def _failure_agreed(known: bool) -> bool:
    """Under ULFM (:func:`_ulfm_on`), whether some rank of the job failed, as every rank
    still alive agrees (ULFM's MPI_Comm_agree over MPI_COMM_WORLD, before MPI_Finalize):
    ``known`` is this rank's own view. A rank that never heard of the failure (it made no
    call with the dead rank) went to MPI_Finalize, which waited on the dead rank for good
    while the ranks that had heard of it left as survivors (9 of 9 jobs in an outside hunt),
    or, where no rank had heard of it, the job ended with status 0 and no word (3 of 3).
    The agreement completes
    once every rank still alive has joined it, with the same answer on each (a failure
    that MPI has not been told to ignore is an MPI_ERR_PROC_FAILED on every rank, even for
    ranks that had not heard of it), so the survivors all leave through
    :func:`_leave_after_failure`, or all finalize. It is not bounded in time: a rank still
    running makes the others wait for it, as MPI_Finalize does (and one that gave up would
    leave them waiting: ULFM does not report a rank's exit with a non-zero status as a
    failure); after ``_SURVIVOR_WAIT`` seconds it says so on stderr. It runs on a daemon
    thread, so that signal handlers still run meanwhile. Without ULFM: False at once (a
    failed rank ends the job there), and nothing is exchanged."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() == 1 or not _ulfm_on():
        return False
    answer: list[bool] = []

    def agree() -> None:
        try:
            answer.append(world.Agree(0 if known else 1) == 0)  # (a bitwise AND of the flags)
        except MPI.Exception:  # MPI_ERR_PROC_FAILED: a rank failed, on every rank alike
            answer.append(True)

    thread = threading.Thread(target=agree, name="hpccomm-exit-agree", daemon=True)
    thread.start()
    thread.join(_SURVIVOR_WAIT)
    if thread.is_alive():
        sys.stderr.write(
            f"hpccomm (rank {world.Get_rank()} of {world.Get_size()}): still waiting at exit, "
            f"after {_SURVIVOR_WAIT:.0f} s, for the job's other ranks to end (ULFM: they agree "
            f"on whether a rank failed before finalizing MPI); a rank that ended without "
            f"MPI_Finalize with a non-zero status (os._exit) is not reported by ULFM\n"
        )
        sys.stderr.flush()
        thread.join()
    return bool(answer and answer[0])


def _leave_after_failure(bound: float) -> None:
    """Under ``--with-ft ulfm`` the survivors of a failed rank get a PeerError and may exit
    normally, but MPI_Finalize then may wait on the dead rank (measured: 1 job in 12-23 hung
    there), and MPI_Abort may leave the launcher itself stuck (1 job in 13). So the
    survivors meet and leave with status 1 without either, after the other atexit handlers
    (:func:`_exit_before_finalize`): the first to leave early got the others killed before
    they had reported (1 job in 2-24). The meeting (at most ``bound`` seconds, on a daemon
    thread: the non-blocking shrink of Open MPI 5.0 fails at once) is ULFM's
    MPI_Comm_shrink, after which every survivor knows the failed ranks (a rank released by
    a peer's revoke may not have known them; 9 of 12 such runs went to MPI_Finalize
    before), this rank's report, then a barrier among the survivors."""
    from mpi4py import MPI

    from .backends.mpi import failed_in

    world = MPI.COMM_WORLD
    shrunk = threading.Event()
    reported = threading.Event()

    def meet() -> None:
        try:
            live = world.Shrink()
            shrunk.set()
            reported.wait(bound)
            live.Barrier()
        except Exception:  # pragma: no cover - a failure during the meeting: leave anyway
            pass
        finally:
            shrunk.set()

    deadline = time.monotonic() + bound
    thread = threading.Thread(target=meet, name="hpccomm-exit", daemon=True)
    thread.start()
    shrunk.wait(bound)
    failed = failed_in(world) or []
    which = f"world rank(s) {failed}" if failed else "a peer process (MPI did not say which)"
    sys.stderr.write(
        f"hpccomm (rank {world.Get_rank()} of {world.Get_size()}): {which} failed during the "
        f"job; exiting with status 1 without finalizing MPI (MPI_Finalize would wait for the "
        f"failed rank(s))\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    reported.set()
    thread.join(max(0.0, deadline - time.monotonic()))
    _exit_before_finalize(1)


class _ExitWhenCollected:
    """Ends the process with ``status`` when the garbage collector frees it. Made as
    unreachable garbage (a cycle through itself) with automatic collection off, it is freed
    by a collection of the interpreter's shutdown (module teardown, on Python 3.11-3.13),
    which comes after every atexit handler (those registered before hpccomm's included,
    which an immediate ``os._exit`` skipped: logging's shutdown, the user's own) and before
    mpi4py's MPI_Finalize (a C-level Py_AtExit function, the very last step). A module
    global deleted at teardown does not work: a daemon thread's frame, such as an idle
    worker's, keeps the module alive. Limits: an atexit handler that calls ``gc.collect()``
    (or turns collection back on) ends the process there, before the handlers registered
    ahead of it; one that calls ``gc.freeze()`` keeps the object, and the SIGALRM backstop
    of :func:`_exit_before_finalize` then ends a hanging MPI_Finalize."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.streams = (sys.stdout, sys.stderr)
        self.exit = os._exit  # bound now: the os module may be torn down by then
        self.cycle = self

    def __del__(self) -> None:
        for stream in self.streams:
            try:
                stream.flush()
            except Exception:  # pragma: no cover - a closed stream: nothing left to flush
                pass
        self.exit(self.status)


_no_finalize = False  # this process leaves without MPI_Finalize (_exit_before_finalize)


def _finalize_what_init_started() -> None:
    """At exit, MPI_Finalize for an MPI that init started itself (mpi4py's rc.initialize
    off), unless this process leaves without it (a failed peer, a fork() child)."""
    from mpi4py import MPI

    if not _no_finalize and not MPI.Is_finalized():
        MPI.Finalize()


def _exit_before_finalize(status: int) -> None:
    """Leave with ``status`` once the other atexit handlers have run, without MPI_Finalize
    (:class:`_ExitWhenCollected`). A backstop in case that collection never comes or
    MPI_Finalize is reached all the same: SIGALRM, whose default action ends the process,
    after ``_SURVIVOR_WAIT`` seconds (it replaces a SIGALRM handler of the program's; an
    atexit handler running longer than that is cut short)."""
    global _no_finalize
    _no_finalize = True
    gc.disable()  # first: no automatic collection between the two lines
    _ExitWhenCollected(status)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(_SURVIVOR_WAIT))


_SURVIVOR_WAIT = 60.0  # seconds the survivors of a failed rank wait for each other at exit


_EXIT_GRACE = 0.5  # seconds a call still running at exit gets to complete, at least


def _stuck_calls(comm: Communicator) -> list[str]:
    """The calls still inside MPI on ``comm``'s worker thread and its groups' (each once).
    A call still running there (an ``async_op`` call never waited for, a peer late) is given
    until its time bound (submitted + the group's timeout; without one, or on a group made
    unusable by a peer's failure, _EXIT_GRACE) to complete first: a call stuck past it
    aborts the job, one that completes does not."""
    out = []
    ex = comm._dispatcher.executor
    if ex is not None:
        since, bound = ex.oldest_submitted(), comm.timeout
        # (a broken group's call is stuck for good: a peer failed or refused it; no grace,
        # where 300 such groups took 0.5 s each)
        grace = 0.05 if comm._dispatcher.broken is not None and ex.pending else _EXIT_GRACE
        if since is not None and bound is not None and comm._dispatcher.broken is None:
            grace = max(grace, since + bound - time.monotonic())
        if not ex.close(timeout=grace):
            out.append(ex.stuck or "a call")
    if comm._dispatcher.interrupted is not None:
        out.append(comm._dispatcher.interrupted)
    # a daemon thread still inside a plain call (its caller's thread, not the worker):
    # MPI_Finalize under it segfaulted (5 of 11 runs in an outside review)
    calls_elsewhere = comm._dispatcher.calls_elsewhere
    if not wait_bounded(lambda: not calls_elsewhere(), _EXIT_GRACE):
        out += calls_elsewhere()
    for child in comm._children:
        out.extend(_stuck_calls(child))
    if comm is _world:  # groups freed with a call stuck inside MPI (see Communicator.free)
        for group in Communicator._abandoned:
            out.extend(_stuck_calls(group))
    return out


def is_initialized() -> bool:
    """True after :func:`init` (and before the world is freed)."""
    return _world is not None and not _world.freed


def world() -> Communicator:
    """The world Communicator made by :func:`init`; raises if init has not run."""
    if _world is None or _world.freed:
        raise HpccommError("hpccomm.world(): call hpccomm.init() first")
    return _world
