"""The interface every backend implements, with identical signatures.

A backend turns a validated :class:`~hpccomm.ops.Call` into something runnable
(``prepare``: it sets ``call.backend``, ``call.body``, ``call.how`` and ``call.mode``) and the
dispatch then runs ``call.body(call, data, out, stream)``. ``call.mode`` says what the body
does:

- ``"blocking"``: it runs the operation to completion and returns the result. The dispatch
  runs it inline, or on the communicator's worker thread for ``async_op`` and bounded calls
  (so every rank issues the same blocking MPI call whatever it waits for), one at a time,
  and sets ``backend.seq`` to the call's sequence number in its group just before (the
  shared-memory path compares it across ranks).
- ``"requests"``: it starts the operation and returns a :class:`~hpccomm.work.Pending`
  (MPI point-to-point: non-blocking sends match blocking receives, so no thread is needed).
- ``"stream"``: it enqueues the operation on a CUDA stream and returns the result (NCCL);
  ``backend.device_work(call, seq, result, stream)`` makes the Work of an async call.

Adding a backend means one class with these methods and one line where the dispatch picks
backends (``Communicator._device_backend``), not a change to every operation.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import HpccommError
from ..ops import Call

__all__ = ["Backend", "HostBackend"]


class Backend(Protocol):
    """``supports`` says whether the backend takes a call (device, op, dtype); ``prepare``
    fills the call's run fields (it may raise the errors only the backend can see, e.g. a
    dtype NCCL lacks); ``close`` releases what it holds and is idempotent."""

    name: str
    seq: int  # the sequence number of the blocking body running now (set by the dispatch)

    def supports(self, call: Call) -> bool: ...

    def prepare(self, call: Call) -> None: ...

    def error(self, call: Call, seq: int, exc: BaseException) -> HpccommError:
        """The library's exception as an HpccommError naming the call (``call.where(seq)``):
        a PeerError when a peer process failed, else a BackendError."""
        ...

    def close(self) -> None: ...


class HostBackend(Backend, Protocol):
    """The group's host backend (MPI) also exchanges small values among the group's ranks,
    for the debug checks: collective over the group, in the group's call order."""

    rank: int
    size: int

    def same_int(self, value: int) -> bool: ...

    def allgather_object(self, obj: Any) -> list[Any]: ...

    def alltoall_ints(self, values: list[int]) -> list[int]: ...

    def start_checked(self, call: Call, seq: int, data: Any, out: Any) -> Any:
        """Start a point-to-point call with debug headers; returns a Pending."""
        ...

    def pickled(self, call: Call, obj: Any, seq: int) -> Any:
        """An object collective's object(s) this rank sends, pickled before the call (one
        that cannot be pickled: InvalidArgumentError)."""
        ...


Body = Any  # Callable[[Call, Any, Any, Any], Any]: (call, data, out, stream) -> result | Pending
