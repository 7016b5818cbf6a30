"""The ``hpccomm`` command: a thin layer over library functions.

hpccomm info [--json] [--no-mpi]     launch table of every rank (rank 0 prints)
hpccomm doctor [--json] [--timeout S] launch table + PASS/FAIL per operation
hpccomm layout ...                    TP/PP/DP/CP/EP groups of a layout
hpccomm trace analyze DIR             who waits where, from the flight recorder's files
hpccomm bench [-o OP] [-b 8] [-e 64M] collective bandwidth, nccl-tests style (under mpiexec)
hpccomm profile report DIR            the profiler's summary again, from its files
hpccomm sbatch ...                    render, write or submit a Slurm batch script
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from . import bench, flight, profiler
from .diagnose import (
    format_checks,
    format_launch_table,
    format_stuck,
    gather_launch,
    leave,
    run_checks,
)
from .discovery import LaunchInfo, discover
from .errors import HpccommError, InvalidArgumentError, UnwaitedWorkWarning
from .layout import Layout
from .ops import MAX_TIMEOUT
from .runtime import init
from .slurm import SUBMIT_TIMEOUT, BatchOptions, render, submit

__all__ = ["main", "build_parser", "SBATCH_TIMEOUT_ENV"]

# Seconds `hpccomm sbatch --submit` waits for sbatch when --submit-timeout is not given.
SBATCH_TIMEOUT_ENV = "HPCCOMM_SBATCH_TIMEOUT"


def _cmd_info(args: argparse.Namespace) -> int:
    if args.no_mpi:
        info = discover()
        print(info.to_json() if args.json else info)
        return 0
    comm = init()
    infos = gather_launch(comm)
    if infos is not None:
        print(
            json.dumps(infos, indent=1, sort_keys=True) if args.json else format_launch_table(infos)
        )
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    # A check's async call that timed out drops its Work still running: the FAIL line says
    # so already (the warning's two lines on every rank were all that was left of it)
    warnings.filterwarnings("ignore", category=UnwaitedWorkWarning)
    comm = init()
    infos = gather_launch(comm)
    results = run_checks(comm, timeout=args.timeout)
    stuck = format_stuck(results)
    if comm.rank == 0 and infos is not None:
        if args.json:
            doc = {"ranks": infos, "checks": [r.__dict__ for r in results]}
            print(json.dumps(doc, indent=1, sort_keys=True))
        else:
            print(format_launch_table(infos))
            print(format_checks(results, comm.size))
        if stuck:
            print(stuck, file=sys.stderr)
    if stuck:  # (every rank has the same results) MPI_Finalize would wait for those calls
        leave(comm, 1)
    return 0 if all(r.ok for r in results) else 1


def _cmd_layout(args: argparse.Namespace) -> int:
    layout = Layout(
        args.world, tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, ep=args.ep, order=args.order
    )
    dims = (
        args.groups.split(",")
        if args.groups
        else [t for t in layout.order if layout.sizes[t] > 1] or ["dp"]
    )
    empty = [i for i, d in enumerate(dims, 1) if not d.strip()]
    if empty:
        raise InvalidArgumentError(
            f"layout: --groups {args.groups!r} has an empty item (item {empty[0]}), expected "
            f"dims such as tp,dp,tp-pp"
        )
    dims = ["-".join(layout.normalize(d.strip())) for d in dims]
    if args.rank is not None:
        coords = layout.coords(args.rank)
        groups = {d: layout.group_of(args.rank, d) for d in dims}
        if args.embedding:  # its embedding group (first and last stage), or none
            groups["embedding"] = next((g for g in layout.embedding_groups() if args.rank in g), [])
        if args.json:
            print(
                json.dumps(
                    {
                        "layout": layout.to_dict(),
                        "rank": args.rank,
                        "coords": coords,
                        "groups": groups,
                    },
                    sort_keys=True,
                )
            )
            return 0
        print(f"rank {args.rank}: " + " ".join(f"{t}={i}" for t, i in coords.items()))
        width = max(8, *(len(d) + 1 for d in groups))
        for d, members in groups.items():
            print(f"{d:<{width}}{members}")
        return 0
    table = {d: layout.groups(d) for d in dims}
    if args.embedding:
        table["embedding"] = layout.embedding_groups()
    if args.json:
        print(json.dumps({"layout": layout.to_dict(), "groups": table}, sort_keys=True))
        return 0
    sizes = " ".join(f"{t}={s}" for t, s in layout.sizes.items())
    mesh = ", ".join(f"{n}={s}" for n, s in zip(layout.mesh_names, layout.mesh_shape, strict=True))
    print(f"world {layout.world_size}: {sizes}; order {'-'.join(layout.order)} (DeviceMesh {mesh})")
    print(f"{'dims':<10}{'#':>4}  members")
    for d, rows in table.items():
        for i, members in enumerate(rows):
            print(f"{d:<10}{i:>4}  {members}")
    return 0


def _submit_timeout(args: argparse.Namespace) -> float:
    """Seconds to wait for sbatch: --submit-timeout, else $HPCCOMM_SBATCH_TIMEOUT, else 60."""
    if args.submit_timeout is not None:
        what, raw = "--submit-timeout", args.submit_timeout
    else:
        what, raw = SBATCH_TIMEOUT_ENV, os.environ.get(SBATCH_TIMEOUT_ENV, "").strip()
        if not raw:
            return SUBMIT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise InvalidArgumentError(f"sbatch: {what} is {raw!r}, expected seconds > 0")
    return value


def _cmd_trace_analyze(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        raise InvalidArgumentError(f"trace analyze: {args.dir} is not a directory")
    trace = flight.load_trace(args.dir)
    try:
        said = flight.verdicts(trace.docs, trace.size, left_out=trace.left_out)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        # each dump was checked alone; what only the dumps together show (a field of
        # another type in one of them) is one line too, not a traceback
        raise InvalidArgumentError(
            f"trace analyze: {args.dir}: the dumps cannot be analyzed together (one is not as "
            f"the flight recorder writes them): {type(exc).__name__}: {exc}"
        ) from None
    if args.json:  # the verdicts, and the dumps they rest on
        doc = {
            "verdicts": said,
            "size": trace.size,
            "job": trace.job,
            "ranks": trace.docs,
            "left_out": list(trace.left_out),
        }
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print(". ".join(said))
    return 0


def _on_one_node(launch: LaunchInfo) -> bool:
    """True when the launcher says every rank of the job runs on this node."""
    return launch.num_nodes == 1 or (launch.size is not None and launch.local_size == launch.size)


def _cmd_bench(args: argparse.Namespace) -> int:
    opts = bench.BenchOptions(
        ops=args.op or ["all_reduce"],
        min_bytes=bench.parse_size(args.minbytes),
        max_bytes=bench.parse_size(args.maxbytes),
        factor=args.stepfactor,
        dtype=args.datatype,
        redop=args.redop,
        root=args.root,
        iters=args.iters,
        warmup=args.warmup_iters,
        check=bool(args.check),
        average=args.average,
        rounds=args.rounds,
        group=args.group,
        device=args.device,
        symmetric=args.symmetric,
        peers=args.peer or [],
        progress=None if args.quiet else sys.stderr,
    ).normalized()  # a bad flag fails here, before MPI starts, on every rank
    if args.plot:
        bench.check_plot_available()
        bench.check_plot_format(args.plot)
    # Rank 0 writes the files. Every rank on its node checks the path too, so that none of
    # them goes on into MPI's start to wait for a rank 0 that has refused; a rank on another
    # node cannot tell (its node may lack the folder rank 0 has) and leaves it to rank 0.
    try:
        launch = discover()
    except Exception:  # noqa: BLE001 - init refuses it on every rank, once MPI is up (raised
        # here, this rank left before MPI_Init and the others waited in it)
        launch = None
    if launch is not None and (launch.rank in (0, None) or _on_one_node(launch)):
        for what, path in (("--json", args.json), ("--plot", args.plot)):
            if path:
                bench.check_writable(path, f"bench {what}")
    comm = init()
    if comm.rank != 0:
        opts.progress = None
    doc = bench.run(comm, opts)
    if doc is None:
        return 0
    print(bench.format_table(doc), flush=True)
    if args.json:
        bench.write_json(doc, args.json)
    if args.plot and not doc.get("skipped"):
        bench.plot(doc, args.plot)
    wrong = sum(r["wrong"] or 0 for g in doc.get("groups", []) for r in g["rows"])
    return 1 if wrong else 0


def _cmd_profile_report(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise InvalidArgumentError(
            f"profile report: --top {args.top}, expected the number of rows to show (>= 1)"
        )
    if args.timeline:  # bench --plot's checks: refused before anything is read or printed
        # (a format matplotlib cannot write failed after the summary, with a traceback; no
        # extension, or a directory, wrote FILE.png)
        what = "profile report --timeline"
        bench.check_plot_available(what)
        bench.check_plot_format(args.timeline, what)
        bench.check_writable(args.timeline, what)
    doc = profiler.load(args.dir)
    try:  # the summary is made with --json too: a document it cannot read is refused alike
        # (--json printed an incomplete profile.json and exited 0)
        text = profiler.format_summary(doc, top=args.top)
        if args.json:
            text = json.dumps(doc, indent=1)
    except profiler.DAMAGED as exc:
        raise HpccommError(
            f"profile report: {args.dir}/profile.json is damaged or incomplete "
            f"({type(exc).__name__}: {exc})"
        ) from None
    print(text)
    if args.timeline:
        profiler.timeline(args.dir, args.timeline)
    return 0


def _cmd_sbatch(args: argparse.Namespace) -> int:
    command = list(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    opts = BatchOptions(
        command=command,
        nodes=args.nodes,
        ntasks_per_node=args.ntasks_per_node,
        gpus_per_node=args.gpus_per_node,
        gpus_per_task=args.gpus_per_task,
        cpus_per_task=args.cpus_per_task,
        time=args.time,
        partition=args.partition,
        account=args.account,
        job_name=args.job_name,
        output=args.output_log,
        mpi=args.mpi,
        array=args.array,
        extra=args.extra or [],
    )
    script = render(opts)
    timeout = _submit_timeout(args) if args.submit else None
    if args.o:
        try:
            with open(args.o, "w") as f:
                f.write(script)
        except OSError as exc:
            raise HpccommError(f"sbatch: cannot write {args.o}: {exc.strerror or exc}") from None
    if args.submit and timeout is not None:
        print(submit(script, timeout=timeout))
    elif not args.o:
        print(script, end="")
    return 0


def _seconds(text: str) -> float:
    """argparse type of doctor --timeout: finite seconds > 0 (argparse names the flag)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}, expected finite seconds > 0")
    if value > MAX_TIMEOUT:  # (its operations failed with OverflowError: false FAILs)
        raise argparse.ArgumentTypeError(
            f"{text!r}, more than {MAX_TIMEOUT:,.0f} seconds (the most hpccomm's waits take)"
        )
    return value


def _path(text: str) -> str:
    """argparse type of an output file: not empty (``--json "$OUT"`` with OUT unset wrote
    nothing, said nothing and exited 0: an outside hunt)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path, expected a file to write")
    return text


class _Once(argparse.Action):
    """An option that may be given once (a repeated ``bench --group`` kept the last alone,
    silently, while a repeated ``-o`` adds: an outside hunt)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(
                f"argument {option_string}: given twice ({getattr(namespace, self.dest)!r} and "
                f"{values!r}); {option_string} takes one"
            )
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpccomm", description="HPC communication toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="print every rank's place in the job (rank 0 prints)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--no-mpi", action="store_true", help="only this process's discovery, without starting MPI"
    )
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("doctor", help="launch table plus a correctness check of every operation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        help="seconds per operation before it counts as hung (default 60)",
    )
    p.set_defaults(func=_cmd_doctor)
    p = sub.add_parser(
        "layout", help="print the TP/PP/DP/CP/EP groups of a parallel layout (no MPI)"
    )
    p.add_argument("--world", type=int, required=True, help="world size")
    for name in ("tp", "pp", "cp", "ep"):
        p.add_argument(f"--{name}", type=int, default=1, help=f"{name} size (default 1)")
    p.add_argument("--dp", type=int, default=None, help="dp size (default: world / the others)")
    p.add_argument("--order", default="tp-cp-ep-dp-pp", help="Megatron order, first token fastest")
    p.add_argument(
        "--groups", help="comma list of dims to show, e.g. tp,dp,tp-pp (default: dims > 1)"
    )
    p.add_argument("--embedding", action="store_true", help="also show the embedding groups")
    p.add_argument("--rank", type=int, help="show one rank's coordinates and groups")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_layout)
    p = sub.add_parser("trace", help="read the flight recorder's files (HPCCOMM_TRACE_DIR)")
    tsub = p.add_subparsers(dest="trace_cmd", required=True)
    t = tsub.add_parser("analyze", help="say from every rank's file who waits where")
    t.add_argument("dir", help="the trace directory (one rank<N>.json per rank)")
    t.add_argument(
        "--json", action="store_true", help="print the verdicts and every rank's dump as JSON"
    )
    t.set_defaults(func=_cmd_trace_analyze)

    p = sub.add_parser(
        "bench",
        help="collective bandwidth in nccl-tests' conventions (run under mpiexec or srun)",
        description="Time hpccomm's operations over a sweep of sizes, as nccl-tests does: "
        "one row per size with time, algbw and busbw (nccl-tests' factors per op). Note: "
        "-o is the operation and -r the reduce op here (nccl-tests: -o reduce op, -r root).",
    )
    p.add_argument(
        "-o",
        "--op",
        action="append",
        default=None,
        help="operation(s), comma-separated or repeated: all_reduce (default), all_gather, "
        "reduce_scatter, broadcast, reduce, all_to_all, send_recv (ping-pong), gather, "
        "scatter, or all",
    )
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8; K/M/G)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size factor (default 2)")
    p.add_argument("-d", "--datatype", default="float32", help="dtype (default float32)")
    p.add_argument(
        "-r", "--redop", default="sum", help="reduce op: sum (default), prod, min, max, avg"
    )
    p.add_argument(
        "--root",
        type=int,
        default=0,
        help="root of broadcast, reduce, gather, scatter (default 0; the other ops ignore it)",
    )
    p.add_argument(
        "-n", "--iters", type=int, default=0, help="calls per timed block (default: auto)"
    )
    p.add_argument(
        "-w",
        "--warmup_iters",
        type=int,
        default=5,
        help="warm-up calls per size (default 5; 0: none, each --peer still makes 1)",
    )
    p.add_argument(
        "-c",
        "--check",
        type=int,
        choices=(0, 1),
        default=1,
        help="check the result of one call per size and count #wrong elements (default 1)",
    )
    p.add_argument(
        "-a",
        "--average",
        type=int,
        choices=(0, 1, 2, 3),
        default=1,
        help="time over the ranks: 0 rank 0, 1 average (default), 2 min, 3 max",
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="timed blocks per size and side (median; default 5)"
    )
    p.add_argument(
        "--group",
        metavar="SPEC",
        action=_Once,
        help="run on every group of a layout dimension at once: tp=2, or tp=2,pp=2:pp",
    )
    p.add_argument("--device", action="store_true", help="CuPy arrays (NCCL or the MPI path)")
    p.add_argument(
        "--symmetric",
        action="store_true",
        help="reductions' inputs from comm.zeros, symmetric buffers (the peers use the same "
        "arrays)",
    )
    p.add_argument(
        "--peer",
        action="append",
        metavar="NAME",
        help="also measure mpi4py (raw, same buffers), gloo (torch) and/or torch "
        "(torch.distributed on hpccomm's backend), alternating",
    )
    p.add_argument("--json", metavar="FILE", type=_path, help="write the results as JSON (rank 0)")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=_path,
        help="busbw and time vs size (matplotlib; the extension picks the format: .png, .pdf, "
        ".svg, ...)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("profile", help="read the profiler's files (HPCCOMM_PROFILE)")
    psub = p.add_subparsers(dest="profile_cmd", required=True)
    t = psub.add_parser("report", help="print the summary of a profile directory")
    t.add_argument("dir", help="the profile directory (profile.json, or rank<N>.json files)")
    t.add_argument("--top", type=int, default=20, help="rows of the (group, op) table")
    t.add_argument("--json", action="store_true", help="print the profile document as JSON")
    t.add_argument(
        "--timeline",
        metavar="FILE.png",
        type=_path,
        help="also draw trace.json (matplotlib; the extension picks the format: .png, .pdf, "
        ".svg, ...)",
    )
    t.set_defaults(func=_cmd_profile_report)

    p = sub.add_parser("sbatch", help="render (print, write or submit) a Slurm batch script")
    p.add_argument("--nodes", "-N", type=int, default=1)
    p.add_argument("--ntasks-per-node", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--gpus-per-task", type=int)
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--time", default="00:30:00", help="Slurm time limit (default 00:30:00)")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--job-name", default="hpccomm")
    p.add_argument("--output", dest="output_log", help="the job's log file (#SBATCH --output)")
    p.add_argument("--mpi", default="pmix", help="srun MPI plug-in (default pmix, for Open MPI)")
    p.add_argument("--array", help="job array indices, e.g. 0-3")
    p.add_argument("--extra", action="append", help="an extra '#SBATCH ...' line (repeatable)")
    p.add_argument(
        "-o", metavar="FILE", type=_path, help="write the script to FILE instead of printing it"
    )
    p.add_argument("--submit", action="store_true", help="submit with sbatch and print the job id")
    p.add_argument(
        "--submit-timeout",
        type=float,
        metavar="S",
        help=f"seconds to wait for sbatch before giving up (default: ${SBATCH_TIMEOUT_ENV}, else 60)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command to run on every task")
    p.set_defaults(func=_cmd_sbatch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hpccomm`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, where a reader gone is caught (not at exit: status 120)
        return status
    except HpccommError as exc:
        print(f"hpccomm: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hpccomm layout ... | head`: the reader left; no traceback
        # (Python's own advice: stdout to /dev/null, so the exit's flush cannot fail again)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
