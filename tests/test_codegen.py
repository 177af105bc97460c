"""codegen.py: the generated training loop parses for every knob combination and really trains."""

from __future__ import annotations

import ast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_failures import job_output
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.core.codegen import knobs_to_code, trial_to_code


def namespace(conv: bool = False) -> dict:
    """The names the snippet expects, bound to a tiny model and dataset."""
    torch.manual_seed(0)
    if conv:
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
        ds = TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 3, (32,)))
    else:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        ds = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    return {"model": model, "dataset": ds, "loss_fn": nn.CrossEntropyLoss(),
            "make_optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}


def run_code(knobs: wb.Knobs, conv: bool = False, steps: int = 3) -> dict:
    ns = namespace(conv)
    before = [p.detach().clone() for p in ns["model"].parameters()]
    threads = torch.get_num_threads()
    try:
        exec(compile(knobs.to_code(steps=steps), "<generated>", "exec"), ns)
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision("highest")
    after = list(ns["model"].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "the loop did not train the model"
    assert ns["step"] == steps
    return ns


@pytest.mark.parametrize("knobs, conv", [
    (wb.Knobs(batch_size=8), False),
    (wb.Knobs(batch_size=4, accum_steps=2, amp="bf16", cpu_threads=1, matmul_precision="high"), False),
    (wb.Knobs(batch_size=8, amp="fp16", checkpoint=("0",), pin_memory=True), False),
    (wb.Knobs(batch_size=8, num_workers=1, persistent_workers=True, prefetch_factor=4, channels_last=True), True),
    (wb.Knobs(batch_size=8, data="cached"), False),
])
def test_generated_loop_runs_and_trains(knobs, conv):
    ns = run_code(knobs, conv)
    if knobs.checkpoint:
        assert ns["model"].get_submodule("0").forward.__name__ == "run"  # wrapped in checkpoint
    if knobs.accum_steps > 1:
        assert ns["micro"] == ns["step"] * knobs.accum_steps
    loader = ns["loader"]
    assert loader.batch_size == knobs.batch_size and loader.num_workers == knobs.num_workers


def test_code_mentions_only_what_changed():
    plain = knobs_to_code(wb.Knobs())
    for absent in ("autocast", "GradScaler", "torch.compile", "checkpoint", "set_num_threads", "accum_steps"):
        assert absent not in plain
    full = knobs_to_code(wb.Knobs(amp="fp16", compile="max-autotune", accum_steps=4, checkpoint=("blocks.0",)))
    for present in ("torch.autocast", "GradScaler", 'mode="max-autotune"', "use_reentrant=False", "accum_steps = 4"):
        assert present in full
    result = wb.TrialResult(knobs=wb.Knobs(batch_size=7), status="ok")
    assert "batch_size=7" in result.to_code()


def test_a_trials_script_is_written_by_codegen():
    """TrialResult.to_code is one call to codegen.trial_to_code: the knobs with the allocator mode the trial's
    process ran in (env), and the keywords passed through."""
    r = wb.TrialResult(knobs=wb.Knobs(batch_size=7), status="ok", env={"allocator": "glibc-kept"})
    code = trial_to_code(r, steps=3)
    assert code == r.to_code(steps=3) and "MALLOC_TRIM_THRESHOLD_" in code and "batch_size=7" in code
    assert code == knobs_to_code(wb.Knobs(batch_size=7, allocator="glibc-kept"), steps=3)


def test_code_validates_names():
    with pytest.raises(ValueError, match="identifier"):
        knobs_to_code(wb.Knobs(), model="my model")
    with pytest.raises(TypeError):
        knobs_to_code({"batch_size": 4})
    assert "net.train()" in knobs_to_code(wb.Knobs(), model="net")


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 512), workers=st.integers(0, 4), amp=st.sampled_from(["off", "bf16", "fp16"]),
       comp=st.sampled_from(["off", "default", "reduce-overhead"]), accum=st.integers(1, 8),
       ckpt=st.lists(st.sampled_from(["a", "b.0", "b.1"]), unique=True), cl=st.booleans(),
       threads=st.one_of(st.none(), st.integers(1, 8)))
def test_any_knobs_give_valid_python(batch, workers, amp, comp, accum, ckpt, cl, threads):
    k = wb.Knobs(batch_size=batch, num_workers=workers, persistent_workers=workers > 0, amp=amp, compile=comp,
                 accum_steps=accum, checkpoint=tuple(ckpt), channels_last=cl, cpu_threads=threads)
    tree = ast.parse(knobs_to_code(k))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "DataLoader")
    kw = {a.arg: a.value for a in call.keywords}
    assert ast.literal_eval(kw["batch_size"]) == batch
    assert ast.literal_eval(kw["num_workers"]) == workers if workers else "num_workers" not in kw


@pytest.mark.slow
def test_generated_compiled_loop_runs():
    run_code(wb.Knobs(batch_size=8, compile="default"), steps=2)


DDP_SETUP = """\
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
dataset = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randint(0, 3, (40,)))
loss_fn = nn.CrossEntropyLoss()
make_optimizer = lambda p: torch.optim.SGD(p, lr=0.1)
before = [p.detach().clone() for p in model.parameters()]
"""


def test_ddp_script_has_the_pieces_and_the_torchrun_line() -> None:
    k = wb.Knobs(batch_size=4, world_size=2, accum_steps=2, ddp_no_sync=True, ddp_bucket_cap_mb=5,
                 ddp_comm_hook="fp16", ddp_static_graph=False, ddp_gradient_as_bucket_view=True)
    code = k.to_code(steps=3)
    ast.parse(code)
    for piece in ("torchrun --standalone --nproc-per-node=2", "dist.init_process_group(",
                  "DistributedSampler(dataset", "sampler.set_epoch(epoch)", "bucket_cap_mb=5",
                  "gradient_as_bucket_view=True", "default_hooks.fp16_compress_hook", "ddp_model.no_sync()",
                  "dist.destroy_process_group()"):
        assert piece in code, piece
    assert "no_sync" not in wb.Knobs(world_size=2, accum_steps=2).to_code()  # only when the knob asks
    assert "torch.distributed" not in wb.Knobs(batch_size=4).to_code()  # world_size=1: the plain loop


def run_on_two_ranks(script, code: str) -> None:
    """Write `code` to `script` and run it under torchrun on 2 gloo ranks; fail with its stderr."""
    import subprocess
    import sys

    script.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, job_output(proc)


@pytest.mark.slow
def test_ddp_script_runs_under_torchrun_with_two_gloo_ranks(tmp_path) -> None:
    import json

    k = wb.Knobs(batch_size=4, world_size=2, accum_steps=2, ddp_no_sync=True, ddp_bucket_cap_mb=1,
                 ddp_comm_hook="fp16", cpu_threads=1)
    code = k.to_code(steps=7, seed=0, setup=DDP_SETUP)  # 14 micro-batches of 4 over 20 samples per rank: 3 epochs
    code += ("\nimport json\n"
             f"json.dump({{'step': step, 'epoch': epoch, 'trained': any(not torch.equal(a, b) for a, b in "
             f"zip(before, model.parameters())), 'w': model[0].weight.sum().item()}}, "
             f"open({str(tmp_path)!r} + f'/rank{{local_rank}}.json', 'w'))\n")
    run_on_two_ranks(tmp_path / "train_ddp.py", code)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["step"] == 7 and r["epoch"] == 3 and r["trained"]
    assert ranks[0]["w"] == pytest.approx(ranks[1]["w"], rel=1e-5)  # DDP kept the replicas identical


def test_ddp_script_states_one_global_batch() -> None:
    """Header and accumulation comment agree: per-rank batch x accumulation x world_size."""
    code = wb.Knobs(batch_size=64, accum_steps=4, world_size=2).to_code()
    assert "64 per rank x 4 accumulated x 2 ranks = 512" in code
    assert "global batch = 64 x 4 x 2 ranks = 512" in code
    assert "256" not in code
    assert "global batch = 8 x 3 = 24" in wb.Knobs(batch_size=8, accum_steps=3).to_code()


FSDP_SETUP = """
import json
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
g = torch.Generator().manual_seed(0)
dataset = torch.utils.data.TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))
ce = nn.CrossEntropyLoss()
seen_losses = []


def loss_fn(out, target):
    loss = ce(out, target)
    seen_losses.append(loss.item())
    return loss


make_optimizer = lambda p: torch.optim.AdamW(p, lr=1e-2)
"""


@pytest.mark.slow
@pytest.mark.fixed_warmup
def test_fsdp2_script_runs_under_torchrun_and_trains_like_the_trial(tmp_path) -> None:
    """The exported FSDP2 script on 2 gloo ranks: its per-step losses are the trial's (fp32)."""
    import json

    k = wb.Knobs(batch_size=8, world_size=2, strategy="fsdp2", accum_steps=2, fsdp_prefetch=1)
    code = k.to_code(steps=6, seed=0, setup=FSDP_SETUP, warmup=2)
    code += f"\njson.dump(seen_losses, open({str(tmp_path)!r} + f'/rank{{local_rank}}.json', 'w'))\n"
    run_on_two_ranks(tmp_path / "train_fsdp2.py", code)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    per_step = [sum(r[2 * i] + r[2 * i + 1] for r in ranks) / 4 for i in range(6)]  # micro-batches, then ranks
    ns: dict = {}
    exec(compile(FSDP_SETUP.replace("seen_losses.append(loss.item())", "pass"), "<setup>", "exec"),
         {"torch": torch, **ns}, ns)
    bench = wb.Workbench(ns["model"], ns["dataset"], loss_fn=nn.CrossEntropyLoss(), optimizer=ns["make_optimizer"],
                         device="cpu", log=None, steps=4, warmup_steps=2, seed=0)
    trial = bench.run(k)
    assert trial.ok, trial.message
    assert list(trial.losses) == pytest.approx(per_step[2:], abs=1e-4, rel=0)  # the trial measured steps 3..6


def test_the_script_warms_up_as_a_steady_trial_does(monkeypatch):
    """The exported loop drains the loader's buffer before its timed window (issue 30)."""
    from workbench.core.codegen import script_warmup

    monkeypatch.delenv("WORKBENCH_FIXED_WARMUP", raising=False)
    k = wb.Knobs(num_workers=2, prefetch_factor=8)
    warm = script_warmup(k, 5)
    assert warm == 1 + 17 + 8  # the first step, 2 x 8 buffered batches + 1 in flight, 8 steps without a trend
    code = k.to_code(steps=warm + 30)
    assert f"warmup_steps = {warm}  #" in code and "buffered batches drained" in code
    assert "warmup_steps = 4  #" in k.to_code(steps=5)  # a short loop keeps one timed step
    monkeypatch.setenv("WORKBENCH_FIXED_WARMUP", "1")
    assert script_warmup(k, 5) == 5
