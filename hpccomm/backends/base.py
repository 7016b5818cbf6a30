"""The interface every backend implements, with identical signatures."""

from __future__ import annotations

from typing import Any, Protocol

from ..record import Call

__all__ = ["Backend"]


class Backend(Protocol):
    """A backend runs validated calls. ``run`` returns the result, or a Work when
    ``call.async_op`` is true. ``supports`` says whether it takes a call (device, op, dtype);
    ``close`` releases what it holds and is idempotent."""

    name: str

    def supports(self, call: Call) -> bool: ...

    def run(self, call: Call) -> Any: ...

    def close(self) -> None: ...
