"""The layers hold: the measurement core imports nothing from the analyses or the faces above it
(not even lazily), and no `_private` name is used outside the module that defines it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
# codegen renders the core's step as text (Knobs.to_code): it sits with the core and imports nothing above it
# resultlog/records/table/comparison hold the log and decide; rounds (which runs trials) and the results
# facade that re-exports it sit above
CORE = ("knobs", "workload", "step", "runner", "measure", "resultlog", "records", "table", "comparison", "progress",
        "compat", "stats", "system", "trace", "codegen", "protocol", "stepshape", "steady", "loadmeter", "phases",
        "earlystop", "fresh", "remote")
ABOVE_CORE = ("diagnose", "tune", "race", "fit", "scaling", "panel", "charts", "cli", "demos", "bench", "workshop", "export",
              "display", "rebuild", "results", "rounds", "learners", "interleave", "budget", "hopeless")
MAX_FUNCTION_LINES = 80  # a function a newcomer reads in one screen


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) for every import in the file, lazy ones included."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names], node.lineno))
    return out


def files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def core_files(name: str) -> list[Path]:
    """A core module's file, or every file of a core package (knobs/)."""
    folder = PACKAGE / name
    return sorted(folder.glob("*.py")) if folder.is_dir() else [PACKAGE / f"{name}.py"]


@pytest.mark.parametrize("name", CORE)
def test_core_imports_nothing_above_it(name):
    bad = []
    for path, (mod, names, line) in [(p, i) for p in core_files(name) for i in imports(p)]:
        targets = [mod] + [f"{mod}.{n}" for n in names] if mod == "workbench" else [mod]
        for t in targets:
            if any(t == f"workbench.{a}" or t.startswith(f"workbench.{a}.") for a in ABOVE_CORE):
                bad.append(f"{path.name}:{line} imports {t}")
    assert not bad, bad


def test_no_private_name_crosses_a_module():
    """`from workbench.x import _y` and `x._y` (x a workbench module) are only allowed inside x."""
    modules = {module_name(p) for p in files()}
    bad = []
    for path in files():
        here = module_name(path)
        aliases: dict[str, str] = {}
        for mod, names, line in imports(path):
            if mod in modules:
                bad += [f"{here}:{line} imports {mod}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__") and mod != here]
                for n in names:
                    if f"{mod}.{n}" in modules:
                        aliases[n] = f"{mod}.{n}"
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{here}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, bad


def test_the_layer_check_catches_a_violation(tmp_path, monkeypatch):
    """The parser resolves relative imports, so a lazy `from .panel import Panel` in the core is seen,
    and the layer check itself fails on it (run on a copy of the package with the import injected)."""
    fake = PACKAGE / "stats.py"
    text = fake.read_text() + "\n\ndef _leak():\n    from .panel import Panel\n    return Panel\n"
    target = tmp_path / "workbench" / "stats.py"
    target.parent.mkdir()
    target.write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "workbench")
    assert ("workbench.panel", ["Panel"]) in [(m, n) for m, n, _ in imports(target)]
    with pytest.raises(AssertionError, match=r"stats\.py:\d+ imports workbench\.panel"):
        test_core_imports_nothing_above_it("stats")
    target.write_text(fake.read_text())  # the same file without the injected import passes
    test_core_imports_nothing_above_it("stats")


FACES = ("scaling", "fit", "tune", "race", "panel", "diagnose")  # every face that takes a workbench


def face_files(name: str) -> list[Path]:
    return [PACKAGE / f"{name}.py"] if (PACKAGE / f"{name}.py").exists() else sorted((PACKAGE / name).rglob("*.py"))


def untyped_benches(path: Path) -> list[str]:
    """Every parameter named `bench` in the file whose annotation is not `Bench` (missing, Any, Workbench)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                note = arg.annotation
                text = note.value if isinstance(note, ast.Constant) else ast.unparse(note) if note else None
                if arg.arg == "bench" and text != "Bench":
                    bad.append(f"{path.name}:{node.lineno} {node.name}(bench: {text})")
    return bad


@pytest.mark.parametrize("name", FACES)
def test_faces_type_the_workbench_as_the_protocol(name):
    """A face that takes a workbench types it `protocol.Bench`, and never imports `bench.Workbench`."""
    paths = face_files(name)
    found = [(mod, names) for p in paths for mod, names, _ in imports(p)]
    assert ("workbench.protocol", ["Bench"]) in found
    assert not any(mod == "workbench.bench" for mod, _ in found)
    bad = [b for p in paths for b in untyped_benches(p)]
    assert not bad, bad


def test_the_face_check_catches_an_untyped_workbench(tmp_path):
    """The check above fails on `bench: Any`, `bench: Workbench` and a bare `bench`."""
    path = tmp_path / "face.py"
    path.write_text("def a(bench: Any): ...\ndef b(bench: 'Workbench'): ...\ndef c(x, bench): ...\n"
                    "def d(bench: Bench): ...\ndef e(bench: 'Bench'): ...\n")
    assert untyped_benches(path) == ["face.py:1 a(bench: Any)", "face.py:2 b(bench: Workbench)", "face.py:3 c(bench: None)"]


def test_the_workbench_satisfies_the_protocol(make_bench):
    from workbench.protocol import Bench

    assert isinstance(make_bench(), Bench)


def test_every_module_is_placed_in_a_layer():
    top = {p.stem if p.name != "__init__.py" else p.parent.name for p in PACKAGE.glob("*.py")} | \
        {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    unplaced = top - set(CORE) - set(ABOVE_CORE) - {"workbench", "__main__", "distributed"}
    assert not unplaced, f"place {sorted(unplaced)} in CORE or ABOVE_CORE"


def test_no_function_is_longer_than_one_screen():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted(PACKAGE.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"split these functions (at most {MAX_FUNCTION_LINES} lines): {long}"


MAX_MODULE_LINES = 600  # a module does one job; past this it is doing two


def test_no_module_is_longer_than_one_job():
    long = [f"{p.relative_to(PACKAGE.parent)} ({n} lines)" for p in files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"split these modules (at most {MAX_MODULE_LINES} lines): {long}"


def test_no_import_circle_between_modules():
    """Counting lazy imports too: module A imports B (at any depth of A's code) and B reaches A back."""
    modules = {module_name(p): p for p in files()}
    graph = {m: {mod for mod, names, _ in imports(p) for mod in [mod, *(f"{mod}.{n}" for n in names)]
                 if mod in modules and mod != m} for m, p in modules.items()}
    for m in graph:  # a package's __init__ hands names on: its submodules are not a circle with it
        graph[m] = {d for d in graph[m] if not (d.startswith(m + ".") or m.startswith(d + "."))}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            here = todo.pop()
            if here == goal:
                return True
            if here not in seen:
                seen.add(here)
                todo += graph.get(here, ())
        return False

    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert not circles, f"import circles (lazy imports counted): {circles}"
