"""hpccomm on a real two-node Slurm cluster: srun steps, the job templates, the batch shell,
mpirun inside an allocation, a job array and `hpccomm sbatch --submit`."""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
JOBS = Path(__file__).resolve().parents[2] / "jobs"


def srun_json(cluster, *args):
    out = cluster.run(["srun", *args, "--mpi=pmix", str(cluster.bin / "hpccomm"), "info", "--json"])
    assert out.returncode == 0, f"srun failed:\n{out.stdout}\n{out.stderr}"
    return json.loads(out.stdout)


def sbatch_wait(cluster, script, tmp_path, *args, extra_env=None):
    """Submit, wait (bounded), return (job id, output text). A failed job's output goes into
    the assertion message."""
    log = tmp_path / "job-%j.out"
    env = cluster.env()
    env.update(extra_env or {})
    cmd = ["sbatch", "--parsable", "--wait", f"--output={log}", "--time=5", *args, str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        jobs = cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()
        cluster.run(["scancel", *jobs])
        pytest.fail(
            f"job did not finish in 240 s: {cmd}; outputs: {[p.read_text() for p in tmp_path.glob('job-*.out')]}"
        )
    job = stdout.strip().split(";")[0]
    text = "\n".join(p.read_text() for p in sorted(tmp_path.glob("job-*.out")))
    assert proc.returncode == 0, (
        f"job {job} failed ({proc.returncode}): {stderr}\n--- job output ---\n{text}"
    )
    return job, text


def test_srun_two_nodes_four_ranks(cluster):
    infos = sorted(srun_json(cluster, "-N2", "-n4"), key=lambda d: d["rank"])
    assert [d["rank"] for d in infos] == [0, 1, 2, 3]
    assert {d["num_nodes"] for d in infos} == {2}
    assert [d["local_rank"] for d in infos] == [0, 1, 0, 1]
    assert [d["node_index"] for d in infos] == [0, 0, 1, 1]
    assert [d["hostname"] for d in infos] == ["node1", "node1", "node2", "node2"]
    assert {tuple(d["nodelist"]) for d in infos} == {("node1", "node2")}
    assert {d["launcher"] for d in infos} == {"slurm"}
    assert infos[0]["sources"]["local_size"] == "SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID]"


def test_arbitrary_distribution_numbers_nodes_as_the_communicator_does(cluster, tmp_path):
    # rank 0 on node2: Slurm numbers it node 1 (SLURM_NODEID), hpccomm by lowest rank (0).
    # Every rank warned "node_index is 1 from SLURM_NODEID but 0 from MPI node leaders" for
    # this valid launch, and `hpccomm info` showed a node index comm.node_index did not have
    hosts = tmp_path / "hosts"
    hosts.write_text("node2\nnode1\nnode1\nnode2\n")
    env = cluster.env()
    env["SLURM_HOSTFILE"] = str(hosts)
    cmd = ["srun", "-n4", "--distribution=arbitrary", "--mpi=pmix",
           str(cluster.bin / "hpccomm"), "info", "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, f"srun failed:\n{out.stdout}\n{out.stderr}"
    infos = sorted(json.loads(out.stdout), key=lambda d: d["rank"])
    assert [d["hostname"] for d in infos] == ["node2", "node1", "node1", "node2"]
    assert [d["node_index"] for d in infos] == [0, 1, 1, 0]  # by lowest rank, as comm's
    assert "SLURM_NODEID numbers it 1" in infos[0]["sources"]["node_index"], infos[0]
    assert not any("node_index is" in w for d in infos for w in d["warnings"]), infos


def test_srun_uneven_layout(cluster):
    infos = sorted(srun_json(cluster, "-N2", "-n3"), key=lambda d: d["rank"])
    assert [d["local_size"] for d in infos] == [2, 2, 1]
    assert [d["node_index"] for d in infos] == [0, 0, 1]


def test_batch_shell_is_not_a_step(cluster, tmp_path):
    script = tmp_path / "shell.sh"
    script.write_text("#!/bin/bash\nhpccomm info --no-mpi --json\n")
    _, text = sbatch_wait(cluster, script, tmp_path, "-N2", "-n4")
    doc = json.loads(text.strip().splitlines()[-1])
    assert (doc["launcher"], doc["rank"], doc["size"]) == ("slurm-batch", 0, 1)
    assert doc["nodelist"] == ["node1", "node2"]
    assert "launch the ranks with srun" in doc["warnings"][0]


def test_cpu_template_doctor_passes_across_both_nodes(cluster, tmp_path):
    _, text = sbatch_wait(cluster, JOBS / "cpu-mpi.sbatch", tmp_path)
    assert "doctor: 16 of 16 operations passed on 4 ranks" in text, text
    assert "node1" in text and "node2" in text


def test_mpirun_inside_allocation_is_open_mpi(cluster, tmp_path):
    _, text = sbatch_wait(
        cluster,
        JOBS / "mpirun-in-allocation.sbatch",
        tmp_path,
        extra_env={"HPCCOMM_CMD": "hpccomm info --json"},
    )
    infos = json.loads(text[text.index("[") :])
    assert len(infos) == 4 and {d["launcher"] for d in infos} == {"openmpi"}
    assert sorted(d["hostname"] for d in infos) == ["node1", "node1", "node2", "node2"]
    assert {d["num_nodes"] for d in infos} == {2}


def test_job_array_sees_task_id(cluster, tmp_path):
    log = tmp_path / "arr-%A_%a.out"
    env = cluster.env()
    out = subprocess.run(
        ["sbatch", "--parsable", "--wait", f"--output={log}", "--time=5", str(JOBS / "job-array.sbatch")],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    texts = {p.name: p.read_text() for p in tmp_path.glob("arr-*.out")}
    assert out.returncode == 0, f"{out.stderr}\n{texts}"
    job = out.stdout.strip().split(";")[0]
    assert len(texts) == 2, texts
    for task in (0, 1):
        text = texts[f"arr-{job}_{task}.out"]
        assert f"array task {task} of job {job}" in text
        rows = [line.split() for line in text.splitlines() if line[:1].isdigit()]
        # Slurm's name for the element (its own SLURM_JOB_ID differs: 84[0] for 83_0)
        assert rows and all(row[-1] == f"{job}_{task}" for row in rows), text


def test_hpccomm_sbatch_submit(cluster, tmp_path):
    # a job name and a log path with spaces: written in double quotes (unquoted, sbatch
    # refused the script: "Invalid directive found in batch script: job")
    (tmp_path / "logs here").mkdir()
    log = tmp_path / "logs here" / "gen-%j.out"
    out = cluster.run(
        [str(cluster.bin / "hpccomm"), "sbatch", "-N", "2", "--ntasks-per-node", "2", "--time", "5", "--job-name", "gen job",
         "--output", str(log), "--submit", "--", "hpccomm", "info", "--json"],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert job.isdigit()
    deadline = time.monotonic() + 180
    while cluster.run(["squeue", "-h", "-j", job]).stdout.strip():
        if time.monotonic() > deadline:
            cluster.run(["scancel", job])
            pytest.fail(f"job {job} still queued or running after 180 s")
        time.sleep(0.5)
    text = Path(str(log).replace("%j", job)).read_text()
    infos = json.loads(text)
    assert sorted(d["node_index"] for d in infos) == [0, 0, 1, 1]


def test_templates_are_valid_bash_with_headers():
    for path in sorted(JOBS.glob("*.s*")):  # the shell scripts and batch templates
        assert (
            subprocess.run(["bash", "-n", str(path)], capture_output=True, timeout=10).returncode
            == 0
        ), path
        head = path.read_text().splitlines()[1]
        assert head.startswith("# ") and len(head) > 20, path


def test_srun_without_pmix_is_named_not_hung(cluster):
    out = cluster.run(["srun", "-N2", "-n2", "--mpi=none", str(cluster.bin / "hpccomm"), "info"])
    assert out.returncode != 0
    assert "size is 2 from SLURM_STEP_NUM_TASKS but 1 from MPI COMM_WORLD" in out.stderr, out.stderr
    assert "srun --mpi=pmix" in out.stderr


def test_a_killed_task_ends_the_step_naming_it(cluster, tmp_path):
    # srun's default lets the other tasks run on into a collective with the dead one;
    # --kill-on-bad-exit=1 (in every template and hpccomm sbatch) ends the step.
    script = tmp_path / "kill.py"
    script.write_text(
        "import os, numpy as np, hpccomm\n"
        "c = hpccomm.init(timeout=60)\n"
        "c.all_reduce(np.ones(2))\n"
        "if c.rank == 3:\n"
        "    os.kill(os.getpid(), 9)\n"
        "c.all_reduce(np.ones(2))\n"
    )
    t0 = time.monotonic()
    out = cluster.run(
        ["srun", "-N2", "-n4", "--mpi=pmix", "--kill-on-bad-exit=1",
         str(cluster.bin / "python"), str(script)],
        timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    # srun names the dead task alone or within a range ("node2: tasks 2-3: Killed")
    named = re.search(r"tasks? (\d+-)?3(-\d+)?: Killed", out.stderr)
    assert named and "CANCELLED" in out.stderr, out.stderr
    assert time.monotonic() - t0 < 50  # not the 60 s timeout: the step ended at once


def test_flight_recorder_on_sigterm_across_nodes(cluster, tmp_path):
    # What Slurm sends at a time limit (SIGTERM, via scancel here) reaches ranks stuck in
    # mismatched collectives on both nodes; each writes its trace and the analysis names
    # the call every rank is stuck in.
    trace = tmp_path / "trace"
    script = tmp_path / "hang.py"
    script.write_text(
        "import numpy as np, hpccomm\n"
        f"c = hpccomm.init(trace_dir={str(trace)!r})\n"
        "c.all_reduce(np.ones(3))\n"
        "print('ready', flush=True)\n"
        "c.barrier() if c.rank == 3 else c.all_reduce(np.ones(8))\n"
    )
    proc = subprocess.Popen(
        ["srun", "-N2", "-n4", "--mpi=pmix", "--job-name=hpccomm-trace",
         str(cluster.bin / "python"), str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env(),
    )  # fmt: skip
    try:
        ready, deadline = 0, time.monotonic() + 90
        while ready < 4 and time.monotonic() < deadline:
            ready += proc.stdout.readline().startswith("ready")
        assert ready == 4, proc.stderr.read() if proc.poll() is not None else "not ready"
        time.sleep(1.0)
        jobs = cluster.run(["squeue", "-h", "-n", "hpccomm-trace", "-o", "%i"]).stdout.split()
        assert jobs, "the job is not in the queue"
        cluster.run(["scancel", "--signal=TERM", *jobs])
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            cluster.run(["scancel", "-n", "hpccomm-trace"])
    files = sorted(p.name for p in trace.glob("rank*.json"))
    assert files == [f"rank{r:05d}.json" for r in range(4)], files
    out = cluster.run([str(cluster.bin / "hpccomm"), "trace", "analyze", str(trace)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        "world #2: ranks 0-3 entered different calls (ranks 0-2 all_reduce; rank 3 barrier)"
    ), out.stdout
    assert "(dumps written on: SIGTERM)" in out.stdout


LAYOUT_SCRIPT = """
import sys, warnings
sys.path.insert(0, {root!r})
import hpccomm
assert hpccomm.__file__.startswith({root!r}), hpccomm.__file__
c = hpccomm.init(timeout=60)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    groups = c.layout(tp=2)
    tp = groups.tp
said = [str(w.message) for w in caught if issubclass(w.category, hpccomm.PlacementWarning)]
print(f"rank {{c.rank}} node {{c.node_index}} tp {{tp.translate(range(tp.size), c)}} "
      f"nodes {{tp.num_nodes}} warned {{said}}", flush=True)
groups.free()
"""


@pytest.mark.parametrize("placed", ["node1 node1 node2 node2", "node1 node2 node1 node2"],
                         ids=["block", "round_robin"])  # fmt: skip
def test_a_tp_group_placed_across_nodes_is_warned_of_on_rank_0(cluster, tmp_path, placed):
    # Ranks placed round-robin across nodes (srun --distribution=cyclic, mpirun --map-by
    # node) put every tp=2 group of a layout on two nodes: its collectives cross the network
    # every layer. Rank 0 warns (PlacementWarning); placed node by node, nobody does.
    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "layout.py"
    script.write_text(LAYOUT_SCRIPT.format(root=root))
    hosts = tmp_path / "hosts"
    hosts.write_text("\n".join(placed.split()) + "\n")
    env = cluster.env()
    env["SLURM_HOSTFILE"] = str(hosts)
    cmd = ["srun", "-n4", "--distribution=arbitrary", "--mpi=pmix", "--kill-on-bad-exit=1",
           str(cluster.bin / "python"), str(script)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, f"srun failed:\n{out.stdout}\n{out.stderr}"
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 4, out.stdout
    across = placed.split()[0] != placed.split()[1]
    for r, line in enumerate(lines):
        assert f"nodes {2 if across else 1} " in line, line
        if across and r == 0:
            assert (
                "warned [\"hpccomm: layout group tp on world (rank 0's: ranks [0, 1]) "
                "spans 2 nodes, though rank 0's node holds 2 ranks of world" in line
            ), line
        else:
            assert line.endswith("warned []"), line


def test_info_says_the_hierarchical_path_is_off_for_one_rank_per_node(cluster):
    # It said "hierarchical all_reduce across nodes" where the first call then refused the
    # layout (one rank per node; 2 + 1), an outside hunt
    env = {**cluster.env(), "HPCCOMM_SHM_THRESHOLD": "0"}
    out = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "--mpi=pmix", str(cluster.bin / "hpccomm"), "info"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert (
        "shared-memory fast path: off across nodes: ranks per node [1, 1]: not the same on "
        "every node, or < 2" in out.stdout
    ), out.stdout


@pytest.mark.parametrize("threshold", [None, "256K"])
def test_info_names_the_hierarchical_path_only_where_a_threshold_runs_it(cluster, threshold):
    # Without HPCCOMM_SHM_THRESHOLD no call takes the hierarchical path; info named it all
    # the same ("... across nodes (from HPCCOMM_SHM_THRESHOLD only)"), an outside hunt
    env = {**cluster.env(), "HPCCOMM_SHM_THRESHOLD": threshold or ""}
    if threshold is None:
        del env["HPCCOMM_SHM_THRESHOLD"]
    out = subprocess.run(
        ["srun", "-N2", "-n4", "--mpi=pmix", str(cluster.bin / "hpccomm"), "info"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    line = next(t for t in out.stdout.splitlines() if t.startswith("shared-memory fast path: "))
    if threshold is None:
        assert line == (
            "shared-memory fast path: off across nodes: HPCCOMM_SHM_THRESHOLD is not set (the "
            "hierarchical all_reduce is not measured across real nodes: it runs only from a size "
            "given)"
        ), out.stdout
    else:
        assert line.startswith(
            "shared-memory fast path: hierarchical all_reduce across nodes from 262,144 bytes "
            "(HPCCOMM_SHM_THRESHOLD); inside each node "
        ), out.stdout
