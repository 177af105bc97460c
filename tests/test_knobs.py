"""Knobs: validation with fixes in the message, no-op notes, diff/label, round trips."""

import pytest

from workbench import Knobs, knob_names
from workbench.knobs import device_notes


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
    assert b.label(a) == "num_workers=2 pin_memory ckpt=2"
    assert a.label(a) == "baseline"
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
