"""hopeless.py: a known hopeless trial is warned about before it starts, with this machine's factor."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.deciding import hopeless
from workbench.deciding.hopeless import known_slow, measured_factor, warning


def _trial(knobs: wb.Knobs, rate: float, device: str = "cpu") -> TrialResult:
    return TrialResult(knobs=knobs, status="ok", samples_per_s=rate, env={"device": device})


def test_known_slow_configurations(monkeypatch):
    monkeypatch.setattr("workbench.core.system.cpu_has_bf16", lambda: False)
    assert known_slow(wb.Knobs(amp="bf16"), "cpu")[1] == {"amp": "off"}
    assert known_slow(wb.Knobs(amp="fp16"), "cpu")[0].startswith("amp='fp16' on CPU")
    assert known_slow(wb.Knobs(compile="reduce-overhead"), "cpu")[1] == {"compile": "off"}
    assert known_slow(wb.Knobs(amp="bf16"), "cuda") is None and known_slow(wb.Knobs(), "cpu") is None
    monkeypatch.setattr("workbench.core.system.cpu_has_bf16", lambda: True)
    assert known_slow(wb.Knobs(amp="bf16"), "cpu") is None


def test_the_factor_comes_from_this_machines_earlier_pairs(monkeypatch):
    monkeypatch.setattr("workbench.core.system.cpu_has_bf16", lambda: False)
    k = wb.Knobs(batch_size=8)
    trials = [_trial(k, 100.0), _trial(k.replace(amp="bf16"), 9.0), _trial(k.replace(amp="bf16"), 9.0, "cuda:0"),
              _trial(k.replace(batch_size=16), 200.0), _trial(k.replace(batch_size=16, amp="bf16"), 20.0)]
    factor, pairs = measured_factor(wb.Knobs(batch_size=4, amp="bf16"), {"amp": "off"}, trials, "cpu")
    assert pairs == 2 and factor == pytest.approx((0.09 * 0.1) ** 0.5)
    text = warning(wb.Knobs(amp="bf16"), trials, "cpu")
    assert "≈0.09× the throughput of amp='off'" in text and "2 earlier pair(s)" in text and "stop_early=False" in text
    assert "no earlier trial on this machine" in warning(wb.Knobs(amp="bf16"), [], "cpu")
    assert warning(wb.Knobs(), trials, "cpu") is None
    assert hopeless.measured_factor(wb.Knobs(amp="bf16"), {"amp": "off"}, [], "cpu") is None


def test_a_cell_is_warned_before_a_hopeless_trial(make_bench, monkeypatch):
    monkeypatch.setattr("workbench.core.system.cpu_has_bf16", lambda: False)
    bench = make_bench(steps=3)
    bench.run()
    assert bench._expect_slow(bench.knobs(amp="bf16")).startswith("amp='bf16' on a CPU without native bf16 units")
    with pytest.warns(UserWarning, match="amp='bf16' on a CPU without native bf16 units"):
        bench.run(amp="bf16")
    assert "earlier pair(s)" in bench._expect_slow(bench.knobs(amp="bf16"))
