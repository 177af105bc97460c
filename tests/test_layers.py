"""The layers hold: the measurement core imports nothing from the analyses or the faces above it
(not even lazily), and no `_private` name is used outside the module that defines it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
# The folders, bottom to top: a folder imports only folders before it in this list (lazy imports counted).
LAYERS = ("core", "launch", "results", "deciding", "diagnose", "search", "demos", "faces")
# The package's own face and the re-exports kept for old imports: nothing inside a folder imports them.
TOP = ("workbench", "workbench.__main__", "workbench.knobs", "workbench.measure")
MAX_TOP_MODULES = 8
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


def folder_of(module: str) -> str | None:
    """The layer folder a `workbench.x...` module lives in (None for a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else None


def layer_violations(paths: list[Path]) -> list[str]:
    """Every import, lazy ones included, from a folder into the same level or above (or into a top-level module)."""
    bad = []
    for path in paths:
        here = folder_of(module_name(path))
        if here is None:
            continue
        for mod, names, line in imports(path):
            for t in [mod] + [f"{mod}.{n}" for n in names]:
                there = folder_of(t)
                if t in TOP[1:] or (mod == "workbench" and t == mod):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports the top-level {t}")
                elif there is not None and LAYERS.index(there) > LAYERS.index(here):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}/) imports {t} ({there}/ is above)")
    return sorted(set(bad))


@pytest.mark.parametrize("layer", LAYERS)
def test_each_folder_imports_only_folders_below_it(layer):
    assert not layer_violations(sorted((PACKAGE / layer).rglob("*.py"))), layer_violations(sorted((PACKAGE / layer).rglob("*.py")))


def test_the_tree_reads_as_the_layers():
    """Every module sits in a layer folder, except the package's face and the old-import re-exports."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top
    assert {f"workbench.{p[:-3]}" if p != "__init__.py" else "workbench" for p in top} <= set(TOP), top
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS), f"place {sorted(folders ^ set(LAYERS))} in LAYERS"


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
    """The parser resolves relative imports, so a lazy `from ..faces.panel import Panel` in the core is seen,
    and the layer check itself fails on it (run on a copy of the module with the import injected)."""
    real = PACKAGE / "results" / "stats.py"
    target = tmp_path / "workbench" / "results" / "stats.py"
    target.parent.mkdir(parents=True)
    target.write_text(real.read_text() + "\n\ndef _leak():\n    from ..faces.panel import Panel\n    return Panel\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "workbench")
    assert ("workbench.faces.panel", ["Panel"]) in [(m, n) for m, n, _ in imports(target)]
    assert [v.split(" ", 1)[1] for v in layer_violations([target])] == [
        "(results/) imports workbench.faces.panel (faces/ is above)", "(results/) imports workbench.faces.panel.Panel (faces/ is above)"]
    target.write_text(real.read_text())  # the same file without the injected import passes
    assert layer_violations([target]) == []


FACES = ("search/scaling", "search/fit", "search/tune", "search/race", "faces/panel", "diagnose")  # every face that takes a workbench


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
    assert ("workbench.results.protocol", ["Bench"]) in found
    assert not any(mod == "workbench.faces.bench" for mod, _ in found)
    bad = [b for p in paths for b in untyped_benches(p)]
    assert not bad, bad


def test_the_face_check_catches_an_untyped_workbench(tmp_path):
    """The check above fails on `bench: Any`, `bench: Workbench` and a bare `bench`."""
    path = tmp_path / "face.py"
    path.write_text("def a(bench: Any): ...\ndef b(bench: 'Workbench'): ...\ndef c(x, bench): ...\n"
                    "def d(bench: Bench): ...\ndef e(bench: 'Bench'): ...\n")
    assert untyped_benches(path) == ["face.py:1 a(bench: Any)", "face.py:2 b(bench: Workbench)", "face.py:3 c(bench: None)"]


def protocol_mismatches(protocol: type, obj: object) -> list[str]:
    """Members of `protocol` that `obj` (an instance: data attributes are set in __init__) lacks, or whose signature cannot take every parameter the
    protocol promises (same name, same kind; a keyword the protocol has must be accepted)."""
    import inspect

    bad, cls = [], type(obj)
    for name in sorted(set(getattr(protocol, "__annotations__", {})) | set(vars(protocol))):
        if name.startswith("_"):
            continue
        promised = inspect.getattr_static(protocol, name, None)
        if not callable(promised) or isinstance(promised, property):
            if not hasattr(obj, name) or (isinstance(promised, property) and not isinstance(inspect.getattr_static(cls, name, None), property)):
                bad.append(f"{name}: missing or not a property")
            continue
        actual = inspect.getattr_static(cls, name, None)
        if not callable(actual):
            bad.append(f"{name}: missing")
            continue
        have = inspect.signature(actual).parameters
        for p in inspect.signature(promised).parameters.values():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                if not any(q.kind == p.kind for q in have.values()):
                    bad.append(f"{name}: no {p}")
            elif p.name not in have and not any(q.kind == q.VAR_KEYWORD for q in have.values()):
                bad.append(f"{name}: no parameter {p.name}")
            elif p.name in have and have[p.name].kind != p.kind:
                bad.append(f"{name}: {p.name} is {have[p.name].kind.description}, not {p.kind.description}")
    return bad


def test_the_workbench_satisfies_the_protocol(make_bench):
    """Every member of Bench exists on Workbench with parameters that take what the protocol promises
    (isinstance on a runtime_checkable Protocol checks names only)."""
    from workbench.results.protocol import Bench

    bench = make_bench()
    assert isinstance(bench, Bench)
    assert protocol_mismatches(Bench, bench) == []


def test_the_protocol_check_catches_a_changed_signature():
    from typing import Protocol

    class P(Protocol):
        size: int

        def run(self, knobs: int, /, *, budget_s: float = 1.0) -> None: ...

    class Renamed:
        size = 1

        def run(self, knobs: int, /, *, seconds: float = 1.0) -> None: ...

    class Positional:
        size = 1

        def run(self, knobs: int, /, budget_s: float = 1.0) -> None: ...

    assert protocol_mismatches(P, Renamed()) == ["run: no parameter budget_s"]
    assert protocol_mismatches(P, Positional()) == ["run: budget_s is positional or keyword, not keyword-only"]
    assert protocol_mismatches(P, object()) == ["run: missing", "size: missing or not a property"]


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
