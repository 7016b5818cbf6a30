"""On/off settings read from the environment, spelt alike for every ``HPCCOMM_*`` switch:
1/true/yes/on and 0/false/no/off, any case, surrounding blanks ignored."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import InvalidArgumentError

__all__ = ["TRUE", "FALSE", "switch"]

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def switch(
    env: Mapping[str, str],
    name: str,
    *,
    default: bool,
    where: str,
    meaning: str = "",
    lenient: bool = False,
) -> bool:
    """The switch ``name`` in ``env``: ``default`` when unset or blank; raises
    InvalidArgumentError naming ``where``, the variable and its value for anything else
    (``lenient``: ``default`` for it too, where init has refused it on every rank already
    or will)."""
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in TRUE or value in FALSE:
        return value in TRUE
    if lenient:
        return default
    raise InvalidArgumentError(f"{where}: {name} is {value!r}, expected 1 or 0{meaning}")
