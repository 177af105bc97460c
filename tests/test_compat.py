"""compat.py: every private torch internal is present in this torch, and each fallback keeps a
trial running (with a note) when it is gone."""

from __future__ import annotations

import ast
from pathlib import Path

import psutil
import pytest
import torch
from conftest import SquareDataset

import workbench as wb
from workbench.core import compat


@pytest.mark.parametrize("name", sorted(compat.PRIVATE))
def test_private_internal_still_exists(name):
    gone = compat.missing(name)
    assert gone is None, (f"torch {torch.__version__} no longer has {gone} (used by compat.{name}): "
                          "update workbench/core/compat.py; its fallback keeps trials running meanwhile")


def test_missing_names_the_attribute_that_is_gone(monkeypatch):
    monkeypatch.setitem(compat.PRIVATE, "fake", ("torch.utils.data", "_no_such_helper"))
    assert compat.missing("fake") == "torch.utils.data._no_such_helper"
    monkeypatch.setitem(compat.PRIVATE, "fake", ("torch._no_such_module", "x"))
    assert compat.missing("fake") == "torch._no_such_module"


def test_unregister_workers_falls_back_with_a_note(monkeypatch):
    from torch.utils.data._utils import signal_handling

    monkeypatch.delattr(signal_handling, "_remove_worker_pids")

    class FakeIterator:
        _worker_pids_set = True

    note = compat.unregister_workers(FakeIterator())
    assert note and "SIGCHLD" in note
    assert compat.unregister_workers(object()) is None  # single-process iterators need nothing


def test_trial_with_workers_runs_when_the_sigchld_internal_is_gone(make_bench, monkeypatch):
    from torch.utils.data._utils import signal_handling

    monkeypatch.delattr(signal_handling, "_remove_worker_pids")
    # 64 batches: no epoch boundary in warm-up or window (torch's own iterator shutdown at an epoch end
    # would call the name deleted here; a torch that really moved it would not)
    r = make_bench(data=SquareDataset(512)).run(num_workers=1)
    assert r.ok and any("SIGCHLD" in n for n in r.notes)
    assert psutil.Process().children(recursive=True) == []


def test_shutdown_workers_stops_both_iterators_and_tolerates_missing_or_failing_hooks():
    from types import SimpleNamespace

    stopped = []
    it = SimpleNamespace(_shutdown_workers=lambda: stopped.append("it"))
    kept = SimpleNamespace(_shutdown_workers=lambda: stopped.append("loader's"))
    loader = SimpleNamespace(_iterator=kept)
    compat.shutdown_workers(loader, it)
    assert stopped == ["it", "loader's"] and loader._iterator is None  # workers stopped, reference dropped

    def dead():
        raise RuntimeError("worker already gone")

    loader = SimpleNamespace(_iterator=SimpleNamespace(_shutdown_workers=dead))
    compat.shutdown_workers(loader, object())  # no hook on one, a failing hook on the other
    assert loader._iterator is None
    compat.shutdown_workers(None, None)


def test_memory_events_raise_naming_the_internal():
    class Moved:
        profiler = object()

    with pytest.raises(RuntimeError, match="kineto_results"):
        compat.memory_events(Moved(), "cpu")


def test_compile_watch_survives_missing_dynamo_counters(monkeypatch):
    watch = compat.CompileWatch(enabled=True)
    monkeypatch.setattr(watch, "counters", lambda: {})
    monkeypatch.setattr(watch, "metrics_since", lambda start: [])
    with watch:
        pass
    assert watch.info["graph_count"] == 0 and watch.info["graph_breaks"] == 0


def test_no_private_torch_access_outside_compat():
    """Private torch names (torch.x._y or ._private attributes of torch objects) live in compat.py."""
    root = Path(wb.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "compat.py":
            continue
        offenders += private_torch_imports(path.name, path.read_text())
    assert not offenders, offenders


def private_torch_imports(name: str, source: str) -> list[str]:
    """`from torch._x import y`, `from torch.x import _y` and `import torch._x` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch") and (
                any(part.startswith("_") for part in node.module.split("."))
                or any(a.name.startswith("_") for a in node.names)):
            found.append(f"{name}: from {node.module} import ...")
        if isinstance(node, ast.Import):
            found += [f"{name}: import {a.name}" for a in node.names
                      if a.name.startswith("torch.") and any(p.startswith("_") for p in a.name.split("."))]
    return found


def test_the_private_import_check_catches_plain_imports():
    source = "def f():\n    import torch._dynamo\n    import torch.nn\n    from torch.x import _y\n"
    assert sorted(private_torch_imports("m.py", source)) == ["m.py: from torch.x import ...",
                                                              "m.py: import torch._dynamo"]



def test_cpu_native_bf16_says_unknown_when_torchs_checks_are_gone(monkeypatch):
    for name in ("cpu_avx512_bf16", "cpu_amx_tile"):
        monkeypatch.delattr(torch.cpu, compat.PRIVATE[name][1], raising=False)
    assert compat.cpu_native_bf16() is None  # system.cpu_has_bf16 then reads the CPU flags


def test_memory_timeline_falls_back_with_a_note(monkeypatch):
    from torch.cuda import _memory_viz

    def broken(snapshot):
        raise KeyError("segments")

    monkeypatch.setattr(_memory_viz, "trace_plot", broken)
    page, note = compat.memory_timeline_html({})
    assert page is None and "trace_plot" in note and "KeyError" in note


def test_compile_watch_lists_each_distinct_graph_break_once_with_its_line_and_count():
    import inspect

    from workbench.diagnose.compile import break_lines

    torch._dynamo.reset()

    def f(x):
        y = x * 2
        torch._dynamo.graph_break()  # the user-code line the summary must name
        return y + 1

    fn = torch.compile(f, backend="eager", dynamic=False)  # dynamo only: fast, no inductor
    line = inspect.getsourcelines(f)[1] + 2
    with compat.CompileWatch(enabled=True) as w:
        for n in (3, 5, 7):  # three static shapes: the same break, compiled three times
            fn(torch.ones(n))
    breaks = w.info["breaks"]
    assert len(breaks) == 1, breaks
    assert breaks[0]["count"] >= 2 and breaks[0]["where"].endswith(f"test_compat.py:{line} in f"), breaks
    text = break_lines(w.info)
    assert len(text) == 1 and f"×{breaks[0]['count']}" in text[0] and "test_compat.py" in text[0]


def test_distinct_breaks_group_records_without_a_stack():
    class Rec:
        def __init__(self, reason):
            self.reason, self.user_stack = reason, None

    out = compat.distinct_breaks([Rec("a\nmore"), Rec("b"), Rec("a")])
    assert out == [{"reason": "a", "where": "", "count": 2}, {"reason": "b", "where": "", "count": 1}]
