"""Dtype and reduction-op tables shared by every backend.

MPI has no float16 or bfloat16: those travel as 2-byte words and are reduced by a
user-defined MPI op that views the words as the real type and combines them with NumPy
(``ml_dtypes`` provides bfloat16), i.e. each pairwise step rounds back to the 2-byte type,
as NCCL's ring does. Bool reductions map to logical ops (SUM/MAX/BOR -> OR, PRODUCT/MIN/BAND
-> AND, BXOR -> XOR), as torch does for bool tensors.
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

import ml_dtypes
import numpy as np

from .errors import DtypeError, InvalidArgumentError

__all__ = [
    "DtypeInfo",
    "ReduceOp",
    "SUPPORTED_DTYPES",
    "ARITHMETIC_UFUNCS",
    "dtype_info",
    "check_op",
    "as_reduce_op",
]

# The NumPy ufunc that folds two operands of an arithmetic reduce op (AVG and PREMUL_SUM sum;
# their scaling, ReduceOp.prescale, is applied to each input first), used wherever hpccomm
# reduces itself.
ARITHMETIC_UFUNCS: dict[str, np.ufunc] = {
    "SUM": np.add,
    "AVG": np.add,
    "PREMUL_SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
}


class DtypeInfo(NamedTuple):
    """What hpccomm knows of one dtype: its category ('bool', 'int', 'float', 'half',
    'complex') and the name MPI and NCCL tables key on."""

    dtype: np.dtype
    category: str
    name: str


def _table() -> dict[np.dtype, DtypeInfo]:
    entries = [
        (np.bool_, "bool"),
        (np.int8, "int"),
        (np.int16, "int"),
        (np.int32, "int"),
        (np.int64, "int"),
        (np.uint8, "int"),
        (np.uint16, "int"),
        (np.uint32, "int"),
        (np.uint64, "int"),
        (np.float16, "half"),
        (ml_dtypes.bfloat16, "half"),
        (np.float32, "float"),
        (np.float64, "float"),
        (np.complex64, "complex"),
        (np.complex128, "complex"),
    ]
    table = {}
    for scalar, category in entries:
        dt = np.dtype(scalar)
        table[dt] = DtypeInfo(dt, category, dt.name)
    return table


SUPPORTED_DTYPES: dict[np.dtype, DtypeInfo] = _table()


def dtype_info(dtype: np.dtype, where: object, arg: str = "array") -> DtypeInfo:
    """Look a dtype up; raise DtypeError naming the operation and the supported list.

    ``where`` is the message prefix, or an object whose ``str()`` gives it (formatted only
    when an error is raised).
    """
    info = SUPPORTED_DTYPES.get(dtype)
    if info is None:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        said = f"dtype is {dtype}" if arg == "dtype" else f"{arg} has dtype {dtype}"
        raise DtypeError(f"{where}: {said}, expected one of {names}")
    return info


_OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")


class ReduceOp(tuple):
    """A reduction: ``ReduceOp.SUM``, ``PRODUCT``, ``MIN``, ``MAX``, ``AVG``, ``BAND``,
    ``BOR``, ``BXOR``, or ``ReduceOp.PREMUL_SUM(factor)`` (each input scaled, then summed).

    A (name, factor) tuple underneath, so equal ops hash equal at C speed (the dispatch keys
    its validation cache on them)."""

    __slots__ = ()
    SUM: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    AVG: ReduceOp
    BAND: ReduceOp
    BOR: ReduceOp
    BXOR: ReduceOp

    def __new__(cls, name: str, factor: complex | None = None) -> ReduceOp:
        if type(name) is not str or name not in _OP_NAMES:
            raise DtypeError(
                f"ReduceOp: name is {name!r}, expected one of {', '.join(_OP_NAMES)} (or use "
                f"ReduceOp.SUM, ..., ReduceOp.PREMUL_SUM(factor))"
            )
        if name != "PREMUL_SUM":
            if factor is not None:
                raise DtypeError(
                    f"ReduceOp: {name} takes no factor, got {factor!r}; "
                    f"ReduceOp.PREMUL_SUM(factor) scales the inputs"
                )
        elif isinstance(factor, (bool, np.bool_, np.timedelta64)) or not isinstance(
            factor, (int, float, complex, np.number)
        ):
            raise DtypeError(
                f"ReduceOp.PREMUL_SUM: factor is {factor!r} ({type(factor).__name__}), expected "
                f"a real or complex number (not bool)"
            )
        else:
            try:
                complex(factor)  # (every factor is used as a float or complex number)
            except OverflowError:  # an int past float64's range failed at the call
                assert isinstance(factor, int)  # (only an int overflows complex())
                raise InvalidArgumentError(
                    f"ReduceOp.PREMUL_SUM: factor is an int of {factor.bit_length()} bits, "
                    f"out of float64's range (magnitude below 2**1024, about 1.8e308)"
                ) from None
        return tuple.__new__(cls, (name, factor))

    name = property(itemgetter(0), doc="The op's name: 'SUM', ..., 'PREMUL_SUM'.")
    factor = property(itemgetter(1), doc="PREMUL_SUM's factor (None for the other ops).")

    @staticmethod
    def PREMUL_SUM(factor: complex) -> ReduceOp:  # noqa: N802 - torch's spelling
        """Scale every rank's input by ``factor``, then sum. A complex factor is only
        defined for complex arrays (checked per call)."""
        return ReduceOp("PREMUL_SUM", factor)

    def prescale(self, size: int) -> complex | None:
        """What each rank scales its input by before the sum, in a group of ``size``:
        PREMUL_SUM's factor; 1/size for AVG, as NCCL makes it (a sum divided after
        overflowed float16 where the average fits: 25,000 on 3 ranks gave inf); None for
        the other ops. Every backend that reduces on the host takes it from here."""
        if self.name == "PREMUL_SUM":
            return self.factor
        return 1.0 / size if self.name == "AVG" else None

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}" + (f"({self.factor})" if self.factor is not None else "")

    def __reduce__(self) -> tuple:
        return (ReduceOp, (self.name, self.factor))


for _name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
    setattr(ReduceOp, _name, ReduceOp(_name))

_BY_NAME = {
    "sum": ReduceOp.SUM,
    "prod": ReduceOp.PRODUCT,
    "product": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "band": ReduceOp.BAND,
    "bor": ReduceOp.BOR,
    "bxor": ReduceOp.BXOR,
}

# Which dtype categories each op is defined for.
ALLOWED_CATEGORIES: dict[str, frozenset[str]] = {
    "SUM": frozenset({"bool", "int", "float", "half", "complex"}),
    "PRODUCT": frozenset({"bool", "int", "float", "half"}),
    "MIN": frozenset({"bool", "int", "float", "half"}),
    "MAX": frozenset({"bool", "int", "float", "half"}),
    "AVG": frozenset({"float", "half", "complex"}),
    "PREMUL_SUM": frozenset({"float", "half", "complex"}),
    "BAND": frozenset({"bool", "int"}),
    "BOR": frozenset({"bool", "int"}),
    "BXOR": frozenset({"bool", "int"}),
}

_WHY = {
    "BAND": "bitwise ops are defined for integers and bool only",
    "BOR": "bitwise ops are defined for integers and bool only",
    "BXOR": "bitwise ops are defined for integers and bool only",
    "PRODUCT": "PRODUCT is not defined for complex numbers here (MIN/MAX/PRODUCT are refused for complex)",
    "MIN": "complex numbers have no order",
    "MAX": "complex numbers have no order",
    "AVG": "AVG is defined for floating and complex types only (integer averages would truncate)",
    "PREMUL_SUM": "PREMUL_SUM is defined for floating and complex types only",
}


def as_reduce_op(op: object, where: object) -> ReduceOp:
    """Accept a ReduceOp or its lower-case name; raise DtypeError for anything else."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.lower() in _BY_NAME:
        return _BY_NAME[op.lower()]
    if op is ReduceOp.PREMUL_SUM:
        raise DtypeError(
            f"{where}: op is ReduceOp.PREMUL_SUM without a factor, expected ReduceOp.PREMUL_SUM(factor)"
        )
    raise DtypeError(
        f"{where}: op is {op!r}, expected a ReduceOp (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR, PREMUL_SUM(f))"
    )


def check_op(op: ReduceOp, info: DtypeInfo, where: object) -> None:
    """Raise DtypeError naming the op and the dtype when the op is not defined for it (or,
    for PREMUL_SUM, when a complex factor meets a real dtype)."""
    if info.category not in ALLOWED_CATEGORIES[op.name]:
        raise DtypeError(
            f"{where}: op {op.name} is not defined for dtype {info.name}: {_WHY[op.name]}"
        )
    if op.factor is not None and info.category != "complex" and np.iscomplexobj(op.factor):
        raise DtypeError(
            f"{where}: op PREMUL_SUM has the complex factor {op.factor!r} for dtype {info.name}, "
            f"expected a real factor (a complex one is only defined for complex arrays)"
        )
