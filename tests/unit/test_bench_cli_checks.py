"""hpccomm bench's and doctor's flags refused before MPI starts (the CLI in-process, with
init() replaced by a failure): --plot formats, -r values, --group syntax, output paths on
every rank of rank 0's node, doctor --timeout; and the README's flag table against the
parser."""

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest

import hpccomm.cli as cli
from hpccomm import bench
from hpccomm.cli import build_parser, main
from hpccomm.discovery import discover
from hpccomm.errors import HpccommError, InvalidArgumentError

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def no_mpi(monkeypatch):
    """init() fails the test: a refusal must come before MPI starts."""

    def init():
        raise AssertionError("MPI started before the flags were checked")

    monkeypatch.setattr(cli, "init", init)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpccomm: "), err
    return err


# -- --plot: a format matplotlib writes, named by the extension --------------------------------


@pytest.mark.parametrize("name", ["out.xyz", "out"])
def test_plot_format_is_refused_before_mpi(no_mpi, tmp_path, capsys, name):
    # out.xyz: a ValueError from matplotlib after the whole sweep, MPI_ABORT, status 1;
    # out: matplotlib wrote out.png without a word
    pytest.importorskip("matplotlib", reason="the 'plot' extra (matplotlib) is not installed")
    path = tmp_path / name
    assert main(["bench", "--plot", str(path)]) == 2
    err = _one_line(capsys)
    why = (
        "the extension .xyz is not a format matplotlib writes"
        if name == "out.xyz"
        else f"it has no extension (matplotlib would write {path}.png instead)"
    )
    assert err.startswith(f"hpccomm: bench --plot: cannot write {path}: {why}, expected one of "), (
        err
    )
    assert ".png, " in err and ".pdf, " in err and ".svg, " in err


def test_plot_accepts_what_matplotlib_writes(tmp_path):
    pytest.importorskip("matplotlib", reason="the 'plot' extra (matplotlib) is not installed")
    for name in ("a.png", "a.PDF", "a.svg"):
        bench.check_plot_format(tmp_path / name)


# -- -r: what the message offers is what is accepted ------------------------------------------


@pytest.mark.parametrize("redop", ["band", "bor", "BXOR", "premul_sum(2.0)", "product"])
def test_redops_the_check_cannot_verify_are_refused_before_mpi(no_mpi, capsys, redop):
    # band/bor/bxor ran the first size, then every rank failed with "-c cannot check";
    # premul_sum(2.0) was refused by a message offering PREMUL_SUM(f)
    assert main(["bench", "-r", redop, "-d", "int32"]) == 2
    err = _one_line(capsys)
    assert err == f"hpccomm: bench: -r {redop!r}, expected one of sum, prod, min, max, avg\n"


def test_redops_agree_with_the_help_and_the_readme():
    for redop in bench._REDOPS:
        bench.BenchOptions(redop=redop, dtype="float32").normalized()
    (row,) = [line for line in README.read_text().splitlines() if line.startswith("| `-r` |")]
    assert "sum (default), prod, min, max, avg" in row
    helps = {a.dest: a.help for a in _bench_parser()._actions}
    assert "sum (default), prod, min, max, avg" in helps["redop"]


# -- --group: its syntax before MPI --------------------------------------------------------


@pytest.mark.parametrize(
    "spec, said",
    [
        ("tp=2,tp=1", "tp is given twice (tp=2 and tp=1), expected each dimension once"),
        ("foo", "'foo' is not DIM=SIZE"),
        ("tp=0", "tp is 0, expected a size >= 1"),
        ("tp=2,order=tp-dp,order=dp-tp", "order is given twice"),
        ("tp=2:xx", "--group 'tp=2:xx': "),
    ],
)
def test_group_syntax_is_refused_before_mpi(no_mpi, capsys, spec, said):
    # tp=2,tp=1 ran with the last value; the others were refused only after MPI init
    assert main(["bench", "--group", spec]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"hpccomm: bench: --group {spec!r}: ") and said in err, err


def test_group_sizes_are_checked_against_the_world_at_init():
    bench.BenchOptions(group="tp=3").normalized()  # fits some world: only init can tell
    with pytest.raises(ValueError, match=r"--group 'tp=3': layout: world 2 is not divisible"):
        bench.parse_group("tp=3", 2)
    with pytest.raises(ValueError, match="tp is given twice"):
        bench.parse_group("tp=2,tp=1", 4)


# -- --json / --plot paths: every rank that can tell refuses ----------------------------------


def _launch(**kw):
    return dataclasses.replace(discover(), launcher="openmpi", **kw)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_a_rank_on_rank_0s_node_refuses_a_bad_path_too(monkeypatch, no_mpi, tmp_path, capsys, flag):
    # rank 1 went on into MPI's start while rank 0 refused (killed by mpiexec; under srun
    # without --kill-on-bad-exit, waiting for rank 0)
    monkeypatch.setattr(bench, "check_plot_available", lambda: None)
    monkeypatch.setattr(bench, "check_plot_format", lambda path: None)
    monkeypatch.setattr(cli, "discover", lambda: _launch(rank=1, size=2, local_size=2))
    missing = tmp_path / "nonexistent" / "x.png"
    assert main(["bench", flag, str(missing)]) == 2
    assert _one_line(capsys) == (
        f"hpccomm: bench {flag}: cannot write {missing}: no directory {missing.parent}\n"
    )


def test_a_rank_on_another_node_leaves_the_path_to_rank_0(monkeypatch, tmp_path):
    # its node may lack the folder rank 0 writes into: it cannot tell, so it starts MPI
    class Started(Exception):
        pass

    def init():
        raise Started

    monkeypatch.setattr(cli, "init", init)
    monkeypatch.setattr(cli, "discover", lambda: _launch(rank=3, size=4, local_size=2, num_nodes=2))
    with pytest.raises(Started):
        main(["bench", "--json", str(tmp_path / "nonexistent" / "x.json")])


# -- doctor --timeout: refused by argparse, naming the flag ---------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_doctor_timeout_is_refused_naming_the_flag(no_mpi, capsys, value):
    # was: "timeout on world/dup (rank 0 of 2): timeout is 0.0, expected finite seconds > 0
    # or None" after MPI started
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "--timeout", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --timeout: {value!r}, expected finite seconds > 0" in err, err
    assert "world/dup" not in err and "None" not in err


def test_doctor_timeout_past_what_waits_take_is_refused(no_mpi, capsys):
    # 1e10: two false FAILs (OverflowError inside the operations), then "16 of 16 passed"
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "--timeout", "1e10"])
    assert exc.value.code == 2
    assert "argument --timeout: '1e10', more than 1,000,000,000 seconds" in capsys.readouterr().err


# -- the README's table and the CLI help agree -----------------------------------------------


def _bench_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["bench"]


def test_every_bench_flag_is_in_the_readme_table():
    # --symmetric was missing from the table
    text = README.read_text()
    start = text.index("| flag | meaning (nccl-tests' where it has one) |")
    table = text[start : text.index("\n\n", start)]
    documented = {w.split()[0] for w in re.findall(r"`(-[^`]+)`", table)}
    for action in _bench_parser()._actions:
        if action.dest == "help":
            continue
        assert documented & set(action.option_strings), (action.option_strings, documented)


def test_symmetric_help_names_the_allocator_the_code_uses():
    helps = {a.dest: a.help for a in _bench_parser()._actions}
    assert "comm.zeros" in helps["symmetric"] and "comm.empty" not in helps["symmetric"]
    source = Path(bench.__file__).read_text()
    assert "case.x = hp.zeros(" in source


@pytest.mark.parametrize("name", ["iters", "warmup", "rounds", "root"])
def test_counts_are_integers_not_bools(name):
    # (True is an int to isinstance: BenchOptions(root=True) ran with root 1, a review)
    flag = {"iters": "-n", "warmup": "-w", "rounds": "--rounds", "root": "--root"}[name]
    with pytest.raises(InvalidArgumentError, match=rf"bench: {flag} is True, expected an integer"):
        bench.BenchOptions(**{name: True}).normalized()
    assert bench.BenchOptions(**{name: np.int64(1)}).normalized()


# -- output paths: what root may not write, empty paths, a repeated --group -----------------


def test_a_path_root_cannot_create_is_refused_before_mpi(no_mpi, tmp_path, capsys):
    # os.access() says yes to root for every path: /proc/x.json failed after the whole
    # sweep (an outside hunt); a path that can be written is left as it was
    assert main(["bench", "--json", "/proc/hpccomm-x.json"]) == 2
    err = _one_line(capsys)
    assert err.startswith("hpccomm: bench --json: cannot write /proc/hpccomm-x.json: "), err
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    bench.check_writable(kept, "bench --json")
    bench.check_writable(tmp_path / "new.json", "bench --json")
    assert kept.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    fifo = tmp_path / "fifo"  # (not opened: a FIFO's open waits for a reader)
    os.mkfifo(fifo)
    bench.check_writable(fifo, "bench --json")
    bench.check_writable("/dev/null", "bench --json")
    # a dangling link is left as it is (it was removed, and its target made: a review)
    (tmp_path / "real").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "real" / "run.json")
    bench.check_writable(link, "bench --json")
    assert link.is_symlink() and not (tmp_path / "real" / "run.json").exists()
    link.unlink()
    link.symlink_to(tmp_path / "nowhere" / "run.json")
    with pytest.raises(HpccommError, match="no directory"):
        bench.check_writable(link, "bench --json")
    with pytest.raises(HpccommError, match="it names a directory"):
        bench.check_writable(f"{kept}/", "bench --json")  # (abspath dropped the slash)


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--json", ""],
        ["bench", "--plot", ""],
        ["profile", "report", ".", "--timeline", ""],
        ["sbatch", "-o", "", "--", "x"],
    ],
)
def test_an_empty_output_path_is_refused(no_mpi, capsys, args):
    # (--json "$OUT" with OUT unset wrote nothing, said nothing and exited 0: an outside hunt)
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert "an empty path, expected a file to write" in capsys.readouterr().err


def test_a_repeated_group_is_refused(no_mpi, capsys):
    # (the last one ran alone, silently: an outside hunt)
    with pytest.raises(SystemExit) as info:
        main(["bench", "--group", "tp=2", "--group", "pp=2"])
    assert info.value.code == 2
    assert "--group: given twice ('tp=2' and 'pp=2')" in capsys.readouterr().err
