"""hpccomm bench and the profiler across the two nodes of the test cluster (srun steps)."""

import json


def test_bench_across_two_nodes(cluster, tmp_path):
    out = tmp_path / "bench.json"
    run = cluster.run(
        [
            "srun",
            "-N2",
            "-n2",
            "--mpi=pmix",
            "--kill-on-bad-exit=1",
            str(cluster.bin / "hpccomm"),
            "bench",
            "-o",
            "all_reduce,all_gather,send_recv",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "16",
            "-n",
            "3",
            "--rounds",
            "2",
            "--peer",
            "mpi4py",
            "--json",
            str(out),
            "-q",
        ],  # fmt: skip
        timeout=180,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 2 and doc["hosts"] == ["node1", "node2"]
    rows = doc["groups"][0]["rows"]
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "send_recv"}
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows)
    assert all(r["peers"]["mpi4py"]["time_us"] > 0 for r in rows)


def test_profile_names_a_straggler_on_the_other_node(cluster, tmp_path):
    prof = tmp_path / "prof"
    script = tmp_path / "job.py"
    script.write_text(
        "import time, numpy as np, hpccomm\n"
        "c = hpccomm.init()\n"
        "tp = c.layout(tp=2).tp\n"
        "for _ in range(6):\n"
        "    if c.rank == 3:\n"
        "        time.sleep(0.05)\n"
        "    c.all_reduce(np.ones(1024))\n"
        "    tp.all_gather(np.ones(16))\n"
    )
    env = {"HPCCOMM_PROFILE": str(prof)}
    run = cluster.run(
        [
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            "srun",
            "-N2",
            "-n4",
            "--mpi=pmix",
            "--kill-on-bad-exit=1",
            str(cluster.bin / "python"),
            str(script),
        ],  # fmt: skip
        timeout=180,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    summary = (prof / "summary.txt").read_text()
    assert summary.startswith("hpccomm profile: 4 ranks on 2 host(s) (node1, node2)")
    assert "world [0, 1, 2, 3]: rank 3 arrived last in" in summary, summary
    doc = json.loads((prof / "profile.json").read_text())
    assert doc["clock"]["bound_us"] is not None and doc["clock"]["bound_us"] < 5000
    trace = json.loads((prof / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"rank 0 (node1)", "rank 1 (node1)", "rank 2 (node2)", "rank 3 (node2)"}
