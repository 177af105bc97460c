"""step.py: one training step for the runner, the analyses and the generated code."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from conftest import TinyNet, tiny_data
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.core.step import BatchSource, LossBuffer, Stage, TrainStep, built, check_loss, seeded
from workbench.core.workload import Workload


class ConvNet(nn.Module):
    """A conv block and a head: channels_last and checkpointing both have something to act on."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8 * 8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def conv_data() -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    return TensorDataset(torch.randn(40, 3, 8, 8, generator=g), torch.randint(0, 3, (40,), generator=g))


def generated_losses(knobs: wb.Knobs, model: nn.Module, data, steps: int) -> list[float]:
    """Per-step losses of the loop `knobs.to_code()` generates (mean over micro-batches)."""
    seen: list[float] = []
    ce = nn.CrossEntropyLoss()

    def loss_fn(out, target):
        loss = ce(out, target)
        seen.append(loss.detach().float().item())
        return loss

    ns = {"model": model, "dataset": data, "loss_fn": loss_fn,
          "make_optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
    threads = torch.get_num_threads()
    with seeded(0):
        try:
            exec(compile(knobs.to_code(steps=steps, seed=0), "<generated>", "exec"), ns)
        finally:
            torch.set_num_threads(threads)
            torch.set_float32_matmul_precision("highest")
    k = knobs.accum_steps
    return [sum(seen[i * k:(i + 1) * k]) / k for i in range(steps)]


@pytest.mark.parametrize("make_model, make_data, knobs", [
    (TinyNet, tiny_data, wb.Knobs(batch_size=8)),
    (TinyNet, tiny_data, wb.Knobs(batch_size=6, accum_steps=3)),  # 64 samples: epochs end mid-step
    (TinyNet, tiny_data, wb.Knobs(batch_size=8, checkpoint=("blocks.0", "blocks.1"))),
    (TinyNet, tiny_data, wb.Knobs(batch_size=8, amp="bf16", accum_steps=2)),
    (TinyNet, tiny_data, wb.Knobs(batch_size=8, optimizer_impl="foreach")),
    (TinyNet, tiny_data, wb.Knobs(batch_size=8, checkpoint=("blocks.1",), checkpoint_mode="selective")),
    (ConvNet, conv_data, wb.Knobs(batch_size=8, channels_last=True)),
    (ConvNet, conv_data, wb.Knobs(batch_size=4, channels_last=True, checkpoint=("features.2",), amp="bf16",
                                  accum_steps=2)),
])
@pytest.mark.fixed_warmup
def test_generated_code_and_run_trial_give_the_same_losses(make_model, make_data, knobs, tmp_path, tolerance=1e-6):
    torch.manual_seed(0)
    model, data = make_model(), make_data()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    bench = wb.Workbench(model, data, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                         steps=4, warmup_steps=2, log=None, knobs=knobs)
    result = bench.run(knobs)
    assert result.ok, result.message
    fresh = make_model()
    fresh.load_state_dict(initial)
    code = generated_losses(knobs, fresh, data, steps=6)[2:]  # the trial measured steps 3..6
    assert result.losses == pytest.approx(code, abs=tolerance, rel=0)


# Knobs the per-knob equivalence below cannot run in one process, and where each is covered instead.
NOT_HERE = {
    "data": "data='cached' repeats one batch in the trial; the generated loop uses the real data",
    "compile": "one compiled pair, not one per knob (a cold compile costs tens of seconds): "
               "test_a_compiled_trial_and_its_script_give_the_same_losses",
    "world_size": "multi-process: test_codegen.test_ddp_script_runs_under_torchrun_with_two_gloo_ranks",
    "group_by_length": "the trial measures a fixed, length-stratified sample of the grouped batches (docs/measurement.md, "
                       "test_hf.test_the_window_is_a_length_stratified_sample_wherever_it_starts), the script trains on "
                       "the grouped sampler itself: the same batches, not the same order; the script runs: "
                       "test_hf.test_the_trainer_script_runs_as_it_is",
    "packing": "needs a model that takes position_ids (test_hf.test_packing_refuses_a_model_without_position_ids); "
               "its trial and script: test_hf.test_a_trainer_wraps_counts_tokens_groups_by_length_and_goes_back_out, "
               "test_hf.test_the_trainer_script_runs_as_it_is",
    "allocator": "a process knob: its trial runs in a fresh process (test_process.test_an_allocator_trial_runs_in_a_"
                 "fresh_process_in_its_mode); its script's launch line: test_process.test_the_script_carries_the_launch_line_and_checks_the_mode",
}
NEEDS = {"checkpoint_mode": {"checkpoint": ("blocks.1",)}, "prefetch_factor": {"num_workers": 1},
         "persistent_workers": {"num_workers": 1}}


def switched_on(name: str) -> dict:
    """The knob at its first non-default valid value (from its declaration), plus what it needs."""
    from workbench.core.knobs import KNOBS

    spec = KNOBS[name]
    valid = ("blocks.0",) if spec.fuzz.valid == "blocks" else spec.fuzz.valid
    value = next(v for v in valid if v != spec.default)
    return {**NEEDS.get(name, {}), name: (value,) if spec.kind == "blocks" else value}


class ConvBlocks(nn.Module):
    """A conv stem (channels_last acts on it) and residual blocks (checkpoint acts on them): a model
    on which every single-process knob changes what runs on a CPU, except those in NOOP_ON_CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.inp = nn.Linear(4 * 8 * 8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(2))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(self.stem(x).flatten(1))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


# Knobs that change nothing a CPU runs (the trial says so in its notes): their equivalence below is
# trivially true here, so a test holds them to that note instead.
NOOP_ON_CPU = {"pin_memory": "no accelerator", "cudnn_benchmark": "cuDNN is NVIDIA's",
               "matmul_precision": "float32 matmuls on a CPU", "strategy": "fsdp2 at world_size=1"}
SINGLE_PROCESS = [n for n in wb.knob_names() if n not in NOT_HERE and not n.startswith(("ddp_", "fsdp_"))]


# ddp_*/fsdp_* knobs need world_size > 1: test_ranks / test_strategy
@pytest.mark.fixed_warmup
@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_every_knob_gives_the_same_losses_in_generated_code_and_run_trial(name, tmp_path):
    """Registry-driven: a knob declared in knobs/ is checked here without editing this file."""
    knobs = wb.Knobs(**{"batch_size": 8, **switched_on(name)})
    test_generated_code_and_run_trial_give_the_same_losses(ConvBlocks, conv_data, knobs, tmp_path)


@pytest.mark.parametrize("name", sorted(NOOP_ON_CPU))
def test_a_knob_that_does_nothing_on_a_cpu_says_so(name):
    from workbench.core.knobs import device_notes

    knobs = wb.Knobs(**{"batch_size": 8, **switched_on(name)})
    assert any(name in note and "no-op" in note for note in device_notes(knobs, "cpu")), device_notes(knobs, "cpu")


@pytest.mark.slow
@pytest.mark.fixed_warmup
def test_a_compiled_trial_and_its_script_give_the_same_losses(tmp_path):
    """compile='default' (inductor) in the trial and in the exported loop: the same numbers (to float32
    rounding of the fused kernels)."""
    test_generated_code_and_run_trial_give_the_same_losses(ConvBlocks, conv_data, wb.Knobs(batch_size=8, compile="default"),
                                                           tmp_path, tolerance=1e-4)


def test_loss_buffer_keeps_values_the_step_overwrites():
    """A CUDA-graph replay reuses the loss's storage; the buffer must hold copies, not views."""
    buf = LossBuffer(3, torch.device("cpu"))
    scratch = torch.zeros(())  # stands in for graph-owned output memory, rewritten every replay
    for step, micro in enumerate([(1.0, 3.0), (2.0, 2.0), (5.0, 7.0)]):
        for value in micro:
            scratch.fill_(value)
            buf.add(step, scratch)
    scratch.fill_(-1.0)
    assert buf.values(divide_by=2) == [2.0, 2.0, 6.0]
    assert buf.values() == [4.0, 4.0, 12.0]


def test_loss_buffer_only_reports_filled_steps():
    buf = LossBuffer(5, torch.device("cpu"))
    buf.add(0, torch.tensor(1.5))
    buf.add(1, torch.tensor(0.5, dtype=torch.bfloat16))
    assert buf.values() == [1.5, 0.5]


def test_no_sync_is_entered_on_every_micro_batch_but_the_last():
    events: list[str] = []

    @contextlib.contextmanager
    def fake_no_sync():
        events.append("enter")
        yield
        events.append("exit")

    wl = Workload(TinyNet(), tiny_data(), loss_fn=nn.CrossEntropyLoss(), device="cpu")
    knobs = wb.Knobs(batch_size=8, accum_steps=3)
    with TrainStep(wl, knobs, no_sync=fake_no_sync) as step, BatchSource(wl, knobs) as source:
        original = step.forward_backward

        def spy(batch):
            events.append("micro")
            return original(batch)

        step.forward_backward = spy
        out = step(source)
    assert events == ["enter", "micro", "exit", "enter", "micro", "exit", "micro"]
    assert out.samples == 24


def test_label_phases_puts_record_function_ranges_around_each_phase():
    wl = Workload(TinyNet(), tiny_data(), loss_fn=nn.CrossEntropyLoss(), device="cpu")
    knobs = wb.Knobs(batch_size=8)
    with built(wl, knobs, label_phases=True) as (step, source):
        with torch.profiler.profile() as prof:
            step(source)
    names = {e.key for e in prof.key_averages()}
    assert {"data", "forward", "backward", "optimizer"} <= names
    with built(wl, knobs, label_phases=False) as (step, source):
        with torch.profiler.profile() as prof:
            step(source)
    assert not {"data", "forward", "backward", "optimizer"} & {e.key for e in prof.key_averages()}


def test_batch_source_restarts_epochs_and_caches():
    wl = Workload(TinyNet(), tiny_data(16), loss_fn=nn.CrossEntropyLoss(), device="cpu")
    with BatchSource(wl, wb.Knobs(batch_size=8)) as source:
        batches = [source.next() for _ in range(5)]
        assert source.epochs == 2 and all(b[0].shape == (8, 8) for b in batches)
    with BatchSource(wl, wb.Knobs(batch_size=8, data="cached")) as source:
        first = source.next()
        assert all(source.next() is first for _ in range(3)) and source.epochs == 0


def test_check_loss_names_the_fix():
    with pytest.raises(TypeError, match="reduction='mean'"):
        check_loss(torch.ones(3, requires_grad=True), Stage())
    with pytest.raises(TypeError, match="does not require grad"):
        check_loss(torch.tensor(1.0))


def test_seeded_restores_the_callers_generators():
    import random

    torch.manual_seed(5)
    random.seed(5)
    expected = (torch.rand(1), random.random())
    torch.manual_seed(5)
    random.seed(5)
    with seeded(0):
        inside = torch.rand(1)
    with seeded(0):
        assert torch.equal(torch.rand(1), inside)  # same seed, same numbers
    assert torch.equal(torch.rand(1), expected[0]) and random.random() == expected[1]


def test_analyses_run_where_this_processs_trials_run(make_bench):
    """One torch thread: an analysis called from the main thread runs on it (where a cell's trial runs),
    one called from another thread (the panel's) on the trial thread, never on a thread of its own."""
    from workbench.diagnose.flops import flops_per_step

    bench = make_bench()
    names = []
    original = bench.workload.compute_loss

    def spy(model, batch, stage):
        names.append(threading.current_thread().name)
        return original(model, batch, stage)

    bench.workload.compute_loss = spy
    flops_per_step(bench.workload, bench.defaults)
    assert names and set(names) == {"MainThread"}
    names.clear()
    t = threading.Thread(target=flops_per_step, args=(bench.workload, bench.defaults), name="panel")
    t.start()
    t.join()
    assert names and all(n.startswith("workbench-trial") for n in names)
