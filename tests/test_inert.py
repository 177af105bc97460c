"""A knob that changes nothing in this workload's step is known before any trial runs (core/knobs/inert.py):
`run` says so, `compare` answers "same" without measuring, and a knob that may act is never answered so."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.core.knobs.inert import same_step
from workbench.results import ResultLog


def test_the_declared_rules_on_a_linear_model_on_cpu():
    k = wb.Knobs(batch_size=8)
    flat = {"four_d": False, "token_data": False}
    assert set(same_step(k, k.replace(channels_last=True, cudnn_benchmark=True, pin_memory=True), "cpu", **flat)) == {
        "channels_last", "cudnn_benchmark", "pin_memory"}
    assert same_step(k, k.replace(prefetch_factor=4), "cpu", **flat)  # no workers: nothing fetched ahead
    assert same_step(k, k.replace(ddp_bucket_cap_mb=5), "cpu", **flat)  # world_size=1: no DDP
    assert same_step(k, k.replace(checkpoint_mode="selective"), "cpu", **flat)  # no block checkpointed
    assert same_step(k, k.replace(packing=True), "cpu", **flat)  # no token batches
    # a knob that may act: no answer without measuring
    assert same_step(k, k.replace(channels_last=True), "cpu", four_d=True) is None  # a conv weight or image batch
    assert same_step(k, k.replace(channels_last=True), "cpu") is None  # not known yet: it may act
    assert same_step(k, k.replace(pin_memory=True), "cuda", **flat) is None
    assert same_step(k.replace(num_workers=2), k.replace(num_workers=2, prefetch_factor=4), "cpu", **flat) is None
    assert same_step(k, k.replace(channels_last=True, batch_size=16), "cpu", **flat) is None  # batch_size acts
    assert same_step(k, k, "cpu", **flat) is None  # nothing differs: a repeat, which compare measures


def test_a_sample_batch_decides_channels_last(make_bench):
    flat = make_bench()  # TinyNet: Linear layers, (N, 8) batches
    assert flat.workload.four_d is False
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 4))
    images = TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,)))
    assert make_bench(conv, images).workload.four_d is True
    mlp_on_images = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    assert make_bench(mlp_on_images, images).workload.four_d is True  # the batch is moved to NHWC


def test_run_says_it_before_the_trial_and_compare_answers_without_measuring(make_bench, tmp_path):
    bench = make_bench()
    base = bench.run(progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        change = bench.run(channels_last=True, progress=False)
    said = [str(w.message) for w in caught if "changes nothing in this step" in str(w.message)]
    assert len(said) == 1 and "channels_last=True" in said[0] and "4-D" in said[0]
    assert any("changes nothing in this step" in n for n in change.notes)
    n = len(bench.log.trials)
    c = bench.compare(base, change, rounds="auto")
    assert len(bench.log.trials) == n  # nothing was run
    assert (c.answer, c.method, c.speedup) == ("same", "unchanged", 1.0)
    assert "same step" in str(c) and "channels_last=True" in str(c)
    assert bench.results.set_index("trial_id").loc[change.trial_id, "verdict"] == "same"
    again = ResultLog(bench.log.path)  # the logged comparison reads back
    assert again.comparisons[-1].method == "unchanged" and again.comparisons[-1].how.startswith("not measured")


def test_a_knob_that_may_act_is_measured(make_bench):
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 4))
    bench = make_bench(conv, TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "changes nothing" warning here
        a, b = bench.run(progress=False), bench.run(channels_last=True, progress=False)
    assert not any("changes nothing" in n for n in b.notes)
    c = bench.compare(a, b)
    assert c.method == "trials"


@pytest.mark.parametrize("name", ["channels_last", "cudnn_benchmark", "pin_memory", "prefetch_factor",
                                  "persistent_workers", "checkpoint_mode", "packing", "ddp_comm_hook"])
def test_every_declared_rule_is_a_hook_of_the_knob(name):
    from workbench.core.knobs import KNOBS

    assert KNOBS[name].inert is not None
