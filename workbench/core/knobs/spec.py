"""KnobSpec: everything about one knob, declared once, and the Context its hooks receive.

A knob's declaration (a field of `Knobs`, in value.py, or a `@wb.knob` function) holds its type,
default, help, panel group, widget, fuzz range and its hooks. The running core never reads a
knob's value itself (apart from the structural knobs, see STRUCTURAL): it asks the registry to
run every knob's hook at one seam, and each hook gets its own value plus a Context (the device,
the workload's loader spec and blocks, a notes sink, the whole Knobs value for knobs that work
together). The family modules (data, precision, memory, optimizer, parallel) hold each knob's
run-time hook, code hook and note side by side.
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Panel groups in the seeds' teaching order: fix the data pipeline first, then precision/compile,
# then memory. Knobs are read in this order, so a knob can depend on the ones before it.
GROUPS = ("Data pipeline", "Precision & compile", "Memory", "CPU", "Distributed", "Your knobs")
USER_GROUP = "Your knobs"  # knobs declared in a notebook cell with @wb.knob
# The generated loop's seams: each knob's `code` hook adds lines to some of them (codegen.py
# renders them in order). header: comment lines; functions: helper sources (your @wb.knob
# functions); setup: lines after the device; loader_args: DataLoader keywords; move_args: keywords
# of the device move (`t.to(device, ...)`); model: lines on the model; optimizer: lines after it;
# ddp_args / ddp_model: DistributedDataParallel keywords / lines after it (comm hooks); fsdp_units /
# fsdp_options / fsdp_mp / fsdp_before / fsdp_after: the shard units, fully_shard's and
# MixedPrecisionPolicy's keywords, lines before and after sharding (codegen lays FSDP2 out); wrap: expressions around "{inner}" (torch.compile); scaler: lines creating
# `scaler`; batch: lines run on `batch` after the move (codegen's each_tensor maps every tensor);
# forward: context expressions around forward + loss; no_sync: "ddp" when micro-batches skip the
# all-reduce; before_step: after backward, before optimizer.step (gradients unscaled).
CODE_SECTIONS = (
    "header",
    "imports",
    "functions",
    "setup",
    "loader_args",
    "move_args",
    "model",
    "optimizer",
    "ddp_args",
    "ddp_model",
    "fsdp_units",
    "fsdp_options",
    "fsdp_mp",
    "fsdp_before",
    "fsdp_after",
    "wrap",
    "scaler",
    "batch",
    "forward",
    "no_sync",
    "before_step",
)
BLOCK_KNOBS = ("checkpoint", "fsdp_shard")  # knobs of kind "blocks": tuples of block names (bench.blocks)
# The only knobs the running core may read directly: they shape the loop itself (how many samples
# per micro-batch and per step, how many processes, which parallel strategy, loader or cached batch).
STRUCTURAL = frozenset({"batch_size", "accum_steps", "world_size", "strategy", "data"})
# What a trial's phases must know of a configuration (`traits`), and what it is when no knob says.
TRAIT_DEFAULTS: dict[str, Any] = {"compiles": False, "workers": 0, "persistent_workers": False,
                                  "buffered_batches": 0, "loss_scaling": False}


@dataclass(frozen=True)
class Fuzz:
    """How the fuzz test draws a knob: `valid` values (a range, a tuple, or "blocks" for the
    workload's block names) and `invalid` ones that must be rejected with a ValueError/TypeError."""

    valid: Any
    invalid: tuple = ()


@dataclass
class Context:
    """What a hook may know besides its own value: the whole Knobs (for knobs that work together,
    e.g. prefetch_factor with num_workers), the device, the workload's loader spec and blocks, the
    loader timeout, and a sink for notes ("ran as given", fallbacks)."""

    knobs: Any
    device: Any = None  # torch.device; None = "cpu"
    spec: Any = None  # the workload's LoaderSpec
    blocks: Mapping[str, int] = field(default_factory=dict)  # checkpoint candidates (bench.blocks)
    notes: list[str] = field(default_factory=list)
    has_conv: bool = True
    four_d: bool | None = None  # the model or a sample batch holds a 4-D tensor (None: not known yet)
    loader_timeout_s: float = 0.0
    checkpoint_kwargs: dict[str, Any] = field(default_factory=dict)  # merged checkpoint_kwargs hooks
    token_data: bool = False  # the batches hold input_ids (the length knobs act only then)
    forward_params: frozenset = frozenset()  # the model's forward parameters (packing needs position_ids)
    window: Any = None  # tokens.TokenWindow: the trial's length-stratified batches (token data, lengths vary)
    max_positions: int | None = None  # the model's position table, in tokens (None: it has none we can read)
    longest_tokens: Callable[[], int | None] | None = None  # the longest sample in tokens (Workload.longest_tokens)

    @property
    def device_type(self) -> str:
        return getattr(self.device, "type", None) or str(self.device or "cpu")


@dataclass(frozen=True)
class KnobSpec:
    """Everything about one knob, declared once. The panel, the CLI, the fuzz test, the docs'
    table, validation, the step and the generated code all read it from here.

    Run-time hooks (all optional; each receives the knob's value and a Context):
      settings(value, ctx) -> context manager: a process-wide setting held for the trial
      loader(value, ctx) -> dict: DataLoader keywords
      move(value, ctx) -> dict: keywords of the batch's move to the device (non_blocking, channels_last)
      on_model(model, value, ctx) -> model | None: transform each trial's fresh model copy (None = in place)
      release(model, value, ctx): undo what on_model attached (wrappers that refer back to the model)
      checkpoint_kwargs(value, ctx) -> dict: keywords for torch.utils.checkpoint (set before on_model)
      on_optimizer(optimizer, value, ctx) -> optimizer: rebuild or adjust the optimizer
      wrap(model, value, ctx) -> model: the model the step calls (torch.compile)
      scaler(value, ctx) -> GradScaler | None: loss scaling for backward and step
      forward(value, ctx) -> context manager | None: entered around every micro-batch's forward and loss
      before_step(value, model, optimizer, ctx): after backward, before optimizer.step (gradients unscaled)
      ddp_kwargs(value, ctx) -> dict: keywords for DistributedDataParallel (world_size > 1)
      parallel(value, ctx) -> dict: the data-parallel strategy's options (comm_hook, no_sync, FSDP2's)
      check_run(value, ctx): raise ValueError naming the fix when the knob cannot run on this device
      traits(value, ctx) -> dict: what the runner must know (TRAITS: compiles, workers, ...)
      note(value, ctx) -> str | None: "runs but does nothing here" sentences
      inert(value, ctx) -> str | None: why this value changes nothing in this workload's step (its
        tensors, the device, the other knobs in ctx.knobs), known before any trial; None when it may change
        the step. Two configurations that differ only in inert knobs run the same step (inert.py):
        `compare` answers "same" without measuring, and `run` says so before the trial
      process_env(value, ctx) -> dict: variables the trial's process must start with (None values: unset);
        read by the C library or the loader at start-up only, so a trial whose process differs runs in a
        fresh one (workbench/launch/fresh.py)
      process_differs(value, ctx) -> str | None: None when this process runs as the value asks, else what it
        runs instead (checked inside the fresh process: a mode that did not take fails the trial)
    Code hook: code(knobs) -> {section: lines}: what the generated training loop adds (CODE_SECTIONS).
    """

    default: Any
    kind: str  # "int" | "float" | "bool" | "choice" | "blocks"
    help: str  # one line: what it does (panel tooltip, CLI help, docs table)
    group: str  # one of GROUPS
    widget: str  # "int" | "slider" | "checkbox" | "dropdown" | "blocks"
    fuzz: Fuzz
    choices: tuple = ()  # allowed values of a "choice" knob
    minimum: float | None = None  # smallest allowed int or float
    optional: bool = False  # None allowed, meaning torch's own default
    options: Any = ()  # dropdown values of an optional int; "cores" = 1..os.cpu_count()
    maximum: Any = None  # widget bound: an int, "dataset" (its length) or "workers" (2 x cores)
    probe: Any = None  # a value that switches the knob on (the panel disables it when that is a no-op)
    settings: Callable[[Any, Context], contextlib.AbstractContextManager] | None = None
    loader: Callable[[Any, Context], dict[str, Any]] | None = None
    move: Callable[[Any, Context], dict[str, Any]] | None = None
    on_model: Callable[[Any, Any, Context], Any] | None = None
    release: Callable[[Any, Any, Context], None] | None = None
    checkpoint_kwargs: Callable[[Any, Context], dict[str, Any]] | None = None
    on_optimizer: Callable[[Any, Any, Context], Any] | None = None
    wrap: Callable[[Any, Any, Context], Any] | None = None
    scaler: Callable[[Any, Context], Any] | None = None
    forward: Callable[[Any, Context], contextlib.AbstractContextManager | None] | None = None
    before_step: Callable[[Any, Any, Any, Context], None] | None = None
    ddp_kwargs: Callable[[Any, Context], dict[str, Any]] | None = None
    parallel: Callable[[Any, Context], dict[str, Any]] | None = None
    check_run: Callable[[Any, Context], None] | None = None
    traits: Callable[[Any, Context], dict[str, Any]] | None = None
    note: Callable[[Any, Context], str | None] | None = None
    inert: Callable[[Any, Context], str | None] | None = None
    process_env: Callable[[Any, Context], dict[str, str | None]] | None = None
    process_differs: Callable[[Any, Context], str | None] | None = None
    code: Callable[[Any], dict[str, list[str]]] | None = None
    function: Callable | None = None  # a user knob's decorated function (its source goes into to_code)
    name: str = ""  # filled in from the field name
    # True when two values can take turns of a few steps on live steps in one process (bench.compare's
    # interleaved path, deciding/interleave.py): the knob acts on its side's own model copy, optimizer or step, or
    # is a process setting entered at each turn. Data-pipeline knobs (each side would need its own loader)
    # and the distributed ones (other processes) leave it False.
    interleave: bool = False

    RUNTIME_HOOKS = (
        "settings",
        "loader",
        "move",
        "on_model",
        "release",
        "checkpoint_kwargs",
        "on_optimizer",
        "wrap",
        "scaler",
        "forward",
        "before_step",
        "ddp_kwargs",
        "parallel",
        "traits",
        "process_env",
    )

    @property
    def flag(self) -> str:
        """The CLI flag: --name-with-dashes."""
        return "--" + self.name.replace("_", "-")

    @property
    def runtime_hooks(self) -> list[str]:
        """The run-time hooks this knob declares (the completeness test wants one, or STRUCTURAL)."""
        return [h for h in self.RUNTIME_HOOKS if getattr(self, h) is not None]

    def check(self, value: Any) -> None:
        """Raise TypeError/ValueError naming the fix if `value` is not allowed for this knob."""
        name = self.name
        if value is None and self.optional:
            return
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                extra = " or None (torch's default)" if self.optional else ""
                raise TypeError(f"Knobs.{name} takes an int, got {value!r}: set it to an int >= {self.minimum}{extra}")
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"Knobs.{name}={value} is too small: set it to an int >= {self.minimum}")
        elif self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                extra = " or None" if self.optional else ""
                raise TypeError(
                    f"Knobs.{name} takes a number, got {value!r}: set it to a float >= {self.minimum}{extra}"
                )
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"Knobs.{name}={value} is too small: set it to a float >= {self.minimum}")
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise TypeError(f"Knobs.{name} takes True or False, got {value!r}: set it to one of them")
        elif self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"Knobs.{name}={value!r} is not one of {', '.join(map(repr, self.choices))}")


def declare(default: Any, **spec: Any) -> Any:
    """A built-in Knobs field whose metadata holds its KnobSpec (the one declaration of the knob)."""
    return field(default=default, metadata={"spec": KnobSpec(default=default, **spec)})


# The registry: the built-in knobs in declaration order (filled in by value.py once `Knobs` exists),
# then the user's (@knob, registry.py), in definition order.
KNOBS: dict[str, KnobSpec] = {}


def knob_names() -> list[str]:
    """The public knob names, in declaration order."""
    return list(KNOBS)


def function_source(fn: Callable) -> str:
    """The function's source without its decorator (a comment if the source cannot be read)."""
    try:
        lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
    except (OSError, TypeError):
        return f"# {fn.__name__}: source not available; define it here (it was declared with @wb.knob)"
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def "))), 0)
    return "\n".join(lines[start:])


def code_sections(knobs: Any) -> dict[str, list[str]]:
    """{section: lines} the knobs' `code` hooks add to the generated training loop (codegen.py)."""
    out: dict[str, list[str]] = {s: [] for s in CODE_SECTIONS}
    for spec in KNOBS.values():
        if spec.code is not None:
            for section, lines in spec.code(knobs).items():
                out[section] += lines
    return out


def traits(knobs: Any, ctx: Context | None = None) -> dict[str, Any]:
    """What the runner (and the script's warm-up) must know of a configuration, from the knobs'
    `traits` hooks: compiles, workers, persistent_workers, buffered_batches, loss_scaling."""
    ctx = ctx or Context(knobs=knobs)
    out = dict(TRAIT_DEFAULTS)
    for spec in KNOBS.values():
        if spec.traits is not None:
            out.update(spec.traits(getattr(knobs, spec.name), ctx))
    return out
