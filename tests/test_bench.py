"""Workbench facade: the core imports without the notebook stack; run/results/compare contract."""

import subprocess
import sys

import pytest


def test_core_imports_without_ipywidgets_or_altair():
    code = (
        "import sys; sys.modules['ipywidgets'] = None; sys.modules['altair'] = None; sys.modules['anywidget'] = None\n"
        "import torch, workbench as wb\n"
        "from torch.utils.data import TensorDataset\n"
        "ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))\n"
        "b = wb.Workbench(torch.nn.Linear(4, 2), ds, loss_fn=torch.nn.CrossEntropyLoss(), log=None, steps=2, warmup_steps=0)\n"
        "r = b.run(batch_size=8)\n"
        "assert r.ok, r\n"
        "assert len(b.results) == 1\n"
        "assert 'ipywidgets' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_run_results_compare_contract(make_bench):
    bench = make_bench(steps=4)
    a = bench.run()
    b = bench.run(batch_size=16)
    df = bench.results
    assert list(df["trial_id"]) == [1, 2] and set(df["status"]) == {"ok"}
    assert df.loc[2, "batch_size"] == 16 and df.loc[1, "verdict"] == "baseline"
    assert bench.baseline.trial_id == a.trial_id
    bench.set_baseline(b)
    assert bench.results.loc[2, "speedup"] == 1.0
    assert bench.compare(1, 2).b == 2
    assert "Workbench 'TinyNet'" in repr(bench) and "2 trials" in repr(bench)
    assert bench.blocks == ["blocks.0", "blocks.1"] and bench.block_params["blocks.0"] > 0


def test_a_new_workbench_on_the_same_log_keeps_earlier_trials(make_bench, tmp_path):
    make_bench().run()
    again = make_bench()
    assert len(again.trials) == 1
    again.run()
    assert [r.trial_id for r in again.trials] == [1, 2]


def test_run_rejects_unknown_knob(make_bench):
    with pytest.raises(TypeError, match="unknown knob"):
        make_bench().run(workers=2)


def test_steps_must_allow_statistics(make_bench):
    with pytest.raises(ValueError, match="steps must be >= 2"):
        make_bench(steps=1)
