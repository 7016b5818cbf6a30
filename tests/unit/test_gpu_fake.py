"""The GPU path run on the CPU against a fake CuPy (arrays backed by NumPy memory, streams,
events, a CUDA runtime and an NCCL communicator that record what is done on which stream).

The fake reproduces what CuPy 14.2's source does where it matters here (``Event.done`` is
``eventQuery(ptr) == 0``, so a sticky CUDA error leaves it False for ever; ``check_status``
raises ``CUDARuntimeError``; NCCL calls take raw pointers; ``get_unique_id`` gives 128 bytes).
A one-rank NCCL communicator really moves the bytes, so results are checked as well as order.
These tests show the defects of issue 14 that can be shown without a GPU; tests/gpu runs the
real thing on a GPU machine.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import sys
import threading
import time
import types
import warnings

import ml_dtypes
import numpy as np
import pytest

from hpccomm import ops as O
from hpccomm.backends.mpi_device import DeviceBackends, DeviceMPIBackend
from hpccomm.backends.nccl import NcclBackend, check_unique_gpus
from hpccomm.cuda_aware import DeviceConfig, DevicePath
from hpccomm.discovery import discover
from hpccomm.dispatch import Dispatcher
from hpccomm.dtypes import ReduceOp, dtype_info
from hpccomm.errors import (
    BackendError,
    CommTimeoutError,
    DtypeError,
    GpuBindingError,
    HpccommError,
    InvalidArgumentError,
    UnwaitedWorkWarning,
)
from hpccomm.gpuselect import choose_on_node, format_uuid
from hpccomm.ops import Group, P2POp
from hpccomm.runtime import _bind_gpu, _device_config

# -- the fake --------------------------------------------------------------------------------

NOT_READY, ILLEGAL_ADDRESS, INSUFFICIENT_DRIVER, NO_DEVICE = 600, 700, 35, 100
_NAMES = {
    NOT_READY: "cudaErrorNotReady",
    ILLEGAL_ADDRESS: "cudaErrorIllegalAddress: an illegal memory access was encountered",
    INSUFFICIENT_DRIVER: "cudaErrorInsufficientDriver: CUDA driver version is insufficient",
    NO_DEVICE: "cudaErrorNoDevice: no CUDA-capable device is detected",
}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(_NAMES.get(status, f"cudaError {status}"))


class NcclError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"NCCL_ERROR {status}")


class Gpu:
    """The fake machine: its devices, its driver, what happens to events, and the log of
    everything done: ("kernel", name, stream), ("alloc", stream), ("sync", stream), ("nccl",
    op, stream), ("group", "start"|"end"), ("event", stream), ("mpi", op)."""

    def __init__(self, uuids=(bytes(range(1, 17)),), *, driver_error=None, driver=13020):
        self.uuids = list(uuids)
        self.driver_error = driver_error
        self.driver = driver
        self.log: list[tuple] = []
        self.event_status = 0  # what eventQuery answers for events not yet released
        self.stuck: set[int] = set()  # events (ptr) that never complete until an abort
        self.recorded: list = []  # every Event recorded, in order
        self.duration = 0.0  # seconds each NCCL call takes on its stream (in stream order)
        self.stream_done: dict[int, float] = {}  # when each stream's NCCL work is done
        self.comm_abort = threading.Event()
        self.block_enqueue = False  # NCCL calls block the host (lazy connect, missing peer)
        self.block_init = False  # NcclCommunicator() blocks (a rank never joins)
        self.issued: list[tuple[int, str]] = []  # (communicator's id, op) in enqueue order
        self.enqueue_time = 0.0  # seconds each NCCL call keeps the host inside NCCL
        self.overlaps = 0  # NCCL calls entered on a communicator another thread was inside
        self.async_error = False
        self.device_calls = 0  # device queries made (binding must make none when told not to)
        self.ptrs = itertools.count(0x1000, 0x10)
        self.local = threading.local()
        self.null = Stream(self, ptr=0)

    # thread-local current device and stream stack, as CuPy keeps them
    def streams(self) -> list:
        if not hasattr(self.local, "streams"):
            self.local.streams = []
        return self.local.streams

    def current(self) -> Stream:
        s = self.streams()
        return s[-1] if s else self.null

    def query(self, event) -> int:
        """What cudaEventQuery answers for ``event``."""
        if event.ptr in self.stuck:  # (a peer that never comes: not even another
            return NOT_READY  # communicator's abort ends it)
        if self.event_status not in (0, NOT_READY):  # a sticky CUDA error: for good
            return self.event_status
        if self.comm_abort.is_set():
            return 0
        if time.monotonic() < getattr(event, "done_at", 0.0):
            return NOT_READY
        return self.event_status

    def unfinished(self) -> bool:
        """Whether some NCCL work is still running (what ncclCommDestroy waits for)."""
        return (
            bool(self.stuck)
            or self.event_status == NOT_READY
            or any(time.monotonic() < t for t in self.stream_done.values())
        )


class Stream:
    def __init__(self, gpu: Gpu, ptr: int | None = None, non_blocking: bool = False) -> None:
        self.gpu = gpu
        self.ptr = next(gpu.ptrs) if ptr is None else ptr

    def __enter__(self) -> Stream:
        self.gpu.streams().append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.gpu.streams().pop()

    def synchronize(self) -> None:
        self.gpu.log.append(("sync", self.ptr))

    def wait_event(self, event) -> None:
        self.gpu.log.append(("wait_event", self.ptr, event.ptr))

    def record(self, event=None):
        event = event or Event(self.gpu)
        event.record(self)
        return event


PTDS = 2  # the per-thread default stream's handle: the calling thread's own stream


class Event:
    def __init__(self, gpu: Gpu, disable_timing: bool = True) -> None:
        self.gpu = gpu
        self.ptr = next(gpu.ptrs)

    def record(self, stream=None) -> None:
        ptr = (stream or self.gpu.current()).ptr
        self.gpu.log.append(("event", ptr))
        self.gpu.recorded.append(self)
        self.gpu.stuck.discard(self.ptr)  # recorded again: it marks the stream's work now
        self.done_at = self.gpu.stream_done.get(ptr, 0.0)

    @property
    def done(self) -> bool:  # CuPy 14.2: runtime.eventQuery(self.ptr) == 0
        return self.gpu_runtime_query() == 0

    def gpu_runtime_query(self) -> int:
        return self.gpu.query(self)


class Device:
    def __init__(self, gpu: Gpu, device: int | None = 0) -> None:
        self.gpu = gpu
        self.id = 0 if device is None else device

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def use(self) -> None:
        self.gpu.device_calls += 1
        if self.gpu.driver_error is not None:
            raise CUDARuntimeError(self.gpu.driver_error)
        self.gpu.log.append(("use", self.id))


class Runtime(types.ModuleType):
    def __init__(self, gpu: Gpu) -> None:
        super().__init__("cupy.cuda.runtime")
        self.gpu = gpu
        self.CUDARuntimeError = CUDARuntimeError
        self.streamPerThread = PTDS  # CuPy: cudaStreamPerThread, Stream.ptds's handle

    def _device(self) -> None:
        self.gpu.device_calls += 1
        if self.gpu.driver_error is not None:
            raise CUDARuntimeError(self.gpu.driver_error)

    def getDeviceCount(self) -> int:
        self._device()
        return len(self.gpu.uuids)

    def getDeviceProperties(self, i: int) -> dict:
        self._device()
        return {"uuid": self.gpu.uuids[i], "name": b"Fake GPU"}

    def deviceGetPCIBusId(self, i: int) -> str:
        self._device()
        return f"0000:{i + 1:02x}:00.0"

    def driverGetVersion(self) -> int:
        return (
            0
            if self.gpu.driver_error == INSUFFICIENT_DRIVER and not self.gpu.driver
            else (self.gpu.driver)
        )

    def runtimeGetVersion(self) -> int:
        return 13020

    def eventQuery(self, ptr: int) -> int:  # CuPy: returns the status, never raises
        events = [e for e in self.gpu.recorded if e.ptr == ptr]
        if events:
            return self.gpu.query(events[-1])
        return 0 if self.gpu.comm_abort.is_set() else self.gpu.event_status

    def check_status(self, status: int) -> None:
        if status:
            raise CUDARuntimeError(status)


class _Data:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _Flags:
    def __init__(self, a: np.ndarray) -> None:
        self.c_contiguous = a.flags.c_contiguous


class ndarray:
    """A CuPy array: NumPy memory, kernels logged on the current stream."""

    __module__ = "cupy"

    def __init__(self, gpu: Gpu, a: np.ndarray) -> None:
        self.gpu = gpu
        self.a = a

    size = property(lambda self: self.a.size)
    dtype = property(lambda self: self.a.dtype)
    shape = property(lambda self: self.a.shape)
    strides = property(lambda self: self.a.strides)
    nbytes = property(lambda self: self.a.nbytes)
    flags = property(lambda self: _Flags(self.a))
    device = property(lambda self: Device(self.gpu, 0))
    data = property(lambda self: _Data(self.a.ctypes.data))

    def _kernel(self, name: str, result: np.ndarray) -> ndarray:
        self.gpu.log.append(("kernel", name, self.gpu.current().ptr))
        return ndarray(self.gpu, result)

    def __mul__(self, factor):
        return self._kernel("multiply", self.a * factor)

    def astype(self, dtype, copy=True):
        return self._kernel("astype", self.a.astype(dtype, copy=copy))

    def reshape(self, *shape):
        return ndarray(self.gpu, self.a.reshape(*shape))

    def __getitem__(self, key):
        return ndarray(self.gpu, self.a[key])

    def __setitem__(self, key, value):
        self.gpu.log.append(("kernel", "copy", self.gpu.current().ptr))
        self.a[key] = value.a if isinstance(value, ndarray) else value

    def get(self, out=None, stream=None):
        self.gpu.log.append(("d2h", (stream or self.gpu.current()).ptr))
        out[...] = self.a
        return out

    def set(self, host, stream=None):
        self.gpu.log.append(("h2d", (stream or self.gpu.current()).ptr))
        self.a[...] = host


_NCCL_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}


class NcclCommunicator:
    """One rank's NCCL communicator; with one rank the collectives are copies, done."""

    instances: list[NcclCommunicator] = []

    def __init__(self, gpu: Gpu, ndev: int, commid, rank: int) -> None:
        assert isinstance(commid, bytes) and len(commid) == 128
        self.gpu = gpu
        self.ndev, self.rank = ndev, rank
        self.aborted = self.destroyed = False
        self.comm = 0x7F00  # the ncclComm_t handle: 0 once aborted or destroyed (as CuPy)
        self.inside = 0  # threads inside an NCCL call on it
        gpu.log.append(("nccl_init", ndev, rank))
        if gpu.block_init:
            gpu.comm_abort.wait(30)  # no handle to abort: only the test's release ends it
        NcclCommunicator.instances.append(self)

    def _enqueue(self, op: str, stream: int) -> None:
        self.gpu.log.append(("nccl", op, stream))
        self.gpu.issued.append((id(self), op))
        self.inside += 1  # NCCL: one thread at a time on a communicator
        if self.inside > 1:
            self.gpu.overlaps += 1
        time.sleep(self.gpu.enqueue_time)
        self.inside -= 1
        if self.gpu.duration:
            start = max(time.monotonic(), self.gpu.stream_done.get(stream, 0.0))
            self.gpu.stream_done[stream] = start + self.gpu.duration
        if self.gpu.block_enqueue:
            self.gpu.comm_abort.wait(30)  # blocked on the host until the communicator aborts

    def _copy(self, send: int, recv: int, count: int, dtype: int) -> None:
        if self.ndev == 1 and send != recv:
            ctypes.memmove(recv, send, count * _NCCL_SIZES[dtype])

    def allReduce(self, send, recv, count, dtype, op, stream):
        self._enqueue("allReduce", stream)
        self._copy(send, recv, count, dtype)

    def reduce(self, send, recv, count, dtype, op, root, stream):
        self._enqueue("reduce", stream)
        self._copy(send, recv, count, dtype)

    def bcast(self, buf, count, dtype, root, stream):
        self._enqueue("bcast", stream)

    def allGather(self, send, recv, count, dtype, stream):
        self._enqueue("allGather", stream)
        self._copy(send, recv, count, dtype)

    def reduceScatter(self, send, recv, count, dtype, op, stream):
        self._enqueue("reduceScatter", stream)
        self._copy(send, recv, count, dtype)

    def send(self, buf, count, dtype, peer, stream):
        self._enqueue("send", stream)

    def recv(self, buf, count, dtype, peer, stream):
        self._enqueue("recv", stream)

    def check_async_error(self):
        if self.comm == 0:  # ncclCommGetAsyncError(NULL): ncclInvalidArgument
            raise NcclError(4)
        if self.gpu.async_error:
            raise NcclError(6)

    def abort(self):
        self.aborted = True
        self.comm = 0
        self.gpu.log.append(("nccl_abort",))
        self.gpu.comm_abort.set()

    def destroy(self):
        # ncclCommDestroy finalizes the communicator: it waits inside NCCL (no bound) for
        # the operations still unfinished on the GPU; an abort from another thread ends it
        unfinished = self.gpu.unfinished()
        deadline = time.monotonic() + 30
        while self.gpu.unfinished() and time.monotonic() < deadline:
            if self.gpu.comm_abort.wait(0.01):
                break
        self.gpu.log.append(("nccl_destroy", "waited" if unfinished else "at once"))
        self.destroyed = True
        self.comm = 0


def make_cupy(gpu: Gpu) -> dict[str, types.ModuleType]:
    """The modules of the fake CuPy, for sys.modules."""
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    nccl = types.ModuleType("cupy.cuda.nccl")
    cupyx = types.ModuleType("cupyx")
    runtime = Runtime(gpu)
    cupy.__version__ = "14.2.0"
    cupy.cuda = cuda
    cupy.ndarray = ndarray
    cupy.empty = lambda shape, dtype=np.float64: (
        gpu.log.append(("alloc", gpu.current().ptr)) or ndarray(gpu, np.empty(shape, dtype))
    )
    cupy.asarray = lambda a: ndarray(gpu, np.array(a))
    cupy.may_share_memory = lambda x, y: np.may_share_memory(x.a, y.a)

    def zeros(shape, dtype=np.float64):
        gpu.device_calls += 1
        gpu.log.append(("kernel", "zeros", gpu.current().ptr))
        return ndarray(gpu, np.zeros(shape, dtype))

    cupy.zeros = zeros

    def divide(x, n, out=None):
        gpu.log.append(("kernel", "divide", gpu.current().ptr))
        np.divide(x.a, n, out=out.a)
        return out

    cupy.divide = divide
    cuda.runtime = runtime
    cuda.nccl = nccl
    cuda.Device = lambda device=0: Device(gpu, device)
    cuda.Stream = lambda non_blocking=False: Stream(gpu, non_blocking=non_blocking)
    cuda.Event = lambda disable_timing=True: Event(gpu, disable_timing)
    cuda.get_current_stream = gpu.current
    nccl.NcclError = NcclError
    nccl.NcclCommunicator = lambda ndev, commid, rank: NcclCommunicator(gpu, ndev, commid, rank)
    nccl.get_version = lambda: 23203
    nccl.get_unique_id = lambda: bytes(range(128))
    nccl.groupStart = lambda: gpu.log.append(("group", "start"))
    nccl.groupEnd = lambda: gpu.log.append(("group", "end"))
    cupyx.empty_pinned = lambda shape, dtype=np.uint8: np.empty(shape, dtype)
    return {
        "cupy": cupy,
        "cupy.cuda": cuda,
        "cupy.cuda.runtime": runtime,
        "cupy.cuda.nccl": nccl,
        "cupyx": cupyx,
    }


class FakeMPI:
    """An mpi4py communicator of ``size`` ranks seen from rank ``rank``: allgather answers
    with the other ranks' contributions given (``others``), or copies of this one's."""

    def __init__(self, rank: int = 0, size: int = 1, others=None) -> None:
        self.rank, self.size, self.others = rank, size, others

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def allgather(self, x):
        if self.others is None:
            return [x] * self.size
        return [x if r == self.rank else self.others[r] for r in range(self.size)]


@pytest.fixture
def gpu(monkeypatch):
    """A fake one-GPU machine installed as CuPy."""
    g = Gpu()
    for name, mod in make_cupy(g).items():
        monkeypatch.setitem(sys.modules, name, mod)
    NcclCommunicator.instances.clear()
    yield g
    g.comm_abort.set()  # release anything still blocked


def dev(gpu: Gpu, a) -> ndarray:
    return ndarray(gpu, np.ascontiguousarray(a))


class HostStub:
    """The group's host backend as DeviceBackends and the dispatch see it."""

    name = "mpi"

    def __init__(self, mpi: FakeMPI) -> None:
        self.mpi = mpi
        self.rank, self.size = mpi.rank, mpi.size

    def same_int(self, value: int) -> bool:  # the debug check of group steps: ranks agree
        return True


def nccl_dispatcher(gpu, *, timeout=None, auto=False, mpi=None):
    mpi = mpi or FakeMPI()
    host = HostStub(mpi)
    devices = DeviceBackends(host, DeviceConfig(0, "nccl", DevicePath(False, "test"), auto=auto))
    d = Dispatcher(Group("world", mpi.rank, mpi.size), host, devices.backend_for, timeout=timeout)
    devices.attach(d)
    return d, devices


def in_thread(fn, limit: float):
    """Run fn in a thread; (finished, its result or exception). A hang does not hang the test."""
    box: list = []

    def run():
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    return (not t.is_alive()), (box[0] if box else None)


# -- defect 9: duplicate GPUs compared by UUID -----------------------------------------------

U1, U2 = bytes(range(1, 17)), bytes(range(2, 18))


def test_mig_instances_of_one_gpu_are_distinct_gpus():
    """Two MIG instances of one GPU share the PCI bus id but not the UUID: NCCL >= 2.30
    accepts them, so must hpccomm (it compared bus ids and refused)."""
    same_bus = [("n1", "MIG-aaaa", "0000:01:00.0"), ("n1", "MIG-bbbb", "0000:01:00.0")]
    check_unique_gpus(same_bus, 0)
    with pytest.raises(GpuBindingError, match=r"ranks \[0, 1\] on host n1 would share GPU MIG-aa"):
        check_unique_gpus([same_bus[0], same_bus[0]], 1)


def test_format_uuid_like_nvidia_smi():
    assert format_uuid(bytes.fromhex("6f5e5d3c2b1a09080706050403020100")) == (
        "GPU-6f5e5d3c-2b1a-0908-0706-050403020100"
    )
    assert format_uuid(bytes(16)) == "" and format_uuid(None) == ""


def test_uuid_as_cupy_reads_it():
    """CuPy reads cudaDeviceProp.uuid as a C string: past the 16 bytes into luid when no
    byte is zero (the first 16 are the UUID; the rest was compared too, and may differ by
    process), cut at a zero byte otherwise (the GPU is then named by its PCI bus id)."""
    u = bytes(range(1, 17))
    assert format_uuid(u + b"ZZZZZZZZ") == format_uuid(u) != ""
    assert format_uuid(u[:5]) == ""  # cut at u[5] == 0: the bus id names the GPU instead
    short = [("n1", format_uuid(u[:5]), "0000:01:00.0")] * 2
    with pytest.raises(GpuBindingError, match=r"would share GPU 0000:01:00.0"):
        check_unique_gpus(short, 1)


def test_nccl_init_exchanges_uuids_and_refuses_a_shared_one(gpu):
    other = ((("n2", format_uuid(U1), "0000:01:00.0"), None, False),)
    with pytest.raises(GpuBindingError, match=rf"would share GPU {format_uuid(U1)} \(PCI"):
        NcclBackend(FakeMPI(0, 2, [None, *other]), 0, host="n1")
    distinct = ((("n2", format_uuid(U2), "0000:01:00.0"), None, False),)
    b = NcclBackend(FakeMPI(0, 2, [None, *distinct]), 0, host="n1")
    assert b.comm.ndev == 2 and b.comm.rank == 0


def test_nccl_init_failure_on_one_rank_is_raised_on_every_rank(gpu):
    """A rank that cannot describe its GPU still joins the exchange, so the others raise
    too, naming it, instead of waiting in the allgather."""
    failed = ("CUDARuntimeError: cudaErrorInsufficientDriver", None, False)
    with pytest.raises(BackendError, match="rank 1 could not describe GPU.*InsufficientDriver"):
        NcclBackend(FakeMPI(0, 2, [None, failed]), 0)


# -- defect 5: "auto" falls back to the MPI device path where NCCL refuses -------------------


def shared_gpu_mpi(allowed: bool = False) -> FakeMPI:
    """Rank 1 of 2 on rank 0's GPU; ``allowed``: NCCL_MULTI_RANK_GPU_ENABLE=1 there."""
    return FakeMPI(0, 2, [None, (("n1", format_uuid(U1), "0000:01:00.0"), None, allowed)])


def test_auto_falls_back_to_mpi_when_ranks_share_a_gpu(gpu, monkeypatch):
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    d, devices = nccl_dispatcher(gpu, auto=True, mpi=shared_gpu_mpi())
    call = O.Call(O.ALL_REDUCE, d.group, redop=ReduceOp.SUM)
    call.device = 0
    with pytest.warns(RuntimeWarning, match="take the MPI device path.*would share GPU"):
        backend = devices.backend_for(call)
    assert isinstance(backend, DeviceMPIBackend) and devices.nccl is None
    assert isinstance(devices.backend_for(call), DeviceMPIBackend)  # no second attempt
    assert [e for e in gpu.log if e[0] == "nccl_init"] == []


def test_explicit_nccl_still_refuses_ranks_sharing_a_gpu(gpu, monkeypatch):
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    d, devices = nccl_dispatcher(gpu, auto=False, mpi=shared_gpu_mpi())
    call = O.Call(O.ALL_REDUCE, d.group, redop=ReduceOp.SUM)
    call.device = 0
    with pytest.raises(GpuBindingError, match="would share GPU"):
        devices.backend_for(call)
    d2, auto = nccl_dispatcher(gpu, auto=True, mpi=shared_gpu_mpi())
    with pytest.raises(GpuBindingError):  # enable_nccl() is explicit even under "auto"
        auto.enable_nccl("enable_nccl (rank 0 of 2)")


def test_multi_rank_gpu_enable_lets_nccl_share(gpu, monkeypatch):
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    d, devices = nccl_dispatcher(gpu, auto=True, mpi=shared_gpu_mpi(allowed=True))
    call = O.Call(O.ALL_REDUCE, d.group, redop=ReduceOp.SUM)
    call.device = 0
    assert isinstance(devices.backend_for(call), NcclBackend)


@pytest.mark.parametrize("here", [True, False])
def test_multi_rank_gpu_enable_on_some_ranks_only_is_refused_on_every_rank(gpu, monkeypatch, here):
    """Each rank decided from its own environment: the ranks with the setting entered
    ncclCommInitRank and waited for the ones that refused. The setting is the group's now."""
    if here:
        monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    else:
        monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    with pytest.raises(
        GpuBindingError, match=rf"set on rank\(s\) \[{0 if here else 1}\] only, and must be"
    ):
        NcclBackend(shared_gpu_mpi(allowed=not here), 0, host="n1")
    assert [e for e in gpu.log if e[0] == "nccl_init"] == []


def test_auto_mode_is_said_and_dup_to_nccl_is_explicit():
    cfg = DeviceConfig(0, "nccl", DevicePath(False, "x"), auto=True)
    assert "MPI device path where NCCL refuses" in cfg.describe()
    assert cfg._replace(mode="nccl", auto=False).auto is False


# -- defect 6: timeouts bound NCCL work --------------------------------------------------------


def test_bounded_call_waits_for_the_gpu_and_aborts_on_timeout(gpu):
    """With a timeout, a synchronous NCCL call must not return before the GPU is done (it
    only enqueued a stream wait): a rank that never joins is a CommTimeoutError and the
    communicator is aborted, not a hang in some later synchronize."""
    d, devices = nccl_dispatcher(gpu, timeout=0.3)
    x = dev(gpu, np.ones(8, np.float32))
    gpu.event_status = NOT_READY  # the collective never completes on the GPU
    t0 = time.monotonic()
    finished, got = in_thread(lambda: d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM), 10)
    assert finished and isinstance(got, CommTimeoutError), got
    assert "NCCL communicator was aborted" in str(got)
    assert str(got).startswith("all_reduce #2 on world (rank 0 of 1): not complete after 0.3 s")
    assert time.monotonic() - t0 < 5
    assert devices.nccl.comm.aborted
    with pytest.raises(BackendError, match="aborted earlier"):
        d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)


def test_bounded_call_whose_enqueue_blocks_the_host_lazy_connect(gpu):
    """NCCL's lazy connect blocks the host inside the first collective until the peers
    connect; a bounded call must still end at its timeout (it ran inline, unbounded)."""
    d, devices = nccl_dispatcher(gpu, timeout=0.3)
    devices.enable_nccl("enable_nccl (rank 0 of 1)")
    gpu.block_enqueue = True
    x = dev(gpu, np.ones(4, np.float32))
    finished, got = in_thread(lambda: d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM), 10)
    assert finished, "the bounded NCCL call hung on the host"
    assert isinstance(got, CommTimeoutError) and "aborted" in str(got), got


def test_bounded_call_completes_with_its_result(gpu):
    d, devices = nccl_dispatcher(gpu, timeout=5)
    x = dev(gpu, np.arange(6, dtype=np.float64))
    assert d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.PREMUL_SUM(2.0)) is x
    assert list(x.a) == [0, 2, 4, 6, 8, 10]
    assert gpu.log.index(("nccl", "allReduce", 0)) < max(
        i for i, e in enumerate(gpu.log) if e[0] == "event"
    )  # an event recorded after the collective, waited on the host


def test_nccl_creation_is_bounded_by_the_timeout(gpu):
    """ncclCommInitRank waits for every rank: with a timeout the first device collective
    ends with CommTimeoutError instead of hanging, and later device calls refuse."""
    d, devices = nccl_dispatcher(gpu, timeout=0.3)
    gpu.block_init = True
    x = dev(gpu, np.ones(4, np.float32))
    finished, got = in_thread(lambda: d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM), 10)
    assert finished, "NCCL creation hung"
    assert isinstance(got, CommTimeoutError), got
    assert "creating the group's NCCL communicator did not complete" in str(got)
    with pytest.raises(BackendError, match="cannot run"):
        devices.enable_nccl("enable_nccl (rank 0 of 1)")


def test_sticky_cuda_error_is_raised_not_a_timeout(gpu):
    """After a sticky CUDA error CuPy's Event.done stays False for ever; synchronize() and
    is_completed() must raise the CUDA error instead of spinning to a timeout."""
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    gpu.event_status = ILLEGAL_ADDRESS
    assert not Event(gpu).done  # what CuPy's own property says
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="CUDA error on the GPU: cudaErrorIllegalAddress"):
        work.synchronize(timeout=2)
    assert time.monotonic() - t0 < 1
    with pytest.raises(BackendError, match="cudaErrorIllegalAddress"):
        work.wait()  # the Work keeps the error


def test_an_abort_fails_the_other_unfinished_works_of_an_unbounded_group(gpu):
    """One Work's synchronize(timeout) aborts the communicator; the aborted kernels' events
    complete, so another Work still running reported success (is_completed() True, no
    exception, wait() returned its result), as if its data were whole. PyTorch fails every
    outstanding Work of an aborted communicator."""
    d, devices = nccl_dispatcher(gpu)
    x, y = dev(gpu, np.ones(4, np.float32)), dev(gpu, np.ones(4, np.float32))
    gpu.event_status = NOT_READY
    first = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    second = d.dispatch(O.ALL_REDUCE, y, redop=ReduceOp.SUM, async_op=True)
    third = d.dispatch(O.ALL_REDUCE, y, redop=ReduceOp.SUM, async_op=True)
    assert not second.is_completed()
    with pytest.raises(CommTimeoutError, match="not complete after 0.1 s on the GPU"):
        first.synchronize(timeout=0.1)
    assert devices.nccl.aborted
    assert Event(gpu).done  # (the abort ended the kernels: their events are done)
    assert second.is_completed()
    assert isinstance(second.exception(), BackendError), second.exception()
    assert "the communicator was aborted" in str(second.exception())
    with pytest.raises(BackendError, match="the communicator was aborted"):
        second.wait()
    with pytest.raises(BackendError, match="the communicator was aborted"):
        third.wait()  # (not polled first: wait() says it too)


@pytest.mark.parametrize("dropped", [True, False])
def test_a_cuda_error_on_a_bounded_group_is_said_not_given_up_as_a_timeout(gpu, dropped):
    """An async call of a bounded group whose event reports a sticky CUDA error never
    completes: the watchdog gave it up at the timeout, and its Work raised CommTimeoutError
    ("some rank of the group has not joined it"). It aborts the communicator naming the
    CUDA error, and the Work raises that."""
    c, devices = nccl_communicator(gpu, timeout=0.3)
    x = dev(gpu, np.ones(8, np.float32))
    gpu.event_status = NOT_READY
    work = c.all_reduce(x, async_op=True)
    gpu.event_status = ILLEGAL_ADDRESS
    t0 = time.monotonic()
    while not devices.nccl.aborted:
        assert time.monotonic() - t0 < 5, "the watchdog never looked"
        time.sleep(0.01)
    assert "CUDA error on the GPU: cudaErrorIllegalAddress" in devices.nccl.aborted
    assert "did not complete" not in devices.nccl.aborted
    if dropped:
        with pytest.warns(UnwaitedWorkWarning):
            del work
    else:
        with pytest.raises(BackendError, match="cudaErrorIllegalAddress") as info:
            work.wait()
        assert not isinstance(info.value, CommTimeoutError)
    y = dev(gpu, np.ones(8, np.float32))
    with pytest.raises(BackendError, match="aborted .*cudaErrorIllegalAddress"):
        c.all_reduce(y)  # later calls say why the communicator is gone
    gpu.event_status = 0
    c.free()


@pytest.mark.parametrize("async_op", [True, False])
def test_a_bounded_calls_temporaries_are_held_by_its_work_alone(gpu, async_op):
    """PREMUL_SUM's scaled copy lives until the GPU is done with it, held by the call's Work;
    the calling thread's own list kept it, and the GPU memory, until its next call."""
    c, devices = nccl_communicator(gpu, timeout=5)
    x = dev(gpu, np.ones(1 << 10, np.float32))
    work = c.all_reduce(x, op=ReduceOp.PREMUL_SUM(2.0), async_op=async_op)
    assert devices.nccl._temps == []  # (this thread's: nothing left there)
    if async_op:
        assert len(work._pending.keep) == 1  # the scaled copy, until the Work completes
        work.wait()
    c.free()


def test_a_finished_device_work_lets_its_temporaries_go(gpu):
    """PREMUL_SUM's scaled copy (GPU memory the size of the input) goes with the finished
    Work's pending state, not kept by the Work for as long as the program holds it."""
    import gc

    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(1 << 10, np.float32))
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.PREMUL_SUM(2.0), async_op=True)
    assert len(work._on_gpu.keep) == 1
    assert work.is_completed()
    gc.collect()
    assert work._on_gpu.keep is None  # (done on the GPU: the copy goes)
    assert work.synchronize(timeout=1) is x


def test_a_work_seen_complete_stays_whole_after_a_cupy_level_abort(gpu):
    """is_completed() saw the call done; the program then aborted the communicator through
    CuPy: synchronize() failed the Work, while wait() and exception() said success (a
    review)."""
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    assert work.is_completed() and work.exception() is None
    devices.nccl.comm.abort()
    assert work.synchronize(timeout=1) is x and work.synchronize() is x


def test_synchronize_after_wait_sees_an_abort_that_cut_the_call_short(gpu):
    """wait() orders the stream and finishes the Work while the GPU may still run the
    call: a later synchronize() must see an abort that ended its kernel (a weak reference
    to the call's state lost it: the cut-short result was returned as whole, a review)."""
    d, devices = nccl_dispatcher(gpu)
    x, y = dev(gpu, np.ones(4, np.float32)), dev(gpu, np.ones(4, np.float32))
    gpu.event_status = NOT_READY
    first = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    second = d.dispatch(O.ALL_REDUCE, y, redop=ReduceOp.SUM, async_op=True)
    assert first.wait() is x  # (stream ordered; the GPU still runs it)
    with pytest.raises(CommTimeoutError):
        second.synchronize(timeout=0.1)
    with pytest.raises(BackendError, match="the communicator was aborted"):
        first.synchronize(timeout=1)


def test_a_work_complete_before_an_abort_keeps_its_result(gpu):
    """A call the GPU had finished before another Work's synchronize(timeout) aborted the
    communicator, not asked about before: its result is whole (abort() looks at the
    unfinished Works' events first), where the abort's failing every unasked Work failed
    it too."""
    d, devices = nccl_dispatcher(gpu)
    x, y = dev(gpu, np.ones(4, np.float32)), dev(gpu, np.ones(4, np.float32))
    first = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    second = d.dispatch(O.ALL_REDUCE, y, redop=ReduceOp.SUM, async_op=True)
    gpu.stuck.add(second._on_gpu.event.ptr)  # (its peer never comes)
    with pytest.raises(CommTimeoutError):
        second.synchronize(timeout=0.1)
    assert devices.nccl.aborted
    assert first.wait() is x and first.exception() is None
    assert first.synchronize(timeout=1) is x


@pytest.mark.parametrize("way", ["is_completed", "wait", "synchronize"])
def test_a_communicator_aborted_through_cupy_is_said(gpu, way):
    """The program aborted the NCCL communicator itself (comm.nccl.abort()): a Work asked
    afterwards raised NCCL's "invalid argument" as an asynchronous error."""
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    devices.nccl.comm.abort()
    if way == "is_completed":
        assert work.is_completed()
        got = work.exception()
    else:
        with pytest.raises(BackendError) as info:
            getattr(work, way)()
        got = info.value
    assert "aborted or destroyed through CuPy (comm.nccl)" in str(got), got
    assert "asynchronous error" not in str(got)


def test_async_error_aborts_and_raises(gpu):
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    gpu.event_status = NOT_READY
    gpu.async_error = True
    with pytest.raises(BackendError, match="asynchronous error"):
        work.synchronize(timeout=2)
    assert devices.nccl.aborted


def nccl_communicator(gpu, timeout):
    """A one-rank Communicator (MPI_COMM_SELF) whose device calls go to the fake NCCL."""
    from mpi4py import MPI

    from hpccomm.backends.mpi import MPIBackend
    from hpccomm.comm import Communicator, NodeInfo

    host = MPIBackend(MPI.COMM_SELF.Dup())
    config = DeviceConfig(0, "nccl", DevicePath(False, "test"))
    devices = DeviceBackends(host, config)
    c = Communicator(
        host,
        devices,
        name="self",
        timeout=timeout,
        nodes=NodeInfo(0, 1, 0, 1),
        node_key=0,
        device=config,
    )
    return c, devices


def test_free_waits_on_the_host_for_a_dropped_async_device_call(gpu):
    """An async NCCL call dropped without synchronize() is still on the GPU at free():
    the communicator is destroyed only once it is done (ncclCommDestroy would wait for it
    inside NCCL, without bound and deaf to Ctrl-C); free() returns then."""
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.ones(8, np.float32))
    with pytest.warns(UnwaitedWorkWarning):
        c.all_reduce(x, async_op=True)  # dropped
    gpu.event_status = NOT_READY
    mark = len(gpu.log)
    box: list = []
    t = threading.Thread(target=lambda: box.append(c.free()), daemon=True)
    t.start()
    t.join(0.5)
    assert t.is_alive() and not [e for e in gpu.log[mark:] if e[0] == "nccl_destroy"]
    gpu.event_status = 0  # the GPU finishes it
    t.join(10)
    assert not t.is_alive() and box == [None]
    comm = NcclCommunicator.instances[-1]
    assert comm.destroyed and not comm.aborted and c.freed
    assert ("nccl_destroy", "at once") in gpu.log  # the host waited, not NCCL


def test_free_waits_for_each_threads_call_on_the_per_thread_default_stream(gpu):
    """CuPy's per-thread default stream has one handle for every thread's own stream: a
    call another thread made later on "the same" handle says nothing of this thread's
    dropped call, which free() must still wait for."""
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.ones(8, np.float32))
    with Stream(gpu, ptr=PTDS):
        with pytest.warns(UnwaitedWorkWarning):
            c.all_reduce(x, async_op=True)  # dropped; its peer never comes
    gpu.stuck = {e.ptr for e in gpu.recorded}

    def other() -> None:
        with Stream(gpu, ptr=PTDS):
            c.all_reduce(dev(gpu, np.ones(4, np.float32)))  # done on the GPU

    finished, got = in_thread(other, 10)
    assert finished and got is None, got
    c.timeout = 0.3
    finished, got = in_thread(c.free, 10)
    assert finished, "free() hung in ncclCommDestroy"
    assert isinstance(got, CommTimeoutError) and "all_reduce #2 on self" in str(got), got
    assert NcclCommunicator.instances[-1].aborted


def test_queued_async_calls_of_a_bounded_group_are_timed_from_their_start(gpu):
    """Three async calls of 0.4 s each on a group with a 1 s timeout: the GPU runs them one
    after another, each bounded from its own start where it waited behind the others on its
    stream, so the third, done 1.2 s after it was made, is not given up and the communicator
    not aborted."""
    c, devices = nccl_communicator(gpu, timeout=1.0)
    x = dev(gpu, np.ones(8, np.float32))
    c.all_reduce(x)  # the communicator made
    gpu.duration = 0.4
    works = [c.all_reduce(x, async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    assert not devices.nccl.aborted
    c.free()
    assert NcclCommunicator.instances[-1].destroyed


def test_free_interrupted_waits_again_when_called_again(gpu, monkeypatch):
    """Ctrl-C in free()'s wait for the GPU releases nothing: a later free() waits for the
    same call again (it went straight to ncclCommDestroy, to wait there for good)."""
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.ones(8, np.float32))
    with pytest.warns(UnwaitedWorkWarning):
        c.all_reduce(x, async_op=True)
    gpu.stuck = {e.ptr for e in gpu.recorded}
    backend = devices.nccl
    real = backend.check
    calls = iter([KeyboardInterrupt])

    def interrupted(done: bool = False) -> None:
        for exc in calls:
            raise exc
        real(done)

    monkeypatch.setattr(backend, "check", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.free()
    assert not backend.comm.destroyed and not backend.comm.aborted
    c.timeout = 0.3
    finished, got = in_thread(c.free, 10)
    assert finished, "free() hung in ncclCommDestroy"
    assert isinstance(got, CommTimeoutError) and "all_reduce #2 on self" in str(got), got
    assert c.freed and NcclCommunicator.instances[-1].aborted


def test_release_in_a_fork_child_touches_neither_cuda_nor_nccl(gpu):
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    backend = devices.nccl
    backend._pid = -1  # as in a fork() child: the communicator is the parent's
    gpu.stuck = {e.ptr for e in gpu.recorded}
    mark = len(gpu.log)
    assert devices.close() is None
    assert gpu.log[mark:] == [] and not backend.comm.destroyed and not backend.comm.aborted
    # and CuPy's object for it is kept for good (collected, CuPy destroys its communicator)
    from hpccomm.backends import nccl as nccl_module

    comm = backend.comm
    before = sys.getrefcount(comm)
    nccl_module._keep_in_child()  # (what os.register_at_fork runs in every child)
    assert sys.getrefcount(comm) == before + 1


def test_a_second_thread_freeing_meanwhile_does_not_destroy_under_the_first(gpu):
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    gpu.stuck = {e.ptr for e in gpu.recorded}
    backend = devices.nccl
    t = threading.Thread(target=backend.release, args=(None,), daemon=True)
    t.start()
    while not backend._releasing:  # the first waits for the GPU
        assert t.is_alive()
        time.sleep(0.01)
    finished, got = in_thread(lambda: backend.release(None), 2)
    assert finished and got is None and not backend.comm.destroyed
    gpu.stuck.clear()
    t.join(10)
    assert backend.comm.destroyed and ("nccl_destroy", "at once") in gpu.log


def test_free_raises_a_sticky_cuda_error_met_while_the_gpu_finishes(gpu):
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.ones(8, np.float32))
    c.all_reduce(x)
    gpu.event_status = ILLEGAL_ADDRESS
    finished, got = in_thread(c.free, 10)
    assert finished and isinstance(got, BackendError), got
    assert "CUDA error on the GPU: cudaErrorIllegalAddress" in str(got) and c.freed
    assert NcclCommunicator.instances[-1].aborted


def test_free_after_a_timeout_was_set_aborts_nccl_after_it(gpu):
    """A peer that never joins the group's last async call (made unbounded; the group's
    timeout set afterwards): free() ends after the timeout with CommTimeoutError naming
    the call, the NCCL communicator aborted (not destroyed: that waited inside NCCL for
    good) and the group freed."""
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.ones(8, np.float32))
    c.all_reduce(x)  # done on the GPU
    gpu.event_status = NOT_READY
    with pytest.warns(UnwaitedWorkWarning):
        c.all_reduce(x, async_op=True)  # dropped
    c.timeout = 0.3
    t0 = time.monotonic()
    finished, got = in_thread(c.free, 10)
    assert finished, "free() hung in ncclCommDestroy"
    assert isinstance(got, CommTimeoutError), got
    assert str(got).startswith("free: NCCL (rank 0 of 1), all_reduce"), got
    assert "not complete on the GPU after 0.3 s" in str(got) and "aborted" in str(got)
    assert time.monotonic() - t0 < 5
    comm = NcclCommunicator.instances[-1]
    assert comm.aborted and not comm.destroyed and c.freed
    assert c.free() is None  # idempotent: freed once


def free_once_given_up(c, t0: float) -> None:
    """free() ``c``, refused (a call still on its worker) until the worker has given the call
    up: within 5 s of ``t0``."""
    while True:
        try:
            c.free()
            return
        except InvalidArgumentError:
            assert time.monotonic() - t0 < 5, "free() still refused long after the timeout"
            time.sleep(0.05)


@pytest.mark.parametrize("dropped", [True, False])
def test_async_call_of_a_bounded_group_ends_at_the_group_timeout(gpu, dropped):
    """On a group with a timeout an async NCCL call whose peer never joins is given up at
    the group's timeout: the communicator is aborted (as PyTorch's watchdog does), also
    where the Work was dropped unwaited, so free() then releases the group at once. Before,
    the worker waited on the host for good, and free() was refused for good."""
    c, devices = nccl_communicator(gpu, timeout=0.3)
    x = dev(gpu, np.ones(8, np.float32))
    gpu.event_status = NOT_READY
    t0 = time.monotonic()
    work = c.all_reduce(x, async_op=True)
    if dropped:
        with pytest.warns(UnwaitedWorkWarning):
            del work
        while not devices.nccl.aborted:
            assert time.monotonic() - t0 < 5, "the dropped call was never given up"
            time.sleep(0.02)
        assert "did not complete in 0.3 s" in devices.nccl.aborted
    else:
        finished, got = in_thread(work.wait, 10)
        assert finished and isinstance(got, CommTimeoutError), got
        assert "(the group's timeout)" in str(got) and "aborted" in str(got), got
        # final: the Work is finished with it (dropped, it is no "unwaited" Work)
        assert work.is_completed() and work.exception() is got
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnwaitedWorkWarning)
            del work
    assert time.monotonic() - t0 >= 0.25
    c.free()  # (already aborted: nothing more to wait for or say)
    comm = NcclCommunicator.instances[-1]
    assert comm.aborted and not comm.destroyed and c.freed


def test_free_while_an_async_call_of_a_bounded_group_is_on_the_gpu(gpu):
    """free() waits for it (it is not a job of the worker's, which free() would refuse
    for) at most the group's timeout, then aborts the communicator and says which call did
    not complete (free()'s own wait or the watchdog, whichever looks first)."""
    c, devices = nccl_communicator(gpu, timeout=0.3)
    x = dev(gpu, np.ones(8, np.float32))
    gpu.event_status = NOT_READY
    work = c.all_reduce(x, async_op=True)
    finished, got = in_thread(c.free, 10)
    assert finished and isinstance(got, CommTimeoutError), got
    # (free()'s own wait or the watchdog, whichever looks first)
    assert re.match(r"free: NCCL \(rank 0 of 1\)[,:] all_reduce #\d+ on self", str(got)), got
    assert re.search(r"(after|in) 0.3 s", str(got)) and "aborted instead of destroyed" in str(got)
    assert c.freed and NcclCommunicator.instances[-1].aborted
    with pytest.raises(HpccommError):
        work.wait()


def test_free_raises_an_async_nccl_error_met_while_the_gpu_finishes(gpu):
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.ones(8, np.float32))
    with pytest.warns(UnwaitedWorkWarning):
        c.all_reduce(x, async_op=True)
    gpu.event_status = NOT_READY
    gpu.async_error = True
    finished, got = in_thread(c.free, 10)
    assert finished and isinstance(got, BackendError), got
    assert "asynchronous error" in str(got) and c.freed
    assert NcclCommunicator.instances[-1].aborted


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_free_of_a_group_with_finished_device_calls_destroys_it(gpu, timeout):
    c, devices = nccl_communicator(gpu, timeout=timeout)
    x = dev(gpu, np.ones(8, np.float32))
    c.all_reduce(x)
    c.all_reduce(x, async_op=True).wait()
    c.free()
    comm = NcclCommunicator.instances[-1]
    assert comm.destroyed and not comm.aborted


# -- defect 7: streams ---------------------------------------------------------------------------


class HostBodies:
    """The host backend's bodies as the MPI device path wraps them: PREMUL_SUM and AVG
    (PREMUL_SUM(1/size)) scale a copy (a CuPy kernel, on whatever stream is current)."""

    name = "mpi"

    def __init__(self, gpu: Gpu) -> None:
        self.gpu, self.rank, self.size = gpu, 0, 2

    def prepare(self, call) -> None:
        scale = call.redop.factor if call.redop.name == "PREMUL_SUM" else None
        if call.redop.name == "AVG":
            scale = 1.0 / self.size
        call.how = ("MPI_FLOAT", "MPI_SUM", scale)
        call.body = self.all_reduce
        call.mode = "blocking"

    def all_reduce(self, call, x, out, stream):
        _, _, scale = call.how
        send = x if scale is None else (x * scale).astype(x.dtype, copy=False)
        self.gpu.log.append(("mpi", "Allreduce"))
        x.a[...] = send.a * self.size  # what the other rank's equal data sums to
        return x


def direct_call(gpu, redop):
    backend = DeviceMPIBackend(HostBodies(gpu), DevicePath(True, "test"))
    call = O.Call(O.ALL_REDUCE, Group("world", 0, 2), redop=redop)
    call.device = 0
    call.count = 4
    call.info = dtype_info(np.dtype(np.float32), "test")
    backend.prepare(call)
    return call


def test_direct_premul_sum_scaled_copy_is_finished_before_mpi_reads_it(gpu):
    call = direct_call(gpu, ReduceOp.PREMUL_SUM(0.5))
    s = Stream(gpu)
    x = dev(gpu, np.full(4, 3.0, np.float32))
    assert call.body(call, x, None, s) is x
    assert list(x.a) == [3.0] * 4  # 0.5 * 3 on both ranks
    log = [e for e in gpu.log if e[0] in ("kernel", "sync", "mpi")]
    mpi = log.index(("mpi", "Allreduce"))
    scale = log.index(("kernel", "multiply", s.ptr))
    assert scale < mpi and ("sync", s.ptr) in log[scale:mpi], log


def test_direct_avg_scaled_copy_is_finished_before_mpi_reads_it(gpu):
    # AVG is PREMUL_SUM(1/size) (as NCCL makes it; a sum divided after overflowed float16):
    # its scaled copy is made on the call's stream and synchronized before MPI reads it
    call = direct_call(gpu, ReduceOp.AVG)
    s = Stream(gpu)
    x = dev(gpu, np.full(4, 3.0, np.float32))
    call.body(call, x, None, s)
    assert list(x.a) == [3.0] * 4
    log = [e for e in gpu.log if e[0] in ("kernel", "sync", "mpi")]
    mpi = log.index(("mpi", "Allreduce"))
    scale = log.index(("kernel", "multiply", s.ptr))
    assert scale < mpi and ("sync", s.ptr) in log[scale:mpi], log


def test_outputs_are_allocated_on_the_call_stream(gpu):
    d, devices = nccl_dispatcher(gpu)
    s = Stream(gpu)
    x = dev(gpu, np.arange(4, dtype=np.float32))
    out = d.dispatch(O.ALL_GATHER, x, stream=s)
    assert list(out.a) == [0, 1, 2, 3]
    assert ("alloc", s.ptr) in gpu.log and ("alloc", 0) not in gpu.log, gpu.log
    assert ("nccl", "allGather", s.ptr) in gpu.log


def test_nccl_premul_and_avg_kernels_on_the_call_stream(gpu):
    d, devices = nccl_dispatcher(gpu)
    s = Stream(gpu)
    x = dev(gpu, np.full(3, 4.0))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.PREMUL_SUM(0.25), stream=s)
    assert list(x.a) == [1.0] * 3
    assert ("kernel", "multiply", s.ptr) in gpu.log and ("nccl", "allReduce", s.ptr) in gpu.log


@pytest.mark.parametrize("backend", ["mpi_device", "nccl"])  # ("mpi": a pytest-mpi marker)
def test_per_thread_default_stream_is_not_handed_to_the_worker(gpu, backend):
    """With CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 the current stream is Stream.ptds, whose
    handle means the calling thread's own stream: a bounded call run on the worker thread on
    it ran on the worker's stream, unordered with the caller's kernels. It runs on a stream
    of hpccomm's own that first waits for an event recorded on the caller's, and is done
    on the GPU before the call returns. (A bounded NCCL call is enqueued in the caller's
    thread, on its own stream, unless the debug check must run on the worker first.)"""
    from mpi4py import MPI

    from hpccomm.backends.mpi import MPIBackend

    if backend == "nccl":
        d, devices = nccl_dispatcher(gpu, timeout=30)
        d.debug = "check"  # (the check runs on the worker, and the enqueue after it)
    else:
        host = MPIBackend(MPI.COMM_SELF.Dup())
        devices = DeviceBackends(host, DeviceConfig(0, "mpi", DevicePath(False, "test")))
        d = Dispatcher(Group("self", 0, 1), host, devices.backend_for, timeout=30)
        devices.attach(d)
    x = dev(gpu, np.arange(5, dtype=np.float32))
    ptds = Stream(gpu, ptr=PTDS)
    with ptds:
        mark = len(gpu.log)
        for async_op in (False, True):
            got = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=async_op)
            if async_op:
                got = got.wait()
            assert list(got.a) == [0, 1, 2, 3, 4]
    log = gpu.log[mark:]
    on_ptds = [e for e in log if PTDS in e[1:] and e != ("event", PTDS)]
    assert on_ptds == [], log  # only the caller's event is recorded on its own stream
    waits = [e for e in log if e[0] == "wait_event"]
    assert len(waits) == 2 and waits[0][1] != PTDS, log
    side = waits[0][1]
    moved = [i for i, e in enumerate(log) if e[0] in ("d2h", "h2d", "nccl")]
    assert moved and all(log[i][-1] == side for i in moved), log
    assert log.index(waits[0]) < moved[0]
    if backend == "mpi_device":  # the worker synchronizes hpccomm's stream before the call is done
        assert ("sync", side) in log[moved[-1] :], log
    d.close()


def test_stream_that_is_no_cupy_stream_is_refused_by_name(gpu):
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(4, np.float32))
    for bad in (5, "s", object()):
        with pytest.raises(
            InvalidArgumentError,
            match=r"all_reduce #\d+ on world \(rank 0 of 1\): stream is \w+, expected a CuPy",
        ):
            d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, stream=bad)
    s = Stream(gpu)
    assert list(d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, stream=s).a) == [1.0] * 4


# -- defect 8: grouped calls -----------------------------------------------------------------


def test_batch_is_checked_whole_before_group_start(gpu):
    """A bad entry in the middle of a batch (here a host array) must be refused before
    anything is posted: posted sends would leave the peers waiting for ever."""
    d, devices = nccl_dispatcher(gpu)
    devices.enable_nccl("enable_nccl")
    items = [
        P2POp("send", dev(gpu, np.ones(4, np.float32)), 0),
        P2POp("recv", np.ones(4, np.float32), 0),
    ]
    with pytest.raises(
        InvalidArgumentError,
        match=r"ops\[1\].array is host memory but ops\[0\].array is on GPU 0; nothing was posted",
    ):
        d.dispatch(O.BATCH_P2P, items)
    assert ("group", "start") not in gpu.log and not any(e[0] == "nccl" for e in gpu.log)


def test_batch_of_host_then_device_arrays_is_refused_whole(gpu):
    """Host first would send the batch down the MPI host path with a device array in it."""
    d, devices = nccl_dispatcher(gpu)
    items = [
        P2POp("send", np.ones(4, np.float32), 0),
        P2POp("recv", dev(gpu, np.ones(4, np.float32)), 0),
    ]
    with pytest.raises(
        InvalidArgumentError,
        match=r"ops\[1\].array is on GPU 0 but ops\[0\].array is host memory; nothing was posted",
    ):
        d.dispatch(O.BATCH_P2P, items)
    assert not any(e[0] in ("nccl", "group") for e in gpu.log), gpu.log


def test_batch_dtype_error_before_group_start(gpu):
    d, devices = nccl_dispatcher(gpu)
    devices.enable_nccl("enable_nccl")
    items = [
        P2POp("send", dev(gpu, np.ones(4, np.float32)), 0),
        P2POp("recv", dev(gpu, np.ones(4, np.int16)), 0),
    ]
    with pytest.raises(DtypeError, match=r"ops\[1\]: dtype int16 has no NCCL type"):
        d.dispatch(O.BATCH_P2P, items)
    assert ("group", "start") not in gpu.log


def test_nccl_refuses_tags_it_cannot_honour(gpu):
    d, devices = nccl_dispatcher(gpu)
    devices.enable_nccl("enable_nccl")
    with pytest.raises(InvalidArgumentError, match="tag is 5, but NCCL has no tags"):
        d.dispatch(O.SEND, dev(gpu, np.ones(2)), peer=0, tag=5)
    items = [P2POp("send", dev(gpu, np.ones(2)), 0, tag=3)]
    with pytest.raises(InvalidArgumentError, match="tag is 3, but NCCL has no tags"):
        d.dispatch(O.BATCH_P2P, items)
    assert ("group", "start") not in gpu.log
    d.dispatch(O.SEND, dev(gpu, np.ones(2)), peer=0, tag=0)  # the default is fine
    assert ("nccl", "send", 0) in gpu.log


# -- defects 3 and 4: binding --------------------------------------------------------------


def info_for(env: dict, rank=0, size=1):
    base = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size)}
    base.update(OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE=str(size))
    return discover({**base, **env}, hostname="n1")


def gather_as(others_views, failures=None, rank=0):
    """An allgather for _bind_gpu on ``rank``: first the views (this rank's inserted), then
    the failures (None for the others unless given)."""
    calls = iter([others_views, failures])

    def allgather(x):
        given = next(calls)
        if given is None:
            given = [None] * len(others_views)
        return [x if r == rank else given[r] for r in range(len(given))]

    return allgather


def test_visible_devices_and_no_driver_gpu_none_stays_cpu_and_says_why(gpu):
    """CUDA_VISIBLE_DEVICES set (Slurm, containers) and no usable driver: init(gpu=None)
    died with a raw CUDARuntimeError; it must stay CPU-only and say why."""
    gpu.driver_error, gpu.driver = INSUFFICIENT_DRIVER, 0
    info = info_for({"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.warns(RuntimeWarning, match="staying CPU-only: no usable NVIDIA driver"):
        bound = _bind_gpu(info, None, gather_as([None]))
    assert bound.gpu is None
    assert bound.sources["gpu"].startswith("CPU-only: no usable NVIDIA driver (CuPy 14.2.0")
    cfg = _device_config(bound, "auto", False)
    assert "no GPU bound on this rank (no usable NVIDIA driver" in cfg.describe()


def test_no_visible_devices_variable_and_no_driver_is_not_swallowed(gpu):
    gpu.driver_error, gpu.driver = INSUFFICIENT_DRIVER, 0
    bound = _bind_gpu(info_for({}), None, gather_as([None]))
    assert bound.gpu is None and "no usable NVIDIA driver" in bound.sources["gpu"]


def test_gpu_true_names_an_old_driver(gpu):
    gpu.driver_error, gpu.driver = INSUFFICIENT_DRIVER, 12040
    with pytest.raises(HpccommError) as exc:
        _bind_gpu(info_for({"CUDA_VISIBLE_DEVICES": "0"}), True, gather_as([None]))
    msg = str(exc.value)
    assert "the NVIDIA driver supports CUDA 12.4, older than the CUDA 13.2" in msg, msg
    assert "no GPU is visible" not in msg or "driver" in msg


def test_gpu_true_failure_on_one_rank_raises_on_every_rank(gpu):
    other = "HpccommError: init (rank 1 of 2): gpu=True but no GPU is visible: x"
    info = info_for({"CUDA_VISIBLE_DEVICES": "0"}, rank=0, size=2)
    views = [None, ("n2", (format_uuid(U2),))]
    with pytest.raises(HpccommError, match=r"rank\(s\) \[1\] required a GPU.*no GPU is visible"):
        _bind_gpu(info, True, gather_as(views, [None, other]))


def test_gpus_per_task_two_each_task_its_own(gpu, monkeypatch):
    """srun --gpus-per-task=2: each of 4 tasks sees its own two GPUs (CUDA_VISIBLE_DEVICES
    "0,1" in each, different UUIDs): binding raised GpuBindingError (2 visible for 4 local
    ranks); each task takes its first."""
    monkeypatch.delenv("HPCCOMM_ALLOW_GPU_SHARING", raising=False)
    gpu.uuids = [bytes([1] * 16), bytes([2] * 16)]
    views = [None] + [("n1", (f"GPU-{r}a", f"GPU-{r}b")) for r in range(1, 4)]
    info = info_for({"CUDA_VISIBLE_DEVICES": "0,1"}, rank=0, size=4)
    bound = _bind_gpu(info, True, gather_as(views))
    assert bound.gpu == 0 and ("use", 0) in gpu.log


def test_one_visible_gpu_shared_by_two_tasks_is_not_silent(gpu, monkeypatch):
    """One visible GPU and two tasks that see the same one: every task silently got GPU 0."""
    monkeypatch.delenv("HPCCOMM_ALLOW_GPU_SHARING", raising=False)
    views = [None, ("n1", (format_uuid(U1),))]
    info = info_for({"CUDA_VISIBLE_DEVICES": "0"}, rank=0, size=2)
    with pytest.raises(GpuBindingError, match=r"local ranks \[0, 1\] would share GPU GPU-0102"):
        _bind_gpu(info, True, gather_as(views))
    with pytest.warns(RuntimeWarning, match="staying CPU-only: .*would share GPU"):
        assert _bind_gpu(info, None, gather_as(views)).gpu is None
    monkeypatch.setenv("HPCCOMM_ALLOW_GPU_SHARING", "1")
    assert _bind_gpu(info, True, gather_as(views)).gpu == 0


def test_one_gpu_per_container_is_fine(gpu):
    """Each task in its own container sees "GPU 0", a different one each: not shared."""
    views = [None, ("n1", (format_uuid(U2),))]
    info = info_for({"CUDA_VISIBLE_DEVICES": "0"}, rank=0, size=2)
    assert _bind_gpu(info, True, gather_as(views)).gpu == 0


@pytest.mark.parametrize(
    ("views", "me", "expect"),
    [
        ([("a", "b"), ("a", "b")], 1, 1),  # two ranks, two GPUs seen by both
        ([("a",), ("b",)], 1, 0),  # one GPU each (per-task binding, containers)
        ([("a", "b"), ("c", "d"), ("e", "f")], 2, 0),  # --gpus-per-task=2
        ([(), ("a",)], 0, None),  # a rank without GPU
    ],
)
def test_choose_on_node(views, me, expect):
    assert choose_on_node(views, me) == expect


def test_choose_on_node_overlapping_views_would_share():
    with pytest.raises(GpuBindingError, match=r"local ranks \[0, 1\] would share GPU b"):
        choose_on_node([("b", "c"), ("b",)], 0)
    assert choose_on_node([("a", "a2"), ("a", "a2"), ("a", "a2")], 2, allow_sharing=True) == 0


# -- defect 10: the GPU tests touch no CUDA before binding -------------------------------------


def test_gpu_test_module_touches_no_device_at_import(gpu):
    """tests/gpu/test_gpu_ops.py ran a CuPy kernel at import (its bfloat16 probe), before
    hpccomm.init bound the rank's GPU: every rank then made a context on device 0."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "gpu" / "test_gpu_ops.py"
    spec = importlib.util.spec_from_file_location("gpu_ops_import_check", path)
    module = importlib.util.module_from_spec(spec)
    gpu.log.clear()
    calls_before = gpu.device_calls
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    assert gpu.log == [] and gpu.device_calls == calls_before
    assert module.ml_dtypes is ml_dtypes


@pytest.mark.parametrize("async_op", [True, False])
def test_device_recv_is_staged_blocking_or_not(gpu, async_op):
    """A blocking recv of a device array goes through the device path's staging, not the
    host's probed receive (which takes host memory only)."""
    from mpi4py import MPI

    from hpccomm.backends.mpi import MPIBackend

    host = MPIBackend(MPI.COMM_SELF.Dup())
    devices = DeviceBackends(host, DeviceConfig(0, "mpi", DevicePath(False, "test")))
    d = Dispatcher(Group("self", 0, 1), host, devices.backend_for)
    devices.attach(d)
    sent = d.dispatch(O.SEND, np.arange(4.0), peer=0, tag=1, async_op=True)  # to self
    y = dev(gpu, np.zeros(4))
    got = d.dispatch(O.RECV, y, peer=0, tag=1, async_op=async_op)
    assert (got.wait() if async_op else got) == 0
    assert sent.wait() is None
    assert list(y.a) == [0.0, 1.0, 2.0, 3.0]
    assert any(e[0] in ("d2h", "h2d") for e in gpu.log), gpu.log  # staged copies
    d.close()


@pytest.mark.parametrize("spec", ["all_gather", "scatter"])
def test_an_in_place_gather_on_the_staged_path(gpu, spec):
    """The in-place form (the array is exactly this rank's block of out) runs as MPI_IN_PLACE
    on host arrays; the staged device path copies to separate host twins, where MPI_IN_PLACE
    would read this rank's block from an uninitialized host out (garbage) or, for scatter's
    source, leave its host out unwritten and copy that back over the device array."""
    from mpi4py import MPI

    from hpccomm.backends.mpi import MPIBackend

    host = MPIBackend(MPI.COMM_SELF.Dup())
    devices = DeviceBackends(host, DeviceConfig(0, "mpi", DevicePath(False, "test")))
    d = Dispatcher(Group("self", 0, 1), host, devices.backend_for)
    devices.attach(d)
    whole = dev(gpu, np.arange(4.0))
    part = whole[0:4]
    if spec == "all_gather":
        got = d.dispatch(O.ALL_GATHER, part, whole)
    else:
        got = d.dispatch(O.SCATTER, whole, part, peer=0)
    assert list(got.a) == [0.0, 1.0, 2.0, 3.0] and list(whole.a) == [0.0, 1.0, 2.0, 3.0]
    d.close()


def test_free_of_a_group_and_its_dup_both_unfinished_says_both(gpu):
    """free() of a group frees the groups made from it; where two NCCL communicators
    were not finished in time, one error says both (the first chained), after all is freed."""
    c, devices = nccl_communicator(gpu, timeout=None)
    d = c.dup()
    x = dev(gpu, np.ones(8, np.float32))
    for g in (c, d):
        g.all_reduce(x)
    gpu.stuck = {e.ptr for e in gpu.recorded}
    c.timeout = d.timeout = 0.2
    finished, got = in_thread(c.free, 10)
    assert finished and isinstance(got, CommTimeoutError), got
    text = str(got)
    assert "all_reduce #2 on self/dup" in text and "; and CommTimeoutError: free: NCCL" in text
    assert "all_reduce #3 on self (rank" in text, text
    assert isinstance(got.__cause__, CommTimeoutError) and c.freed and d.freed
    assert all(comm.aborted for comm in NcclCommunicator.instances[-2:])


def test_free_after_the_communicator_was_aborted_through_cupy(gpu):
    """``comm.nccl`` is CuPy's communicator: one aborted there (its handle 0) is released,
    and free() says nothing (it asked NCCL for the errors of a NULL communicator:
    BackendError, ncclInvalidArgument)."""
    c, devices = nccl_communicator(gpu, timeout=5.0)
    x = dev(gpu, np.ones(8, np.float32))
    c.all_reduce(x)
    c.nccl.abort()
    c.free()
    assert c.freed and not NcclCommunicator.instances[-1].destroyed


def test_async_call_blocked_in_the_lazy_connect_is_given_up(gpu):
    """The first call of a bounded group blocks the host inside NCCL until its peers connect
    (NCCL's lazy connect); an async one too, enqueued in the caller's thread (the NCCL order
    is the program's): the watchdog aborts the communicator at the group's timeout and the
    call raises CommTimeoutError, after which free() releases the group. (On the worker,
    with its Work dropped, free() was refused while the connect blocked: for good.)"""
    c, devices = nccl_communicator(gpu, timeout=0.3)
    c.enable_nccl()
    gpu.block_enqueue = True
    x = dev(gpu, np.ones(8, np.float32))
    t0 = time.monotonic()
    finished, got = in_thread(lambda: c.all_reduce(x, async_op=True), 10)
    assert finished and isinstance(got, CommTimeoutError), got  # (enqueued by the caller)
    assert 0.25 <= time.monotonic() - t0 < 5
    c.free()
    assert c.freed and NcclCommunicator.instances[-1].aborted
    assert "did not complete in 0.3 s" in devices.nccl.aborted


def test_device_call_behind_a_worker_job_on_a_group_without_timeout(gpu):
    """On a group without a timeout a device call waits behind the worker's queued jobs
    (an async host call, say) and runs there, unbounded (a TypeError formatting the bound
    None, in a review of the watchdog's first version)."""
    d, devices = nccl_dispatcher(gpu)
    x = dev(gpu, np.arange(4, dtype=np.float32))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)  # the communicator made
    gate = threading.Event()
    d.worker().submit("a host job", gate.wait, 10)  # the worker busy
    box: list = []
    t = threading.Thread(
        target=lambda: box.append(d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)), daemon=True
    )
    t.start()
    time.sleep(0.1)
    gate.set()
    t.join(10)
    assert box and box[0] is x and list(x.a) == [0, 1, 2, 3], box
    assert not devices.nccl.aborted


# -- the order NCCL calls reach the GPU in ----------------------------------------------------


@pytest.mark.parametrize("debug", ["large", "check"])
def test_async_calls_of_two_bounded_groups_reach_the_gpu_in_the_program_order(gpu, debug):
    """NCCL matches a communicator's calls across ranks by their order, and two
    communicators' kernels on one stream run in the order they were enqueued: ranks that
    enqueue two groups' calls in different orders wait for each other on the GPU for good.
    A bounded group's worker thread waited on the host for each call before enqueueing the
    next, so a group whose earlier call was still running enqueued its next call after a
    later call of another group: the order then depended on how long the GPU took on each
    rank (here A, B, A where the program made A, A, B). Each async call is enqueued before
    it returns now."""
    a, _ = nccl_dispatcher(gpu, timeout=5)
    b, _ = nccl_dispatcher(gpu, timeout=5)
    a.debug = b.debug = debug  # ("check": on the worker, after the check; the caller waits)
    x = dev(gpu, np.ones(8, np.float32))
    a.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)  # the communicators made
    b.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    comm_a, comm_b = NcclCommunicator.instances[-2:]
    gpu.issued.clear()
    gpu.duration = 0.3
    works = [
        a.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True),
        a.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True),
        b.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True),
    ]
    for w in works:
        w.wait()
    assert gpu.issued == [
        (id(comm_a), "allReduce"),
        (id(comm_a), "allReduce"),
        (id(comm_b), "allReduce"),
    ]


def test_an_async_call_made_while_the_worker_runs_a_host_job_keeps_the_program_order(gpu):
    """On a group without a timeout a device call made while the worker runs a host job (an
    async host call) went to the worker, behind the job, and returned at once: the program's
    next call on another group reached the GPU first. Calls the debug check does not compare
    (the default level) are enqueued at once in the caller's thread now (NCCL's order is not
    MPI's)."""
    a, _ = nccl_dispatcher(gpu)
    b, _ = nccl_dispatcher(gpu)
    x = dev(gpu, np.ones(8, np.float32))
    a.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    b.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    comm_a, comm_b = NcclCommunicator.instances[-2:]
    gpu.issued.clear()
    a.worker().submit("a host job", time.sleep, 0.3)  # the worker busy
    work = a.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    b.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    work.wait()
    assert gpu.issued == [(id(comm_a), "allReduce"), (id(comm_b), "allReduce")]


def test_point_to_point_from_two_threads_enters_nccl_one_thread_at_a_time(gpu):
    """NCCL allows one thread at a time on a communicator; point-to-point calls from two
    threads of one group (allowed: they are not collectives) entered it together."""
    mpi = FakeMPI(0, 2, [None, (("n2", format_uuid(U2), "0000:01:00.0"), None, False)])
    d, devices = nccl_dispatcher(gpu, mpi=mpi)
    devices.enable_nccl("enable_nccl (rank 0 of 2)")
    gpu.enqueue_time = 0.002
    x = dev(gpu, np.ones(8, np.float32))

    def sends():
        for _ in range(40):
            d.dispatch(O.SEND, x, peer=1, tag=0)

    threads = [threading.Thread(target=sends, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len([e for e in gpu.issued if e[1] == "send"]) == 80
    assert gpu.overlaps == 0


@pytest.mark.parametrize("debug", ["large", "check"])
def test_an_async_device_call_does_not_wait_for_a_stuck_host_job(gpu, debug):
    """An async device call made while the group's worker is inside an earlier host call
    (whose peer may come only after this rank's next calls on other groups) returns at
    once: waiting there for its enqueue could deadlock a correct program (a review)."""
    d, _ = nccl_dispatcher(gpu)
    d.debug = debug
    x = dev(gpu, np.ones(8, np.float32))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    gate = threading.Event()
    d.worker().submit("a host job", gate.wait, 10)
    t0 = time.monotonic()
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    assert time.monotonic() - t0 < 1
    gate.set()
    assert work.wait() is x


def test_an_async_call_cut_short_by_another_abort_does_not_succeed(gpu):
    """ncclCommAbort ends the GPU work, so the event of a call still running completes:
    a Work that took that for its completion returned invalid results (a review)."""
    c, devices = nccl_communicator(gpu, timeout=5)
    x = dev(gpu, np.ones(8, np.float32))
    c.all_reduce(x)
    gpu.event_status = NOT_READY
    work = c.all_reduce(x, async_op=True)
    devices.nccl.abort("another call failed")  # (the fake's events complete)
    time.sleep(0.2)  # the watchdog looks meanwhile
    with pytest.raises(BackendError, match="another call failed"):
        work.wait()
    c.free()


def test_an_async_work_waited_after_a_clean_free_has_its_result(gpu):
    """free() destroys the communicator once every call is done on the GPU; a Work waited
    afterwards completes with its result (it raised 'aborted (closed)' unless the
    watchdog happened to have seen it done: a review)."""
    c, devices = nccl_communicator(gpu, timeout=5)
    x = dev(gpu, np.arange(4, dtype=np.float32))
    c.all_reduce(x)
    work = c.all_reduce(x, async_op=True)
    c.free()
    assert NcclCommunicator.instances[-1].destroyed
    assert work.wait() is x and work.is_completed()


def test_calls_behind_a_compared_call_on_the_worker_keep_the_communicators_order(gpu):
    """Under "check" an async collective made while the worker runs a host job is compared
    and enqueued there, later; a send after it (point-to-point: not compared) went to NCCL
    at once, before it: the communicator's calls in another order than on a rank whose
    worker was idle (a review). Device calls queue behind the group's device calls there."""
    mpi = FakeMPI(0, 2, [None, (("n2", format_uuid(U2), "0000:01:00.0"), None, False)])
    d, devices = nccl_dispatcher(gpu, timeout=5, mpi=mpi)
    d.debug = "check"
    devices.enable_nccl("enable_nccl (rank 0 of 2)")
    x = dev(gpu, np.ones(8, np.float32))
    gpu.issued.clear()
    gate = threading.Event()
    d.worker().submit("a host job", gate.wait, 10)
    work = d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True)
    sent = d.dispatch(O.SEND, x, peer=1, tag=0, async_op=True)
    gate.set()
    work.wait()
    sent.wait()
    assert [op for _, op in gpu.issued] == ["allReduce", "send"]


@pytest.mark.filterwarnings("ignore::hpccomm.errors.UnwaitedWorkWarning")
def test_a_synchronous_bounded_call_nobody_waits_for_is_given_up_by_the_watchdog(gpu, monkeypatch):
    """A synchronous call's caller gives it up at its bound; where its wait ended early (a
    peer's failure notice, a Ctrl-C) the watchdog does (it stayed on the GPU for good)."""
    import hpccomm.backends.nccl as nccl_module

    d, devices = nccl_dispatcher(gpu, timeout=0.3)
    x = dev(gpu, np.ones(8, np.float32))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    gpu.event_status = NOT_READY

    def interrupted(self, timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(nccl_module._HostWait, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    t0 = time.monotonic()
    while not devices.nccl.aborted:
        assert time.monotonic() - t0 < 5, "the watchdog never gave the call up"
        time.sleep(0.02)
    assert "did not complete in 0.3 s" in devices.nccl.aborted


def test_synchronize_after_a_clean_free_has_the_result(gpu):
    c, devices = nccl_communicator(gpu, timeout=None)
    x = dev(gpu, np.arange(4, dtype=np.float32))
    work = c.all_reduce(x, async_op=True)
    c.free()
    assert NcclCommunicator.instances[-1].destroyed
    assert work.synchronize(timeout=5) is x


def test_a_job_failing_before_its_enqueue_leaves_no_count_behind(gpu):
    """A compared call's job that fails at its first CUDA call (a sticky error) said
    neither that it was enqueued nor that it ended: the group's later device calls all went
    to the worker, and its caller waited for an enqueue that never came (a review)."""
    d, devices = nccl_dispatcher(gpu, timeout=5)
    d.debug = "check"
    x = dev(gpu, np.ones(8, np.float32))
    d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM)
    gpu.driver_error = ILLEGAL_ADDRESS
    finished, work = in_thread(
        lambda: d.dispatch(O.ALL_REDUCE, x, redop=ReduceOp.SUM, async_op=True), 3
    )
    assert finished, "the caller waited for an enqueue that never came"
    with pytest.raises(Exception, match="illegal memory access"):
        work.wait()
    gpu.driver_error = None
    time.sleep(0.05)
    assert (devices.nccl.queued, devices.nccl.jobs) == (0, 0)
