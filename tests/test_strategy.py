"""launch/strategy.py: FSDP2 trials (strategy="fsdp2") beside DDP, and the fsdp_* knobs.

The knob checks, the generated script's pieces and model_state_bytes are fast; the trials fork 2
gloo ranks (`slow`), reusing test_ranks's tiny MLP, fault switch and orphan check.
"""

from __future__ import annotations

import ast
import time

import pytest
import torch
from rank_failures import why
from test_ranks import FAULT, make_bench, no_children

import workbench as wb
from workbench.core.knobs import Knobs, device_notes

FSDP = dict(world_size=2, strategy="fsdp2")


def adamw(p):
    return torch.optim.AdamW(p, lr=1e-2)


# ---- knobs (fast) --------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, fix", [
    (dict(fsdp_prefetch=1), "set world_size >= 2 and strategy='fsdp2'"),
    (dict(world_size=2, fsdp_reshard_after_forward=False), "set strategy='fsdp2'"),
    (dict(**FSDP, ddp_no_sync=True), "ddp_no_sync apply to DDP only: set them back to their defaults, or strategy='ddp'"),
    (dict(**FSDP, amp="fp16"), "use amp='bf16' or fsdp_param_dtype='bf16'"),
    (dict(**FSDP, compile="default"), "set compile='off', or strategy='ddp'"),
    (dict(**FSDP, fsdp_shard=("net.0", "net.0")), "list each once"),
])
def test_invalid_combinations_fail_with_the_fix(changes, fix) -> None:
    with pytest.raises(ValueError) as e:
        Knobs(**changes)
    assert fix in str(e.value)


def test_fsdp_knobs_take_lists_and_notes_say_what_is_a_no_op() -> None:
    k = Knobs(**FSDP, fsdp_shard=["net.0"], fsdp_prefetch=1)
    assert k.fsdp_shard == ("net.0",) and Knobs.from_dict(k.to_dict()) == k
    assert any("strategy='fsdp2' is a no-op with world_size=1" in n
               for n in device_notes(Knobs(strategy="fsdp2"), "cpu"))
    assert any("fsdp_cpu_offload is a no-op without a GPU" in n
               for n in device_notes(Knobs(**FSDP, fsdp_cpu_offload=True), "cpu"))
    assert not any("fsdp_cpu_offload" in n for n in device_notes(Knobs(**FSDP, fsdp_cpu_offload=True), "cuda"))


def test_unknown_shard_unit_is_refused_before_any_process_starts(tmp_path) -> None:
    bench = make_bench(tmp_path, log=None)
    with pytest.raises(ValueError, match=r"fsdp_shard names unknown block 'nope'; choose from bench\.blocks"):
        bench.run(**FSDP, fsdp_shard=["nope"])
    assert not bench.trials and no_children()


def test_fsdp2_script_shards_blocks_then_root_and_skips_sync_while_accumulating() -> None:
    k = Knobs(batch_size=4, **FSDP, accum_steps=2, fsdp_prefetch=2, fsdp_param_dtype="bf16",
              fsdp_cpu_offload=True, checkpoint=("net.0",))
    code = k.to_code(steps=3)
    ast.parse(code)
    for piece in ("torchrun --standalone --nproc-per-node=2 train_fsdp2.py", "def blocks_of(",
                  "fully_shard(unit, **fsdp_options)",
                  'fully_shard(model, **{**fsdp_options, "reshard_after_forward": None})',
                  "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=None)",
                  "set_modules_to_forward_prefetch(units[i + 1:i + 1 + 2])", "CPUOffloadPolicy()",
                  "model.set_requires_gradient_sync((micro + 1) % accum_steps == 0)", "dist.destroy_process_group()"):
        assert piece in code, piece
    assert "DDP(" not in code and "no_sync()" not in code
    assert code.index("checkpointed(block.forward") < code.index("fully_shard(unit")  # checkpoint, then shard
    assert code.index("fully_shard(model") < code.index("optimizer = make_optimizer(model.parameters())")
    named = Knobs(**FSDP, fsdp_shard=("net.2",)).to_code()
    assert "for n in ['net.2']]" in named and "def blocks_of(" not in named
    assert "fully_shard" not in Knobs(world_size=2).to_code()


def test_model_state_bytes_counts_params_grads_and_optimizer_state(tmp_path) -> None:
    bench = make_bench(tmp_path, optimizer=adamw, log=None)
    r = bench.run()
    params = sum(p.numel() for p in bench.workload.pristine.parameters())
    # fp32 params + grads + AdamW's exp_avg and exp_avg_sq, plus one 'step' scalar per parameter tensor
    n_tensors = len(list(bench.workload.pristine.parameters()))
    assert r.model_state_bytes == 4 * 4 * params + 4 * n_tensors
    assert "model_state_mb" in bench.results.columns


# ---- trials on 2 gloo ranks (slow) --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.fixed_warmup  # DDP's and FSDP2's losses compared step by step: the same warm-up count
def test_fsdp2_trains_like_ddp_in_half_the_model_state_and_every_knob_runs(tmp_path) -> None:
    FAULT["kind"] = None
    bench = make_bench(tmp_path, optimizer=adamw, knobs=Knobs(batch_size=8, accum_steps=2))
    ddp = bench.run(world_size=2)
    fsdp = bench.run(**FSDP)
    assert ddp.ok and fsdp.ok, why(ddp, fsdp)
    assert fsdp.losses == pytest.approx(ddp.losses, abs=1e-4, rel=0)  # fp32: the same training
    assert fsdp.model_state_bytes <= 0.65 * ddp.model_state_bytes
    d = fsdp.extra["distributed"]
    assert d["strategy"] == "fsdp2" and d["allreduce_calls"] == 0 and d["exposed_comm_share"] is None
    for knob in (dict(fsdp_reshard_after_forward=False, fsdp_prefetch=1), dict(fsdp_param_dtype="bf16",
                 fsdp_reduce_dtype="bf16", fsdp_cpu_offload=True, fsdp_shard=("net.2",), checkpoint=("net.0",))):
        r = bench.run(**FSDP, **knob)
        assert r.ok, (knob, why(r))
    assert any("fsdp_cpu_offload is a no-op" in n for n in r.notes)
    assert no_children()


@pytest.mark.slow
@pytest.mark.parametrize("kind, words", [
    ("raise", ["rank 1: RuntimeError in the model's forward at measured step", "planted failure"]),
    ("kill", ["rank 1 was killed by SIGKILL"]),
])
@pytest.mark.fixed_warmup  # the planted failure is counted in steps: it must land in the measured window
def test_a_failing_fsdp2_rank_ends_every_rank_and_the_next_trial_works(tmp_path, kind, words) -> None:
    FAULT.update(kind=kind, at=2 + 2)  # past the 2 warm-up steps
    bench = make_bench(tmp_path)
    t0 = time.monotonic()
    try:
        r = bench.run(**FSDP)
    finally:
        FAULT["kind"] = None
    assert r.status == "error" and all(w in r.message for w in words), why(r)
    assert time.monotonic() - t0 < 60
    assert no_children()
    nxt = bench.run(**FSDP)
    assert nxt.ok, why(nxt)


@pytest.mark.slow
def test_scaling_sets_ddp_and_fsdp2_side_by_side(tmp_path) -> None:
    FAULT["kind"] = None
    bench = make_bench(tmp_path, optimizer=adamw)
    result = bench.scaling(world_sizes=(1, 2), strategies=("ddp", "fsdp2"), fsdp_prefetch=1)
    df = result.frame
    assert list(df["setup"]) == ["1", "2 x ddp", "2 x fsdp2"] and (df["status"] == "ok").all()
    one, ddp, fsdp = (df.iloc[i] for i in range(3))
    assert one["model_state_mb"] == pytest.approx(ddp["model_state_mb"])  # DDP replicates the whole state
    assert fsdp["model_state_mb"] < 0.65 * ddp["model_state_mb"]
    assert result.chart().to_dict()["layer"][0]["encoding"]["x"]["field"] == "setup"  # a bar per setup: DDP, FSDP2 apart
    with pytest.raises(ValueError, match="strategies must list each of"):
        bench.scaling(strategies=("zero3",))
    assert wb.Knobs(**FSDP).strategy == "fsdp2"


def test_fsdp2_on_a_torch_without_fully_shard_is_refused_naming_the_fix(monkeypatch):
    """pyproject accepts torch>=2.4, FSDP2's fully_shard is public from 2.6: an older torch gets a clear refusal
    before any process starts, naming the upgrade (or DDP)."""
    import torch.distributed.fsdp as fsdp

    from workbench.core.knobs import check_run, context

    knobs = wb.Knobs(world_size=2, strategy="fsdp2")
    check_run(knobs, context(knobs))  # this torch has it: no refusal
    monkeypatch.delattr(fsdp, "fully_shard")
    with pytest.raises(ValueError, match=r"torch >= 2\.6.*pip install 'torch>=2\.6'.*strategy='ddp'"):
        check_run(knobs, context(knobs))
    check_run(wb.Knobs(world_size=2), context(wb.Knobs(world_size=2)))  # DDP needs no fully_shard
