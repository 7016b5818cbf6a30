"""On/off settings read from the environment, spelt alike for every ``HPCCOMM_*`` switch:
1/true/yes/on and 0/false/no/off, any case, surrounding blanks ignored."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import InvalidArgumentError

__all__ = ["TRUE", "FALSE", "SPELLINGS", "switch"]

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
TRUE = frozenset(_ON)
FALSE = frozenset(_OFF)
# what a refusal says is accepted ("expected 1 or 0" refused 'maybe' but took 'no' and 'on')
SPELLINGS = f"{'/'.join(_ON)} or {'/'.join(_OFF)} (any case)"


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
    raw = env.get(name, "").strip()
    value = raw.lower()
    if not value:
        return default
    if value in TRUE or value in FALSE:
        return value in TRUE
    if lenient:
        return default
    raise InvalidArgumentError(f"{where}: {name} is {raw!r}, expected {SPELLINGS}{meaning}")
