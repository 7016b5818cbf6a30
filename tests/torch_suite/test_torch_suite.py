"""PyTorch's DistributedTest._DistTestBase against the hpccomm backend (see conftest.py)."""

import datetime
import functools
import os
import unittest

import pytest

if os.environ.get("BACKEND") != "mpi":  # not under mpiexec: conftest skips, says why
    pytest.skip("PyTorch's suite runs under mpiexec (make test-torch)", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS, DistTestCases  # noqa: E402

# What the backend has, in the suite's own table (read when the suite's classes are made).
DistTestCases.backend_feature["ddp"].add("mpi")
DistTestCases.backend_feature["subgroup"].add("mpi")

from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402

import hpccomm.torch as ht  # noqa: E402

# Tests the adapter cannot run in shared processes, and why: they start or end
# torch.distributed themselves, kill or fork ranks, or measure torch's own backends.
LEFT_OUT = {
    "test_destroy_group": "destroys groups the later tests use",
    "test_destroy_full_group": "destroys groups the later tests use",
    "test_ddp_has_finalized": "expects a rank to crash (torch's harness tolerates it)",
    "test_dump_DDP_relevant_env_vars": "checks torch's launcher variables (MASTER_PORT)",
    "test_monitored_barrier_failure_order": "gloo-only monitored_barrier",
    "test_monitored_barrier_gloo": "gloo-only monitored_barrier",
    "test_monitored_barrier_gloo_rank_0_timeout": "gloo-only monitored_barrier",
    "test_monitored_barrier_gloo_subgroup": "gloo-only monitored_barrier",
    "test_monitored_barrier_wait_all_ranks": "gloo-only monitored_barrier",
    "test_monitored_barrier_allreduce_hang": "hangs a rank on purpose",
    "test_monitored_barrier_allreduce_hang_wait_all_ranks": "hangs a rank on purpose",
}

_SKIP_CODES = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}


class TestTorchSuite(suite.DistributedTest._DistTestBase, TestCase):
    """Each test of PyTorch's suite, on hpccomm's default group."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not dist.is_initialized():
            ht.register()
            ht.serve_mpi()
            dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=60))

    def setUp(self):
        super().setUp()
        self.rank = dist.get_rank()
        self.file_name = os.path.join(os.environ["TEMP_DIR"], "init_dir", "shared_init_file")
        dist.barrier()

    def tearDown(self):
        dist.barrier()
        super().tearDown()

    def _barrier(self, *args, **kwargs):
        dist.barrier()

    @property
    def world_size(self):
        return os.environ["WORLD_SIZE"]

    @property
    def init_method(self):
        return "env://"


def _skipping_exits(test):
    """The suite's GPU and world-size guards sys.exit() with a code its harness reads as a
    skip: the same skip here, with the suite's own reason."""

    @functools.wraps(test)
    def run(self, *args, **kwargs):
        try:
            return test(self, *args, **kwargs)
        except SystemExit as exc:
            if exc.code in _SKIP_CODES:
                raise unittest.SkipTest(_SKIP_CODES[exc.code]) from None
            raise

    return run


for _name in dir(TestTorchSuite):
    if _name.startswith("test_"):
        _test = getattr(TestTorchSuite, _name)
        if _name in LEFT_OUT:
            _test = unittest.skip(f"left out by the adapter: {LEFT_OUT[_name]}")(_test)
        setattr(TestTorchSuite, _name, _skipping_exits(_test))
