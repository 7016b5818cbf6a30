"""The package's import graph: no circle among hpccomm's modules, function-level imports only
for optional dependencies (and the modules that load them), and ``import hpccomm`` starts
neither MPI nor CuPy."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import hpccomm

PACKAGE = Path(hpccomm.__file__).parent
# Imported inside functions on purpose: they start MPI or load CUDA, so only the code that
# needs them may import them (init(), the GPU paths).
LAZY_OK = {
    "mpi4py",
    "cupy",
    "cupyx",
    "torch",
    "matplotlib",  # hpccomm bench --plot (the 'plot' extra)
    "hpccomm.torch",  # imports torch; hpccomm bench --peer torch
    "hpccomm.backends.mpi",
    "hpccomm.backends.mpi_device",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(node: ast.ImportFrom | ast.Import, here: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = here.split(".")
        if not is_pkg:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    names = []
    for alias in node.names:  # "from . import ops" imports the submodule ops
        candidate = f"{base}.{alias.name}"
        names.append(candidate if candidate in MODULES else base)
    return names


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules imported when the module loads, modules imported inside functions)."""
    tree = ast.parse(path.read_text())
    here, is_pkg = module_name(path), path.name == "__init__.py"
    top: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                continue  # annotations only: never executed
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (lazy if in_function else top).update(resolve(child, here, is_pkg))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            else:
                visit(child, in_function)

    visit(tree, False)
    return top, lazy


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p) for p in FILES}


def graph() -> dict[str, set[str]]:
    edges = {}
    for path in FILES:
        top, _ = imports(path)
        edges[module_name(path)] = {m for m in top if m in MODULES and m != module_name(path)}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_no_import_circle():
    edges = graph()
    assert len(edges) >= 20  # every module was parsed
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_the_checker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_are_optional_dependencies_only():
    bad = {}
    for path in FILES:
        _, lazy = imports(path)
        wrong = sorted(
            m for m in lazy if not any(m == ok or m.startswith(ok + ".") for ok in LAZY_OK)
        )
        if wrong:
            bad[module_name(path)] = wrong
    assert not bad, bad


def test_dispatch_imports_nothing_above_it():
    # The dispatch is handed its backends and group; it must not reach up to the
    # communicator, the runtime, the CLI or a concrete backend.
    top, lazy = imports(PACKAGE / "dispatch.py")
    above = {
        "hpccomm.comm",
        "hpccomm.runtime",
        "hpccomm.cli",
        "hpccomm.diagnose",
        "hpccomm.backends.mpi",
        "hpccomm.backends.nccl",
        "hpccomm.backends.mpi_device",
    }
    assert not (top | lazy) & above


def test_import_starts_neither_mpi_nor_cupy():
    code = (
        "import sys, hpccomm, hpccomm.cli, hpccomm.diagnose\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'cupy', 'torch')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
