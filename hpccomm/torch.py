"""hpccomm as a PyTorch distributed backend: ``torch.distributed`` over MPI from a plain
``pip install``.

PyTorch's wheels ship without their MPI backend. This module registers one named
``"hpccomm"`` for CPU tensors; ``init_process_group()`` starts hpccomm under
mpiexec/srun, sets up torch's store over MPI and calls torch's own init, so a torchrun-style
script changes one line::

    import hpccomm.torch
    hpccomm.torch.init_process_group()          # instead of dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(model)

Every torch collective becomes the hpccomm operation of the same name on NumPy views of
the tensors (zero-copy; bfloat16 through ml_dtypes), issued with ``async_op=True``: it runs on
the group's ordered worker thread, so the caller (DDP's backward, say) keeps computing, and
the returned Work's Future is completed from that thread (DDP chains on the Future and
never calls ``wait()``). torch's timeout becomes the group's hpccomm timeout; an error
reaches the Future and ``wait()`` as the hpccomm error naming op and rank.

PyTorch 2.13's c10d ``Backend`` class cannot be subclassed from Python (no constructor is
bound), so hpccomm registers a whole ``ProcessGroup``: a default group of ``"hpccomm"`` serves
CPU tensors only, and a mixed ``"cpu:hpccomm,cuda:nccl"`` string is refused with that reason;
for CUDA tensors make an NCCL group beside it (``dist.new_group(backend="nccl")``).
"""

from __future__ import annotations

import atexit
import datetime
import fcntl
import importlib.util
import os
import re
import runpy
import socket
import struct
import sys
import threading
import time
import traceback
import types
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from numpy.lib.array_utils import byte_bounds
from torch.futures import Future

from . import ops as O
from .comm import Communicator
from .dtypes import ReduceOp
from .errors import CommTimeoutError, DtypeError, HpccommError, InvalidArgumentError, where
from .executor import on_worker
from .ops import MAX_TIMEOUT, P2POp
from .runtime import init as hpccomm_init
from .runtime import is_initialized as hpccomm_initialized
from .work import Work as HWork

__all__ = [
    "NAME",
    "register",
    "init_process_group",
    "serve_mpi",
    "HpccommProcessGroup",
    "as_numpy",
    "TensorRefused",
]

NAME = "hpccomm"
_OPS = {
    dist.ReduceOp.SUM: ReduceOp.SUM,
    dist.ReduceOp.PRODUCT: ReduceOp.PRODUCT,
    dist.ReduceOp.MIN: ReduceOp.MIN,
    dist.ReduceOp.MAX: ReduceOp.MAX,
    dist.ReduceOp.BAND: ReduceOp.BAND,
    dist.ReduceOp.BOR: ReduceOp.BOR,
    dist.ReduceOp.BXOR: ReduceOp.BXOR,
    dist.ReduceOp.AVG: ReduceOp.AVG,
}
_registered = False

# The torch dtypes hpccomm carries, as NumPy sees their memory (bfloat16 through ml_dtypes);
# others (float8, quantized, sub-byte; complex32 where torch does not pass its real view)
# are refused by name.
_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.uint16: np.dtype(np.uint16),
    torch.int32: np.dtype(np.int32),
    torch.uint32: np.dtype(np.uint32),
    torch.int64: np.dtype(np.int64),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}


class TensorRefused(InvalidArgumentError):
    """A tensor hpccomm cannot hand to MPI as it is (a device tensor, a non-contiguous one)."""

    named = False  # whether the message names the operation and rank yet


def as_numpy(t: torch.Tensor, what: str = "tensor", copied: bool = False) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (bfloat16 as ml_dtypes.bfloat16); refuses
    device tensors, sparse ones, dtypes MPI cannot carry here (float8, complex32...),
    conjugate or negative views and non-contiguous ones (hpccomm never copies behind your
    back). ``copied``: an input the backend copies anyway (a list of tensors stacked into one
    array), which may then be non-contiguous or a conjugate or negative view (read through a
    contiguous copy)."""
    _usable(t, what)
    t = t.detach()  # the same memory; NumPy refuses tensors that require grad
    if copied:
        t = t.resolve_conj().resolve_neg().contiguous()
    else:
        if t.is_conj():
            raise TensorRefused(
                f"hpccomm torch backend: {what} is a conjugate view (is_conj()), whose memory "
                f"holds the unconjugated values; pass t.resolve_conj()"
            )
        if t.is_neg():
            raise TensorRefused(
                f"hpccomm torch backend: {what} is a negative view (is_neg()), whose memory "
                f"holds the negated values; pass t.resolve_neg()"
            )
        if not t.is_contiguous():
            raise TensorRefused(
                f"hpccomm torch backend: {what} is not contiguous (shape {tuple(t.shape)}, "
                f"stride {t.stride()}); pass a contiguous tensor, and where the operation "
                f"writes into it (all_reduce, broadcast, recv, an output) copy the result back: "
                f"c = t.contiguous(); <the call on c>; t.copy_(c)"
            )
    return _view(t)


# The array interface's type of each dtype's elements (bfloat16's: int16, viewed after)
_TYPESTR = {
    dt: (np.dtype(np.int16) if dt is torch.bfloat16 else npd).str
    for dt, npd in _NUMPY_DTYPES.items()
}


class _Memory:
    """A contiguous tensor's memory as NumPy sees it (``__array_interface__``): the array
    made from it keeps the tensor alive. ``Tensor.numpy()`` marks the tensor's storage not
    resizable for good, so after any call of the backend ``t.resize_()`` raised "Trying to
    resize storage that is not resizable" (torch's batched PowerSGD hook resizes), where
    gloo leaves it resizable."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        self.__array_interface__ = {
            "version": 3,
            "shape": tuple(t.shape),
            "typestr": _TYPESTR[t.dtype],
            "data": (t.data_ptr(), False),
        }


def _view(t: torch.Tensor) -> np.ndarray:
    """A writable NumPy array on a contiguous CPU tensor's memory (no copy)."""
    if t.numel() == 0:  # no memory to share (its pointer may be NULL)
        return np.empty(tuple(t.shape), _NUMPY_DTYPES[t.dtype])
    a = np.asarray(_Memory(t))
    return a.view(ml_dtypes.bfloat16) if t.dtype is torch.bfloat16 else a


def _usable(t: torch.Tensor, what: str) -> None:
    """Refuses device tensors, sparse ones and dtypes hpccomm does not carry."""
    if t.device.type != "cpu":
        raise TensorRefused(
            f"hpccomm torch backend: {what} is on {t.device}, expected a CPU tensor (use an "
            f"NCCL group for CUDA tensors: dist.new_group(backend='nccl'))"
        )
    if t._is_zerotensor():  # (torch's internal zero tensor: no memory behind it)
        raise TensorRefused(
            f"hpccomm torch backend: {what} is a zero tensor (torch._efficientzerotensor, "
            f"shape {tuple(t.shape)}), which has no memory; pass torch.zeros(...)"
        )
    if t.layout != torch.strided:
        raise TensorRefused(
            f"hpccomm torch backend: {what} is {t.layout} (shape {tuple(t.shape)}), expected a "
            f"dense tensor (torch.strided); pass t.to_dense()"
        )
    if t.dtype not in _NUMPY_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _NUMPY_DTYPES)
        raise TensorRefused(
            f"hpccomm torch backend: {what} has dtype {t.dtype}, expected one of {names} "
            f"(hpccomm has no {t.dtype}; a collective that only moves data, such as "
            f"broadcast or all_gather, takes t.view(torch.uint8))"
        )


def _outputs(
    outs: Sequence[torch.Tensor], count: int, numel: int, dtype: np.dtype, what: str = "output"
) -> None:
    """A list of tensors the backend copies (outputs after the call, or a list of inputs
    stacked into one array; any strides): refused before the call unless there are
    ``count`` CPU dense tensors of ``numel`` elements each and ``dtype``, so no rank learns
    only after the collective (or from NumPy) that it cannot take them."""
    if len(outs) != count:
        raise TensorRefused(
            f"hpccomm torch backend: {len(outs)} {what} tensors, expected {count} (one per rank)"
        )
    mine = "the input's" if what == "output" else "the output's"
    for i, o in enumerate(outs):
        _usable(o, f"{what} {i}")
        if o.numel() != numel or _np_dtype(o.dtype) != dtype:
            raise TensorRefused(
                f"hpccomm torch backend: {what} {i} has {o.numel()} elements of {o.dtype}, "
                f"expected {numel} of {mine} dtype ({dtype})"
            )


def _stacked(tensors: Sequence[torch.Tensor], shape: tuple[int, ...]) -> np.ndarray:
    """Input blocks (checked by _outputs: the output's element count and dtype) as one array
    of blocks of ``shape``, the output's: a block of another shape (6 elements as (2, 3),
    for a (6,) output) is its elements in order, as MPI sends them (NumPy's stack refused it
    with a bare ValueError, on the root only)."""
    return np.stack(
        [as_numpy(t, f"input {i}", copied=True).reshape(shape) for i, t in enumerate(tensors)]
    )


def _overlapping(arrays: Sequence[np.ndarray]) -> bool:
    """Whether two of ``arrays`` may share memory (their byte ranges overlap)."""
    if len(arrays) < 2:
        return False
    spans = sorted(byte_bounds(a) for a in arrays if a.size)
    end = None
    for lo, hi in spans:
        if end is not None and lo < end:
            return True
        end = hi if end is None else max(end, hi)
    return False


def _paired(
    output: torch.Tensor,
    input: torch.Tensor,  # noqa: A002 - torch's name
    n: int,
    form: str,
) -> None:
    """An output and an input tensor of one collective, refused before the call (by torch's
    names, not hpccomm's) unless their dtypes are equal and their sizes fit ``form``:
    "gather" (output = n x input: all_gather_into_tensor), "scatter" (input = n x output:
    reduce_scatter_tensor), "same" (all_to_all_single without split sizes) or "splits"
    (with split sizes: hpccomm checks them)."""
    if output.dtype != input.dtype:
        raise TensorRefused(
            f"hpccomm torch backend: output is {output.dtype}, expected the input's dtype "
            f"({input.dtype})"
        )
    k_out, k_in = output.numel(), input.numel()
    if form == "gather" and k_out != n * k_in:
        raise TensorRefused(
            f"hpccomm torch backend: output has {k_out} elements, expected {n * k_in} ({n} "
            f"ranks x {k_in} input elements)"
        )
    if form == "scatter" and k_in != n * k_out:
        raise TensorRefused(
            f"hpccomm torch backend: input has {k_in} elements, expected {n * k_out} ({n} "
            f"ranks x {k_out} output elements)"
        )
    if form == "same" and k_out != k_in:
        raise TensorRefused(
            f"hpccomm torch backend: output has {k_out} elements, expected {k_in} (the "
            f"input's: without split sizes every rank sends and receives equal blocks)"
        )


def _equal_rows(t: torch.Tensor, what: str, n: int) -> int:
    """The rows (dim 0; 1 for a 0-d tensor) of each rank's block of an all_to_all_single
    ``what`` tensor without its split sizes: refused unless they divide by ``n``."""
    rows = t.shape[0] if t.dim() else 1
    if rows % n:
        raise TensorRefused(
            f"hpccomm torch backend: {what} has {rows} rows (dim 0 of shape {tuple(t.shape)}), "
            f"expected a multiple of {n} (one equal block per rank without {what}_split_sizes)"
        )
    return rows // n


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype that :func:`_usable` accepted."""
    return _NUMPY_DTYPES[dtype]


def _copy_into(o: torch.Tensor, values: np.ndarray) -> None:
    """``values`` into output tensor ``o`` (any strides, a conjugate or negative view too),
    by torch. ``values`` may be a NumPy scalar (one row of a gathered 0-d tensor)."""
    src = np.asarray(values).reshape(tuple(o.shape))
    if src.dtype == ml_dtypes.bfloat16:
        o.detach().copy_(torch.from_numpy(src.view(np.int16)).view(torch.bfloat16))
    else:
        o.detach().copy_(torch.from_numpy(src))


def _redop(op: Any) -> ReduceOp:
    if op == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor if hasattr(op, "factor") else None
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        if factor is None:
            raise DtypeError("hpccomm torch backend: PREMUL_SUM without a factor")
        return ReduceOp.PREMUL_SUM(factor)
    for torch_op, ours in _OPS.items():
        if op == torch_op:
            return ours
    raise DtypeError(f"hpccomm torch backend: reduce op {op!r} is not supported")


class _Failed:
    """An error travelling through the private Future to :func:`_deliver`."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _deliver(base: Future) -> Any:
    value = base.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class _Watchdog:
    """Fails the Future of a Work still running past its group's timeout. DDP and FSDP chain
    on Futures and never wait with a deadline, so without this a collective that a peer never
    joins blocks backward forever (torch's NCCL backend has a watchdog thread for the same
    reason). One thread per process, started with the first watched Work; it looks at the
    running Works every 0.2 s."""

    PERIOD = 0.2

    def __init__(self) -> None:
        self._running: dict[_TorchWork, float] = {}  # work -> deadline (time.monotonic())
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, work: _TorchWork, seconds: float) -> None:
        with self._lock:
            self._running[work] = time.monotonic() + seconds
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hpccomm-torch-watchdog", daemon=True
                )
                self._thread.start()

    def done(self, work: _TorchWork) -> None:
        with self._lock:
            self._running.pop(work, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.PERIOD)
            now = time.monotonic()
            with self._lock:
                running = list(self._running.items())
            for work, deadline in running:
                if deadline <= now:
                    work._expire()
                else:  # a peer's failure notice ends it (its MPI call may never end)
                    work._notice()


_watchdog = _Watchdog()


class _Settler:
    """Completes the Futures of Works that hpccomm's own threads finish (the group's worker
    thread, the watchdog), on threads of its own. Completing a torch Future runs its
    callbacks in the completing thread, and a callback may start another collective of the
    group and wait for it (torch's PowerSGD DDP hook does): run on the worker thread, that
    collective waited behind the callback until the group's timeout. A settling thread
    blocked in a callback gets company: the next Future goes to an idle thread or a new one.
    Threads idle for IDLE seconds end.

    At exit (atexit, registered at the first use, so after hpccomm's own exit handler and
    run before it) the process waits, 5 s at most, until no thread is inside callbacks: a
    callback still running a collective while the interpreter ended aborted the process
    (std::terminate) or met the group already closed."""

    IDLE = 5.0
    EXIT_WAIT = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_SettleSlot] = []
        self._busy = 0  # threads inside a fn
        self._quiet = threading.Condition(self._lock)  # notified when _busy drops to 0
        self._registered = False

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._busy += 1  # counted from here: drain() at exit waits for it
            slot = self._idle.pop() if self._idle else None
            if not self._registered:
                self._registered = True
                atexit.register(self.drain)
        if slot is not None:
            slot.fn = fn
            slot.ready.set()
            return
        try:
            threading.Thread(
                target=self._serve,
                args=(_SettleSlot(fn),),
                name="hpccomm-torch-future",
                daemon=True,
            ).start()
        except RuntimeError:  # no thread to be had: here, rather than never
            self._call(fn)

    def drain(self) -> None:
        """Wait (EXIT_WAIT seconds at most) until no thread runs a Future's callbacks."""
        deadline = time.monotonic() + self.EXIT_WAIT
        with self._quiet:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._quiet.wait(left)

    def _call(self, fn: Callable[[], None]) -> None:
        """Run one fn that run() counted; its error is reported, the thread goes on."""
        try:
            fn()
        except BaseException:  # torch reports callbacks' errors through the Futures:
            sys.stderr.write("hpccomm torch backend: completing a Future failed:\n")
            traceback.print_exc()  # this is the completion itself failing
        finally:
            with self._lock:
                self._busy -= 1
                if not self._busy:
                    self._quiet.notify_all()

    def _serve(self, slot: _SettleSlot) -> None:
        while True:
            fn, slot.fn = slot.fn, None
            if fn is not None:
                self._call(fn)
            with self._lock:
                slot.ready.clear()
                self._idle.append(slot)
            if not slot.ready.wait(self.IDLE):
                with self._lock:
                    if slot in self._idle:  # not taken meanwhile: the thread ends
                        self._idle.remove(slot)
                        return
                slot.ready.wait()  # taken just as it timed out: its fn is on the way


class _SettleSlot:
    __slots__ = ("fn", "ready")

    def __init__(self, fn: Callable[[], None] | None) -> None:
        self.fn = fn
        self.ready = threading.Event()


_settler = _Settler()


def _on_service_thread() -> bool:
    """Whether the calling thread is one that other Works need to make progress."""
    return on_worker() or threading.current_thread() is _watchdog._thread


# the threads of point-to-point Futures (_TorchWork._drive) still running, with their Works
_drivers: dict[threading.Thread, _TorchWork] = {}


@atexit.register
def _join_drivers() -> None:
    """At exit, join the Future threads whose Work has completed: the caller's wait may
    return while such a thread is still inside torch's Future (its completion callbacks),
    and a daemon thread stopped there by the interpreter's exit aborts the process
    (std::terminate: exit code 134 in 7 of 18 runs). A thread still waiting on MPI is left
    (it stops in Python, harmlessly)."""
    for thread, work in list(_drivers.items()):
        if work._finished.is_set():
            thread.join(5.0)


class _TorchWork(dist.Work):
    """A torch Work over an hpccomm Work: its Future is completed when the hpccomm operation
    completes (from the group's worker thread), after ``post`` copied results into torch's
    output tensors; ``wait()`` raises the hpccomm error of a failed operation."""

    def __init__(
        self,
        work: HWork | None,
        result: Any,
        post: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self._work = work
        self._result = result
        self._post = post
        self._timeout = timeout
        # torch's Python Future has no way to fail its C++ side (set_exception stores the
        # exception as a value, which DDP's reducer then reads as its result and crashes on),
        # so the Future handed out follows a private one through then(): a callback that
        # raises fails it for real, in C++ (DDP's backward raises) and in Python alike.
        self._base: Future = Future()
        self._future: Future | None = None  # made on first get_future(): then() costs 15 us
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()  # set once results are in torch's tensors
        self.source: HWork | None = None  # recv from any source: the hpccomm receive
        self._driven = False  # a thread of its own waits for it (a point-to-point Future)
        self._op: str | None = getattr(_calling, "op", None)  # the torch operation, errors name
        if work is None:
            self._complete(None)
        else:
            if timeout and work.completes_by_itself():  # collectives: DDP never waits
                _watchdog.watch(self, timeout)
            work.add_done_callback(self._complete)

    def _complete(self, work: HWork | None) -> None:
        """Copy results, then complete the Future; exactly once, from whichever thread sees
        the operation done first (the worker's callback or a waiting caller)."""
        with self._lock:
            if self._finished.is_set():
                return
            error = None if work is None else work.exception()
            if error is None and self._post is not None:
                try:
                    self._post()
                except Exception as exc:  # a failed copy into torch's outputs
                    error = exc
            if error is not None:
                error = _in_torch_op(error, self._op)
            self._error = error
            self._finished.set()
            elsewhere = self._future is not None and _on_service_thread()
        _watchdog.done(self)
        self._settle(_Failed(error) if error is not None else self._result, elsewhere)

    def _fail(self, error: BaseException) -> None:
        error = _in_torch_op(error, self._op)
        with self._lock:
            if self._finished.is_set():
                return
            self._error = error
            self._finished.set()
            elsewhere = self._future is not None and _on_service_thread()
        _watchdog.done(self)
        self._settle(_Failed(error), elsewhere)

    def _settle(self, value: Any, elsewhere: bool) -> None:
        """Complete the private Future, and through it the one handed out (running its
        callbacks): on a settling thread where this is a thread other Works need and a
        Future was handed out (its callbacks may wait for another call of the group, see
        _Settler); else here (no callbacks but wait()'s: a synchronous torch call then
        costs no extra thread hand-over)."""
        if elsewhere:
            _settler.run(lambda: self._base.set_result(value))
        else:
            self._base.set_result(value)

    def _notice(self) -> None:
        """The watchdog, before the timeout: complete the Future of a collective a peer's
        failure notice ended (it stayed pending until the timeout: DDP's backward, which
        only chains on the Future, waited out torch's 30 minutes after a peer refused)."""
        work = self._work
        if self._finished.is_set() or work is None:
            return
        if work._completed(bounded=False):  # (done or failed: exception() gives the error)
            self._complete(work)

    def _expire(self) -> None:
        """Past the group's timeout (the watchdog): fail with hpccomm's timeout error."""
        if self._finished.is_set() or self._work is None:
            _watchdog.done(self)
            return
        if self._work._completed(bounded=False):
            self._complete(self._work)
            return
        self._fail(self._work._timed_out(self._timeout or 0.0))

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        seconds = _bound(timeout.total_seconds()) if timeout else self._timeout
        if self._finished.is_set():
            pass  # complete, or failed for good (the watchdog past the group's timeout: a
            # wait() then waited out another timeout, each time, an outside hunt)
        elif self._driven and self._work is not None:  # its thread waits on MPI, not this one
            if not self._finished.wait(seconds):
                raise _in_torch_op(self._work._timed_out(seconds or 0.0), self._op)
        elif self._work is not None:
            try:
                self._work.wait(seconds)
            except CommTimeoutError as exc:
                if not timeout:  # past the group's timeout: terminal, as the watchdog's and
                    # torch's own backends' (the Future fails too; MPI cannot cancel it)
                    self._fail(exc)
                # a shorter wait(timeout=) the caller chose: the operation goes on, and a
                # later wait() may still complete it (as gloo's)
                renamed = _in_torch_op(exc, self._op)
                if renamed is exc:
                    raise
                raise renamed from None
            except HpccommError:
                pass  # delivered below, once the completion ran
            self._complete(self._work)
        self._finished.wait()
        self._delivered()  # (under torch's profiler: its event has ended then, see after())
        if self._error is not None:
            raise self._error
        return True

    def _delivered(self) -> None:
        """Wait until the Future is complete too (as gloo's is when wait() returns): the
        thread that completed the operation sets the Future's result just after marking it
        finished, so ``wait(); get_future().value()`` failed now and then with torch's
        ``completed() INTERNAL ASSERT FAILED`` (1-2 in 200 calls per rank in a review).
        Neither wait blocks a callback of the Future itself: it is complete by then."""
        self._base.wait()  # its value is the result or a _Failed: it never raises
        future = self._future
        if future is not None:
            try:
                future.wait()
            except Exception:  # its error is self._error, which the caller raises
                pass

    def is_completed(self) -> bool:
        # (a peer's failure notice ends a collective; its timeout is the watchdog's)
        if not self._driven and self._work is not None and self._work._completed(False):
            self._complete(self._work)
        future = self._future
        return self._finished.is_set() and self._base.done() and (future is None or future.done())

    def is_success(self) -> bool:
        return self._finished.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> Future:
        with self._lock:
            if self._future is None:
                if self._finished.is_set():  # settling here, without a handed-out Future:
                    self._base.wait()  # then()'s callback runs in this thread, not there
                self._future = self._base.then(_deliver)
                work = self._work
                if work is not None and not self._finished.is_set():
                    if not work.completes_by_itself():
                        self._drive()
            return self._future

    def _drive(self) -> None:
        """A point-to-point Work completes only when someone waits for it or tests it, and
        whoever asked for its Future may only wait on the Future: a thread of its own waits
        (bounded by the group's timeout, then the Future fails with the CommTimeoutError)
        and completes it; wait() and is_completed() then only look at that (one thread
        waits on an MPI request, as MPI requires)."""
        self._driven = True
        thread = threading.Thread(target=self._drive_run, name="hpccomm-torch-p2p", daemon=True)
        _drivers[thread] = self
        thread.start()

    def _drive_run(self) -> None:
        assert self._work is not None
        try:
            try:
                self._work.wait(self._timeout)
            except CommTimeoutError as exc:
                self._fail(exc)
                return
            except HpccommError:
                pass  # delivered by _complete
            self._complete(self._work)
        finally:
            _drivers.pop(threading.current_thread(), None)

    def _source_rank(self) -> int:
        """The sender of a receive from any source."""
        if self.source is None:
            raise InvalidArgumentError("hpccomm torch backend: not a receive from any source")
        if self._driven:  # after its thread's wait: no second waiter on the request
            self.wait()
        return int(self.source.wait(self._timeout))

    def source_rank(self) -> int:  # (torch's own, deprecated: c10d's base Work raised "may
        # only be called on work objects that correspond to a recv or recv-from-any call")
        """The sender of a receive from any source (gloo's answer)."""
        return self._source_rank()

    def result(self) -> Any:
        self.wait()
        return self._result


class HpccommProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup whose every call is an hpccomm operation on ``comm``."""

    def __init__(self, comm: Communicator, timeout: float | None, group_name: str = "") -> None:
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]  # torch 2.13: no store
        self.comm = comm
        self.timeout = timeout
        self._name = group_name
        self._desc = ""
        self._rename()

    # -- identity -----------------------------------------------------------------------

    backend_name = NAME  # "mpi" where hpccomm serves torch's MPI backend (serve_mpi)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self.backend_name

    # torch names groups after creating them (device meshes and FSDP2 look them up by name)
    def _set_group_name(self, name: str) -> None:
        self._name = name
        self._rename()

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._set_group_name(name)

    def _rename(self) -> None:
        """hpccomm's messages name the torch group: "torch:1 (tp)", "torch:0 (default_pg)"."""
        desc = f" ({self._desc})" if self._desc and self._desc != "undefined" else ""
        self.comm.name = f"torch:{self._name}{desc}"

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        self._rename()

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._set_group_desc(desc)

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def name(self) -> str:
        return self.backend_name

    # -- devices ------------------------------------------------------------------------
    # torch asks a group which devices it serves, and for each its c10d Backend. Registered
    # from Python, a group is its own backend and torch registers none with it, so its
    # device list was empty: FSDP2's set_model_state_dict(broadcast_from_rank0=True)
    # (IndexError), dcp.async_save ("A CPU backend must be enabled") and FSDP1's sharded
    # state dicts ("Default device not found") failed where gloo works.

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("cpu")]

    def _get_backend(self, device: torch.device | str) -> HpccommProcessGroup:
        kind = torch.device(device).type
        if kind != "cpu":
            raise RuntimeError(
                f"No backend type associated with device type {kind}: hpccomm's torch "
                f"backend serves CPU tensors (group {self.comm.name})"
            )
        return self

    # what torch asks of the backend _get_backend returns: none of these c10d features
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = False

    def supports_tensor_alloc(self, device: torch.device) -> bool:
        return False

    def shutdown(self) -> None:
        """torch's ``destroy_process_group``: frees the hpccomm communicator (its worker
        thread and MPI communicator; each destroyed group kept a thread and ~80 kB before).
        A call of the group still running keeps it, with a warning naming the call."""
        try:
            self.comm.free()
        except InvalidArgumentError as exc:
            warnings.warn(f"hpccomm torch backend: group {self.comm.name} not freed: {exc}",
                          RuntimeWarning, stacklevel=2)  # fmt: skip

    def _work(
        self, work: HWork | None, result: Any, post: Callable[[], None] | None = None
    ) -> _TorchWork:
        return _TorchWork(work, result, post, self.timeout)

    # -- collectives --------------------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _TorchWork:
        op = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        # every tensor taken before the first call: one refused after a call had gone out
        # (all_reduce_coalesced) was not told to the peers, which completed the call without
        # it and paired this rank's next call with it: wrong sums, silently, for good
        xs = [as_numpy(t) for t in tensors]
        post = None
        if _overlapping(xs):  # (all_reduce_coalesced([t, t])): each reduced once, as gloo,
            # which reads every input before it writes (reduced in place one after another,
            # memory shared was reduced twice: 4 where 2, at 2 ranks)
            views, xs = xs, [x.copy() for x in xs]

            def post() -> None:
                for view, x in zip(views, xs, strict=True):
                    view[...] = x

        works = [self.comm.all_reduce(x, op=op, async_op=True) for x in xs]
        return self._chain(works, list(tensors), post)

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _TorchWork:
        return self.allreduce(tensors, opts)

    def _chain(
        self, works: list[HWork], result: Any, post: Callable[[], None] | None = None
    ) -> _TorchWork:
        """One torch Work for several hpccomm calls on this group: they run in order on the
        worker thread, so the last one completing means all did; errors of any are raised."""
        if not works:
            return self._work(None, result, post)

        def check() -> None:
            for w in works[:-1]:
                w.wait(self.timeout)
            if post is not None:
                post()

        return self._work(works[-1], result, check)

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any) -> _TorchWork:
        root = opts.rootRank
        xs = [as_numpy(t) for t in tensors]  # (all before the first call: see allreduce)
        works = [self.comm.broadcast(x, root, async_op=True) for x in xs]
        return self._chain(works, list(tensors))

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any) -> _TorchWork:
        op = _redop(opts.reduceOp)
        xs = [as_numpy(t) for t in tensors]  # (all before the first call: see allreduce)
        works = [self.comm.reduce(x, opts.rootRank, op=op, async_op=True) for x in xs]
        return self._chain(works, list(tensors))

    def allgather(
        self,
        output_lists: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        opts: Any = None,
    ) -> _TorchWork:
        works, posts = [], []
        xs = [as_numpy(t, copied=True) for t in inputs]
        for outs, x in zip(output_lists, xs, strict=True):
            _outputs(outs, self.comm.size, x.size, x.dtype)
        for outs, x in zip(output_lists, xs, strict=True):
            gathered = np.empty((self.comm.size, *x.shape), x.dtype)
            works.append(self.comm.all_gather(x.reshape(1, *x.shape), out=gathered, async_op=True))
            posts.append((outs, gathered))

        def post() -> None:
            for outs, gathered in posts:
                for i, o in enumerate(outs):
                    _copy_into(o, gathered[i])

        # the Future's value: the output list (gloo's and torch's MPI backend's), one per
        # input when coalesced
        lists = [list(o) for o in output_lists]
        return self._chain(works, lists[0] if len(lists) == 1 else lists, post)

    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _TorchWork:  # noqa: A002
        x = as_numpy(input, "input")
        out = as_numpy(output, "output")
        _paired(output, input, self.comm.size, "gather")
        work = self.comm.all_gather(x.reshape(-1), out=out.reshape(-1), async_op=True)
        return self._work(work, [output])

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _TorchWork:  # noqa: A002
        return self._allgather_base(output, input, opts)

    def allgather_coalesced(
        self,
        output_lists: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        opts: Any = None,
    ) -> _TorchWork:
        # output_lists[rank][j] receives input j of that rank (allgather's lists are the
        # other way round: one list over the ranks per input)
        if len(output_lists) != self.comm.size:
            raise InvalidArgumentError(
                f"{where('all_gather_coalesced', self.comm.rank, self.comm.size)}: "
                f"{len(output_lists)} output lists, expected one per rank ({self.comm.size})"
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise TensorRefused(
                    f"hpccomm torch backend: output list {r} has {len(outs)} tensors, "
                    f"expected {len(inputs)} (one per input)"
                )
        per_input = [[outs[j] for outs in output_lists] for j in range(len(inputs))]
        work = self.allgather(per_input, inputs, opts)
        work._result = [list(o) for o in output_lists]
        return work

    def all_gather_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> _TorchWork:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> _TorchWork:
        pairs = [
            (as_numpy(o, "output"), as_numpy(i, "input"))
            for o, i in zip(outputs, inputs, strict=True)
        ]
        for o, i in zip(outputs, inputs, strict=True):
            _paired(o, i, self.comm.size, "gather")  # all, before the first call
        works = [
            self.comm.all_gather(x.reshape(-1), out=out.reshape(-1), async_op=True)
            for out, x in pairs
        ]
        return self._chain(works, list(outputs))

    def gather(
        self,
        output_lists: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        opts: Any,
    ) -> _TorchWork:
        root = opts.rootRank
        x = as_numpy(inputs[0], "input", copied=True)
        is_root = self.comm.rank == root
        if is_root:
            _outputs(output_lists[0], self.comm.size, x.size, x.dtype)
        gathered = np.empty((self.comm.size, *x.shape), x.dtype) if is_root else None
        work = self.comm.gather(x.reshape(1, *x.shape), dst=root, out=gathered, async_op=True)

        def post() -> None:
            if is_root and gathered is not None:
                for i, o in enumerate(output_lists[0]):
                    _copy_into(o, gathered[i])

        # the Future's value: the output list on the root (gloo's), [] elsewhere
        return self._work(work, list(output_lists[0]) if output_lists else [], post)

    def scatter(
        self,
        outputs: Sequence[torch.Tensor],
        input_lists: Sequence[Sequence[torch.Tensor]],
        opts: Any,
    ) -> _TorchWork:
        root = opts.rootRank
        out = as_numpy(outputs[0], "output")
        full = None
        if self.comm.rank == root:
            _outputs(input_lists[0], self.comm.size, out.size, out.dtype, "input")
            full = _stacked(input_lists[0], out.shape)
        work = self.comm.scatter(full, src=root, out=out.reshape(1, *out.shape), async_op=True)
        return self._work(work, list(outputs))

    def reduce_scatter(
        self,
        outputs: Sequence[torch.Tensor],
        input_lists: Sequence[Sequence[torch.Tensor]],
        opts: Any,
    ) -> _TorchWork:
        op = _redop(opts.reduceOp)
        out = as_numpy(outputs[0], "output")
        inputs = input_lists[0]
        n, me = self.comm.size, self.comm.rank
        if len(inputs) == n and any(t.numel() != out.size for t in inputs):
            # uneven blocks (gloo takes them): input i is block i, of any size, this rank's
            # of the output's; hpccomm's reduce_scatter with sizes= (element counts)
            for i, t in enumerate(inputs):
                _usable(t, f"input {i}")
                if _np_dtype(t.dtype) != out.dtype:
                    raise TensorRefused(
                        f"hpccomm torch backend: input {i} is {t.dtype}, expected the "
                        f"output's dtype ({out.dtype})"
                    )
            if inputs[me].numel() != out.size:
                raise TensorRefused(
                    f"hpccomm torch backend: input {me} (this rank's block) has "
                    f"{inputs[me].numel()} elements, expected the output's {out.size}"
                )
            full = np.concatenate([as_numpy(t, "input", copied=True).reshape(-1) for t in inputs])
            sizes = [t.numel() for t in inputs]
            work = self.comm.reduce_scatter(
                full, op=op, sizes=sizes, out=out.reshape(-1), async_op=True
            )
            return self._work(work, list(outputs))
        _outputs(inputs, n, out.size, out.dtype, "input")
        full = _stacked(inputs, out.shape)
        work = self.comm.reduce_scatter(full, op=op, out=out.reshape(1, *out.shape), async_op=True)
        return self._work(work, list(outputs))

    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any
    ) -> _TorchWork:  # noqa: A002
        op = _redop(opts.reduceOp)
        out = as_numpy(output, "output").reshape(-1)
        full = as_numpy(input, "input").reshape(-1)
        _paired(output, input, self.comm.size, "scatter")
        work = self.comm.reduce_scatter(full, op=op, out=out, async_op=True)
        return self._work(work, [output])

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any
    ) -> _TorchWork:  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any
    ) -> _TorchWork:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any
    ) -> _TorchWork:
        op = _redop(opts.reduceOp)
        pairs = [
            (as_numpy(o, "output"), as_numpy(i, "input"))
            for o, i in zip(outputs, inputs, strict=True)
        ]
        for o, i in zip(outputs, inputs, strict=True):
            _paired(o, i, self.comm.size, "scatter")  # all, before the first call
        works = [
            self.comm.reduce_scatter(full.reshape(-1), op=op, out=out.reshape(-1), async_op=True)
            for out, full in pairs
        ]
        return self._chain(works, list(outputs))

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> _TorchWork:
        x = as_numpy(input, "input")
        out = as_numpy(output, "output")
        n = self.comm.size
        splits: dict[str, Any] = {}
        if input_split_sizes or output_split_sizes:  # a side without: equal blocks
            splits = {
                "input_split_sizes": list(input_split_sizes)
                or [_equal_rows(input, "input", n)] * n,
                "output_split_sizes": list(output_split_sizes)
                or [_equal_rows(output, "output", n)] * n,
            }
            _paired(output, input, n, "splits")
        else:
            _paired(output, input, n, "same")
            _equal_rows(input, "input", n)
        work = self.comm.all_to_all_single(x, out=out, async_op=True, **splits)
        return self._work(work, [output])

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> _TorchWork:
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> _TorchWork:
        n = self.comm.size
        for what, tensors in (("input", inputs), ("output", outputs)):
            if len(tensors) != n:  # (said as split sizes of the wrong length before)
                raise TensorRefused(
                    f"hpccomm torch backend: {len(tensors)} {what} tensor"
                    f"{'' if len(tensors) == 1 else 's'}, expected {n} (one per rank of the "
                    f"group)"
                )
        xs = [as_numpy(t, "input", copied=True).reshape(-1) for t in inputs]
        sends = [a.size for a in xs]
        dtype = xs[0].dtype if xs else np.float32
        for i, o in enumerate(outputs):
            _usable(o, f"output {i}")
            if _np_dtype(o.dtype) != dtype:
                raise TensorRefused(
                    f"hpccomm torch backend: output {i} is {o.dtype}, expected the inputs' "
                    f"dtype ({dtype})"
                )
        recvs = [o.numel() for o in outputs]
        flat_in = np.concatenate(xs) if xs else np.empty(0, dtype)
        flat_out = np.empty(sum(recvs), dtype)
        work = self.comm.all_to_all_single(
            flat_in, out=flat_out, input_split_sizes=sends, output_split_sizes=recvs, async_op=True
        )

        def post() -> None:
            start = 0
            for o, k in zip(outputs, recvs, strict=True):
                _copy_into(o, flat_out[start : start + k])
                start += k

        return self._work(work, list(outputs), post)

    def barrier(self, opts: Any = None) -> _TorchWork:
        return self._work(self.comm.barrier(async_op=True), [])  # gloo's Future value

    # -- point-to-point -----------------------------------------------------------------

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int) -> _TorchWork:
        works = [self.comm.isend(as_numpy(t), dst, tag=tag) for t in tensors]
        return self._chain(works, list(tensors))

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int) -> _TorchWork:
        works = [self.comm.irecv(as_numpy(t, "output"), src, tag=tag) for t in tensors]
        return self._chain(works, list(tensors))

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int) -> _TorchWork:
        works = [self.comm.irecv(as_numpy(t, "output"), None, tag=tag) for t in tensors]
        work = self._chain(works, list(tensors))
        work.source = works[-1]  # torch asks the Work for the sender (_source_rank)
        return work

    def batch(self, ops: Sequence[P2POp]) -> HWork:
        return self.comm.batch_isend_irecv(ops)


def _profiled(
    group: HpccommProcessGroup,
    method: Callable[..., Any],
    op: str,
    inputs: int,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``method`` inside a profiler event "<backend>:<op>" recording the shapes of its input
    tensors (``args[inputs]``), as torch's own backends do; the event ends when the Work's
    Future completes (on the worker thread: an async event)."""
    shown = _PROFILED_AS.get(method.__name__, op)
    record = torch.autograd._record_function_with_args_enter(
        f"{group.backend_name}:{shown}", *_tensors(args[inputs] if len(args) > inputs else ())
    )
    try:
        work = method(group, *args, **kwargs)
    except BaseException:
        torch.autograd._record_function_with_args_exit(record)
        raise
    if isinstance(work, _TorchWork):
        _end_after(record, work)
    else:
        torch.autograd._record_function_with_args_exit(record)
    return work


def _end_after(record: Any, work: _TorchWork) -> None:
    """Make ``work``'s Future complete (with the same value or error) once ``record``
    ended, and its ``wait()`` return only then, as it waits for that Future (an event ended
    after the profiler stopped would be lost). A callback of that Future may call
    ``wait()``: the Future is complete by then (an event of its own that wait() waited for
    was set only after the callbacks returned: a deadlock).

    The event ends on a settling thread (_Settler) once the operation's Future completes.
    An event ended on the calling thread is a synchronous one in torch's profiler: an
    operation that happened to finish before the call returned would show as synchronous
    and one still running as asynchronous; ended there they are all asynchronous, as torch's
    own backends' events are (their worker thread ends them). Ending it completes the
    handed-out Future, whose callbacks may wait for another Work: they ran on one profiler
    thread of their own, and one that waited for another Work's Future hung for ever."""
    gate: Future[None] = Future()
    with torch._C.DisableTorchFunctionSubclass():
        ended = torch.ops.profiler._call_end_callbacks_on_jit_fut._RecordFunction(record, gate)
    future = work.get_future()
    work._future = ended.then(lambda _: future.value())
    future.add_done_callback(lambda _: _settler.run(partial(gate.set_result, None)))


# Events named as torch's backends name them (method -> name) where the name is not the op's.
_PROFILED_AS = {
    "allgather_coalesced": "all_gather",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "recv_anysource": "recvAnySource",
}


def _tensors(arg: Any) -> list[torch.Tensor]:
    """The tensors in a tensor, a list of them or a list of lists, in order."""
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, (list, tuple)):
        return [t for item in arg for t in _tensors(item)]
    return []


_inside = threading.local()  # .call: a profiled backend method is running on this thread
_calling = threading.local()  # .op: the torch operation whose backend method runs here


# A running call's error: "all_gather #3 on GROUP (rank r of n): ..." (errors.where)
_RUNNING = re.compile(r"([a-z_]+) (#\d+) on ")


def _in_torch_op(exc: BaseException, op: str | None) -> BaseException:
    """``exc``, an error of a running hpccomm call made for torch's ``op``, naming ``op``
    where hpccomm's operation has another name: ``all_gather #3 (torch
    all_gather_into_tensor) on torch:0 (default_pg) (rank 0 of 2): ...`` (the number stays
    hpccomm's, the one flight recorder dumps show); ``exc`` itself otherwise."""
    if op is None or not isinstance(exc, HpccommError) or getattr(exc, "named", False):
        return exc
    text = str(exc)
    running = _RUNNING.match(text)
    if running is None or running.group(1) == op:
        return exc
    hpccomm_op, seq = running.groups()
    renamed = type(exc)(f"{hpccomm_op} {seq} (torch {op}) on {text[running.end() :]}")
    renamed.__dict__.update(exc.__dict__)
    renamed.named = True  # type: ignore[attr-defined]
    return renamed.with_traceback(exc.__traceback__)


def _naming(method: Callable[..., Any], op: str, inputs: int) -> Callable[..., Any]:
    """``method`` with a refused tensor's error naming the torch operation, rank and group,
    and a profiler event when torch's profiler is on (``inputs``: where its input tensors
    are among the arguments)."""

    def named(self: HpccommProcessGroup, *args: Any, **kwargs: Any) -> Any:
        dispatcher = self.comm._dispatcher
        before = dispatcher.group.seq
        outer = getattr(_calling, "op", None)  # a method calling another: its own op inside
        _calling.op = op
        try:
            # an event per call, as torch's backends record (one: not for an inner method)
            if torch.autograd._profiler_enabled() and not getattr(_inside, "call", False):
                _inside.call = True
                try:
                    return _profiled(self, method, op, inputs, *args, **kwargs)
                finally:
                    _inside.call = False
            return method(self, *args, **kwargs)
        except Exception as exc:  # refused here or by hpccomm's checks, before MPI
            if getattr(exc, "named", False):  # an inner method named it already
                raise
            refused = _renamed(exc, op, self.comm)
            # refused here before any call (e.g. on the root only): the others are told,
            # of each call the operation makes (a coalesced one: one per tensor)
            _tell_peers(dispatcher, op, before, refused or exc, _calls(op, args, inputs))
            # else a running call's error (a blocking wait), or another error
            renamed = refused or _in_torch_op(exc, op)
            if renamed is exc:
                raise
            raise renamed.with_traceback(exc.__traceback__) from None
        finally:
            _calling.op = outer

    named.__name__ = method.__name__
    named.__doc__ = method.__doc__
    return named


# How a refusal's message starts where it does not name the torch operation and group: this
# module's own refusals, and those of hpccomm's checks (its operation's name, no group)
# a refusal before MPI: "op (rank r of n): " on the world, "op on GROUP (rank r of n): "
# elsewhere (Group.here); a running call's "op #seq on GROUP" is left as it is
_UNNAMED = re.compile(r"hpccomm torch backend: |[a-z_]+( on .+?)? \(rank \d+ of \d+\): ")


def _renamed(exc: BaseException, op: str, comm: Communicator) -> HpccommError | None:
    """``exc``, an hpccomm error refusing a call before MPI, as the same error naming the
    torch operation, the rank and the group (``all_reduce on torch:0 (default_pg) (rank 1 of
    2): ...``); None for other errors, and for hpccomm's errors of a running call (they name
    its sequence number and the group already)."""
    if not isinstance(exc, HpccommError):
        return None
    text = str(exc)
    start = _UNNAMED.match(text)
    if start is None:
        return None
    head = where(op, comm.rank, comm.size, group=comm.name)
    renamed = type(exc)(f"{head}: {text[start.end() :]}")
    renamed.__dict__.update(exc.__dict__)
    renamed.named = True  # type: ignore[attr-defined]
    return renamed


def _tell_peers(dispatcher: Any, op: str, before: int, exc: BaseException, calls: int = 1) -> None:
    """A collective refused on this rank before it issued all its ``calls`` (its group's
    sequence number was ``before``): the group's other ranks may be inside them already (a
    root's own arguments), so they are told, as hpccomm's own refusals tell them (a
    PeerError there instead of waiting for the timeout), of each call not made here (the
    others make them all: a coalesced operation of two tensors refused here after its first
    call, or by hpccomm at it, left this rank's next call paired with their second, with
    wrong sums silently from then on)."""
    spec = _SPECS.get(op.removesuffix("_coalesced").removesuffix("_tensor"))
    if spec is None:
        return
    for _ in range(calls - max(0, dispatcher.group.seq - before)):
        dispatcher.refused(spec, exc)


# the operations that make one hpccomm call per tensor of their input list
_PER_TENSOR = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_coalesced",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced",
    }
)


def _calls(op: str, args: tuple[Any, ...], inputs: int) -> int:
    """How many hpccomm calls operation ``op`` makes on every rank for these arguments."""
    if op not in _PER_TENSOR or len(args) <= inputs:
        return 1
    tensors = args[inputs]
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
        return 1
    return max(1, len(tensors))


_SPECS = {
    "all_reduce": O.ALL_REDUCE,
    "broadcast": O.BROADCAST,
    "reduce": O.REDUCE,
    "all_gather": O.ALL_GATHER,
    "all_gather_into": O.ALL_GATHER,
    "gather": O.GATHER,
    "scatter": O.SCATTER,
    "reduce_scatter": O.REDUCE_SCATTER,
    "all_to_all_single": O.ALL_TO_ALL,
    "all_to_all": O.ALL_TO_ALL,
}

# method: (the torch operation, where its input tensors are among the arguments)
for _method, (_op, _inputs) in {
    "allreduce": ("all_reduce", 0),
    "allreduce_coalesced": ("all_reduce_coalesced", 0),
    "broadcast": ("broadcast", 0),
    "reduce": ("reduce", 0),
    "allgather": ("all_gather", 1),
    "_allgather_base": ("all_gather_into_tensor", 1),
    "all_gather_single": ("all_gather_into_tensor", 1),
    "allgather_coalesced": ("all_gather_coalesced", 1),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", 1),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", 1),
    "gather": ("gather", 1),
    "scatter": ("scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter_tensor", 1),
    "reduce_scatter_single": ("reduce_scatter_tensor", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", 1),
    "alltoall_base": ("all_to_all_single", 1),
    "all_to_all_single": ("all_to_all_single", 1),
    "alltoall": ("all_to_all", 1),
    "send": ("send", 0),
    "recv": ("recv", 0),
    "recv_anysource": ("recv", 0),
}.items():
    setattr(
        HpccommProcessGroup, _method, _naming(getattr(HpccommProcessGroup, _method), _op, _inputs)
    )


_creations: Communicator | None = None  # where torch's groups are made (see _group_comm)
# create_group's tag for it ("hpc"; a creation takes tags up to half MPI's tag bound,
# 1,073,741,823 on Open MPI): apart from a user's creations on the world
_CREATIONS_TAG = 0x687063


def _group_comm(world: Communicator, ranks: list[int], timeout: float | None) -> Communicator:
    """A new torch group's communicator: a duplicate for every rank of the world, else one
    its members make alone (MPI_Comm_create_group). Made from a communicator of the
    backend's own whose timeout is the new group's (init_process_group's, new_group's): on
    hpccomm's world, which has no timeout, ranks that passed different lists to new_group
    waited in the creation for ever, past both torch timeouts."""
    global _creations
    every = not ranks or ranks == list(range(world.size))
    try:
        if every and (_creations is None or _creations.freed):
            # every rank of the world: made by them alone (MPI_Comm_create_group), bounded
            # (a world dup is not: ranks whose lists differ waited in it for ever)
            _creations = world.create_group(
                list(range(world.size)),
                tag=min(_CREATIONS_TAG, world._backend.creation_tag_max),
                timeout=timeout,
            )
        if _creations is None or _creations.freed:  # members only (the default group is
            # another backend's): made from the world, bounded by its own timeout
            comm = world.create_group(ranks, timeout=timeout)
        else:
            _creations.timeout = timeout
            comm = _creations.dup() if every else _creations.create_group(ranks)
    except CommTimeoutError as exc:
        listed = ranks or list(range(world.size))
        raise CommTimeoutError(
            f"torch new_group({listed}) on world rank {world.rank}: {exc}; every rank of "
            f"the new group calls it with the same ranks (lists that differ across ranks, "
            f"or a rank that skips it, leave the others waiting)"
        ) from exc
    comm.timeout = timeout
    return comm


def _bound(seconds: float | None) -> float | None:
    """A torch timeout in seconds as hpccomm's: torch has no "no timeout", and programs pass
    a huge timedelta for one (timedelta(days=36500)); past the most hpccomm's waits take
    (MAX_TIMEOUT, 1e9 s) it is None, where hpccomm refuses it (its waits overflowed past
    9.2e9 s: a bare OverflowError)."""
    return None if seconds is not None and seconds > MAX_TIMEOUT else seconds


def _creator(opts: Any, backend_options: Any = None) -> HpccommProcessGroup:
    """torch's backend creator (extended API): the group's communicator is made by its
    members (torch calls this on members only), bounded by its timeout (_group_comm)."""
    world = hpccomm_init()
    timeout = _bound(opts.timeout.total_seconds() if opts.timeout else None)
    comm = _group_comm(world, list(opts.global_ranks_in_group or []), timeout or None)
    return HpccommProcessGroup(comm, timeout, str(opts.group_id))


class _ServedMPI:
    """Stands in for torch's ProcessGroupMPI, which pip wheels lack: torch's ``"mpi"`` path
    calls ``create(global_ranks)`` on every rank of a new group (members-only, as
    ``MPI_Comm_create_group``) and takes a returned ProcessGroup as the group itself."""

    hpccomm = True

    @staticmethod
    def create(ranks: Sequence[int]) -> HpccommProcessGroup | None:
        world = hpccomm_init()
        members = list(ranks or [])
        if members and world.rank not in members:
            return None
        timeout = _torch_timeout()
        seconds = world.timeout if timeout is None else timeout.total_seconds() or None
        comm = _group_comm(world, members, _bound(seconds))
        group = HpccommProcessGroup(comm, comm.timeout)
        group.backend_name = "mpi"
        return group


_HELPER = "_new_process_group_helper"


def _torch_timeout() -> datetime.timedelta | None:
    """The timeout torch's caller of ``ProcessGroupMPI.create`` holds for the new group:
    torch passes it to every backend but MPI's (``create(global_ranks)`` takes no timeout),
    so it is read from the caller's frame, torch's ``_new_process_group_helper`` (its
    ``timeout`` argument: init_process_group's or new_group's, torch's default 30 min when
    not given). None, with a warning, where no such frame holds one (a torch that calls
    it otherwise): the group then keeps the world's timeout."""
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(8):  # create()'s caller, or a few frames above it
        if frame is None:
            break
        if (
            frame.f_code.co_name == _HELPER
            and frame.f_globals.get("__name__") == dist.distributed_c10d.__name__
        ):
            timeout = frame.f_locals.get("timeout")
            if isinstance(timeout, datetime.timedelta):
                return timeout
            break
        frame = frame.f_back
    warnings.warn(
        f"hpccomm torch backend: torch {torch.__version__} did not pass its timeout to the "
        f"'mpi' group (no {_HELPER} frame with a timeout above ProcessGroupMPI.create); the "
        f"group takes the world's (hpccomm.init(timeout=), else none)",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def serve_mpi() -> None:
    """Serve torch's ``backend="mpi"`` with hpccomm, so ``dist.init_process_group("mpi")``
    and ``dist.new_group(backend="mpi")`` work unchanged on a pip-installed torch (CPU
    tensors). Each group takes torch's timeout, as on gloo: ``timeout=`` of
    ``init_process_group`` or ``new_group``, else torch's default (30 min). torch does not
    pass it to ``ProcessGroupMPI.create``, so hpccomm reads it from torch's calling frame;
    where that fails (another torch) a RuntimeWarning says so and the group takes the
    world's timeout (``hpccomm.init(timeout=)``, else none).

    A torch built with its own MPI backend is left alone. ``python -m hpccomm.torch
    script.py ...`` runs an unchanged script this way.
    """
    c10d = dist.distributed_c10d
    current = getattr(c10d, "ProcessGroupMPI", None)
    if c10d._MPI_AVAILABLE and not getattr(current, "hpccomm", False):
        return  # torch's own MPI backend
    c10d._MPI_AVAILABLE = True
    c10d.ProcessGroupMPI = _ServedMPI  # type: ignore[misc,assignment]


def register() -> None:
    """Register the "hpccomm" backend with torch.distributed (for CPU tensors); idempotent.
    Importing this module calls it: ``dist.init_process_group("hpccomm", ...)`` works after
    ``import hpccomm.torch`` (it only names the backend; cpu's default stays gloo's)."""
    global _registered
    if not _registered:
        dist.Backend.register_backend(NAME, _creator, extended_api=True, devices=["cpu"])
        _registered = True


_STARTED = "started"  # rank 0's offer where its default group is up (see init_process_group)


def init_process_group(
    *, timeout: datetime.timedelta | float | None = None, **kwargs: Any
) -> Communicator:
    """Start hpccomm under mpiexec/srun and initialize torch.distributed on it.

    Sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (from hpccomm's
    verified launch), makes torch's TCPStore on rank 0's host (its address travels over
    MPI), and calls ``dist.init_process_group(backend="hpccomm", ...)``. Extra keyword
    arguments go to torch's init (``device_id``, ...).

    Returns:
        hpccomm's world Communicator.
    """
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    delta = datetime.timedelta(seconds=seconds if seconds else 1800)
    if not hpccomm_initialized():
        # hpccomm starts MPI here: MPI_Init (a fence over every rank of the job) is bounded
        # as hpccomm.init(timeout=) bounds it, the larger of the timeout and 60 s (it had no
        # bound: a rank that started late held the others there, GIL and all, whatever
        # timeout=; an outside hunt, 2026-12-05)
        world = hpccomm_init(init_timeout=min(max(delta.total_seconds(), 60.0), MAX_TIMEOUT))
    else:
        world = hpccomm_init()
    register()
    backend = kwargs.pop("backend", NAME)
    if backend != NAME:
        raise InvalidArgumentError(
            f"hpccomm.torch.init_process_group: backend is {backend!r}, expected {NAME!r} (a "
            f"mixed 'cpu:hpccomm,cuda:nccl' needs a c10d Backend subclass, which PyTorch "
            f"{torch.__version__} does not allow from Python: make an NCCL group beside it)"
        )
    # bounded by torch's timeout, as gloo's start is (a rank that never calls this left the
    # others here for good: the world may have no timeout)
    saved = world.timeout
    world.timeout = delta.total_seconds() if saved is None else min(saved, delta.total_seconds())
    try:
        # a second call (the default group is up): rank 0 makes no store then, and every
        # rank raises torch's ValueError (rank 0 made one, raised and dropped it, while rank
        # 1 dialled it for torch's 30 min: an outside hunt)
        store = None
        if world.rank == 0 and not dist.is_initialized():
            store = dist.TCPStore(
                "127.0.0.1", 0, world.size, is_master=True, timeout=delta, wait_for_workers=False
            )
            offer: Any = (_addresses(world), store.port)
        else:
            offer = _STARTED if world.rank == 0 else None
        offer = world.broadcast_object(offer, src=0)
        if offer == _STARTED or dist.is_initialized():
            raise ValueError(
                f"hpccomm.torch.init_process_group (rank {world.rank} of {world.size}): the "
                f"default process group is initialized already on "
                f"{'this rank' if dist.is_initialized() else 'rank 0'} (torch: trying to "
                f"initialize the default process group twice); call "
                f"dist.destroy_process_group() first, on every rank"
            )
        hosts, port = offer
    finally:
        world.timeout = saved
    host = hosts[0]
    if world.rank != 0:
        host = _reachable(world, hosts, port)
        store = dist.TCPStore(host, port, world.size, is_master=False, timeout=delta)
    _set_launch_env(world)
    os.environ["MASTER_ADDR"] = host
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        backend=NAME, store=store, rank=world.rank, world_size=world.size, timeout=delta, **kwargs
    )
    return world


def _addresses(world: Communicator) -> list[str]:
    """Where the others may reach rank 0's store, best first: ``MASTER_ADDR`` alone when set;
    loopback when every rank is on one node; else the address rank 0's host name resolves
    to, then each IPv4 address of its network interfaces (a node whose name does not
    resolve, or resolves to loopback, is still reachable)."""
    if os.environ.get("MASTER_ADDR"):
        return [os.environ["MASTER_ADDR"]]
    if world.num_nodes == 1:
        return ["127.0.0.1"]
    found: list[str] = []
    try:
        found.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    found += _interface_addresses()
    usable = [a for i, a in enumerate(found) if a not in found[:i] and not a.startswith("127.")]
    return usable or [socket.gethostname()]  # nothing better: the name, as torchrun would


def _interface_addresses() -> list[str]:
    """IPv4 addresses of this host's network interfaces (Linux SIOCGIFADDR; [] elsewhere)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                packed = struct.pack("256s", name.encode()[:15])
                found.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, packed)[20:24]))
            except OSError:
                continue  # an interface without an IPv4 address
    return found


def _reachable(world: Communicator, hosts: Sequence[str], port: int, within: float = 30.0) -> str:
    """The first of rank 0's addresses this rank can connect to; tries them all for
    ``within`` seconds, then raises naming each address and what connecting to it said."""
    deadline = time.monotonic() + within
    said: dict[str, str] = {}
    while True:
        for host in hosts:
            try:
                with socket.create_connection((host, port), timeout=2.0):
                    return host
            except OSError as exc:
                said[host] = str(exc) or type(exc).__name__
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    tried = "; ".join(f"{h}: {e}" for h, e in said.items()) or "rank 0 offered no address"
    raise CommTimeoutError(
        f"hpccomm.torch.init_process_group: rank {world.rank} cannot reach rank 0's store on "
        f"port {port} after {within:.0f} s ({tried}); set MASTER_ADDR to an address of rank "
        f"0's node that the other nodes can reach"
    )


def _set_launch_env(world: Communicator) -> None:
    """torchrun's variables from hpccomm's verified launch: ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (a script picks its GPU by ``LOCAL_RANK``)."""
    for key, value in (
        ("RANK", world.rank),
        ("WORLD_SIZE", world.size),
        ("LOCAL_RANK", world.local_rank),
        ("LOCAL_WORLD_SIZE", world.local_size),
    ):
        os.environ[key] = str(value)


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpccomm.torch script.py [args]``: run an unchanged torch.distributed script
    whose backend is "mpi" (or "hpccomm") on hpccomm, under mpiexec or srun, with RANK,
    WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set as torchrun sets them."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(_main.__doc__)
        return 0
    # what to run is checked before MPI starts, as python checks it (a mistyped name was a
    # traceback on every rank and an aborted job; an outside hunt)
    usage = "usage: python -m hpccomm.torch script.py [args] | -m MODULE [args]"
    if not args:
        print(f"{usage}: no script given", file=sys.stderr)
        return 2
    if args[0] == "-m":
        if len(args) < 2:
            print(f"{usage}: -m: MODULE is missing", file=sys.stderr)
            return 2
        name, why = args[1], None
        try:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations is not None:
                # a package runs its __main__, as python -m runs it (review AJ: one without
                # it passed this check and failed after MPI started)
                name = f"{name}.__main__"
                spec = importlib.util.find_spec(name)
                why = f"No module named {name}; {args[1]!r} is a package and cannot be run"
        except (ImportError, ValueError) as exc:  # a parent package that is not there
            spec, why = None, f"{type(exc).__name__}: {exc}"
        if spec is None:
            print(
                f"python -m hpccomm.torch: -m {args[1]}: {why or f'No module named {name}'}",
                file=sys.stderr,
            )
            return 2
    elif not (
        os.path.isfile(args[0]) or os.path.isfile(os.path.join(args[0], "__main__.py"))
    ):  # (a folder or zip file with a __main__.py runs, as python runs it: review AJ)
        print(
            f"python -m hpccomm.torch: can't open file {os.path.abspath(args[0])!r}: "
            + ("a folder without a __main__.py" if os.path.isdir(args[0]) else "no such file"),
            file=sys.stderr,
        )
        return 2
    _set_launch_env(hpccomm_init())  # (mpiexec and srun set none of them)
    register()
    serve_mpi()
    sys.argv = args
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        # the script's folder first on the path, as `python script.py` and torchrun put it
        # (a script importing a module beside it failed when run from another folder)
        if not os.path.isdir(args[0]):  # (run_path puts a folder or zip file itself there)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    return 0


# Importing registers the backend, as the module's docstring says (only its name and
# creator: no MPI, nothing else changes until a group is made with it).
register()

if __name__ == "__main__":  # this file run as a script: use the one importable copy
    from hpccomm.torch import _main as _run

    raise SystemExit(_run())
