"""The interface every backend implements, with identical signatures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..record import Call

__all__ = ["Backend"]


class Backend(Protocol):
    """A backend runs validated calls. ``run`` returns the result, or a Work when
    ``call.async_op`` is true. ``supports`` says whether it takes a call (device, op, dtype);
    ``fast`` may return a zero-argument callable that repeats a validated synchronous call
    (its result is ``call.result``) for the dispatch's memo, or None; ``close`` releases
    what it holds and is idempotent."""

    name: str

    def supports(self, call: Call) -> bool: ...

    def run(self, call: Call) -> Any: ...

    def fast(self, call: Call) -> Callable[[], Any] | None: ...

    def close(self) -> None: ...
