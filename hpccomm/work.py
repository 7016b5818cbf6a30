"""Work: the handle an ``async_op=True`` operation returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import record
from .errors import BackendError, CommTimeoutError, HpccommError

__all__ = ["Work"]


class Work:
    """A pending operation. Backends give it ``test`` (non-blocking completion check),
    ``block`` (wait until done), ``post`` (finishing step run once, after completion) and
    ``keep`` (the buffers and temporaries the library uses until completion, held here).

    ``wait()`` returns the operation's result (the output array, the source rank of a
    receive, or None); a handle whose operation was never waited is reported when it is
    garbage collected.
    """

    __slots__ = (
        "_call",
        "_test",
        "_block",
        "_post",
        "_keep",
        "_done",
        "_exc",
        "_result",
        "__weakref__",
    )

    def __init__(
        self,
        call: record.Call,
        test: Callable[[], bool],
        block: Callable[[], None],
        post: Callable[[], Any] | None = None,
        keep: Any = None,
    ) -> None:
        self._call = call
        self._test = test
        self._block = block
        self._post = post
        # Everything the library reads or writes until completion (mpi4py keeps no reference
        # to the buffers of a non-blocking collective): dropped only once the call is done.
        self._keep = keep
        self._done = False
        self._exc: BaseException | None = None
        self._result: Any = None

    def _where(self) -> str:
        c = self._call
        return f"{c.op.name} #{c.seq} on {c.comm.name} (rank {c.comm.rank} of {c.comm.size})"

    def _finish(self, failure: BaseException | None = None) -> None:
        """Mark the operation done: run the finishing step (unless the library reported
        ``failure`` while completing), keep the result or the error for every later
        ``wait()``/``exception()``, and tell the listeners."""
        self._done = True
        self._keep = None
        call = self._call
        if failure is not None:
            self._exc = failure
        else:
            try:
                if self._post is not None:
                    value = self._post()
                    if value is not None:
                        call.result = value
                self._result = call.result
            except HpccommError as exc:
                self._exc = exc
            except Exception as exc:  # the backend's own error, named
                self._exc = BackendError(f"{self._where()}: failed while completing: {exc}")
                self._exc.__cause__ = exc
        call.error = self._exc
        if record.listeners and not call.quiet:
            record.notify("end", call)

    def _failed(self, exc: Exception) -> BaseException:
        """The library failed while completing: the operation is over, with this error."""
        if isinstance(exc, HpccommError):
            err: BaseException = exc
        else:
            err = BackendError(f"{self._call}: failed while completing: {exc}")
            err.__cause__ = exc
        self._finish(err)
        return err

    def is_completed(self) -> bool:
        """True when the operation has finished, successfully or not (never blocks)."""
        if not self._done:
            try:
                done = self._test()
            except CommTimeoutError:
                raise
            except Exception as exc:
                err = self._failed(exc)
                raise err from err.__cause__
            if done:
                self._finish()
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation completes; return its result.

        Args:
            timeout: seconds to wait at most (None: forever).

        Raises:
            CommTimeoutError: the operation did not complete in time; it stays pending (MPI
                cannot cancel a started collective), so the job should be aborted.
            HpccommError: the operation failed.
        """
        if not self._done:
            try:
                self._block_until_done(timeout)
            except CommTimeoutError:
                raise  # still pending: a later wait() may complete it
            except Exception as exc:
                err = self._failed(exc)
                raise err from err.__cause__
            self._finish()
        if self._exc is not None:
            raise self._exc
        return self._result

    def _block_until_done(self, timeout: float | None) -> None:
        if timeout is None:
            self._block()
            return
        deadline = time.monotonic() + timeout
        pause = 1e-6
        while not self._test():
            if time.monotonic() >= deadline:
                raise CommTimeoutError(
                    f"{self._where()}: not complete after {timeout:g} s; some rank of "
                    f"the group has not joined it (MPI cannot cancel it: abort the job)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def result(self) -> Any:
        """The operation's result, waiting for it first."""
        return self.wait()

    def exception(self) -> BaseException | None:
        """The error the finished operation raised, or None (None too while pending)."""
        if not self._done:
            self.is_completed()
        return self._exc

    def __del__(self) -> None:
        if not self._done and not getattr(self._call.comm, "_freed", True):
            import warnings

            warnings.warn(
                f"{self._where()}: Work handle dropped without wait()",
                ResourceWarning,
                stacklevel=1,
            )

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<Work {self._where()} {state}>"
