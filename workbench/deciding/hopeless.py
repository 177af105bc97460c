"""Warn before a known hopeless trial: knobs that are known to run far slower on this device (bf16
without native units, fp16 on a CPU, a CUDA-graph compile mode without CUDA), with the factor
this machine's earlier trials measured for the same change, not a constant.

`warning(knobs, trials, device)` is the sentence (or None): `bench.run` warns with it in a cell and
the panel shows it as the trial starts. The factor is the geometric mean, over pairs of earlier ok
trials on this device that differ only in the knob, of the throughput with the knob over without.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..core.knobs import Knobs
from ..core.measure import TrialResult


def known_slow(knobs: Knobs, device_type: str, bf16: bool | None = None) -> tuple[str, dict[str, Any]] | None:
    """(why it is known to be slow here, the change back to the reference) or None. `bf16`: whether the
    device has native bf16 units (the device facts'); None asks this machine's CPU."""
    if knobs.amp == "bf16" and device_type == "cpu":
        if bf16 is None:
            from ..core.system import cpu_has_bf16

            bf16 = cpu_has_bf16()
        if not bf16:
            return "amp='bf16' on a CPU without native bf16 units (emulated)", {"amp": "off"}
    if knobs.amp == "fp16" and device_type == "cpu":
        return "amp='fp16' on CPU (converted to and from fp32 around each op)", {"amp": "off"}
    if knobs.compile in ("reduce-overhead", "max-autotune") and device_type != "cuda":
        return f"compile={knobs.compile!r} without CUDA (no CUDA graphs: it compiles like 'default')", {"compile": "off"}
    return None


def measured_factor(knobs: Knobs, back: dict[str, Any], trials: Sequence[TrialResult],
                    device: str) -> tuple[float, int] | None:
    """(geometric-mean throughput ratio, pairs) of earlier ok trials on `device` with `knobs`' value of the
    changed knobs over the same knobs changed `back`; None without such a pair."""
    rates: dict[Knobs, list[float]] = {}
    for t in trials:
        if t.ok and t.samples_per_s and t.env.get("device", device) == device:
            rates.setdefault(t.knobs, []).append(float(t.samples_per_s))
    logs = []
    for k, with_knob in rates.items():
        if all(getattr(k, name) == getattr(knobs, name) for name in back):
            try:
                without = rates.get(k.replace(**back))
            except (ValueError, TypeError):
                continue
            if without:
                logs.append(math.log(_mean(with_knob) / _mean(without)))
    return (math.exp(sum(logs) / len(logs)), len(logs)) if logs else None


def _mean(rates: list[float]) -> float:
    return math.exp(sum(map(math.log, rates)) / len(rates))


def warning(knobs: Knobs, trials: Sequence[TrialResult], device: str, bf16: bool | None = None) -> str | None:
    """The warning before a trial of `knobs` known to be slow on `device`, with this machine's factor
    (`bf16`: the device facts' native bf16 units; None asks this machine's CPU)."""
    slow = known_slow(knobs, device.split(":")[0], bf16)
    if slow is None:
        return None
    why, back = slow
    ref = ", ".join(f"{k}={v!r}" for k, v in back.items())
    found = measured_factor(knobs, back, trials, device)
    if found is None:
        expect = f"expect it much slower than {ref}; no earlier trial on this machine says by how much"
    else:
        factor, pairs = found
        expect = (f"expect ≈{factor:.2f}× the throughput of {ref}, as {pairs} earlier pair(s) of trials on this "
                  "machine measured")
    return (f"{why}: {expect}. With a baseline, the trial stops early once it is clearly slower "
            "(stop_early=False runs it whole)")
