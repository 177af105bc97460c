"""Knobs: every tunable setting of a trial, as one frozen, validated, diff-able value.

Each field is declared once, with its hooks, in a family module (data, precision, memory,
optimizer, parallel, process); `Knobs` inherits them all. Validation that needs nothing but the values happens here, so a bad
combination fails before any work starts; `registry.check_run` adds the checks that need the device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from . import parallel
from .data import DataKnobs
from .memory import MemoryKnobs
from .optimizer import OptimizerKnobs
from .parallel import ParallelKnobs
from .precision import PrecisionKnobs
from .process import ProcessKnobs
from .spec import BLOCK_KNOBS, KNOBS, knob_names


@dataclass(frozen=True, init=False)
class Knobs(ProcessKnobs, ParallelKnobs, OptimizerKnobs, MemoryKnobs, PrecisionKnobs, DataKnobs):
    """One configuration of the training step. Build with keywords; `replace()` to vary one.

    Each knob is one field, declared once with `declare(...)` in its family module (data,
    precision, memory, optimizer, parallel, process: the field order is the families' order), beside its
    hooks: its type, default, help, panel group and widget, fuzz range (see KnobSpec). Adding a knob
    = adding a field and its hooks to one family module (+ its tests).
    """

    user: tuple = field(default=(), metadata={})  # (name, value) of your own knobs (@knob), defaults left out

    def __post_init__(self) -> None:
        # Normalise list -> tuple so Knobs stay hashable and compare by value.
        for name in BLOCK_KNOBS:
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,) if value else ())
            elif not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        self.validate()

    # ---- validation that needs nothing but the values -------------------------------------
    def validate(self) -> None:
        """Raise ValueError/TypeError naming the fix if a value or combination cannot work."""
        for spec in KNOBS.values():
            spec.check(getattr(self, spec.name))
        for knob in BLOCK_KNOBS:
            names = getattr(self, knob)
            for name in names:
                if not isinstance(name, str) or not name:
                    raise TypeError(
                        f"Knobs.{knob} takes block names (strings such as 'blocks.0'), got {name!r}; "
                        "see bench.blocks for the candidates"
                    )
            if len(set(names)) != len(names):
                raise ValueError(f"Knobs.{knob} names a block twice: {names}; list each once")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError(
                "persistent_workers=True needs worker processes: set num_workers >= 1 or persistent_workers=False"
            )
        if self.data == "cached" and self.num_workers > 0:
            raise ValueError(
                "data='cached' reuses one batch already on the device, so there is nothing for "
                "workers to load: set num_workers=0 (or data='loader')"
            )
        if self.ddp_static_graph and self.ddp_no_sync and self.accum_steps > 1 and self.world_size > 1:
            # DDP's reducer fails an internal assert on the first no_sync backward with a static
            # graph (checked on torch 2.13, gloo): refuse it before any process starts
            raise ValueError(
                "ddp_static_graph=True cannot be combined with ddp_no_sync=True and accum_steps > 1 "
                "(DDP's reducer asserts on the skipped all-reduce): set ddp_static_graph=False or "
                "ddp_no_sync=False"
            )
        parallel.check_strategy(self)

    # ---- your own knobs (@knob) ride along in `user`: (name, value) pairs, defaults left out ------
    def __init__(self, **values: Any) -> None:
        user = dict(values.pop("user", ()))  # may hold unknown names (a log read before the knob's cell ran)
        for f in BUILTIN_FIELDS:
            object.__setattr__(self, f.name, values.pop(f.name, f.default))
        for name, value in values.items():
            if name not in KNOBS:
                raise TypeError(
                    f"unknown knob {name!r}; known: {', '.join(knob_names())} (define your own with @wb.knob)"
                )
            user[name] = value
        kept = {n: v for n, v in user.items() if n not in KNOBS or v != KNOBS[n].default}
        object.__setattr__(self, "user", tuple(sorted(kept.items())))
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "user":
            raise AttributeError(name)
        given = dict(self.user)
        if name in given:
            return given[name]
        if name in KNOBS:
            return KNOBS[name].default
        raise AttributeError(f"Knobs has no knob {name!r}; known: {', '.join(knob_names())}")

    @property
    def unknown(self) -> tuple[str, ...]:
        """Knob names this value carries that no declaration knows (read back before their cell ran)."""
        return tuple(n for n, _ in self.user if n not in KNOBS)

    # ---- helpers ---------------------------------------------------------------------------
    def replace(self, **changes: Any) -> Knobs:
        """A copy with some knobs changed (validated)."""
        unknown = set(changes) - set(KNOBS)
        if unknown:
            raise TypeError(f"unknown knob(s) {sorted(unknown)}; known: {', '.join(knob_names())}")
        return Knobs(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (block-name knobs as lists): every declared knob, then any unknown ones."""
        d = {name: getattr(self, name) for name in KNOBS}
        d.update((name, list(getattr(self, name))) for name in BLOCK_KNOBS)
        d.update((n, v) for n, v in self.user if n not in KNOBS)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, keep_unknown: bool = False) -> Knobs:
        """Inverse of `to_dict`; unknown keys raise TypeError naming the known knobs, or with
        `keep_unknown` are carried along as they are (see `unknown`)."""
        known = {k: v for k, v in d.items() if k in KNOBS}
        other = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k not in KNOBS}
        if other and not keep_unknown:
            return cls().replace(**d)  # raises, naming the known knobs
        return cls(**known, user=tuple(other.items()))

    def diff(self, other: Knobs) -> dict[str, tuple[Any, Any]]:
        """{knob: (self value, other value)} for every knob that differs."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)}

    def label(self, base: Knobs | None = None) -> str:
        """Short label for tables and charts: what differs from `base` (a workbench's defaults; default:
        the default Knobs), e.g. "num_workers=2, channels_last"; "defaults" when nothing does."""
        changes = (base or Knobs()).diff(self)
        if not changes:
            return "defaults"
        parts = []
        for k, (_, v) in changes.items():
            if k == "checkpoint":
                parts.append(f"ckpt={len(v)}" if v else "ckpt=none")
            elif isinstance(v, bool):
                parts.append(k if v else f"no {k}")
            else:
                parts.append(f"{k}={v}")
            if k in self.unknown:
                parts[-1] += "(unknown)"
        return ", ".join(parts)

    def to_code(self, **kwargs: Any) -> str:
        """A runnable plain-PyTorch training loop reproducing this configuration (see codegen.py)."""
        from ..codegen import knobs_to_code

        return knobs_to_code(self, **kwargs)

    def __str__(self) -> str:
        changes = Knobs().diff(self)
        inner = ", ".join(
            f"{k}={v!r}" + (" (unknown knob)" if k in self.unknown else "") for k, (_, v) in changes.items()
        )
        return f"Knobs({inner})"


BUILTIN_FIELDS = tuple(f for f in fields(Knobs) if f.name != "user")
BUILTIN_KNOBS = frozenset(f.name for f in BUILTIN_FIELDS)
KNOBS.update((f.name, dataclasses.replace(f.metadata["spec"], name=f.name)) for f in BUILTIN_FIELDS)
# the built-in knobs whose values can take turns in one process (each declares `interleave=True`)
INTERLEAVE_KNOBS = frozenset(n for n in BUILTIN_KNOBS if KNOBS[n].interleave)
