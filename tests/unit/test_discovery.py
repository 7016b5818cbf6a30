"""Launch discovery from recorded environments: every precedence row and every trap."""

import json
import subprocess
import sys

import pytest

from hpccomm.discovery import discover
from hpccomm.errors import GpuBindingError, InvalidArgumentError
from hpccomm.gpuselect import choose_gpu, parse_visible_devices

# What `srun -N2 -n4 --mpi=pmix` gives rank 3 (second node), as observed on the test rig.
SRUN_STEP = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "PMIX_RANK": "3",
}

# The batch shell of `sbatch -N2 -n4`: looks like rank 0 of 4, but it is no step.
BATCH_SHELL = {
    "SLURM_JOB_ID": "43",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
}

OMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "PMIX_RANK": "5",
}


def d(env, **kw):
    return discover(env, hostname="h1", **kw)


def test_nothing():
    info = d({})
    assert info.launcher == "none"
    assert (info.rank, info.size, info.local_rank, info.local_size) == (None, None, None, None)
    assert info.gpu is None and info.visible_gpus is None
    assert "(from MPI after init)" in str(info)


def test_torchrun():
    env = {
        "TORCHELASTIC_RUN_ID": "abc",
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == (
        "torchrun",
        9,
        16,
        1,
        8,
    )
    assert (info.node_index, info.num_nodes) == (1, 2)
    assert info.sources["rank"] == "RANK" and info.sources["node_index"] == "GROUP_RANK"


def test_torchrun_without_run_id():
    env = {
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
    }
    assert d(env).launcher == "torchrun"


def test_srun_plus_torchrun_torchrun_wins():
    # SLURM_PROCID is per node under srun + torchrun: torchrun's variables win.
    env = {
        **SRUN_STEP,
        "SLURM_PROCID": "1",
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "7",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
    }
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == (
        "torchrun",
        7,
        8,
        3,
        4,
    )
    assert info.nodelist is None  # not mixed in from the Slurm row
    assert info.job_id == "42"


def test_openmpi():
    info = d(OMPI)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == (
        "openmpi",
        5,
        8,
        1,
        4,
    )
    # OMPI_COMM_WORLD_NODE_RANK is not a node index: left to MPI.
    assert info.node_index is None and info.nodelist is None
    assert info.sources["local_rank"] == "OMPI_COMM_WORLD_LOCAL_RANK"


def test_mpirun_inside_slurm_allocation():
    # Processes inherit SLURM_PROCID/SLURM_LOCALID of the batch step; Open MPI's own win.
    env = {**BATCH_SHELL, **OMPI, "SLURM_STEP_NUM_TASKS": "1"}
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.local_rank) == ("openmpi", 5, 8, 1)
    assert info.job_id == "43"
    assert not info.warnings


def test_mvapich2():
    env = {
        "MV2_COMM_WORLD_RANK": "2",
        "MV2_COMM_WORLD_SIZE": "4",
        "MV2_COMM_WORLD_LOCAL_RANK": "0",
        "MV2_COMM_WORLD_LOCAL_SIZE": "2",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "4",
    }
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == (
        "mvapich2",
        2,
        4,
        0,
        2,
    )


def test_cray_pals():
    env = {
        "PALS_RANKID": "6",
        "PMI_SIZE": "8",
        "PALS_LOCAL_RANKID": "2",
        "PMI_LOCAL_SIZE": "4",
        "PALS_NODEID": "1",
        "PMI_RANK": "6",
    }
    info = d(env)
    assert (
        info.launcher,
        info.rank,
        info.size,
        info.local_rank,
        info.local_size,
        info.node_index,
    ) == ("pals", 6, 8, 2, 4, 1)


def test_cray_pals_local_rank_fallback():
    env = {"PALS_RANKID": "1", "PMI_SIZE": "2", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"}
    info = d(env)
    assert info.local_rank == 1 and info.sources["local_rank"] == "PMI_LOCAL_RANK"


def test_hydra():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == (
        "hydra",
        3,
        4,
        1,
        2,
    )


def test_hydra_pmi_id():
    env = {"PMI_ID": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert d(env).rank == 1


def test_srun_step():
    info = d(SRUN_STEP)
    assert info.launcher == "slurm"
    assert (info.rank, info.size, info.local_rank, info.local_size) == (3, 4, 1, 2)
    assert (info.node_index, info.num_nodes, info.nodelist) == (1, 2, ("node1", "node2"))
    assert info.sources["size"] == "SLURM_STEP_NUM_TASKS"
    assert info.sources["local_size"] == "SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID]"
    assert info.job_id == "42"


@pytest.mark.parametrize(("node", "local_size"), [(0, 3), (1, 2), (2, 2), (3, 1)])
def test_srun_uneven_tasks_per_node(node, local_size):
    env = {
        **SRUN_STEP,
        "SLURM_NODEID": str(node),
        "SLURM_LOCALID": "0",  # (SRUN_STEP's local rank 1 is not on a node with one task)
        "SLURM_STEP_TASKS_PER_NODE": "3,2(x2),1",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NUM_NODES": "4",
        "SLURM_STEP_NODELIST": "n[1-4]",
    }
    info = d(env)
    assert info.local_size == local_size and info.num_nodes == 4


def test_no_tasks_on_this_tasks_node_is_refused():
    # "0" gave local size 0 (sizes below 1 are refused everywhere else)
    env = {**SRUN_STEP, "SLURM_STEP_TASKS_PER_NODE": "2,0", "SLURM_STEP_NUM_TASKS": "2"}
    with pytest.raises(ValueError, match=r"SLURM_STEP_TASKS_PER_NODE='2,0' gives node 1 "
                       r"\(SLURM_NODEID\) 0 tasks, but this task runs there"):  # fmt: skip
        d(env)


def test_a_launcher_integer_beyond_any_job_is_refused_by_name():
    # 5,000 digits: int()'s own ValueError ("Exceeds the limit (4300 digits)"), naming no
    # variable
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "9" * 5000}
    with pytest.raises(InvalidArgumentError, match=r"OMPI_COMM_WORLD_SIZE='9{20}\.\.\.\(5000 "
                       r"digits\)' is too large"):  # fmt: skip
        d(env)


def test_srun_step_nodeid_out_of_range():
    env = {**SRUN_STEP, "SLURM_NODEID": "5"}
    with pytest.raises(ValueError, match=r"SLURM_NODEID=5 .* lists only 2 nodes"):
        d(env)


def test_srun_step_size_falls_back_to_ntasks():
    env = {k: v for k, v in SRUN_STEP.items()}
    env["SLURM_STEP_NUM_TASKS"] = ""
    info = d(env)
    assert info.size == 4 and info.sources["size"] == "SLURM_NTASKS"


def test_interactive_srun_pty_is_one_task_step():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_NTASKS": "4",
    }
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.local_size) == ("slurm", 0, 1, 1)


def test_batch_shell_is_not_rank_0_of_n():
    info = d(BATCH_SHELL)
    assert info.launcher == "slurm-batch"
    assert (info.rank, info.size, info.local_rank, info.local_size) == (0, 1, 0, 1)
    assert info.nodelist == ("node1", "node2") and info.num_nodes == 2
    assert len(info.warnings) == 1
    assert "launch the ranks with srun" in info.warnings[0]
    assert "SLURM_NTASKS=4" in info.warnings[0]


def test_pmix_only():
    info = d({"PMIX_RANK": "2"})
    assert (info.launcher, info.rank, info.size) == ("pmi", 2, None)


def test_pmi_rank_only():
    info = d({"PMI_RANK": "1"})
    assert (info.launcher, info.rank) == ("pmi", 1)


def test_bad_integer_names_variable():
    with pytest.raises(
        ValueError,
        match=r"launch discovery \(openmpi\): OMPI_COMM_WORLD_RANK='x' is not an integer",
    ):
        d({**OMPI, "OMPI_COMM_WORLD_RANK": "x"})


def test_job_array():
    env = {**SRUN_STEP, "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2"}
    info = d(env)
    assert info.array_task_id == "2"
    # Slurm's name for the element (SRUN_STEP's own SLURM_JOB_ID is another job id), as an
    # outside review saw `84[0]` for element 0 of array job 83
    assert info.job_id == "40_2" and "SLURM_ARRAY_JOB_ID" in info.sources["job_id"]
    from hpccomm.diagnose import format_launch_table

    table = format_launch_table([info.to_dict()])
    assert " 40_2" in table and "[2]" not in table, table


def test_gpu_per_task_isolation():
    info = d({**SRUN_STEP, "CUDA_VISIBLE_DEVICES": "0"})
    assert info.visible_gpus == ("0",) and info.gpu == 0


def test_gpu_all_visible_pick_local_rank():
    info = d({**SRUN_STEP, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert info.gpu == 1


def test_gpu_too_few_is_a_warning_in_discovery():
    info = d({**OMPI, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert info.gpu is None
    assert any("would share GPU 1" in w for w in info.warnings)


def test_gpu_sharing_allowed():
    info = d({**OMPI, "CUDA_VISIBLE_DEVICES": "0,1", "HPCCOMM_ALLOW_GPU_SHARING": "1"})
    assert info.gpu == 1


def test_gpu_hidden_is_cpu_only():
    info = d({**OMPI, "CUDA_VISIBLE_DEVICES": ""})
    assert info.visible_gpus == () and info.gpu is None and not info.warnings


def test_gpu_count_when_env_unset():
    info = d(OMPI, gpu_count=4)
    assert info.gpu == 1 and info.sources["visible_gpus"] == "device count"


def test_printable_and_json():
    info = d(SRUN_STEP)
    text = str(info)
    assert "node[1-2]" in text and "[SLURM_PROCID]" in text
    doc = json.loads(info.to_json())
    assert (
        doc["rank"] == 3
        and doc["nodelist"] == ["node1", "node2"]
        and doc["sources"]["rank"] == "SLURM_PROCID"
    )


def test_frozen():
    info = d({})
    with pytest.raises(AttributeError):
        info.rank = 3


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, None),
        ("", ()),
        ("-1", ()),
        ("NoDevFiles", ()),
        ("0", ("0",)),
        ("0,1, 2", ("0", "1", "2")),
        ("GPU-abc,GPU-def", ("GPU-abc", "GPU-def")),
        ("MIG-abc", ("MIG-abc",)),
        # CUDA sees only the devices before the first invalid entry (0,-1,1 counted 2)
        ("0,-1,1", ("0",)),
        ("0,2,-1,1", ("0", "2")),
        ("1,x,0", ("1",)),
        # each entry as C's strtoul reads it (these read as no device, or two: an outside
        # hunt, against PyTorch's model of CUDA, torch.cuda._parse_visible_devices)
        ("0 1", ("0",)),
        ("1e", ("1",)),
        ("01,+2", ("1", "2")),
        ("-0", ("0",)),
        ("0,,1", ("0",)),
        (",0", ()),
        # a repeated device hides every device
        ("0,0", ()),
        ("1,0,1", ()),
        ("MIG-a,MIG-a", ()),
        # a UUID list ends at the first entry without its prefix
        ("GPU-abc,1", ("GPU-abc",)),
        ("MIG-a,GPU-b", ("MIG-a",)),
        ("none", ()),
        # a UUID list as given (PyTorch's model: " GPU-a" is an index list, so no device)
        (" GPU-aaaa", ()),
        ("GPU-aaaa,GPU-aaaa ", ("GPU-aaaa", "GPU-aaaa ")),
    ],
)
def test_parse_visible_devices(value, parsed):
    assert parse_visible_devices(value) == parsed


@pytest.mark.parametrize(
    ("visible", "lr", "ls", "gpu"),
    [(0, 0, 4, None), (1, 3, 4, 0), (4, 3, 4, 3), (8, 2, 4, 2), (4, 0, 1, 0)],
)
def test_choose_gpu(visible, lr, ls, gpu):
    assert choose_gpu(visible, lr, ls) == gpu


def test_choose_gpu_too_few_names_ranks_and_fix():
    with pytest.raises(GpuBindingError) as info:
        choose_gpu(2, 1, 4)
    msg = str(info.value)
    assert "local ranks [1, 3] would share GPU 1" in msg
    assert "--gpus-per-task=1" in msg and "HPCCOMM_ALLOW_GPU_SHARING=1" in msg
    assert isinstance(info.value, ValueError)


def test_choose_gpu_sharing():
    assert choose_gpu(2, 3, 4, allow_sharing=True) == 1


@pytest.mark.parametrize("module", ["hpccomm.discovery", "hpccomm"])
def test_import_leaves_mpi_and_cuda_alone(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith(('mpi4py', 'cupy'))))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_choose_gpu_too_few_names_a_real_pair_on_every_rank():
    for lr in range(3):
        with pytest.raises(GpuBindingError, match=r"local ranks \[0, 2\] would share GPU 0"):
            choose_gpu(2, lr, 3)


# --- Slurm variables that cannot belong to this process -------------------------------------

# Task 3's variables without srun's step variables: a shell started inside an allocation, a
# container that was handed a few variables. Neither a step (srun sets SLURM_STEP_ID and
# SLURM_STEP_NUM_TASKS in every task) nor a batch shell (always task 0).
LEFTOVER = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}


def test_task_variables_without_a_step_are_ignored_with_a_warning():
    info = d(LEFTOVER)
    assert info.launcher == "none"
    fields = (info.rank, info.size, info.local_rank, info.local_size, info.node_index)
    assert fields == (None, None, None, None, None) and info.nodelist is None
    assert info.job_id == "5"  # still the job this process runs in, if any
    [warning] = info.warnings
    assert warning.startswith(
        "ignored SLURM_PROCID=3, SLURM_LOCALID=1, SLURM_NTASKS=8 (Slurm job 5): this process is "
        "not a task of an srun step (SLURM_STEP_ID and SLURM_STEP_NUM_TASKS, which srun sets in "
        "every task, are missing) nor the batch shell (task 0; here SLURM_PROCID=3, "
        "SLURM_LOCALID=1): they were inherited or copied from another process"
    ), warning
    assert "rank and size come from MPI" in warning


def test_step_count_without_step_id_is_not_a_step():
    dropped = ("SLURM_STEP_ID", "SLURM_STEPID", "PMIX_RANK")  # (with PMIX_RANK, PMIx's row wins)
    info = d({k: v for k, v in SRUN_STEP.items() if k not in dropped})
    assert (info.launcher, info.rank, info.size, info.nodelist) == ("none", None, None, None)
    assert "SLURM_STEP_NUM_TASKS is set but SLURM_STEP_ID is not" in info.warnings[0]
    assert info.warnings[0].startswith("ignored SLURM_PROCID=3, SLURM_LOCALID=1, SLURM_NODEID=1")


def test_step_id_without_step_count_is_not_a_step():
    info = d({**BATCH_SHELL, "SLURM_STEP_ID": "0"})
    assert (info.launcher, info.rank) == ("none", None)
    assert "SLURM_STEP_ID is set but SLURM_STEP_NUM_TASKS is not" in info.warnings[0]


def test_no_job_id_still_ignored():
    info = d({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"})
    assert (info.launcher, info.rank, info.job_id) == ("none", None, None)
    assert info.warnings[0].startswith("ignored SLURM_PROCID=2, SLURM_NTASKS=4: ")


def test_launchers_own_variables_still_win_over_leftovers():
    info = d({**LEFTOVER, "PMIX_RANK": "3"})
    assert (info.launcher, info.rank, info.warnings) == ("pmi", 3, ())


def test_batch_shell_with_the_batch_scripts_step_id():
    # Slurm 26.05 exports the batch script's own step id (SLURM_BATCH_SCRIPT printed signed).
    info = d({**BATCH_SHELL, "SLURM_STEP_ID": "-5", "SLURM_STEPID": "-5"})
    assert (info.launcher, info.rank, info.size) == ("slurm-batch", 0, 1)


def test_batch_shell_warning_says_what_it_found():
    [warning] = d(BATCH_SHELL).warnings
    assert warning == (
        "this is the batch shell of Slurm job 43 (SLURM_JOB_ID is set, SLURM_STEP_ID and "
        "SLURM_STEP_NUM_TASKS are not): it runs as 1 process, not as rank 0 of SLURM_NTASKS=4; "
        "launch the ranks with srun"
    )


def test_salloc_shell_is_one_process():
    env = {"SLURM_JOB_ID": "44", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2"}  # fmt: skip
    info = d(env)
    assert (info.launcher, info.rank, info.size, info.nodelist) == (
        "slurm-batch",
        0,
        1,
        ("node1", "node2"),
    )
    [warning] = info.warnings
    assert warning.startswith("this is a shell of Slurm job 44 outside any srun step (salloc")
    assert "not as rank 0 of SLURM_NTASKS=4; launch the ranks with srun" in warning


# --- errors are hpccomm errors naming the variable ------------------------------------------


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ({**OMPI, "OMPI_COMM_WORLD_RANK": "x"}, "(openmpi): OMPI_COMM_WORLD_RANK='x' is not an integer"),
        ({**SRUN_STEP, "SLURM_NODEID": "5"}, "(slurm, rank 3 of 4): SLURM_NODEID=5 but SLURM_STEP_TASKS_PER_NODE='2(x2)' lists only 2 nodes"),
        ({**SRUN_STEP, "SLURM_STEP_NODELIST": "node[1-"}, "(slurm, rank 3 of 4): SLURM_STEP_NODELIST='node[1-' is not a Slurm hostlist: hostlist 'node[1-': '[' without ']' at position 4"),
        ({**SRUN_STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x"}, "(slurm, rank 3 of 4): SLURM_STEP_TASKS_PER_NODE='2(x' is not a Slurm tasks-per-node list"),
        ({**BATCH_SHELL, "SLURM_JOB_NODELIST": "n[3-1]"}, "(slurm-batch): SLURM_JOB_NODELIST='n[3-1]' is not a Slurm hostlist"),
        # the rank (and size) the launcher gave, where they were read before the error; the
        # batch shell's rank 0 of 1 is hpccomm's, not a variable's: not named
        ({**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "5"}, "(openmpi, rank 5 of 8): local rank 5 (OMPI_COMM_WORLD_LOCAL_RANK) is not below the local size 4"),
        ({**OMPI, "OMPI_COMM_WORLD_SIZE": "y"}, "(openmpi, rank 5): OMPI_COMM_WORLD_SIZE='y' is not an integer >= 0"),
        ({**OMPI, "OMPI_COMM_WORLD_SIZE": "4"}, "(openmpi, rank 5): rank 5 (OMPI_COMM_WORLD_RANK) is not below the size 4"),
        ({**SRUN_STEP, "SLURM_LOCALID": "5"}, "(slurm, rank 3 of 4): local rank 5 (SLURM_LOCALID) is not below the local size 2"),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "z"}, "(hydra, rank 1 of 2): MPI_LOCALNRANKS='z' is not an integer"),
    ],
)  # fmt: skip
def test_malformed_variables_are_invalid_argument_errors(env, text):
    with pytest.raises(InvalidArgumentError) as err:
        d(env)
    assert str(err.value).startswith(f"launch discovery {text}"), str(err.value)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"SLURM_LOCALID": "5"}, r"local rank 5 \(SLURM_LOCALID\) is not below the local size 2"),
        ({"SLURM_PROCID": "9"}, r"rank 9 \(SLURM_PROCID\) is not below the size 4"),
        ({"SLURM_PROCID": "1_0"}, r"SLURM_PROCID='1_0' is not an integer >= 0"),
        ({"SLURM_PROCID": "-1"}, r"SLURM_PROCID='-1' is not an integer >= 0"),
        ({"SLURM_PROCID": "\u0663"}, r"is not an integer >= 0"),  # Arabic-Indic digit 3
    ],
)
def test_launcher_values_that_contradict_each_other_are_refused(changes, said):
    # They were taken as they came: local rank 5 of 2 (and GPU 5 of 2 visible), rank 9 of
    # 4, "1_0" as 10, -1
    with pytest.raises(ValueError, match=said):
        d({**SRUN_STEP, **changes})


def test_torchrun_world_size_zero_is_refused():
    env = {"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip
    with pytest.raises(ValueError, match=r"WORLD_SIZE='0', expected a count >= 1"):
        d(env)


def test_a_step_tasks_list_that_contradicts_the_step_is_refused():
    # "2(x3),1" is 7 tasks on 4 nodes for a step of 4 tasks on 2 nodes: it was read as it came
    env = {**SRUN_STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "0"}
    with pytest.raises(ValueError, match=r"lists 7 tasks on 4 nodes, but the step has 4 tasks"):
        d(env)


def test_on_off_settings_are_spelt_alike():
    # HPCCOMM_ALLOW_GPU_SHARING took " 1" as off and ignored a typo silently;
    # HPCCOMM_ABORT_ON_EXCEPTION took only "0" as off ("off", "false" still aborted)
    import pytest

    from hpccomm import runtime
    from hpccomm.errors import InvalidArgumentError
    from hpccomm.gpuselect import sharing_allowed

    assert sharing_allowed({"HPCCOMM_ALLOW_GPU_SHARING": " On "})
    assert not sharing_allowed({"HPCCOMM_ALLOW_GPU_SHARING": "no"})
    assert not sharing_allowed({"HPCCOMM_ALLOW_GPU_SHARING": "yse"})  # (discovery: off)
    with pytest.raises(InvalidArgumentError, match="HPCCOMM_ALLOW_GPU_SHARING is 'yse'"):
        sharing_allowed({"HPCCOMM_ALLOW_GPU_SHARING": "yse"}, strict=True)
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("HPCCOMM_ABORT_ON_EXCEPTION", "off")
        assert runtime._abort_on_exception() is False
        mp.setenv("HPCCOMM_ABORT_ON_EXCEPTION", "nope")
        assert runtime._abort_on_exception() is True
        with pytest.raises(InvalidArgumentError, match="HPCCOMM_ABORT_ON_EXCEPTION is 'nope'"):
            runtime._abort_on_exception(strict=True)
    finally:
        mp.undo()


@pytest.mark.parametrize(
    ("env", "text"),
    [
        # the step's node list against the step's node count and the task's node index
        (
            {**SRUN_STEP, "SLURM_STEP_NODELIST": "node[1-3]"},
            "(slurm, rank 3 of 4): SLURM_STEP_NODELIST='node[1-3]' lists 3 nodes, but "
            "SLURM_STEP_NUM_NODES=2; the launcher's variables contradict each other",
        ),
        (
            {k: v for k, v in SRUN_STEP.items() if "TASKS_PER_NODE" not in k and k != "SLURM_STEP_NUM_NODES"}
            | {"SLURM_NODEID": "3", "SLURM_STEP_NODELIST": "n[1-2]"},
            "(slurm, rank 3 of 4): SLURM_NODEID=3 but SLURM_STEP_NODELIST='n[1-2]' lists only 2 nodes",
        ),
        # counts above the size
        (
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            "(openmpi, rank 0 of 2): local size 4 (OMPI_COMM_WORLD_LOCAL_SIZE) is above the "
            "size 2 (OMPI_COMM_WORLD_SIZE); the launcher's variables contradict each other",
        ),
        (
            {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
             "LOCAL_WORLD_SIZE": "4"},
            "(torchrun, rank 1 of 2): local size 4 (LOCAL_WORLD_SIZE) is above the size 2 (WORLD_SIZE)",
        ),
        (
            {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "5"},
            "(slurm, rank 1 of 2): num nodes 5 (SLURM_STEP_NUM_NODES) is above the size 2 "
            "(SLURM_STEP_NUM_TASKS)",
        ),
        (
            {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_TASKS_PER_NODE": "4"},
            "(slurm, rank 1 of 2): local size 4 (SLURM_TASKS_PER_NODE[SLURM_NODEID]) is above "
            "the size 2 (SLURM_STEP_NUM_TASKS)",
        ),
    ],
)  # fmt: skip
def test_counts_and_node_lists_that_contradict_each_other_are_refused(env, text):
    # They were taken as they came: a step of 2 nodes on a list of 3, node 3 of a list of 2,
    # 4 ranks on a node of a job of 2, 5 nodes for 2 tasks
    with pytest.raises(InvalidArgumentError) as err:
        d(env)
    assert str(err.value).startswith(f"launch discovery {text}"), str(err.value)


def test_job_wide_values_are_not_checked_against_the_step():
    # SLURM_JOB_NODELIST and SLURM_JOB_NUM_NODES cover the job, the step may use part of it;
    # the batch shell is one process of a job of many nodes (its size is hpccomm's, not a
    # variable's)
    step = {**SRUN_STEP, "SLURM_JOB_NODELIST": "node[1-8]", "SLURM_JOB_NUM_NODES": "8"}
    info = d(step)
    assert (info.num_nodes, info.nodelist) == (2, ("node1", "node2"))
    shell = d({**BATCH_SHELL, "SLURM_JOB_NUM_NODES": "6", "SLURM_JOB_NODELIST": "n[1-6]"})
    assert (shell.size, shell.num_nodes, len(shell.nodelist)) == (1, 6, 6)
    # a step of one task on one node of a bigger job (srun --pty bash)
    pty = d({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NUM_NODES": "1",
             "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_NTASKS": "4",
             "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4"})  # fmt: skip
    assert (pty.size, pty.num_nodes, pty.nodelist) == (1, 1, ("n1",))
    # a step without SLURM_STEP_NUM_NODES: the node count falls back to the job's
    # SLURM_NNODES, which may be above the step's task count
    bare = d({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NNODES": "4"})  # fmt: skip
    assert (bare.size, bare.num_nodes) == (2, 4)
