"""The optimizer knob: the user's optimizer as given, or rebuilt with multi-tensor (foreach) or
fused kernels. Its run-time hook and its code hook sit together."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from .spec import Context, Fuzz, declare

OPTIMIZER_IMPLS = ("as-given", "foreach", "fused")
IMPL_FLAGS = {"foreach": {"foreach": True, "fused": None}, "fused": {"foreach": None, "fused": True}}


def rebuild_optimizer(optimizer: Any, value: str, ctx: Context) -> Any:
    """The user's optimizer rebuilt with foreach=/fused= (same class, param groups and
    hyperparameters), or unchanged with a note in `ctx.notes` when its class takes no such argument."""
    if value == "as-given":
        return optimizer
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    if value not in accepted:
        ctx.notes.append(f"optimizer_impl={value!r}: {cls.__name__} takes no {value}= argument, so it ran as given")
        return optimizer
    flags = {k: v for k, v in IMPL_FLAGS[value].items() if k in accepted}
    groups = [{**group, **flags} for group in optimizer.param_groups]  # keeps per-group lr, betas...
    try:
        rebuilt = cls(groups, **flags)
    except (RuntimeError, ValueError, TypeError) as e:  # e.g. fused kernels missing for this device/dtype
        ctx.notes.append(f"optimizer_impl={value!r}: {cls.__name__} refused it here ({e}); it ran as given")
        return optimizer
    for hook in getattr(optimizer, "_optimizer_step_post_hooks", {}).values():  # e.g. a scheduler's stepper
        rebuilt.register_step_post_hook(hook)
    return rebuilt


def optimizer_code(k: Any) -> dict[str, list[str]]:
    if k.optimizer_impl == "as-given":
        return {}
    flags = ", ".join(f"{a}={b}" for a, b in IMPL_FLAGS[k.optimizer_impl].items())
    return {
        "imports": ["import inspect"],
        "optimizer": [
            f"# optimizer_impl={k.optimizer_impl!r}: the same optimizer rebuilt with {flags} (param groups kept)",
            f'if "{k.optimizer_impl}" in inspect.signature(type(optimizer).__init__).parameters:',
            f"    flags = dict({flags})",
            "    optimizer = type(optimizer)([{**g, **flags} for g in optimizer.param_groups], **flags)",
        ],
    }


# ---- the declarations: Knobs (value.py) inherits these fields, in this order ---------------------------
@dataclass(frozen=True, init=False)
class OptimizerKnobs:
    """The optimizer knob, declared once (Knobs inherits this field)."""

    optimizer_impl: str = declare("as-given", interleave=True, kind="choice", choices=OPTIMIZER_IMPLS, group="Precision & compile",
        widget="dropdown", on_optimizer=rebuild_optimizer, code=optimizer_code,
        fuzz=Fuzz(OPTIMIZER_IMPLS, ("apex", "")),
        help="optimizer kernels: as given, or rebuilt with foreach=True / fused=True (multi-tensor or fused update)")
