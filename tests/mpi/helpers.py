"""Deterministic per-rank data and NumPy references, so each rank can compute every
rank's input locally and check its result without communicating."""

import ml_dtypes
import numpy as np

from hpccomm.dtypes import SUPPORTED_DTYPES

ALL_DTYPES = list(SUPPORTED_DTYPES)
BF16 = np.dtype(ml_dtypes.bfloat16)


def data(dtype, rank, shape, seed=0):
    """Small integers (exact in every dtype, sums/products of 4 ranks included)."""
    rng = np.random.default_rng(97 * seed + rank)
    dtype = np.dtype(dtype)
    ints = rng.integers(0, 4, size=shape)
    if dtype == np.bool_:
        return ints.astype(bool) & (ints > 1)
    if dtype.kind == "c":
        return (ints + 1j * rng.integers(0, 4, size=shape)).astype(dtype)
    return ints.astype(dtype)


def wide(x):
    """Upcast for reference arithmetic (bfloat16/float16 through float64)."""
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype == np.bool_:
        return x
    if x.dtype.kind in "iu":
        return x.astype(np.int64)
    return x.astype(np.float64)


def reduce_ref(arrays, op_name, factor=None):
    xs = np.stack([wide(a) for a in arrays])
    is_bool = arrays[0].dtype == np.bool_
    if op_name == "SUM":
        return xs.any(0) if is_bool else xs.sum(0)
    if op_name == "PRODUCT":
        return xs.all(0) if is_bool else xs.prod(0)
    if op_name == "MIN":
        return xs.min(0)
    if op_name == "MAX":
        return xs.max(0)
    if op_name == "AVG":
        return xs.mean(0)
    if op_name == "PREMUL_SUM":
        return (xs * factor).sum(0)
    table = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
    if is_bool:
        table = {"BAND": np.logical_and, "BOR": np.logical_or, "BXOR": np.logical_xor}
    return table[op_name].reduce(xs, axis=0)


def assert_close(got, expect, dtype):
    dtype = np.dtype(dtype)
    g = wide(np.asarray(got))
    if dtype in (np.dtype(np.float16), BF16):
        np.testing.assert_allclose(g, expect, rtol=1e-2, atol=1e-2)
    elif dtype.kind in "fc":
        np.testing.assert_allclose(g, expect, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(g, expect)
