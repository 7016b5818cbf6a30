"""What init() decided for device arrays on this machine (no GPU here: the decision only)."""

import importlib.util


def test_device_path_decided_at_init(world):
    dev = world.device
    if importlib.util.find_spec("cupy") is None:
        assert dev.gpu is None and dev.mode == "mpi"
    # The PyPI Open MPI wheel is built without CUDA; MPIX_Query_cuda_support answers 0.
    if "MPIX_Query_cuda_support" in dev.path.reason:
        assert dev.path.cuda_aware is False
    assert "device arrays" in dev.describe()


def test_dup_can_switch_device_backend(comm):
    d = comm.dup(device_backend="mpi")
    assert d.device.mode == "mpi"
    d.free()
