"""Shared test set-up: the pytest header names the MPI library, the rank/size and the GPU
stack (when present), so every report says what it ran on."""

import importlib.util
import os


def pytest_report_header(config):
    lines = []
    if (
        "mpi4py" in __import__("sys").modules
        or os.environ.get("OMPI_COMM_WORLD_SIZE")
        or config.getoption("with_mpi", False)
    ):
        from mpi4py import MPI

        lines.append(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
        lines.append(f"MPI rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}")
    if importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            line = f"CuPy {cupy.__version__}"
            try:
                from cupy.cuda import nccl

                line += f", NCCL {nccl.get_version()}"
            except Exception as exc:  # report, do not fail the header
                line += f", NCCL unavailable ({exc})"
            lines.append(line)
        except Exception as exc:
            lines.append(f"CuPy failed to import: {exc}")
    else:
        lines.append("CuPy: not installed (GPU tests skip)")
    return lines
