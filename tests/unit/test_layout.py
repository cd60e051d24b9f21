"""The package's layout, read from its source with `ast`: where Slurm is named, how big a module is, what imports what.

Slurm's commands are run only from `slurm/` (the gateway, its argv builders) and `cluster/` (the local
cluster's own daemons); everything else calls their functions. A module holds one concept and stays
readable (450 lines; a CLI module, which only parses, calls and prints, 150). No two modules import each
other, directly or around a circle, even inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_elastico"
SLURM_HOMES = ("slurm", "cluster")
"""The subpackages that may name Slurm's commands."""
SLURM_COMMANDS = frozenset({
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab", "sdiag",
    "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger", "sview",
})
MAX_LINES = 450
MAX_CLI_LINES = 150


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its `__init__.py`)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings: of the module, a class or a function, or an attribute's
    (a string statement right after an assignment)."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                continue
            first = i == 0 and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            after_assignment = i > 0 and isinstance(body[i - 1], (ast.Assign, ast.AnnAssign))
            if first or after_assignment:
                ids.add(id(stmt.value))
    return ids


def slurm_command_uses(source: str) -> list[tuple[int, str]]:
    """Where `source` names a Slurm command as code: a string literal that is the command's name (an argv
    element, a default program), or an f-string that starts a command line with it ("scontrol update ...").

    Docstrings and comments do not count, nor does prose in a message that mentions a command in passing.
    """
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value.strip() in SLURM_COMMANDS:
                hits.append((node.lineno, node.value.strip()))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                word, _, rest = head.value.partition(" ")
                if word in SLURM_COMMANDS and (rest or len(node.values) > 1):
                    hits.append((node.lineno, word))
    return sorted(hits)


def test_the_check_of_slurm_command_names_finds_code_and_leaves_prose():
    source = '''"""Runs sbatch and scontrol."""
ARGV = ["scontrol", "update"]  # a comment naming squeue
PROGRAM = "sbatch"
"""The program: sbatch by default."""
LINE = f"srun -n {4}"
MESSAGE = f"job {7} is not in squeue; try sinfo -p {'x'}"
'''
    assert slurm_command_uses(source) == [(2, "scontrol"), (3, "sbatch"), (5, "srun")]


def test_slurm_commands_are_named_only_in_slurm_and_cluster():
    offending = []
    for name, path in MODULES.items():
        if name.split(".")[1:2] and name.split(".")[1] in SLURM_HOMES:
            continue
        for line, command in slurm_command_uses(path.read_text(encoding="utf-8")):
            offending.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {command!r}")
    assert not offending, ("Slurm commands named outside slurm/ and cluster/ (call a builder in "
                           "slurm_elastico.slurm.commands instead):\n" + "\n".join(offending))


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_450_lines():
    big = [f"{p.relative_to(PACKAGE.parent)}: {_lines(p)} lines" for p in MODULES.values() if _lines(p) > MAX_LINES]
    assert not big, f"modules over {MAX_LINES} lines (split them by concept):\n" + "\n".join(big)


def test_no_cli_module_is_over_150_lines():
    big = [f"{p.relative_to(PACKAGE.parent)}: {_lines(p)} lines" for n, p in MODULES.items()
           if n.startswith("slurm_elastico.cli") and _lines(p) > MAX_CLI_LINES]
    assert not big, (f"CLI modules over {MAX_CLI_LINES} lines (move the logic into the library):\n"
                     + "\n".join(big))


def imports_of(name: str, source: str) -> set[str]:
    """The package's modules that module `name` imports anywhere in `source` (inside functions too).

    `from P import x` is module P.x when that is a module, else P itself; `import P.Q` is P.Q. A package's
    `__init__` is imported implicitly with each of its modules, but that is no edge here: a module that imports
    its package's sibling through the package (`from slurm_elastico.cluster import config`) is no circle.
    """
    package = name if MODULES.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one circle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(_circle(graph, sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One path from the component's first module back to itself, inside the component (breadth first)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return component  # pragma: no cover - a component always closes


def test_the_cycle_finder_finds_circles_and_only_them():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_imports_are_read_inside_functions_and_relative_ones_resolved():
    source = "def f():\n    from slurm_elastico.slurm import commands\nfrom . import errors\n"
    assert imports_of("slurm_elastico.model", source) == {"slurm_elastico.slurm.commands", "slurm_elastico.errors"}


def test_no_import_circle():
    graph = {n: imports_of(n, p.read_text(encoding="utf-8")) for n, p in MODULES.items()}
    found = cycles(graph)
    assert not found, "import circles (move what both sides need to a module both may import):\n" + "\n".join(
        " -> ".join(c) for c in found)
