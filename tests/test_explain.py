"""bench.explain(a, b): two trials' traced steps compared by phase and op, with the evidence rules
(traced steps only, how much of the measured difference they account for, "same" or "undecided" first)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from workbench.core.measure import TrialResult
from workbench.diagnose import explain as ex
from workbench.results.stats import Noise, decide

QUIET = Noise(sigma=0.01, df=50, repeats=46, configs=4)  # a quiet machine: 18% is decided (faster)

PHASE_ROWS = list(ex.PHASE_ROWS)


# ---- a hand-made trace: every figure is known ------------------------------------------------------
def _x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def _trace(tmp_path: Path, name: str, conv_us: float, *, extra_op: str | None = None, gpu: bool = False,
           kernel_us: float = 550) -> Path:
    """Two steps of 1000 us + conv_us: data 100, forward 200 + conv_us (a linear holding an addmm,
    and a conv), backward 500, optimizer 100; the rest is 'other'."""
    events = []
    t = 0.0
    for i in (1, 2):
        step = 1000 + conv_us + (max(0.0, kernel_us - 550) if gpu else 0.0)  # a longer kernel: a longer step
        events.append(_x(f"ProfilerStep#{i}", "user_annotation", t, step))
        events.append(_x("data", "user_annotation", t + 10, 100))
        events.append(_x("forward", "user_annotation", t + 110, 200 + conv_us))
        events.append(_x("aten::linear", "cpu_op", t + 120, 150))
        events.append(_x("aten::addmm", "cpu_op", t + 130, 100))  # inside linear: linear's self time is 50
        events.append(_x("aten::conv2d", "cpu_op", t + 280, conv_us))
        if extra_op:
            events.append(_x(extra_op, "cpu_op", t + 280 + conv_us, 10))
        events.append(_x("backward", "user_annotation", t + 310 + conv_us, 500))
        events.append(_x("aten::mm", "cpu_op", t + 320 + conv_us, 400, tid=2))  # autograd thread: phase by time
        events.append(_x("optimizer", "user_annotation", t + 810 + conv_us, 100))
        if gpu:
            events.append(_x("backward", "gpu_user_annotation", t + 330 + conv_us, kernel_us + 50, tid=7))
            events.append(_x("sgemm_kernel", "kernel", t + 340 + conv_us, kernel_us, tid=7))
        t += step
    path = tmp_path / f"{name}.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [*events, {"ph": "M", "name": "process_name", "pid": 1}]}))
    return path


def test_read_trace_gives_phases_per_step_and_self_times(tmp_path):
    s = ex.read_trace(_trace(tmp_path, "a", 300))
    assert s.steps == 2 and s.step_ms == pytest.approx(1.3)
    assert s.phases["data wait"] == pytest.approx(0.1) and s.phases["forward"] == pytest.approx(0.5)
    assert s.phases["backward"] == pytest.approx(0.5) and s.phases["optimizer"] == pytest.approx(0.1)
    assert sum(s.phases.values()) == pytest.approx(s.step_ms)  # 'other' closes the step
    ops = s.ops.set_index("op")
    assert ops.loc["aten::linear", "ms"] == pytest.approx(0.05)  # self time: minus the addmm inside
    assert ops.loc["aten::addmm", "ms"] == pytest.approx(0.1) and ops.loc["aten::conv2d", "ms"] == pytest.approx(0.3)
    assert ops.loc["aten::mm", "phase"] == "backward" and ops.loc["aten::conv2d", "calls"] == 1
    assert not s.device


def test_gpu_traces_use_device_ranges_and_kernels(tmp_path):
    s = ex.read_trace(_trace(tmp_path, "g", 300, gpu=True))
    # the kernel the backward range queued (0.55 ms), not the host's 0.5 nor the device-side range's 0.6
    assert s.device and s.phases["backward"] == pytest.approx(0.55)
    k = s.ops[s.ops["kind"] == "kernel"].set_index("op")
    assert k.loc["sgemm_kernel", "ms"] == pytest.approx(0.55) and k.loc["sgemm_kernel", "phase"] == "backward"
    slow = ex.read_trace(_trace(tmp_path, "h", 300, gpu=True, kernel_us=850))
    a, b = _result(1, 1.6, tmp_path / "h.pt.trace.json"), _result(2, 1.3, tmp_path / "g.pt.trace.json")
    e = ex.explain_traces([a], [b], decide([5000.0] * 3, [6150.0] * 3, QUIET, a_trials=[1], b_trials=[2]))
    assert slow.phases["backward"] == pytest.approx(0.85) and e.phases.set_index("phase").loc["backward", "delta_ms"] < 0
    assert "in backward, mostly sgemm_kernel (-0.3 ms)" in str(e)  # on a GPU the kernel, not a host op, explains it


def test_a_trace_without_steps_is_refused(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": [_x("aten::mm", "cpu_op", 0, 5)]}))
    with pytest.raises(ValueError, match="trace=True"):
        ex.read_trace(path)


def test_tables_sort_by_change_and_mark_new_and_gone_ops(tmp_path):
    a = ex.read_trace(_trace(tmp_path, "a", 300, extra_op="aten::old"))
    b = ex.read_trace(_trace(tmp_path, "b", 100, extra_op="aten::new"))
    phases = ex.phase_table(a, b)
    assert list(phases["phase"]) == PHASE_ROWS
    assert phases["delta_ms"].sum() == pytest.approx(b.step_ms - a.step_ms)
    assert phases.set_index("phase").loc["forward", "delta_ms"] == pytest.approx(-0.2)
    ops = ex.op_table(a, b)
    assert ops.iloc[0]["op"] == "aten::conv2d" and ops.iloc[0]["delta_ms"] == pytest.approx(-0.2)
    assert list(ops["delta_ms"].abs()) == sorted(ops["delta_ms"].abs(), reverse=True)
    change = ops.set_index("op")["change"]
    assert change["aten::new"] == "new in B" and change["aten::old"] == "gone in B" and change["aten::mm"] == ""


def _result(trial_id, ms, path, **kw):
    return TrialResult(knobs=kw.pop("knobs", None) or __import__("workbench").Knobs(batch_size=8), status="ok",
                       samples_per_s=8000 / ms, step_times_s=(ms / 1e3,) * 4, trial_id=trial_id,
                       trace_path=str(path), samples_per_step=8, **kw)


def test_sentences_say_the_saving_the_share_and_where(tmp_path):
    a = _result(1, 1.3, _trace(tmp_path, "a", 300))
    b = _result(2, 1.1, _trace(tmp_path, "b", 100))
    c = decide([a.samples_per_s] * 3, [b.samples_per_s] * 3, QUIET, a_trials=[1], b_trials=[2])
    e = ex.explain_traces([a], [b], c)
    text = str(e)
    assert e.verdict == "faster" and text.startswith("#2 saves 0.2 ms per step")
    assert e.accounted == pytest.approx(1.0) and "account for 100%" in text
    assert "100% of the traced change is in forward, mostly aten::conv2d (-0.2 ms)" in text
    assert "data wait is unchanged" in text
    assert "<table" in e._repr_html_() and e.to_dict()["phases"][0]["phase"] == "data wait"
    from workbench.faces.cli import jsonable

    doc = jsonable(e)  # e.g. inside a TuneResult's --json document
    assert doc["text"] == e.sentences() and doc["phases"][0]["phase"] == "data wait" and doc["ops"]


def test_undecided_comes_first_and_disagreement_is_quantified(tmp_path):
    a = _result(1, 1.0, _trace(tmp_path, "a", 300))
    b = _result(2, 1.01, _trace(tmp_path, "b", 100))
    same = decide([1000.0], [990.0], a_trials=[1], b_trials=[2])
    e = ex.explain_traces([a], [b], same)
    assert e.verdict == "undecided"  # one pair against the prior noise: not shown faster, slower or the same
    first = e.sentences()[0]
    assert first.startswith("Undecided: #2 vs #1") and "cannot tell" in first  # never called "same"
    assert "point the other way" in str(e) and "off by" in str(e)  # traced -0.2 ms vs measured +0.01 ms


def test_same_comes_first_and_says_same_not_undecided(tmp_path):
    a = _result(1, 1.0, _trace(tmp_path, "a", 300))
    b = _result(2, 1.0, _trace(tmp_path, "b", 300))
    e = ex.explain_traces([a], [b], decide([5000.0] * 8, [5010.0] * 8, QUIET, a_trials=[1], b_trials=[2]))
    assert e.verdict == "same"
    first = e.sentences()[0]
    assert first.startswith("Same: #2 vs #1") and "within ±5%" in first and "Undecided" not in str(e)


def test_verdict_word_prefers_the_comparisons_own_answer():
    c = decide([100.0, 101.0], [150.0, 151.0])
    assert ex.verdict_word(c) == "faster"

    class Answered:
        answer = "undecided"

    assert ex.verdict_word(Answered()) == "undecided"  # type: ignore[arg-type]


def test_compiled_side_reports_compile_time_apart_from_the_per_step_saving(tmp_path):
    import workbench as wb

    eager = _result(1, 1.3, _trace(tmp_path, "a", 300))
    compiled = _result(2, 1.1, _trace(tmp_path, "b", 100), knobs=wb.Knobs(batch_size=8, compile="default"),
                       compile_s=12.5, extra={"compile": {"breaks": [
                           {"reason": "Tensor.item()", "where": "model.py:12 in forward", "count": 3}]}})
    e = ex.explain_traces([eager], [compiled], decide([6000.0] * 3, [7300.0] * 3, QUIET, a_trials=[1], b_trials=[2]))
    text = str(e)
    assert "12.5 s of compile + warm-up, paid once and not in the per-step figures" in text
    assert "pays back after 62,500 steps" in text  # 12.5 s / 0.2 ms
    assert "distinct graph breaks: ×3: Tensor.item() at model.py:12 in forward" in text


# ---- through a workbench ----------------------------------------------------------------------------
def test_bench_explain_uses_traces_and_adds_a_traced_repeat_when_missing(make_bench):
    bench = make_bench()
    a = bench.run(trace=True, progress=False)
    b = bench.run(batch_size=8, progress=False, cpu_threads=1)  # no trace: explain traces a repeat
    e = bench.explain(a.trial_id, b.trial_id, progress=False)
    assert len(bench.trials) == 3 and bench.trials[-1].trace_path and bench.trials[-1].knobs == b.knobs
    assert e.comparison.b_trials == (b.trial_id, 3) and e.traces[1] == bench.trials[-1].trace_path
    assert list(e.phases["phase"]) == PHASE_ROWS
    assert e.phases["delta_ms"].sum() == pytest.approx(e.traced_delta_ms)
    assert e.ops["op"].str.startswith("aten::").any() and not e.ops["op"].str.startswith("ProfilerStep").any()
    assert e.measured_a_ms == pytest.approx(a.step_time_s * 1e3)  # the measured window, not the traced steps
    assert isinstance(e.ops, pd.DataFrame)
    assert str(e).splitlines()[0] == " ".join(e.sentences())  # the printed form is the sentences, then notes
    assert str(e).splitlines()[1:] == [f"note: {n}" for n in e.notes]


def test_explain_refuses_failed_trials_and_bad_arguments(make_bench):
    bench = make_bench()
    with pytest.raises(ValueError, match="needs A"):
        bench.explain(None, 1)
    with pytest.raises(TypeError, match="trial ids, TrialResults or Knobs"):
        bench.explain("fast", "slow")


def test_explain_chart_draws_phases_and_ops(tmp_path):
    pytest.importorskip("altair")
    a = _result(1, 1.3, _trace(tmp_path, "a", 300))
    b = _result(2, 1.1, _trace(tmp_path, "b", 100))
    e = ex.explain_traces([a], [b], decide([6000.0] * 3, [7300.0] * 3, QUIET, a_trials=[1], b_trials=[2]))
    spec = e.chart().to_dict()
    assert len(spec["vconcat"]) == 2


def test_b_flags_parse_with_the_knob_types():
    from workbench.faces.cli import b_changes

    assert b_changes(["channels_last", "amp=bf16", "num_workers=2"], []) == {
        "channels_last": True, "amp": "bf16", "num_workers": 2}
    assert b_changes(["pin-memory=off"], []) == {"pin_memory": False}
    with pytest.raises(ValueError, match="unknown knob"):
        b_changes(["warp_speed"], [])
    with pytest.raises(ValueError, match="needs a value"):
        b_changes(["num_workers"], [])


def test_cli_explain_json_prints_one_document_with_phases_and_ops(capsys):
    from workbench.faces.cli import main

    code = main(["explain", "--demo", "cnn", "--size", "tiny", "--log", "none", "--steps", "3", "--warmup-steps", "1",
                 "--b", "channels_last", "--json", "--quiet"])
    doc = json.loads(capsys.readouterr().out)  # exactly one document
    assert code == 0 and doc["command"] == "explain" and doc["ok"]
    result = doc["result"]
    assert [p["phase"] for p in result["phases"]] == PHASE_ROWS
    assert result["ops"] and {"op", "calls_a", "calls_b", "a_ms", "b_ms", "delta_ms"} <= set(result["ops"][0])
    assert result["text"] and result["comparison"]["speedup"] > 0


def test_explain_winner_is_none_when_the_start_won(make_bench):
    bench = make_bench()
    start = bench.run(trace=True, progress=False)
    assert ex.explain_winner(bench, start, start) is None
    other = bench.run(trace=True, progress=False, cpu_threads=1)
    e = ex.explain_winner(bench, start, other)
    assert e is not None and e.a == start.trial_id and e.b == other.trial_id and len(bench.trials) == 2


def test_traces_that_barely_differ_say_so_instead_of_a_share(tmp_path):
    a = _result(1, 1.3, _trace(tmp_path, "a", 300))
    b = _result(2, 1.1, _trace(tmp_path, "b", 300))  # the same traced steps, a different measured step
    e = ex.explain_traces([a], [b], decide([6000.0] * 3, [7300.0] * 3, QUIET, a_trials=[1], b_trials=[2]))
    assert "barely differ (+0.00 ms vs measured -0.2 ms)" in str(e) and "%" not in e.sentences()[1]


def test_the_median_traced_step_ignores_one_disturbed_step(tmp_path):
    path = _trace(tmp_path, "a", 300)
    doc = json.loads(path.read_text())
    doc["traceEvents"].append(_x("ProfilerStep#3", "user_annotation", 5000, 9000))  # a step stalled by another process
    doc["traceEvents"].append(_x("aten::stall", "cpu_op", 5100, 8800))
    path.write_text(json.dumps(doc))
    s = ex.read_trace(path)
    assert s.steps == 3 and s.step_ms == pytest.approx(1.3) and "aten::stall" not in set(s.ops["op"])
    assert "the median of 3 traced steps" in s.used
    mean = ex.read_trace(path, median=False)
    assert mean.step_ms == pytest.approx((1.3 * 2 + 9.0) / 3) and "aten::stall" in set(mean.ops["op"])
