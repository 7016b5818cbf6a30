"""Backends: one small interface (:class:`~hpccomm.backends.base.Backend`), one module each."""

from .base import Backend

__all__ = ["Backend"]
