"""On/off switches (hpccomm.switches): one spelling for every HPCCOMM_* switch, and a refusal
that lists what is accepted ("expected 1 or 0" refused 'maybe' while 'no', 'on' and 'yes'
were taken)."""

import pytest

from hpccomm.errors import InvalidArgumentError
from hpccomm.switches import FALSE, TRUE, switch

SPELT = "1/true/yes/on or 0/false/no/off (any case)"


@pytest.mark.parametrize("raw", ["1", "true", "YES", " On ", "0", "False", "no", "OFF"])
def test_every_spelling_is_taken(raw):
    want = raw.strip().lower() in ("1", "true", "yes", "on")
    assert switch({"X": raw}, "X", default=not want, where="init") is want


@pytest.mark.parametrize("raw", ["", "  "])
def test_unset_or_blank_is_the_default(raw):
    assert switch({"X": raw}, "X", default=True, where="init") is True
    assert switch({}, "X", default=False, where="init") is False


@pytest.mark.parametrize("raw", ["maybe", "2", "Y", "enable"])
def test_a_refusal_lists_what_is_accepted(raw):
    with pytest.raises(InvalidArgumentError) as err:
        switch({"HPCCOMM_X": f" {raw} "}, "HPCCOMM_X", default=True, where="init", meaning=" (m)")
    assert str(err.value) == f"init: HPCCOMM_X is {raw!r}, expected {SPELT} (m)"
    listed = SPELT.removesuffix(" (any case)").replace(" or ", "/").split("/")
    assert set(listed) == TRUE | FALSE  # the message offers exactly what is accepted


def test_lenient_takes_the_default_for_anything_else():
    assert switch({"X": "maybe"}, "X", default=True, where="init", lenient=True) is True
