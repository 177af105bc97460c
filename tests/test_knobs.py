"""Knobs: validation with fixes in the message, no-op notes, diff/label, round trips."""

import contextlib

import pytest
import torch

import workbench as wb
from workbench import Knobs, knob_names
from workbench.core.knobs import device_notes


def test_defaults_are_valid_and_hashable():
    k = Knobs()
    assert hash(k) == hash(Knobs())
    assert k == Knobs()
    assert "checkpoint" in knob_names() and "data" in knob_names()


@pytest.mark.parametrize(
    "changes, error, fix",
    [
        ({"batch_size": 0}, ValueError, ">= 1"),
        ({"batch_size": 2.5}, TypeError, "int"),
        ({"num_workers": -1}, ValueError, ">= 0"),
        ({"amp": "fp8"}, ValueError, "'bf16'"),
        ({"compile": "fast"}, ValueError, "'max-autotune'"),
        ({"matmul_precision": "low"}, ValueError, "'high'"),
        ({"data": "disk"}, ValueError, "'cached'"),
        ({"persistent_workers": True}, ValueError, "num_workers >= 1"),
        ({"data": "cached", "num_workers": 2}, ValueError, "num_workers=0"),
        ({"checkpoint": ["a", "a"]}, ValueError, "twice"),
        ({"checkpoint": [3]}, TypeError, "bench.blocks"),
        ({"pin_memory": "yes"}, TypeError, "True or False"),
        ({"accum_steps": 0}, ValueError, ">= 1"),
        ({"cpu_threads": 0}, ValueError, ">= 1"),
    ],
)
def test_invalid_combinations_name_the_fix(changes, error, fix):
    with pytest.raises(error, match=fix.replace("(", r"\(").replace("'", "'")):
        Knobs(**changes)


def test_replace_rejects_unknown_knob_listing_known():
    with pytest.raises(TypeError, match="known: batch_size"):
        Knobs().replace(workers=2)


def test_checkpoint_normalised_to_tuple():
    assert Knobs(checkpoint=["blocks.0"]).checkpoint == ("blocks.0",)
    assert Knobs(checkpoint="blocks.0").checkpoint == ("blocks.0",)


def test_diff_and_label():
    a, b = Knobs(), Knobs(num_workers=2, pin_memory=True, checkpoint=("x", "y"))
    assert a.diff(b) == {"num_workers": (0, 2), "pin_memory": (False, True), "checkpoint": ([], ["x", "y"])}
    assert b.label(a) == "num_workers=2, pin_memory, ckpt=2"
    assert a.label(a) == "defaults" and a.label() == "defaults"  # what differs: nothing (never "baseline")
    assert str(b).startswith("Knobs(num_workers=2")


def test_dict_round_trip():
    k = Knobs(batch_size=7, amp="bf16", checkpoint=("blocks.1",), cpu_threads=1, prefetch_factor=None)
    assert Knobs.from_dict(k.to_dict()) == k


def test_no_op_notes_on_cpu():
    notes = device_notes(Knobs(pin_memory=True, prefetch_factor=4, compile="reduce-overhead", amp="fp16",
                               channels_last=True), "cpu", has_conv=False)
    text = " ".join(notes)
    assert "pin_memory is a no-op" in text
    assert "prefetch_factor is a no-op" in text
    assert "reduce-overhead" in text
    assert "fp16" in text and "slower" in text
    assert "channels_last is a no-op" in text
    assert device_notes(Knobs(pin_memory=True), "cuda") == []


def test_pin_memory_on_mps_says_it_is_dropped():
    notes = device_notes(Knobs(pin_memory=True), "mps")
    assert any("pin_memory is a no-op on MPS" in n for n in notes)
    assert not any("pin_memory" in n for n in device_notes(Knobs(pin_memory=False), "mps"))
def test_knob_table_has_one_row_per_knob_from_its_declaration():
    from workbench.core.knobs import KNOBS, knob_table

    rows = knob_table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == list(KNOBS)
    assert '| `amp` | `"off"` | `"off"` \\| `"bf16"` \\| `"fp16"` |' in knob_table()


def test_every_declaration_is_complete_and_its_fuzz_ranges_hold():
    from workbench.core.knobs import GROUPS, KNOBS, STRUCTURAL

    for name, spec in KNOBS.items():
        assert spec.name == name and spec.help and spec.group in GROUPS, name
        # applied by its own run-time hook, or one of the few knobs the loop itself reads
        assert spec.runtime_hooks or name in STRUCTURAL, f"{name} has no run-time hook and is not structural"
        assert spec.code is not None or name in STRUCTURAL, f"{name} has no code hook: to_code() would drop it"
        assert spec.widget in ("int", "slider", "checkbox", "dropdown", "blocks"), name
        spec.check(spec.default)
        if spec.fuzz.valid != "blocks":
            for value in spec.fuzz.valid:
                spec.check(value)
            for value in spec.fuzz.invalid:
                if name == "batch_size" and value > 1:
                    continue  # too large for the tiny demos' datasets: rejected by check_knobs, not here
                with pytest.raises((TypeError, ValueError)):
                    spec.check(value)


# ---- optimizer_impl ------------------------------------------------------------------------------
def test_optimizer_impl_rebuilds_with_the_flag_keeping_groups_and_hyperparameters():
    import torch

    from workbench.core.knobs import adjust_optimizer

    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
    opt = torch.optim.AdamW([{"params": [a], "lr": 0.1}, {"params": [b], "weight_decay": 0.5}],
                            lr=0.01, betas=(0.8, 0.9))
    notes: list[str] = []
    fused = adjust_optimizer(opt, Knobs(optimizer_impl="fused"), notes)
    assert type(fused) is torch.optim.AdamW and fused is not opt and not notes
    assert [g["params"] for g in fused.param_groups] == [[a], [b]]
    assert [g["lr"] for g in fused.param_groups] == [0.1, 0.01]
    assert [g["weight_decay"] for g in fused.param_groups] == [0.01, 0.5]
    assert all(g["betas"] == (0.8, 0.9) and g["fused"] and not g["foreach"] for g in fused.param_groups)
    foreach = adjust_optimizer(opt, Knobs(optimizer_impl="foreach"), notes)
    assert all(g["foreach"] and not g["fused"] for g in foreach.param_groups)
    assert adjust_optimizer(opt, Knobs(), notes) is opt


def test_optimizer_impl_notes_a_class_without_the_argument():
    import torch

    from workbench.core.knobs import adjust_optimizer

    class Plain(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def step(self, closure=None):
            return None

    opt = Plain([torch.nn.Parameter(torch.ones(1))])
    notes: list[str] = []
    assert adjust_optimizer(opt, Knobs(optimizer_impl="fused"), notes) is opt
    assert notes and "Plain takes no fused= argument" in notes[0]


@pytest.mark.fixed_warmup
def test_optimizer_impl_runs_in_a_trial_and_in_generated_code(make_bench):
    import torch

    bench = make_bench(optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    base, fused = bench.run(), bench.run(optimizer_impl="fused")
    assert base.ok and fused.ok and not any("optimizer_impl" in n for n in fused.notes)
    assert fused.losses == pytest.approx(base.losses, abs=1e-4)  # same maths, other kernels
    code = Knobs(batch_size=8, optimizer_impl="foreach").to_code(steps=2)
    ns = {"model": torch.nn.Linear(4, 2),
          "dataset": torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))),
          "loss_fn": torch.nn.CrossEntropyLoss(), "make_optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3)}
    exec(compile(code, "<generated>", "exec"), ns)
    assert ns["step"] == 2 and ns["optimizer"].param_groups[0]["foreach"] is True


# ---- checkpoint_mode -----------------------------------------------------------------------------
@pytest.mark.fixed_warmup
def test_selective_checkpointing_saves_matmuls_and_matches_full(make_bench):
    from workbench.core.knobs import checkpoint_options

    assert checkpoint_options(Knobs()) == {}
    assert "context_fn" in checkpoint_options(Knobs(checkpoint_mode="selective"))
    bench = make_bench()
    blocks = ("blocks.0", "blocks.1")
    full = bench.run(checkpoint=blocks)
    selective = bench.run(checkpoint=blocks, checkpoint_mode="selective")
    assert full.ok and selective.ok
    assert selective.losses == pytest.approx(full.losses, abs=1e-6)  # recomputation changes no value


def test_selective_without_blocks_is_a_noted_no_op():
    notes = device_notes(Knobs(checkpoint_mode="selective"), "cpu")
    assert any(n.startswith("checkpoint_mode='selective' is a no-op") for n in notes)
    assert not any("checkpoint_mode" in n for n in device_notes(Knobs(checkpoint_mode="selective",
                                                                      checkpoint=("b",)), "cpu"))


# ---- cudnn_benchmark -----------------------------------------------------------------------------
def test_cudnn_benchmark_is_a_noted_no_op_on_cpu_and_restored_after(make_bench):
    import torch

    assert any(n.startswith("cudnn_benchmark is a no-op") for n in device_notes(Knobs(cudnn_benchmark=True), "cpu"))
    assert not device_notes(Knobs(cudnn_benchmark=True), "cuda")
    before = torch.backends.cudnn.benchmark
    r = make_bench().run(cudnn_benchmark=True)
    assert r.ok and any("cudnn_benchmark is a no-op" in n for n in r.notes)
    assert torch.backends.cudnn.benchmark == before
    assert "torch.backends.cudnn.benchmark = True" in Knobs(cudnn_benchmark=True).to_code()


def test_results_nullable_int_columns_come_from_the_registry():
    from workbench.results import OPTIONAL_INT_KNOBS

    assert set(OPTIONAL_INT_KNOBS) == {"prefetch_factor", "cpu_threads", "ddp_bucket_cap_mb", "fsdp_prefetch",
                                       "pad_to_multiple_of"}


# ---- your own knobs (@wb.knob) -------------------------------------------------------------------
class TwoPaths(torch.nn.Module):
    """A model with two ways to compute the same thing: `mode` picks one (an attention switch)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)
        self.mode = "naive"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "twice":
            return self.lin(x) * 0.5 + self.lin(x) * 0.5
        return self.lin(x)


@pytest.fixture
def path_knob():
    """`path` declared the way a notebook cell does; forgotten after the test."""
    calls = []

    @wb.knob(choices=["naive", "twice"], default="naive", help="which forward path")
    def path(model, value):
        calls.append(value)
        model.mode = value

    yield calls
    wb.forget_knob("path")


def test_user_knob_is_a_knob_like_any_other(path_knob):
    k = Knobs(batch_size=8, path="twice")
    assert k.path == "twice" and Knobs().path == "naive"
    assert k.to_dict()["path"] == "twice" and Knobs.from_dict(k.to_dict()) == k
    assert k.diff(Knobs(batch_size=8)) == {"path": ("twice", "naive")}
    assert Knobs(path="naive") == Knobs() and hash(Knobs(path="naive")) == hash(Knobs())
    assert "path" in knob_names() and wb.tunable_knobs() == {"path": ("naive", "twice")}
    assert "path=twice" in k.label() and "path='twice'" in str(k)


def test_running_the_cell_again_replaces_the_knob(path_knob):
    @wb.knob(choices=["naive", "twice", "thrice"], help="which forward path")
    def path(model, value):
        model.mode = value

    assert Knobs(path="thrice").path == "thrice"
    assert knob_names().count("path") == 1


def test_a_bad_value_names_the_choices_and_records_nothing(path_knob, make_bench):
    bench = make_bench(model=TwoPaths(), data=torch.utils.data.TensorDataset(torch.randn(64, 16),
                                                                              torch.randint(0, 4, (64,))))
    with pytest.raises(ValueError, match=r"Knobs\.path='flash' is not one of 'naive', 'twice'"):
        bench.run(path="flash")
    assert bench.trials == [] and path_knob == []  # raised before any trial, nothing applied or logged
    with pytest.raises(TypeError, match="needs choices"):
        wb.knob(default="x")


def test_user_knob_runs_on_each_trials_copy_and_reaches_results_and_code(path_knob, make_bench):
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    bench = make_bench(model=TwoPaths(), data=data)
    a, b = bench.run(path="naive"), bench.run(path="twice")
    assert a.ok and b.ok and path_knob == ["naive", "twice"]
    assert bench.workload.pristine.mode == "naive"  # the user's model is never touched
    assert bench.results["path"].tolist() == ["naive", "twice"]
    code = b.to_code()
    assert "def path(model, value):" in code and "model = path(model, 'twice') or model" in code
    assert "@wb.knob" not in code
    compile(code, "<generated>", "exec")


def test_an_unknown_knob_read_back_from_the_log_stays_and_is_shown(path_knob, make_bench, tmp_path):
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    make_bench(model=TwoPaths(), data=data, name="two").run(path="twice")
    wb.forget_knob("path")  # a kernel restart: the cell has not run again yet
    try:
        again = make_bench(model=TwoPaths(), data=data, name="two")
        k = again.trials[0].knobs
        assert k.unknown == ("path",) and k.to_dict()["path"] == "twice"
        assert again.results["path"].tolist() == ["twice"] and "path=twice(unknown)" in k.label()
        assert "unknown knob" in str(k)
    finally:
        @wb.knob(choices=["naive", "twice"], default="naive")
        def path(model, value):
            model.mode = value
    # once the cell has run again, the logged trial is an ordinary one: compare across the restart works
    back = make_bench(model=TwoPaths(), data=data, name="two")
    assert back.trials[0].knobs == Knobs(batch_size=8, path="twice") and back.trials[0].knobs.unknown == ()


def test_forward_and_before_step_hooks(make_bench):
    seen = []

    @wb.knob(default=False, where="forward", help="a context around the forward")
    def traced(value):
        seen.append(("forward", value))
        return contextlib.nullcontext()

    @wb.knob(choices=[0.0, 1.0], where="before_step", help="clip gradients")
    def clip(value, model, optimizer):
        seen.append(("step", value))
        if value:
            torch.nn.utils.clip_grad_norm_(model.parameters(), value)

    try:
        assert make_bench().run(traced=True, clip=1.0).ok
        assert ("forward", True) in seen and ("step", 1.0) in seen
        code = Knobs(traced=True, clip=1.0, amp="fp16").to_code()
        assert "with torch.autocast(device.type, dtype=torch.float16), traced(True):" in code
        assert "scaler.unscale_(optimizer)" in code and "clip(1.0, model, optimizer)" in code
    finally:
        wb.forget_knob("traced")
        wb.forget_knob("clip")


def test_grad_clip_norm_validates_runs_and_is_in_the_code(make_bench):
    with pytest.raises(ValueError, match=r"grad_clip_norm=-1\.0 is too small: set it to a float >= 0\.0"):
        Knobs(grad_clip_norm=-1.0)
    with pytest.raises(TypeError, match="set it to a float"):
        Knobs(grad_clip_norm="1")
    assert make_bench().run(grad_clip_norm=0.5).ok
    code = Knobs(grad_clip_norm=0.5, amp="fp16").to_code()
    assert "scaler.unscale_(optimizer)" in code and "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)" in code
    assert "clip_grad_norm_" not in Knobs().to_code()


def test_a_knob_that_is_off_adds_no_work_to_the_measured_step():
    from workbench.core.knobs import step_hooks

    assert step_hooks(wb.Knobs()) == []  # grad_clip_norm=None: no per-step call, no fp16 unscale
    assert len(step_hooks(wb.Knobs(grad_clip_norm=1.0))) == 1


def test_the_completeness_rule_fails_a_knob_with_no_hook():
    """The rule above is not vacuous: a declaration without hooks, outside STRUCTURAL, is caught."""
    from workbench.core.knobs import STRUCTURAL, Fuzz, KnobSpec

    bare = KnobSpec(default=False, kind="bool", help="does nothing", group="Memory", widget="checkbox",
                    fuzz=Fuzz((False, True)), name="bare")
    assert not bare.runtime_hooks and bare.name not in STRUCTURAL


def test_the_running_core_reads_only_structural_knobs():
    """apply, step, runner, workload, codegen, measure, trace and distributed/ reach a knob's effect through
    its hooks: an attribute read of a built-in, non-structural knob there fails this test."""
    import ast
    from pathlib import Path

    from workbench.core.knobs import BUILTIN_KNOBS, STRUCTURAL

    package = Path(wb.__file__).parent
    files = [package / "core" / f"{m}.py" for m in ("step", "codegen", "measure", "trace")]
    files += sorted((package / "launch").glob("*.py"))  # run_trial and the ranks
    # DataLoader.num_workers and move_to's channels_last keyword share a knob's name: not knob reads
    allowed = {("workload.py", "num_workers"), ("workload.py", "channels_last")}
    reads = [f"{p.name}:{node.lineno} .{node.attr}" for p in files for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
             and node.attr in BUILTIN_KNOBS - STRUCTURAL and (p.name, node.attr) not in allowed]
    assert not reads, f"read these through the knobs' hooks (workbench/core/knobs/registry.py): {reads}"
