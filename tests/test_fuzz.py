"""Fuzzing the whole Knobs space x the built-in demos: every combination either runs (ok or nan)
or is rejected up front with a ValueError that names the fix — never a raw error from PyTorch.

The quick run draws a few dozen examples; the slow one draws 1,000 (CI runs both).
"""

from __future__ import annotations

import functools
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.knobs import AMP_MODES, DATA_MODES, MATMUL_PRECISIONS

DEMO_NAMES = ("jpeg", "cnn", "mlp-memory", "transformer")
# torch.compile is left out of the draws: a cold compile of each new graph costs 10-70 s on this
# 2-core CPU, so 1,000 draws would take hours. Compiled trials are covered by their own tests
# (test_runner, test_codegen, test_fuzz.test_compile_modes_run_on_every_demo, notebook 05).
COMPILE_CHOICES = ("off",)


@functools.cache
def bench(name: str) -> wb.Workbench:
    return wb.demo(name, size="tiny", log=None, steps=2, warmup_steps=1)


def knob_values(blocks: list[str], *, invalid: bool) -> st.SearchStrategy[dict]:
    """Every knob over its range; with invalid=True also out-of-range values and unknown names.

    Combinations that cannot work (persistence without workers, a cached batch with workers...)
    come up in both modes.
    """

    def vals(valid: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
        return valid | bad if invalid else valid

    return st.fixed_dictionaries({
        "batch_size": vals(st.integers(1, 48), st.integers(-2, 0) | st.integers(49, 10_000)),
        "num_workers": vals(st.integers(0, 2), st.just(-1)),
        "pin_memory": st.booleans(),
        "persistent_workers": st.booleans(),
        "prefetch_factor": vals(st.none() | st.integers(1, 4), st.just(0)),
        "amp": vals(st.sampled_from(AMP_MODES), st.sampled_from(["fp8", "BF16", ""])),
        "compile": vals(st.sampled_from(COMPILE_CHOICES), st.sampled_from(["fast", "inductor"])),
        "checkpoint": st.lists(vals(st.sampled_from(blocks), st.sampled_from(["no.such.block", ""])), max_size=3),
        "accum_steps": vals(st.integers(1, 3), st.just(0)),
        "channels_last": st.booleans(),
        "cpu_threads": vals(st.none() | st.integers(1, 3), st.just(0)),
        "matmul_precision": vals(st.sampled_from(MATMUL_PRECISIONS), st.just("low")),
        "data": vals(st.sampled_from(DATA_MODES), st.just("disk")),
    })


FIX_WORDS = ("set ", "use ", "lower ", "choose ", "must be", "is not one of", "list each once", "twice")


def check(name: str, values: dict, tally: dict) -> None:
    """Run one draw: a ValueError naming the fix, or a trial that ends ok or nan."""
    b = bench(name)
    try:
        knobs = b.knobs(**values)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fp16 on CPU warns by design
            result = b.run(knobs)
    except ValueError as e:
        text = str(e)
        assert any(w in text for w in FIX_WORDS), f"rejection without a fix: {text}"
        tally["rejected"] += 1
        return
    assert result.status in ("ok", "nan"), f"{name} {knobs}: {result.status}: {result.message}\n{result.traceback}"
    tally[result.status] += 1


def fuzz(examples: int, *, invalid: bool) -> dict:
    """Run `examples` draws; returns how many ran ok / nan and how many were rejected."""
    tally = {"ok": 0, "nan": 0, "rejected": 0}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data):
        name = data.draw(st.sampled_from(DEMO_NAMES), label="demo")
        values = data.draw(knob_values(bench(name).blocks, invalid=invalid), label="knobs")
        check(name, values, tally)

    run()
    print(f"fuzz ({examples} examples, invalid={invalid}): {tally}")
    return tally


def test_fuzz_valid_ranges_quick():
    tally = fuzz(25, invalid=False)
    assert tally["ok"] + tally["nan"] >= 8, tally  # a third of the draws must run trials, not only validate


def test_fuzz_invalid_values_are_rejected_with_a_fix():
    tally = fuzz(60, invalid=True)
    assert tally["rejected"] >= 20, tally


@pytest.mark.slow
def test_fuzz_1000():
    tally = fuzz(1000, invalid=False)
    assert tally["ok"] + tally["nan"] >= 333, tally


@pytest.mark.slow
@pytest.mark.parametrize("name, mode, extra", [
    ("mlp-memory", "default", {"checkpoint": ("blocks.0",), "accum_steps": 2}),
    ("cnn", "max-autotune", {"channels_last": True}),
    ("transformer", "reduce-overhead", {"amp": "bf16"}),
])
def test_compile_modes_run_on_every_demo(name, mode, extra):
    """Each compile mode with other knobs on a different demo (one cold compile each)."""
    result = bench(name).run(compile=mode, **extra)
    assert result.status in ("ok", "nan"), result.message
