"""Fuzzing the whole Knobs space x the built-in demos: every combination either runs (ok; nan only under fp16)
or is rejected up front with a ValueError that names the fix — never a raw error from PyTorch.

The quick run draws a few dozen examples; the slow one draws 1,000 (CI runs both).
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.core.knobs import KNOBS, Fuzz

DEMO_NAMES = ("jpeg", "cnn", "mlp-memory", "transformer")


@functools.cache
def bench(name: str) -> wb.Workbench:
    return wb.demo(name, size="tiny", log=None, steps=2, warmup_steps=1)


def draw(fuzz: Fuzz, blocks: list[str], *, invalid: bool) -> st.SearchStrategy:
    """A strategy from a knob's declared Fuzz: its valid values, plus its invalid ones if asked."""
    if fuzz.valid == "blocks":  # a list of block names, up to three
        names = st.sampled_from(blocks) | st.sampled_from(fuzz.invalid) if invalid and fuzz.invalid else st.sampled_from(blocks)
        return st.lists(names, max_size=3)
    if isinstance(fuzz.valid, range):
        valid = st.integers(fuzz.valid.start, fuzz.valid.stop - 1)
    else:
        valid = st.sampled_from(list(fuzz.valid))
    return valid | st.sampled_from(list(fuzz.invalid)) if invalid and fuzz.invalid else valid


def knob_values(blocks: list[str], *, invalid: bool) -> st.SearchStrategy[dict]:
    """Every declared knob over its declared range (knobs.KNOBS: a new knob is drawn as soon as
    it is declared); with invalid=True also out-of-range values and unknown names.

    Combinations that cannot work (persistence without workers, a cached batch with workers...)
    come up in both modes. Three parts of the space are pinned here, each covered elsewhere:
    torch.compile draws only "off" (a cold compile costs 10-70 s per graph on a 2-core CPU: every
    mode on every demo below, and test_step's compiled pair); world_size draws only 1, and each
    fsdp_* knob its default, since any other value needs forked ranks (test_ranks,
    test_strategy: every fsdp_* knob on 2 gloo ranks, DDP against one process at the same global batch).
    """
    return st.fixed_dictionaries({name: draw(spec.fuzz, blocks, invalid=invalid) for name, spec in KNOBS.items()})


FIX_WORDS = ("set ", "use ", "lower ", "choose ", "is not one of", "list each once", "twice")


def check(name: str, values: dict, tally: dict) -> None:
    """Run one draw: a ValueError naming the fix, or a trial that ends ok (nan only under fp16)."""
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
    what = f"{name} {knobs}: {result.status}: {result.message}\n{result.traceback}"
    # a non-finite loss is an honest outcome only where fp16 can overflow; anywhere else it is a bug
    assert result.status == "ok" or (result.status == "nan" and knobs.amp == "fp16"), what
    assert result.status == "nan" or (result.samples_per_s or 0) > 0, what
    tally[result.status] += 1


def fuzz(examples: int, *, invalid: bool) -> dict:
    """Run `examples` draws; returns how many ran ok / nan and how many were rejected."""
    tally = {"ok": 0, "nan": 0, "rejected": 0}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data):
        name = data.draw(st.sampled_from(DEMO_NAMES), label="demo")
        values = data.draw(knob_values(list(bench(name).blocks), invalid=invalid), label="knobs")
        check(name, values, tally)

    run()
    print(f"fuzz ({examples} examples, invalid={invalid}): {tally}")
    return tally


def test_fuzz_valid_ranges_quick():
    examples = 40
    tally = fuzz(examples, invalid=False)
    # close to a third of the draws must run ok trials, not only validate (nan is no pass); the rest combine
    # knobs that cannot work together (persistence without workers, a cached batch with workers...). The draws
    # are derandomized, so a new knob shifts them: the floor is a share (30%), not one draw sequence's count.
    assert tally["ok"] >= 0.3 * examples, tally


def test_fuzz_invalid_values_are_rejected_with_a_fix():
    tally = fuzz(60, invalid=True)
    assert tally["rejected"] >= 20, tally


@pytest.mark.slow
@pytest.mark.fixed_warmup  # the warm-up's steady-state rule is fuzzed by the quick run and the soak; here
def test_fuzz_1000():  # 1,000 combinations run or are refused (adaptive warm-ups were 85% of this test's time)
    tally = fuzz(1000, invalid=False)
    assert tally["ok"] >= 333, tally


@pytest.mark.slow
@pytest.mark.parametrize("name, mode, extra", [
    ("mlp-memory", "default", {"checkpoint": ("blocks.0",), "accum_steps": 2}),
    ("cnn", "max-autotune", {"channels_last": True}),
    ("transformer", "reduce-overhead", {"amp": "bf16"}),
    ("jpeg", "default", {"num_workers": 1, "persistent_workers": True}),
])
def test_compile_modes_run_on_every_demo(name, mode, extra):
    """Each compile mode with other knobs, on every demo (one cold compile each)."""
    result = bench(name).run(compile=mode, **extra)
    assert result.ok, f"{result.status}: {result.message}"  # no fp16 here: a nan loss is a failure
    assert result.losses and all(math.isfinite(x) for x in result.losses), result.losses
