"""init() in a plain python process that holds another process's Slurm variables: the
warning or the error says what was found and why it was ignored or why it is wrong."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("mpiexec")  # without mpiexec (no MPI installed) all skip

CODE = "import hpccomm; c = hpccomm.init(); print(c.rank, c.size, c.launch.launcher)"


def run_init(mpi_env, variables):
    env = dict(mpi_env)  # no launcher variables of our own; root allowed
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, env=env
    )


def test_task_variables_outside_a_step_are_ignored_with_a_warning(mpi_env):
    # A shell inside an salloc allocation, or a container handed these: no SLURM_STEP_*.
    out = run_init(
        mpi_env,
        {"SLURM_JOB_ID": "5", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "none"]
    assert "RuntimeWarning: hpccomm: ignored SLURM_PROCID=3, SLURM_LOCALID=1, SLURM_NTASKS=8" in (
        out.stderr
    )
    assert "not a task of an srun step" in out.stderr
    assert "LaunchMismatchError" not in out.stderr


def test_step_variables_in_a_one_rank_world_name_both_causes(mpi_env):
    # What a task of `srun -n8` sees, in a process that MPI started alone: either srun ran
    # without an MPI plug-in, or python was started by hand inside the step.
    out = run_init(
        mpi_env,
        {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8",
         "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "8",
         "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_STEP_NODELIST": "n1"},
    )  # fmt: skip
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "hpccomm.errors.LaunchMismatchError: init (rank 0 of 1): broken launch: rank is 3 from "
        "SLURM_PROCID but 0 from MPI COMM_WORLD; size is 8 from SLURM_STEP_NUM_TASKS but 1 from "
        "MPI COMM_WORLD"
    ), last
    assert "srun --mpi=pmix" in last  # a real step launched without an MPI plug-in
    assert "SLURM_STEP_ID and SLURM_STEP_NUM_TASKS say srun started it as a task" in last
    assert "not started by that launcher but inherited" in last  # or not one of its tasks


def test_warnings_point_at_the_programs_init_line(mpi_env):
    # they named hpccomm's own wrapper (runtime.py, "return fn(*args, **kwargs)") as the
    # place to look
    out = run_init(mpi_env, {"SLURM_JOB_ID": "5", "SLURM_PROCID": "3", "SLURM_NTASKS": "8"})
    assert out.returncode == 0, out.stderr
    assert "<string>:1: RuntimeWarning: hpccomm: ignored SLURM_PROCID=3" in out.stderr, out.stderr


def test_a_node_index_only_mpi_contradicts_is_said(mpi_env):
    # the launcher's node index and count against MPI's node leaders: found after MPI
    # started, kept in comm.launch.warnings, never said (an outside hunt)
    out = run_init(
        mpi_env,
        {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
         "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "torchrun"]
    said = "node_index is 1 from GROUP_RANK but 0 from MPI node leaders"
    assert f"<string>:1: RuntimeWarning: hpccomm: {said}" in out.stderr, out.stderr


@pytest.mark.parametrize("values", ["0 0 1", "2 2 2"])
def test_local_ranks_that_are_no_permutation_are_named_on_every_rank(mpiexec, mpi_env, values):
    # Open MPI's local ranks overridden per rank (as a wrong SLURM_LOCALID would be): one
    # value twice made the ranks holding valid values after it fail ("local rank is 1 from
    # ... but 2 from the MPI COMM_TYPE_SHARED split"), and rank 0 said only "3 other rank(s)
    # found the environment disagreeing with MPI (see their errors)" (an outside hunt)
    wrap = (
        f'set -- {values} "$@"; shift $OMPI_COMM_WORLD_RANK; v=$1; shift $((3 - '
        f'$OMPI_COMM_WORLD_RANK)); OMPI_COMM_WORLD_LOCAL_RANK=$v exec "$@"'
    )
    out = subprocess.run([mpiexec, "--oversubscribe", "-n", "3", "sh", "-c", wrap, "sh", sys.executable, "-c", CODE],
                         capture_output=True, text=True, timeout=120, env=mpi_env)  # fmt: skip
    assert out.returncode != 0
    said = (
        "given more than once: 0 on ranks [0, 1], missing: [2]"
        if values == "0 0 1"
        else "given more than once: 2 on ranks [0, 1, 2], missing: [0, 1]"
    )
    for r in range(3):
        assert (
            f"init (rank {r} of 3): broken launch: local ranks from OMPI_COMM_WORLD_LOCAL_RANK "
            f"on this node ("
        ) in out.stderr, out.stderr
    assert (
        out.stderr.count(
            f"world ranks [0, 1, 2], by the MPI COMM_TYPE_SHARED split) are not 0..2 once each: {said}"
        )
        == 3
    ), out.stderr


def test_a_node_where_some_ranks_have_no_local_rank_names_them(mpiexec, mpi_env):
    # local ranks 0, none, 0: the message quoted a place "1 from the MPI COMM_TYPE_SHARED
    # split" made by filling rank 1's gap with its world rank (a review)
    wrap = (
        'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then unset OMPI_COMM_WORLD_LOCAL_RANK; else '
        'OMPI_COMM_WORLD_LOCAL_RANK=0; export OMPI_COMM_WORLD_LOCAL_RANK; fi; exec "$@"'
    )
    out = subprocess.run([mpiexec, "--oversubscribe", "-n", "3", "sh", "-c", wrap, "sh", sys.executable, "-c", CODE],
                         capture_output=True, text=True, timeout=120, env=mpi_env)  # fmt: skip
    assert out.returncode != 0
    said = "are not 0..2 once each: given more than once: 0 on ranks [0, 2]; world rank(s) [1]"
    assert out.stderr.count(said) == 3, out.stderr
    assert "from the MPI COMM_TYPE_SHARED split" not in out.stderr, out.stderr
