"""StepShape: what one training step of the user's workload looks like, as plain data.

`to_code()` has to write the step that was measured, not a guess. The step depends on the user's
batch format and on where the loss comes from, so the workbench reads both once (from the first
batch it checks, in `Workbench._probe`) into a StepShape, stamps it on every logged trial, and
codegen renders the loop from it:

    batch   "tuple"  (inputs..., target) or (inputs...)    -> model(*inputs), loss_fn(out, target)
            "dict"   {"input_ids": ..., "labels": ...}      -> model(**batch)
            "tensor" one tensor (or a namedtuple, or other) -> model(batch)
    loss    "loss_fn" the user's loss_fn(output, target) (or loss_fn(output) when there is no target)
            "model"   the model's own: `.loss`, a dict's "loss", or the output itself (Hugging Face)
            "step_fn" the user's step_fn(model, batch) -> loss

A StepShape is stored in logs, which are untrusted input: `from_record` accepts only the values
this module writes and falls back to None (the caller then uses the classic tuple shape).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

BATCHES = ("tuple", "dict", "tensor")
LOSSES = ("loss_fn", "model", "step_fn")


@dataclass(frozen=True)
class StepShape:
    """The batch format, the loss's source and the loader's sampling of one workload."""

    batch: str = "tuple"  # one of BATCHES
    loss: str = "loss_fn"  # one of LOSSES
    items: int = 2  # tuple batches: how many items (the last is the target under loss_fn)
    keys: tuple[str, ...] = ()  # dict batches: the top-level keys, for the script's comments
    nested: bool = False  # containers inside the batch (a dict of dicts, a tuple of tuples...)
    step_fn: str | None = None  # "module:qualname" when importable, else None
    step_fn_problem: str | None = None  # why the step_fn cannot be carried over (a lambda, a closure)
    collate_fn: bool = False  # the user's DataLoader had its own collate_fn
    sampler: bool = False  # the user's DataLoader had its own sampler
    shuffle: bool = True
    drop_last: bool = False
    factory: str | None = None  # "pkg.mod:fn" (--model) or "demo:NAME:SIZE": the script rebuilds the parts
    notes: tuple[str, ...] = field(default=())

    @property
    def splits_target(self) -> bool:
        """Whether the last tuple item is the target handed to loss_fn (as `split_batch` does)."""
        return self.batch == "tuple" and self.loss == "loss_fn" and self.items >= 2

    def describe(self) -> str:
        """One line for the script's header: what the dataset yields and how the loss is made."""
        if self.batch == "dict":
            keys = ", ".join(self.keys[:6]) + (", ..." if len(self.keys) > 6 else "")
            what = f"dict batches ({keys})" if keys else "dict batches"
        elif self.batch == "tuple":
            what = "(inputs..., target) batches" if self.splits_target else f"{self.items}-item tuple batches"
        else:
            what = "single-tensor batches"
        what += " with nested containers" if self.nested else ""
        loss = {"loss_fn": "loss_fn(output, target)" if self.splits_target else "loss_fn(output)",
                "model": "the model's own loss (output.loss, output['loss'] or the output)",
                "step_fn": "step_fn(model, batch)"}[self.loss]
        return f"{what}; loss = {loss}"

    def to_record(self) -> dict[str, Any]:
        """JSON-able dict for the trial log (`from_record` reads it back)."""
        d = asdict(self)
        d["keys"], d["notes"] = list(self.keys), list(self.notes)
        return d

    @classmethod
    def from_record(cls, record: Any) -> StepShape | None:
        """The StepShape a log line holds, or None when it is missing or malformed (logs are untrusted)."""
        if not isinstance(record, Mapping):
            return None
        try:
            batch, loss = record.get("batch"), record.get("loss")
            if batch not in BATCHES or loss not in LOSSES:
                return None
            items = record.get("items", 2)
            if isinstance(items, bool) or not isinstance(items, int) or not 0 <= items <= 1000:
                return None
            keys = tuple(str(k) for k in record.get("keys", ())[:1000])
            notes = tuple(str(n)[:500] for n in record.get("notes", ())[:20])
            step_fn = record.get("step_fn")
            if step_fn is not None and not is_import_path(step_fn):
                step_fn = None
            factory = record.get("factory")
            if factory is not None and not (is_import_path(factory) or is_demo_source(factory)):
                factory = None
            problem = record.get("step_fn_problem")
            return cls(batch=batch, loss=loss, items=items, keys=keys, nested=bool(record.get("nested", False)),
                       step_fn=step_fn, step_fn_problem=str(problem)[:500] if problem is not None else None,
                       collate_fn=bool(record.get("collate_fn", False)), sampler=bool(record.get("sampler", False)),
                       shuffle=bool(record.get("shuffle", True)), drop_last=bool(record.get("drop_last", False)),
                       factory=factory, notes=notes)
        except (TypeError, AttributeError):
            return None


def is_import_path(text: Any) -> bool:
    """'pkg.module:qualified.name', every part an identifier."""
    if not isinstance(text, str) or text.count(":") != 1:
        return False
    module, name = text.split(":")
    return all(p.isidentifier() for p in module.split(".")) and all(p.isidentifier() for p in name.split("."))


def is_demo_source(text: Any) -> bool:
    """'demo:NAME:SIZE' (a built-in demo's name may hold a dash, e.g. mlp-memory)."""
    if not isinstance(text, str):
        return False
    parts = text.split(":")
    return len(parts) == 3 and parts[0] == "demo" and parts[1].replace("-", "_").isidentifier() and parts[2].isidentifier()


def function_path(fn: Callable) -> tuple[str | None, str | None]:
    """(import path "module:qualname", None) for a function a script can import, else (None, why not).

    A lambda, a function defined inside another (a closure) or in the notebook itself (`__main__`)
    cannot be imported by a script; the reason names the fix.
    """
    name = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", "?")
    module = getattr(fn, "__module__", None)
    fix = "define it with `def` at the top level of a .py module and import it, or paste its definition above the script"
    if getattr(fn, "__name__", "") == "<lambda>":
        return None, f"step_fn is a lambda, which a script cannot import: {fix}"
    if "<locals>" in name or getattr(getattr(fn, "__code__", None), "co_freevars", ()):
        free = getattr(getattr(fn, "__code__", None), "co_freevars", ())
        over = f" over {', '.join(free)}" if free else ""
        return None, f"step_fn {name} is a closure{over}, which a script cannot rebuild: {fix}"
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):
        return None, f"step_fn is a {type(fn).__name__} object, not a function: {fix}"
    if module in (None, "__main__", "builtins") or module.startswith("__"):
        return None, None  # defined in the notebook or script itself: the script calls it by name
    return f"{module}:{name}", None


def _nested(value: Any) -> bool:
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    return any(isinstance(v, (Mapping, list, tuple)) for v in items)


def shape_of(batch: Any, *, has_loss_fn: bool, step_fn: Callable | None, spec: Any) -> StepShape:
    """Read a StepShape from one batch of the user's data and the workload's parts (`spec`: a LoaderSpec)."""
    if isinstance(batch, Mapping):
        kind, items, keys = "dict", 0, tuple(str(k) for k in batch)
    elif isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        kind, items, keys = "tuple", len(batch), ()
    else:
        kind, items, keys = "tensor", 1, ()
    loss = "step_fn" if step_fn is not None else "loss_fn" if has_loss_fn else "model"
    path = problem = None
    if step_fn is not None:
        path, problem = function_path(step_fn)
    collate = spec.collate_fn is not None and not _is_default_collate(spec.collate_fn)
    return StepShape(batch=kind, loss=loss, items=items, keys=keys, nested=_nested(batch), step_fn=path,
                     step_fn_problem=problem, collate_fn=collate, sampler=spec.sampler is not None,
                     shuffle=bool(spec.shuffle), drop_last=bool(spec.drop_last))


def _is_default_collate(fn: Callable) -> bool:
    """DataLoader's own collate functions (what a script gets without passing collate_fn)."""
    return fn in (torch.utils.data.default_collate, torch.utils.data.default_convert)
