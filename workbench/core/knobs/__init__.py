"""Knobs: every tunable setting of a trial, declared once, applied by its own hooks.

    spec.py       KnobSpec (a knob's declaration), Context (what its hooks see), the registry dict
    data.py, precision.py, memory.py, optimizer.py, parallel.py, process.py
                  the families: each knob's run-time hook, note and code hook side by side
    value.py      Knobs, the frozen, validated, diff-able value (one declared field per knob)
    registry.py   @knob for your own, and the hook loops the core calls instead of reading values

Everything importable from `workbench.core.knobs` before the split still is.
"""

from __future__ import annotations

from .data import DATA_MODES
from .memory import CHECKPOINT_MODES, SAVED_OPS
from .optimizer import OPTIMIZER_IMPLS
from .parallel import COMM_HOOKS, FSDP_DTYPES, STRATEGIES, check_strategy
from .precision import AMP_MODES, COMPILE_MODES, MATMUL_PRECISIONS
from .registry import (
    USER_WHERE,
    adjust_optimizer,
    adopt_user_knobs,
    check_run,
    checkpoint_options,
    context,
    ddp_options,
    device_notes,
    first_doc_line,
    forget_knob,
    forward_hooks,
    grouped,
    knob,
    knob_table,
    loader_kwargs,
    make_scaler,
    move_kwargs,
    parallel_options,
    process_differs,
    process_env,
    release_model,
    settings,
    step_hooks,
    transform_model,
    tunable_knobs,
    user_code,
    user_knob_names,
    user_knob_specs,
    wrap_model,
)
from .spec import (
    BLOCK_KNOBS,
    CODE_SECTIONS,
    GROUPS,
    KNOBS,
    STRUCTURAL,
    TRAIT_DEFAULTS,
    USER_GROUP,
    Context,
    Fuzz,
    KnobSpec,
    code_sections,
    declare,
    function_source,
    knob_names,
    traits,
)
from .value import BUILTIN_FIELDS, BUILTIN_KNOBS, INTERLEAVE_KNOBS, Knobs

__all__ = [
    "AMP_MODES",
    "BLOCK_KNOBS",
    "BUILTIN_FIELDS",
    "BUILTIN_KNOBS",
    "CHECKPOINT_MODES",
    "CODE_SECTIONS",
    "COMM_HOOKS",
    "COMPILE_MODES",
    "DATA_MODES",
    "FSDP_DTYPES",
    "GROUPS",
    "INTERLEAVE_KNOBS",
    "KNOBS",
    "MATMUL_PRECISIONS",
    "OPTIMIZER_IMPLS",
    "SAVED_OPS",
    "STRATEGIES",
    "STRUCTURAL",
    "TRAIT_DEFAULTS",
    "USER_GROUP",
    "USER_WHERE",
    "Context",
    "Fuzz",
    "KnobSpec",
    "Knobs",
    "adjust_optimizer",
    "adopt_user_knobs",
    "check_run",
    "check_strategy",
    "checkpoint_options",
    "code_sections",
    "context",
    "ddp_options",
    "declare",
    "device_notes",
    "first_doc_line",
    "forget_knob",
    "forward_hooks",
    "function_source",
    "grouped",
    "knob",
    "knob_names",
    "knob_table",
    "loader_kwargs",
    "make_scaler",
    "move_kwargs",
    "parallel_options",
    "process_differs",
    "process_env",
    "release_model",
    "settings",
    "step_hooks",
    "traits",
    "transform_model",
    "tunable_knobs",
    "user_code",
    "user_knob_names",
    "user_knob_specs",
    "wrap_model",
]
