"""New input shapes: what their first calls cost, what a real run pays, and the knob that cuts it.

Each distinct (batch, length) shape costs its first call once per process: cuBLAS/cuDNN plans,
`cudnn.benchmark` autotuning, CUDA-graph capture, `torch.compile` recompiles (core/shapes.py). A trial
warms those up before its window and records them apart (`TrialResult.shapes`, `shape_warmup_s`,
`extra["shapes"]`). This analysis reads the diagnosed trial's figures (it runs no step) and says:
N shapes x X ms; that a real run pays X once per distinct shape in the user's data (counted from the
data's lengths, for token data); and what `pad_to_multiple_of` would leave, with the measured cost.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..core import tokens
from ..core.measure import TrialResult
from ..core.workload import Workload
from .analysis import Context, analysis

MULTIPLES = (8, 16, 32, 64, 128)  # pad_to_multiple_of values the analysis prices
FEWER = 4  # offer the smallest multiple that leaves at most 1/FEWER of the shapes (else the largest that fits)


@dataclass
class ShapeCost:
    """The diagnosed trial's input shapes and their one-time cost, what one pass over the data would
    pay, and `options`: per pad_to_multiple_of, the shapes left, the padding added and the one-time cost."""

    shapes: int
    per_shape_s: float | None
    warmup_s: float | None
    data_shapes: int | None = None  # distinct shapes in one pass over the data (token data), None if unknown
    options: pd.DataFrame | None = None
    offer: dict[str, Any] = field(default_factory=dict)  # the knob offered: {"pad_to_multiple_of": m}
    lines: list[str] = field(default_factory=list)


def pass_shapes(lengths: list[int], batch_size: int, multiple: int | None = None, seed: int = 0) -> tuple[int, float]:
    """(distinct batch shapes, padded slots per token) of one shuffled pass over samples of `lengths` in
    batches of `batch_size`, each padded to its longest sample (rounded up to `multiple` when given)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    widths, slots = set(), 0
    for i in range(0, len(order) - batch_size + 1, batch_size):
        longest = max(lengths[j] for j in order[i:i + batch_size])
        width = -(-longest // multiple) * multiple if multiple else longest
        widths.add(width)
        slots += width * batch_size
    total = sum(lengths[j] for j in order[: len(order) // batch_size * batch_size]) or 1
    return len(widths), slots / total


def _lengths(workload: Workload) -> tuple[list[int], bool] | None:
    """(sample lengths, whether that is every sample) for a map-style token dataset, else None."""
    spec = workload.spec
    if not getattr(workload, "token_data", False) or spec.iterable:
        return None
    if not tokens.is_token_item(tokens.first_item(spec.dataset)) and getattr(spec.dataset, "lengths", None) is None:
        return None
    indices, lengths = tokens.length_pool(spec.dataset, workload.seed)
    return lengths, len(indices) == len(spec.dataset)


def _options(lengths: list[int], batch_size: int, per_s: float | None, max_positions: int | None) -> pd.DataFrame:
    """One row per pad_to_multiple_of (None first): shapes in one pass, padded slots per token, one-time seconds."""
    longest = max(lengths)
    rows = []
    for m in (None, *MULTIPLES):
        if m is not None and max_positions is not None and -(-longest // m) * m > max_positions:
            continue  # pads past the position table: the knob refuses it (pad_check)
        n, slots = pass_shapes(lengths, batch_size, m)
        rows.append({"pad_to_multiple_of": m, "shapes_per_pass": n, "slots_per_token": slots,
                     "one_time_s": None if per_s is None else n * per_s})
    return pd.DataFrame(rows)


def _per_shape(r: TrialResult) -> float | None:
    info = r.extra.get("shapes") if isinstance(r.extra, dict) else None
    per = info.get("per_shape_s") if isinstance(info, dict) else None
    return per if isinstance(per, (int, float)) else None


def paid_most(trials: list[TrialResult], base: TrialResult) -> TrialResult:
    """Of `base` and the ok trials with its knobs, the one whose shapes cost most on their first calls: the
    caches are the process's, so a later trial of the same knobs meets the shapes already planned."""
    same = [r for r in trials if r.ok and r.knobs == base.knobs and (r.shapes or 0) > 1 and _per_shape(r) is not None]
    return max(same, key=lambda r: _per_shape(r) or 0.0, default=base) if same else base


def shape_cost(base: TrialResult, workload: Workload) -> ShapeCost:
    """The ShapeCost of trial `base` on `workload` (see the module docstring)."""
    n, per = int(base.shapes or 0), _per_shape(base)
    cost = ShapeCost(n, per, base.shape_warmup_s)
    if per is not None:
        cost.lines.append(f"{n} input shapes x {per * 1e3:,.0f} ms = {n * per:,.1f} s of first calls (plans, "
                          f"autotune, recompiles), paid in trial #{base.trial_id}'s warm-up, apart from its window "
                          "(once per shape per process: a later trial of the same knobs may pay none)")
    else:
        cost.lines.append(f"{n} input shapes; their first calls' cost was not measured apart from start-up")
    found = _lengths(workload)
    bs = base.knobs.batch_size
    if found is None or base.knobs.packing:
        cost.lines.append(f"a real run pays it once per distinct input shape in your data (at least the {n} seen "
                          "here), in every process; making the inputs a few fixed sizes (bucketing) leaves fewer")
        return cost
    lengths, every = found
    table = _options(lengths, bs, per, workload.max_positions)
    cost.options = table
    now = table.iloc[0]
    cost.data_shapes = int(now["shapes_per_pass"])
    paid = f" (≈{now['one_time_s']:,.1f} s)" if per is not None else ""
    cost.lines.append(f"a real run pays it once per distinct shape in your data: {'' if every else 'at least '}"
                      f"{cost.data_shapes} in one pass at batch_size={bs}{paid}, in every process that trains")
    padded = table[table["pad_to_multiple_of"].notna()]
    if padded.empty:
        return cost
    fewer = padded[padded["shapes_per_pass"] <= max(1, math.ceil(cost.data_shapes / FEWER))]
    pick = (fewer if not fewer.empty else padded.tail(1)).iloc[0]
    m = int(pick["pad_to_multiple_of"])
    cost.offer = {"pad_to_multiple_of": m}
    once = f" (≈{pick['one_time_s']:,.1f} s once)" if per is not None else ""
    more = pick["slots_per_token"] / now["slots_per_token"] - 1
    cost.lines.append(f"pad_to_multiple_of={m} leaves {int(pick['shapes_per_pass'])} shapes{once} for {more:+.0%} "
                      f"padded slots: bench.run(pad_to_multiple_of={m}) measures it")
    return cost


@analysis("input shapes", title="New input shapes (a one-time cost per shape)", steps=0.0, order=40,
          show=lambda c: c.lines, when=lambda ctx: (ctx.base.shapes or 0) > 1)
def _input_shapes(ctx: Context) -> ShapeCost:
    return shape_cost(paid_most(list(ctx.bench.trials), ctx.base), ctx.workload)
