"""Traces: run(trace=True) and diagnose() keep a Chrome-trace JSON with labelled steps and phases,
profiled after the measured window, never inside it."""

import json
from pathlib import Path

import pytest
import torch
from conftest import TinyNet, tiny_data

from workbench.core import trace as tracing
from workbench.launch.runner import TRACE_STEPS

PHASES = {"data", "forward", "backward", "optimizer"}


def _names(path) -> set[str]:
    doc = json.loads(Path(path).read_text())
    assert doc["traceEvents"], "a trace without events"
    return {e.get("name", "") for e in doc["traceEvents"]}


def test_run_with_trace_writes_a_chrome_trace_next_to_the_log(make_bench):
    bench = make_bench()
    r = bench.run(trace=True, progress=False)
    assert r.ok and r.trace_path is not None
    path = Path(r.trace_path)
    assert path.parent == bench.log.path.parent and path.name.endswith(".pt.trace.json")
    names = _names(path)
    assert PHASES <= names, names
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert len(steps) == TRACE_STEPS, steps
    assert r.extra["trace"]["trace_path"] == r.trace_path
    # the path survives the log: a new workbench on the same log reads it back
    assert bench.log.__class__(bench.log.path).trials[-1].trace_path == r.trace_path


def test_no_trace_unless_asked(make_bench):
    r = make_bench().run(progress=False)
    assert r.trace_path is None and "trace" not in r.extra


@pytest.mark.fixed_warmup
def test_traced_steps_come_after_the_measured_window(make_bench):
    """Every forward records whether the profiler was on: the measured steps never see it."""
    seen: list[bool] = []
    loss_fn = torch.nn.CrossEntropyLoss()

    def step_fn(model, batch):
        seen.append(torch.autograd._profiler_enabled())
        x, y = batch
        return loss_fn(model(x), y)

    bench = make_bench(step_fn=step_fn, loss_fn=None, warmup_steps=1, steps=3)
    seen.clear()  # the constructor's probe step
    r = bench.run(trace=True, progress=False)
    assert r.ok
    # warm-up step 1 is the CPU memory probe (profiled), then 3 measured steps, then the trace:
    # one profiler warm-up step (profiler prepared, not yet recording) + TRACE_STEPS recorded ones
    assert seen == [True] + [False] * 3 + [False] + [True] * TRACE_STEPS, seen


def test_a_failing_trace_leaves_the_measurement(make_bench, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("profiler unavailable")

    monkeypatch.setattr(tracing, "capture", broken)
    r = make_bench().run(trace=True, progress=False)
    assert r.ok and r.samples_per_s and r.trace_path is None
    assert any(n.startswith("no trace: RuntimeError: profiler unavailable") for n in r.notes), r.notes


def test_capture_labels_steps_and_rejects_bad_counts(tmp_path):
    model = TinyNet()
    calls = []

    def step():
        calls.append(1)
        with torch.profiler.record_function("forward"):
            model(torch.randn(4, 8)).sum().backward()

    files = tracing.capture(step, tmp_path / "t.json", device=torch.device("cpu"), steps=2, warmup=1,
                            keep_averages=True)
    assert len(calls) == 3 and files.path.exists() and files.memory_snapshot is None
    assert {"ProfilerStep#1", "ProfilerStep#2", "forward"} <= _names(files.path)
    assert any(e.key == "forward" for e in files.averages)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        tracing.capture(step, tmp_path / "u.json", device=torch.device("cpu"), steps=0)


def test_trace_file_names_are_unique_and_in_the_folder(tmp_path):
    a, b = tracing.trace_file(tmp_path, "my model"), tracing.trace_file(tmp_path, "my model")
    assert a != b and a.parent == tmp_path and a.name.startswith("my_model-trace-")


def test_profile_step_keeps_its_trace(tmp_path):
    import workbench as wb
    from workbench.diagnose.profile import profile_step

    bench = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.05), log=None, knobs=wb.Knobs(batch_size=8))
    path = tmp_path / "diag.pt.trace.json"
    stages, ops = profile_step(bench.workload, bench.defaults, steps=2, trace_path=path)
    assert set(stages["stage"]) == PHASES
    assert not ops["op"].str.startswith("ProfilerStep").any()
    names = _names(path)
    assert PHASES <= names and {"ProfilerStep#1", "ProfilerStep#2"} <= names


def test_the_runner_trace_reads_back_as_phases_and_ops(make_bench):
    """What bench.explain reads (diagnose/explain.py parses the file, no HolisticTraceAnalysis needed):
    every traced step, the four phases inside it, host ops with self times."""
    from workbench.diagnose.explain import read_trace

    r = make_bench().run(trace=True, progress=False)
    s = read_trace(r.trace_path)
    assert s.steps == TRACE_STEPS and s.step_ms > 0 and not s.device
    assert all(s.phases[p] > 0 for p in ("forward", "backward", "optimizer"))
    assert sum(s.phases.values()) == pytest.approx(s.step_ms)
    assert s.phases["other"] >= -1e-6  # the phases nest inside the step
    assert (s.ops["ms"] >= 0).all() and s.ops["op"].str.startswith("aten::").any()


@pytest.mark.fixed_warmup
def test_epochs_crossed_by_the_traced_steps_are_not_the_windows(make_bench):
    # 40 samples at batch 8 = 5 batches: warm-up 1 + 3 measured steps fit, the 4 traced steps cross
    r = make_bench(data=tiny_data(40)).run(trace=True, progress=False)
    assert r.ok and r.trace_path is not None
    assert r.extra["epochs"] == 0
