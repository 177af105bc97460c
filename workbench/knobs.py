"""Knobs: every tunable setting of a trial, as one frozen, validated, diff-able value.

A `Knobs` value says *what* to try; `apply.py` turns it into a DataLoader, autocast, GradScaler,
compile and checkpoint wrappers. Validation happens here (pure checks) and in `check()` (checks
that need the workload and the device), so a bad combination fails before any work starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from .system import usable_cores

AMP_MODES = ("off", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISIONS = ("highest", "high", "medium")
DATA_MODES = ("loader", "cached")
# Panel groups in the seeds' teaching order: fix the data pipeline first, then precision/compile,
# then memory. Knobs are read in this order, so a knob can depend on the ones before it.
GROUPS = ("Data pipeline", "Precision & compile", "Memory", "CPU", "Distributed", "Your knobs")
USER_GROUP = "Your knobs"  # knobs declared in a notebook cell with @wb.knob
# ddp_args: keywords of DistributedDataParallel(...); ddp_model: lines after it (comm hooks)
# the generated loop's seams: each knob's `code` hook adds lines to some of them (codegen.py renders them in
# order); "forward" holds context expressions entered around forward+loss, "before_step" runs after
# backward and before optimizer.step (gradients unscaled), "functions" holds user knobs' source
CODE_SECTIONS = ("header", "imports", "functions", "setup", "loader_args", "model", "optimizer", "ddp_args",
                 "ddp_model", "shard", "wrap", "scaler", "batch", "forward", "before_step")
# header: comment lines; loader_args: DataLoader keywords; wrap: expressions around "{inner}" (the model
# the step calls: torch.compile); scaler: lines creating `scaler` (loss scaling: backward and step go
# through it); batch: lines run on `inputs` after the device move
# shard: lines that shard the model with FSDP2 (strategy="fsdp2"), in place of the DDP wrapper
COMM_HOOKS = ("none", "fp16", "bf16")
STRATEGIES = ("ddp", "fsdp2")
BLOCK_KNOBS = ("checkpoint", "fsdp_shard")  # knobs of kind "blocks": tuples of block names (bench.blocks)
FSDP_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class Fuzz:
    """How the fuzz test draws a knob: `valid` values (a range, a tuple, or "blocks" for the
    workload's block names) and `invalid` ones that must be rejected with a ValueError/TypeError."""

    valid: Any
    invalid: tuple = ()


@dataclass(frozen=True)
class KnobSpec:
    """Everything about one knob, declared once. The panel, the CLI, the fuzz test, the README
    table, validation, the step and the generated code all read it from here.

    Hooks (all optional; each receives the knob's value, or the whole Knobs where it says so):
      settings(value) -> context manager: a process-wide setting held for the trial
      on_optimizer(optimizer, value, notes) -> optimizer: rebuild or adjust the optimizer
      checkpoint_kwargs(value) -> dict: extra keywords for torch.utils.checkpoint.checkpoint
      note(knobs, device_type) -> str | None: "runs but does nothing here" sentences
      code(knobs) -> {section: lines}: what the generated training loop adds (see CODE_SECTIONS)
      ddp_kwargs(value) -> dict: keywords for DistributedDataParallel (world_size > 1)
      on_model(model, value) -> model | None: transform each trial's fresh model copy (None = in place)
      forward(value) -> context manager: entered around every micro-batch's forward and loss
      before_step(value, model, optimizer): after backward, before optimizer.step (gradients unscaled)
    """

    default: Any
    kind: str  # "int" | "float" | "bool" | "choice" | "blocks"
    help: str  # one line: what it does (panel tooltip, CLI help, README table)
    group: str  # one of GROUPS
    widget: str  # "int" | "slider" | "checkbox" | "dropdown" | "blocks"
    fuzz: Fuzz
    choices: tuple = ()  # allowed values of a "choice" knob
    minimum: float | None = None  # smallest allowed int or float
    optional: bool = False  # None allowed, meaning torch's own default
    options: Any = ()  # dropdown values of an optional int; "cores" = 1..os.cpu_count()
    maximum: Any = None  # widget bound: an int, "dataset" (its length) or "workers" (2 x cores)
    probe: Any = None  # a value that switches the knob on (the panel disables it when that is a no-op)
    settings: Callable[[Any], contextlib.AbstractContextManager] | None = None
    on_optimizer: Callable[[Any, Any, list[str]], Any] | None = None
    checkpoint_kwargs: Callable[[Any], dict[str, Any]] | None = None
    note: Callable[[Any, str], str | None] | None = None
    code: Callable[[Any], dict[str, list[str]]] | None = None
    ddp_kwargs: Callable[[Any], dict[str, Any]] | None = None
    on_model: Callable[[Any, Any], Any] | None = None
    forward: Callable[[Any], contextlib.AbstractContextManager] | None = None
    before_step: Callable[[Any, Any, Any], None] | None = None
    function: Callable | None = None  # a user knob's decorated function (its source goes into to_code)
    name: str = ""  # filled in from the field name
    # True when two values can take turns on live steps in one process (see INTERLEAVE_KNOBS)
    interleave: bool = False

    @property
    def flag(self) -> str:
        """The CLI flag: --name-with-dashes."""
        return "--" + self.name.replace("_", "-")

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
                raise TypeError(f"Knobs.{name} takes a number, got {value!r}: set it to a float >= {self.minimum}{extra}")
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


# ---- hooks of the knobs that apply as process settings -------------------------------------------
@contextlib.contextmanager
def _threads(value: int | None) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    try:
        if value is not None:
            torch.set_num_threads(value)
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _matmul_precision(value: str) -> Iterator[None]:
    import torch

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(value)
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _threads_code(k: Knobs) -> dict[str, list[str]]:
    if k.cpu_threads is None:
        return {}
    return {"setup": [f"torch.set_num_threads({k.cpu_threads})  # main-process compute threads"]}


def _matmul_code(k: Knobs) -> dict[str, list[str]]:
    if k.matmul_precision == "highest":
        return {}
    return {"setup": [f'torch.set_float32_matmul_precision("{k.matmul_precision}")  # TF32/bf16 matmuls for float32']}


OPTIMIZER_IMPLS = ("as-given", "foreach", "fused")
_IMPL_FLAGS = {"foreach": {"foreach": True, "fused": None}, "fused": {"foreach": None, "fused": True}}


def _rebuild_optimizer(optimizer: Any, value: str, notes: list[str]) -> Any:
    """The user's optimizer rebuilt with foreach=/fused= (same class, param groups and
    hyperparameters), or unchanged with a note when its class takes no such argument."""
    if value == "as-given":
        return optimizer
    import inspect

    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    if value not in accepted:
        notes.append(f"optimizer_impl={value!r}: {cls.__name__} takes no {value}= argument, so it ran as given")
        return optimizer
    flags = {k: v for k, v in _IMPL_FLAGS[value].items() if k in accepted}
    groups = [{**group, **flags} for group in optimizer.param_groups]  # keeps per-group lr, betas...
    try:
        return cls(groups, **flags)
    except (RuntimeError, ValueError, TypeError) as e:  # e.g. fused kernels missing for this device/dtype
        notes.append(f"optimizer_impl={value!r}: {cls.__name__} refused it here ({e}); it ran as given")
        return optimizer


def _optimizer_code(k: Knobs) -> dict[str, list[str]]:
    if k.optimizer_impl == "as-given":
        return {}
    flags = ", ".join(f"{a}={b}" for a, b in _IMPL_FLAGS[k.optimizer_impl].items())
    return {"imports": ["import inspect"], "optimizer": [
        f"# optimizer_impl={k.optimizer_impl!r}: the same optimizer rebuilt with {flags} (param groups kept)",
        f'if "{k.optimizer_impl}" in inspect.signature(type(optimizer).__init__).parameters:',
        f"    flags = dict({flags})",
        "    optimizer = type(optimizer)([{**g, **flags} for g in optimizer.param_groups], **flags)",
    ]}


CHECKPOINT_MODES = ("full", "selective")
# Selective checkpointing keeps the outputs of these (expensive) ops and recomputes the rest.
SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")


def _selective(value: str) -> dict[str, Any]:
    """checkpoint(...) keywords: selective = save matmul/conv/attention outputs, recompute cheap ops."""
    if value == "full":
        return {}
    import functools

    import torch
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    ops = [getattr(torch.ops.aten, n).default for n in SAVED_OPS if hasattr(torch.ops.aten, n)]
    return {"context_fn": functools.partial(create_selective_checkpoint_contexts, ops)}


def _selective_note(k: Knobs, device_type: str) -> str | None:
    if k.checkpoint_mode == "selective" and not k.checkpoint:
        return "checkpoint_mode='selective' is a no-op without checkpointed blocks (pick some in checkpoint)"
    return None


def _selective_code(k: Knobs) -> dict[str, list[str]]:
    if k.checkpoint_mode == "full" or not k.checkpoint:
        return {}
    return {
        "imports": ["import functools", "from torch.utils.checkpoint import create_selective_checkpoint_contexts"],
        "setup": ["# selective checkpointing: keep matmul/conv/attention outputs, recompute the cheap ops",
                  f"SAVED_OPS = [getattr(torch.ops.aten, n).default for n in {list(SAVED_OPS)!r} if hasattr(torch.ops.aten, n)]"],
    }


@contextlib.contextmanager
def _cudnn_benchmark(value: bool) -> Iterator[None]:
    import torch

    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = value  # autotune conv algorithms per input shape (CUDA only)
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _cudnn_note(k: Knobs, device_type: str) -> str | None:
    if k.cudnn_benchmark and device_type != "cuda":
        return "cudnn_benchmark is a no-op without CUDA (cuDNN autotunes convolutions on NVIDIA GPUs only)"
    return None


def _cudnn_code(k: Knobs) -> dict[str, list[str]]:
    if not k.cudnn_benchmark:
        return {}
    return {"setup": ["torch.backends.cudnn.benchmark = True  # autotune conv algorithms (fixed input shapes)"]}


def _clip(value: float | None, model: Any, optimizer: Any) -> None:
    if value is not None:
        import torch

        torch.nn.utils.clip_grad_norm_(model.parameters(), value)


def _clip_code(k: Knobs) -> dict[str, list[str]]:
    if k.grad_clip_norm is None:
        return {}
    return {"before_step": [f"torch.nn.utils.clip_grad_norm_({{model}}.parameters(), {k.grad_clip_norm})"]}


# ---- code hooks of the knobs that apply in apply.py / step.py -----------------------------------
AMP_CODE_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def _amp_code(k: Knobs) -> dict[str, list[str]]:
    if k.amp == "off":
        return {}
    out = {"forward": [f"torch.autocast(device.type, dtype={AMP_CODE_DTYPE[k.amp]})"]}
    if k.amp == "fp16":
        out["scaler"] = ["scaler = torch.amp.GradScaler(device.type)  # fp16 gradients underflow without scaling"]
    return out


def _compile_code(k: Knobs) -> dict[str, list[str]]:
    if k.compile == "off":
        return {}
    mode = "" if k.compile == "default" else f', mode="{k.compile}"'
    return {"wrap": [f"torch.compile({{inner}}{mode})  # first steps compile (seconds to minutes)"]}


def _workers_code(k: Knobs) -> dict[str, list[str]]:
    if not k.num_workers:
        return {}
    return {"header": ['# Worker processes: on Windows/macOS run this under `if __name__ == "__main__":`.'],
            "loader_args": [f"num_workers={k.num_workers}"]}


def _loader_flag_code(name: str, arg: str) -> Callable[[Knobs], dict[str, list[str]]]:
    """Code hook passing a loader knob to DataLoader when it applies (workers exist, not the default)."""

    def code(k: Knobs) -> dict[str, list[str]]:
        value = getattr(k, name)
        if not k.num_workers or value == KNOBS[name].default or value is None:
            return {}
        return {"loader_args": [f"{arg}={value!r}"]}

    return code


def _pin_code(k: Knobs) -> dict[str, list[str]]:
    return {"loader_args": ['pin_memory=device.type == "cuda"']} if k.pin_memory else {}


def _data_code(k: Knobs) -> dict[str, list[str]]:
    if k.data != "cached":
        return {}
    return {"header": ["# data='cached' was a measurement short-circuit (one repeated batch); "
                       "this loop uses the real data."]}


def _channels_last_code(k: Knobs) -> dict[str, list[str]]:
    if not k.channels_last:
        return {}
    return {"model": ["{model} = {model}.to(memory_format=torch.channels_last)  # NHWC for convolutions"],
            "batch": ["inputs = [x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 and "
                      "x.is_floating_point() else x for x in inputs]"]}


CHECKPOINT_HELPER = "\n".join([
    "def checkpointed(forward, **options):",
    '    """Recompute this block\'s activations in backward instead of storing them."""',
    "    def run(*args, **kwargs):",
    "        if not torch.is_grad_enabled():",
    "            return forward(*args, **kwargs)",
    "        return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)",
    "    return run",
])


def _checkpoint_code(k: Knobs) -> dict[str, list[str]]:
    if not k.checkpoint:
        return {}
    selective = ", context_fn=functools.partial(create_selective_checkpoint_contexts, SAVED_OPS)" \
        if k.checkpoint_mode == "selective" else ""
    return {"imports": ["from torch.utils.checkpoint import checkpoint"], "functions": [CHECKPOINT_HELPER],
            "model": [f"for name in {list(k.checkpoint)!r}:",
                      "    block = {model}.get_submodule(name)",
                      f"    block.forward = checkpointed(block.forward{selective})"]}


# ---- the distributed knobs (world_size > 1: workbench/distributed/) ------------------------------
def _ddp_note(name: str) -> Callable[[Any, str], str | None]:
    """A DDP knob changed while world_size == 1 is a note (and a disabled panel control), not an
    error: scaling() runs the same knobs at world_size 1 and N, and the panel lets a user set them
    before raising world_size."""

    def note(k: Knobs, device_type: str) -> str | None:
        if k.world_size == 1 and getattr(k, name) != KNOBS[name].default:
            return f"{name} is a no-op with world_size=1 (one process runs without DDP)"
        return None

    return note


def _ddp_arg(name: str, arg: str) -> tuple[Callable[[Any], dict[str, Any]], Callable[[Any], dict[str, list[str]]]]:
    """(ddp_kwargs hook, code hook) passing the knob to DistributedDataParallel as `arg` when it
    differs from DDP's own default (the knob's default)."""

    def kwargs(value: Any) -> dict[str, Any]:
        return {} if value is None or value == KNOBS[name].default else {arg: value}

    def code(k: Knobs) -> dict[str, list[str]]:
        value = getattr(k, name)
        if k.world_size == 1 or value == KNOBS[name].default or value is None:
            return {}
        return {"ddp_args": [f"{arg}={value!r}"]}

    return kwargs, code


def _broadcast_buffers(value: bool) -> dict[str, Any]:
    if value:
        return {}
    # torch >= 2.13 renames it forward_sync_buffers (for us the same: every rank starts from the
    # same snapshot, so the one sync at construction that forward_sync_buffers keeps changes nothing)
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}


def _broadcast_code(k: Knobs) -> dict[str, list[str]]:
    if k.world_size == 1 or k.ddp_broadcast_buffers:
        return {}
    return {"ddp_args": ["broadcast_buffers=False  # forward_sync_buffers=False on torch >= 2.13"]}


COMM_HOOK_FN = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}


def _comm_hook_code(k: Knobs) -> dict[str, list[str]]:
    if k.world_size == 1 or k.ddp_comm_hook == "none":
        return {}
    return {"imports": ["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"],
            "ddp_model": [f"ddp_model.register_comm_hook(None, default_hooks.{COMM_HOOK_FN[k.ddp_comm_hook]})"
                          f"  # {k.ddp_comm_hook} on the wire"]}


def _world_size_note(k: Knobs, device_type: str) -> str | None:
    threads = (k.cpu_threads or 1) * k.world_size
    cores = usable_cores()  # affinity and container quota
    if k.world_size > 1 and device_type == "cpu" and threads > cores:
        return (f"world_size={k.world_size} x {k.cpu_threads or 1} thread(s) = {threads} threads on "
                f"{cores} cores: the ranks compete for cores (oversubscription)")
    return None


def _no_sync_note(k: Knobs, device_type: str) -> str | None:
    if k.world_size > 1 and k.ddp_no_sync and k.accum_steps == 1:
        return "ddp_no_sync is a no-op with accum_steps=1 (every micro-batch ends an optimizer step)"
    return _ddp_note("ddp_no_sync")(k, device_type)


_BUCKET = _ddp_arg("ddp_bucket_cap_mb", "bucket_cap_mb")


def _ddp_flag(name: str, ddp_arg: str, *, help: str) -> Any:
    """A DDP constructor flag as a knob (default False): a checkbox in "Distributed", passed as
    DDP(..., ddp_arg=True), a note while world_size == 1."""
    kwargs, code = _ddp_arg(name, ddp_arg)
    return declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True, note=_ddp_note(name),
                ddp_kwargs=kwargs, code=code, fuzz=Fuzz((False, True)), help=help)


# ---- FSDP2 (strategy="fsdp2"): torch.distributed.fsdp.fully_shard, applied in distributed/strategy.py --------
def _strategy_note(k: Knobs, device_type: str) -> str | None:
    if k.world_size == 1 and k.strategy != "ddp":
        return f"strategy={k.strategy!r} is a no-op with world_size=1 (one process holds the whole model)"
    return None


def _offload_note(k: Knobs, device_type: str) -> str | None:
    if k.fsdp_cpu_offload and device_type != "cuda":
        return "fsdp_cpu_offload is a no-op without a GPU (the sharded parameters already live in CPU memory)"
    return None


def check_strategy(k: Knobs) -> None:
    """Refuse, with the fix, knobs of one data-parallel strategy set under the other."""
    changed = [n for n in KNOBS if n.startswith(("fsdp_", "ddp_")) and getattr(k, n) != KNOBS[n].default]
    fsdp = [n for n in changed if n.startswith("fsdp_")]
    ddp = [n for n in changed if n.startswith("ddp_")]
    if fsdp and k.world_size == 1:
        raise ValueError(f"{', '.join(fsdp)} shard the model across processes: set world_size >= 2 and "
                         "strategy='fsdp2', or leave them at their defaults")
    if fsdp and k.strategy != "fsdp2":
        raise ValueError(f"{', '.join(fsdp)} apply to FSDP2 only: set strategy='fsdp2', or leave them at their defaults")
    if k.strategy != "fsdp2" or k.world_size == 1:  # one process: both strategies are no-ops (notes)
        return
    if ddp:
        raise ValueError(f"{', '.join(ddp)} apply to DDP only: set them back to their defaults, or strategy='ddp'")
    if k.amp == "fp16":
        raise ValueError("amp='fp16' needs a GradScaler that understands sharded gradients, which the workbench does "
                         "not set up for FSDP2: use amp='bf16' or fsdp_param_dtype='bf16', or strategy='ddp'")
    if k.compile != "off":
        raise ValueError("compile with strategy='fsdp2' is not wired up yet (the workbench compiles the whole "
                         "wrapped model; FSDP2 wants each block compiled before fully_shard, as torchtitan does, and "
                         "that order is untested here): set compile='off', or strategy='ddp'")


FSDP_TORCH_DTYPE = {"fp32": "None", "bf16": "torch.bfloat16"}  # None: FSDP2 keeps the parameters' own dtype


def _fsdp_code(k: Knobs) -> dict[str, list[str]]:
    """The generated script's FSDP2 section: checkpoint wrappers (model section) come first, then
    fully_shard per shard unit (deepest first), then the root, then the prefetch lists."""
    if k.world_size == 1 or k.strategy != "fsdp2":
        return {}
    from .workload import blocks_of

    mp = (f"MixedPrecisionPolicy(param_dtype={FSDP_TORCH_DTYPE[k.fsdp_param_dtype]}, "
          f"reduce_dtype={FSDP_TORCH_DTYPE[k.fsdp_reduce_dtype]})")
    units = (f"[{{model}}.get_submodule(n) for n in {list(k.fsdp_shard)!r}]" if k.fsdp_shard else
             "[{model}.get_submodule(n) for n in blocks_of({model})]  # the blocks bench.blocks finds")
    lines = ["# FSDP2: each shard unit gathers its parameters for its forward/backward and frees them after",
             f"units = {units}",
             f"fsdp_options = dict(reshard_after_forward={k.fsdp_reshard_after_forward}, mp_policy={mp})"]
    if k.fsdp_cpu_offload:
        lines += ['if device.type == "cuda":  # offload parameters, gradients and optimizer state to the CPU',
                  '    fsdp_options["offload_policy"] = CPUOffloadPolicy()']
    lines += ["for unit in sorted(units, key=lambda u: -len(next(n for n, m in {model}.named_modules() if m is u)"
              ".split('.'))):",
              "    fully_shard(unit, **fsdp_options)  # deepest first: a unit inside another is sharded before it",
              "# the root: every parameter left over; None = FSDP2 keeps a root's parameters for backward",
              'fully_shard({model}, **{**fsdp_options, "reshard_after_forward": None})']
    if k.fsdp_prefetch is not None:
        n = k.fsdp_prefetch
        lines += [f"for i, unit in enumerate(units):  # prefetch {n} unit(s) ahead in forward and in backward",
                  f"    unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + {n}])",
                  f"    unit.set_modules_to_backward_prefetch(units[max(0, i - {n}):i][::-1])"]
    imports = ["from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"]
    if k.fsdp_cpu_offload:
        imports.append("from torch.distributed.fsdp import CPUOffloadPolicy")
    if not k.fsdp_shard:
        imports.append("from torch import nn  # blocks_of")
    return {"imports": imports, "functions": [] if k.fsdp_shard else [function_source(blocks_of)], "shard": lines}


@dataclass(frozen=True, init=False)
class Knobs:
    """One configuration of the training step. Build with keywords; `replace()` to vary one.

    Each field is declared once with `declare(...)`: its type, default, help, panel group and widget,
    fuzz range and hooks (see KnobSpec). Adding a knob = adding a field here (+ its tests).
    """

    batch_size: int = declare(32, kind="int", minimum=1, group="Data pipeline", widget="int", maximum="dataset",
                           help="samples per micro-batch (per optimizer step: batch_size * accum_steps)",
                           fuzz=Fuzz(range(1, 49), (-2, 0, 49, 10_000)))
    data: str = declare("loader", code=_data_code, kind="choice", choices=DATA_MODES, group="Data pipeline", widget="dropdown",
                     help="loader = real DataLoader; cached = one batch kept on the device (much faster = data-bound)",
                     fuzz=Fuzz(DATA_MODES, ("disk",)))
    num_workers: int = declare(0, code=_workers_code, kind="int", minimum=0, group="Data pipeline", widget="slider", maximum="workers",
                            probe=1, fuzz=Fuzz(range(0, 3), (-1,)),
                            help="DataLoader worker processes; 0 = load in the main process (start near half the cores)")
    pin_memory: bool = declare(False, code=_pin_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True,
                            fuzz=Fuzz((False, True)),
                            help="page-locked host buffers for faster async host->device copies")
    persistent_workers: bool = declare(False, code=_loader_flag_code("persistent_workers", "persistent_workers"), kind="bool", group="Data pipeline", widget="checkbox", probe=True,
                                    fuzz=Fuzz((False, True)),
                                    help="keep workers alive across epochs (needs num_workers > 0)")
    prefetch_factor: int | None = declare(None, code=_loader_flag_code("prefetch_factor", "prefetch_factor"), kind="int", minimum=1, optional=True, group="Data pipeline",
                                       widget="dropdown", options=(None, 1, 2, 4, 8), probe=4,
                                       fuzz=Fuzz((None, 1, 2, 3, 4), (0,)),
                                       help="batches buffered per worker; None = torch's default (2); costs host memory")
    amp: str = declare("off", code=_amp_code, kind="choice", choices=AMP_MODES, group="Precision & compile", widget="dropdown",
                    fuzz=Fuzz(AMP_MODES, ("fp8", "BF16", "")),
                    help='autocast dtype: "off" | "bf16" | "fp16" (fp16 adds a GradScaler)')
    compile: str = declare("off", code=_compile_code, kind="choice", choices=COMPILE_MODES, group="Precision & compile", widget="dropdown",
                        # a cold compile costs 10-70 s per graph on a 2-core CPU: compiled trials have their own tests
                        fuzz=Fuzz(("off",), ("fast", "inductor")),
                        help="torch.compile mode; the first steps compile (seconds to minutes) and are not measured")
    matmul_precision: str = declare("highest", kind="choice", choices=MATMUL_PRECISIONS, group="Precision & compile",
                                 widget="dropdown", probe="high", settings=_matmul_precision, code=_matmul_code,
                                 fuzz=Fuzz(MATMUL_PRECISIONS, ("low",)),
                                 help="torch.set_float32_matmul_precision: allow TF32/bf16 for float32 matmuls")
    channels_last: bool = declare(False, code=_channels_last_code, kind="bool", group="Precision & compile", widget="checkbox", probe=True,
                               fuzz=Fuzz((False, True)),
                               help="NHWC memory format for the model and 4-D inputs (convnets, best with AMP)")
    cudnn_benchmark: bool = declare(False, kind="bool", group="Precision & compile", widget="checkbox", probe=True,
                                 settings=_cudnn_benchmark, note=_cudnn_note, code=_cudnn_code,
                                 fuzz=Fuzz((False, True)),
                                 help="torch.backends.cudnn.benchmark: autotune conv algorithms for fixed shapes (GPU)")
    accum_steps: int = declare(1, kind="int", minimum=1, group="Memory", widget="int", maximum=1024,
                            fuzz=Fuzz(range(1, 4), (0,)),
                            help="micro-batches per optimizer step (gradient accumulation): a large batch in small memory")
    checkpoint: tuple[str, ...] = declare((), code=_checkpoint_code, kind="blocks", group="Memory", widget="blocks",
                                       fuzz=Fuzz("blocks", ("no.such.block", "")),
                                       help="block names wrapped in torch.utils.checkpoint: recompute activations in backward")
    optimizer_impl: str = declare("as-given", kind="choice", choices=OPTIMIZER_IMPLS, group="Precision & compile",
                               widget="dropdown", on_optimizer=_rebuild_optimizer, code=_optimizer_code,
                               fuzz=Fuzz(OPTIMIZER_IMPLS, ("apex", "")),
                               help="optimizer kernels: as given, or rebuilt with foreach=True / fused=True "
                                    "(multi-tensor or fused update)")
    checkpoint_mode: str = declare("full", kind="choice", choices=CHECKPOINT_MODES, group="Memory", widget="dropdown",
                                probe="selective", checkpoint_kwargs=_selective, note=_selective_note,
                                code=_selective_code, fuzz=Fuzz(CHECKPOINT_MODES, ("some",)),
                                help="full = recompute everything in checkpointed blocks; selective = keep "
                                     "matmul/conv outputs, recompute the cheap ops")
    grad_clip_norm: float | None = declare(None, kind="float", minimum=0.0, optional=True, group="Memory",
                                           widget="dropdown", options=(None, 0.5, 1.0, 5.0),
                                           before_step=_clip, code=_clip_code,
                                           fuzz=Fuzz((None, 0.5, 1.0), (-1.0,)),
                                           help="clip the gradients' total norm before each optimizer step")
    cpu_threads: int | None = declare(None, kind="int", minimum=1, optional=True, group="CPU", widget="dropdown",
                                   options="cores", settings=_threads, code=_threads_code,
                                   fuzz=Fuzz((None, 1, 2, 3), (0,)),
                                   help="main-process intra-op threads; None = torch's default (with workers, fewer can be faster)")
    world_size: int = declare(1, kind="int", minimum=1, group="Distributed", widget="dropdown", options=(1, 2, 4),
                           note=_world_size_note, fuzz=Fuzz((1,), (0, -1)),  # multi-process trials: test_distributed
                           help="processes under DDP or FSDP2 (see strategy): one per GPU (NCCL), or gloo CPU "
                                "processes with 1 thread each unless cpu_threads says otherwise")
    strategy: str = declare("ddp", kind="choice", choices=STRATEGIES, group="Distributed", widget="dropdown",
                            probe="fsdp2", note=_strategy_note, code=_fsdp_code, fuzz=Fuzz(STRATEGIES, ("fsdp", "zero3")),
                            help='data parallelism at world_size > 1: "ddp" replicates the model and all-reduces '
                                 'gradients; "fsdp2" shards parameters, gradients and optimizer state (fully_shard)')
    ddp_no_sync: bool = declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
                             note=_no_sync_note, fuzz=Fuzz((False, True)),
                             help="skip the gradient all-reduce on all but the last accumulation micro-batch")
    ddp_bucket_cap_mb: int | None = declare(None, kind="int", minimum=1, optional=True, group="Distributed",
                                         widget="dropdown", options=(None, 1, 5, 25, 100), probe=5,
                                         note=_ddp_note("ddp_bucket_cap_mb"), ddp_kwargs=_BUCKET[0], code=_BUCKET[1],
                                         fuzz=Fuzz((None, 1, 25), (0,)),
                                         help="DDP gradient bucket size in MB; None = torch's 25 (the first bucket "
                                              "is 1 MB); bigger = fewer all-reduces, later start")
    ddp_comm_hook: str = declare("none", kind="choice", choices=COMM_HOOKS, group="Distributed", widget="dropdown",
                              probe="fp16", note=_ddp_note("ddp_comm_hook"), code=_comm_hook_code,
                              fuzz=Fuzz(COMM_HOOKS, ("int8",)),
                              help='compress gradients before the all-reduce: "none" | "fp16" | "bf16" (NCCL only)')
    ddp_gradient_as_bucket_view: bool = _ddp_flag("ddp_gradient_as_bucket_view", "gradient_as_bucket_view",
                                                  help="gradients are views into the all-reduce buckets: one copy less")
    ddp_static_graph: bool = _ddp_flag("ddp_static_graph", "static_graph",
                                       help="DDP static_graph=True: the same parameters get gradients every step")
    ddp_find_unused_parameters: bool = _ddp_flag("ddp_find_unused_parameters", "find_unused_parameters",
                                                 help="DDP walks the graph each step for parameters without gradients")
    ddp_broadcast_buffers: bool = declare(True, kind="bool", group="Distributed", widget="checkbox", probe=False,
                                       note=_ddp_note("ddp_broadcast_buffers"), ddp_kwargs=_broadcast_buffers,
                                       code=_broadcast_code, fuzz=Fuzz((True, False)),
                                       help="DDP broadcasts rank 0's buffers (BatchNorm statistics) every forward")
    fsdp_reshard_after_forward: bool = declare(True, kind="bool", group="Distributed", widget="checkbox", probe=False,
                                               fuzz=Fuzz((True,), ("yes",)),
                                               help="FSDP2 frees each shard unit's gathered parameters after forward "
                                                    "and gathers them again in backward (less memory, more "
                                                    "communication); the root follows FSDP2's default")
    fsdp_param_dtype: str = declare("fp32", kind="choice", choices=FSDP_DTYPES, group="Distributed",
                                    widget="dropdown", probe="bf16", fuzz=Fuzz(("fp32",), ("fp16",)),
                                    help="FSDP2 MixedPrecisionPolicy: dtype of the gathered parameters for compute")
    fsdp_reduce_dtype: str = declare("fp32", kind="choice", choices=FSDP_DTYPES, group="Distributed",
                                     widget="dropdown", probe="bf16", fuzz=Fuzz(("fp32",), ("fp16",)),
                                     help="FSDP2 MixedPrecisionPolicy: dtype of the gradient reduce-scatter")
    fsdp_prefetch: int | None = declare(None, kind="int", minimum=0, optional=True, group="Distributed",
                                        widget="dropdown", options=(None, 0, 1, 2), probe=1,
                                        fuzz=Fuzz((None,), (-1,)),
                                        help="FSDP2 units gathered ahead in forward and backward; None = FSDP2's "
                                             "default (one ahead in backward)")
    fsdp_cpu_offload: bool = declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
                                     note=_offload_note, fuzz=Fuzz((False,), ("no",)),
                                     help="FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in "
                                          "CPU memory (GPU only)")
    fsdp_shard: tuple[str, ...] = declare((), kind="blocks", group="Distributed", widget="dropdown", options=(("bench.blocks, then the root", ()),),
                                          fuzz=Fuzz(((),)),  # names: test_strategy
                                          help="FSDP2 shard units (block names); () = the blocks bench.blocks finds, "
                                               "then the root")

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
                "persistent_workers=True needs worker processes: set num_workers >= 1 "
                "or persistent_workers=False"
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
        check_strategy(self)

    # ---- your own knobs (@knob) ride along in `user`: (name, value) pairs, defaults left out ------
    def __init__(self, **values: Any) -> None:
        user = dict(values.pop("user", ()))  # may hold unknown names (a log read before the knob's cell ran)
        for f in BUILTIN_FIELDS:
            object.__setattr__(self, f.name, values.pop(f.name, f.default))
        for name, value in values.items():
            if name not in KNOBS:
                raise TypeError(f"unknown knob {name!r}; known: {', '.join(knob_names())} "
                                "(define your own with @wb.knob)")
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
        """Short label for charts: what differs from `base` (default: the default Knobs)."""
        changes = (base or Knobs()).diff(self)
        if not changes:
            return "baseline" if base is not None else "defaults"
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
        return " ".join(parts)

    def to_code(self, **kwargs: Any) -> str:
        """A runnable plain-PyTorch training loop reproducing this configuration (see codegen.py)."""
        from .codegen import knobs_to_code

        return knobs_to_code(self, **kwargs)

    def __str__(self) -> str:
        changes = Knobs().diff(self)
        inner = ", ".join(f"{k}={v!r}" + (" (unknown knob)" if k in self.unknown else "")
                          for k, (_, v) in changes.items())
        return f"Knobs({inner})"


BUILTIN_FIELDS = tuple(f for f in fields(Knobs) if f.name != "user")
BUILTIN_KNOBS = frozenset(f.name for f in BUILTIN_FIELDS)
# the registry: the built-in knobs in declaration order, then the user's (@knob), in definition order
# Knobs whose two values can take turns in short blocks in one process (bench.compare's interleaved
# path, workbench/interleave.py): each acts on its own side's model copy, optimizer or step (amp,
# compile, channels_last, checkpoint*, optimizer_impl, grad_clip_norm), or is a process setting the
# interleaver switches per block (matmul_precision, cudnn_benchmark, cpu_threads); batch_size and
# accum_steps change what one step does, and samples/s per block still compares them. Left out: the
# data pipeline (data, num_workers, pin_memory, persistent_workers, prefetch_factor: each side would need
# its own loader, and the interleaver replays prepared batches, so the loader is not measured) and
# world_size, strategy, ddp_*, fsdp_* (other processes).
INTERLEAVE_KNOBS = frozenset({"batch_size", "accum_steps", "amp", "compile", "matmul_precision", "channels_last",
                              "cudnn_benchmark", "checkpoint", "checkpoint_mode", "optimizer_impl", "grad_clip_norm",
                              "cpu_threads"})
KNOBS: dict[str, KnobSpec] = {f.name: dataclasses.replace(f.metadata["spec"], name=f.name,
                                                          interleave=f.name in INTERLEAVE_KNOBS)
                              for f in BUILTIN_FIELDS}


USER_WHERE = ("model", "forward", "before_step")


def knob(*, choices: Any = (), default: Any = None, help: str = "", where: str = "model",
         interleave: bool = True) -> Callable[[Callable], Callable]:
    """Declare your own knob from a notebook cell; the function's name is the knob's name.

        @wb.knob(choices=["naive", "sdpa"], default="naive", help="attention implementation")
        def attention(model, value):      # applied to each trial's fresh copy of the model
            model.set_attention(value)

    `where` says when the function runs: "model" = fn(model, value) on each trial's model copy
    (return a new model or None); "forward" = fn(value) -> a context manager around every forward
    and loss; "before_step" = fn(value, model, optimizer) after backward, before optimizer.step.
    A knob takes `choices` (what tune() tries), or is a switch with default True/False. Running
    the cell again replaces the knob. It then shows up in the panel, results, compare, the log,
    tune() and to_code() like a built-in knob.

    `interleave=False` says the function changes something global (a torch flag, an environment
    variable, a module-level setting) rather than the model or the step it is given: then
    `bench.compare(..., rounds="auto")` compares its values by separate trials instead of taking
    turns on two live models in one process.
    """
    if where not in USER_WHERE:
        raise ValueError(f"where={where!r} is not one of {', '.join(map(repr, USER_WHERE))}")
    if not isinstance(interleave, bool):
        raise TypeError(f"interleave takes True or False, got {interleave!r}")
    choices = tuple(choices)
    if not choices and not isinstance(default, bool):
        raise TypeError("a knob needs choices=[...] (the values to try), or default=True/False for a switch; "
                        f"got choices={list(choices)} and default={default!r}")
    if choices and default is None:
        default = choices[0]

    def register(fn: Callable) -> Callable:
        name = getattr(fn, "__name__", "")
        if not name.isidentifier() or name in {f.name for f in BUILTIN_FIELDS} or name in ("user", "unknown"):
            raise ValueError(f"cannot name a knob {name!r}: it is built in (or not an identifier); "
                             "rename the function")
        kind = "choice" if choices else "bool"
        hook = {"model": "on_model", "forward": "forward", "before_step": "before_step"}[where]
        spec = KnobSpec(default=default, kind=kind, choices=choices, help=help or first_doc_line(fn, name),
                        group=USER_GROUP, widget="dropdown" if choices else "checkbox",
                        fuzz=Fuzz(choices or (False, True)), code=user_code(name, where), function=fn,
                        name=name, interleave=interleave, **{hook: fn})
        spec.check(default)
        KNOBS.pop(name, None)  # a re-run cell replaces the knob (and moves it to the end)
        KNOBS[name] = spec
        return fn

    return register


def first_doc_line(fn: Callable, name: str) -> str:
    """The first line of the function's docstring, or a stand-in naming the knob."""
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else f"your knob {name} (@wb.knob)"


def forget_knob(name: str) -> None:
    """Remove one of your own knobs (built-in ones stay)."""
    if name not in KNOBS or KNOBS[name].function is None:
        raise ValueError(f"{name!r} is not one of your knobs; yours: {', '.join(user_knob_names()) or '(none)'}")
    del KNOBS[name]


def user_knob_names() -> list[str]:
    """Names of the knobs declared with @knob, in definition order."""
    return [n for n, s in KNOBS.items() if s.function is not None]


def tunable_knobs(*, user_only: bool = True) -> dict[str, tuple]:
    """{knob: its choices} for the knobs with `choices` (your @knob ones; all with `user_only=False`):
    what a search such as tune() can try."""
    return {n: s.choices for n, s in KNOBS.items() if s.choices and (s.function is not None or not user_only)}


def user_code(name: str, where: str) -> Callable[[Any], dict[str, list[str]]]:
    """The code hook of a user knob: its function's source, and the call at its seam."""

    def code(k: Knobs) -> dict[str, list[str]]:
        value = getattr(k, name)
        call = {"model": f"{{model}} = {name}({{model}}, {value!r}) or {{model}}",
                "forward": f"{name}({value!r})",
                "before_step": f"{name}({value!r}, {{model}}, optimizer)"}[where]
        section = "model" if where == "model" else where
        return {"functions": [function_source(KNOBS[name].function)], section: [call]}

    return code


def function_source(fn: Callable) -> str:
    """The function's source without its decorator (a comment if the source cannot be read)."""
    import inspect
    import textwrap

    try:
        lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
    except (OSError, TypeError):
        return f"# {fn.__name__}: source not available; define it here (it was declared with @wb.knob)"
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def "))), 0)
    return "\n".join(lines[start:])


def transform_model(model: Any, knobs: Knobs) -> Any:
    """Every knob's `on_model` hook in turn on a fresh model copy (a hook may return a new model)."""
    for spec in KNOBS.values():
        if spec.on_model is not None:
            out = spec.on_model(model, getattr(knobs, spec.name))
            model = model if out is None else out
    return model


def forward_hooks(knobs: Knobs) -> list[Callable[[], contextlib.AbstractContextManager]]:
    """Factories of the contexts the knobs' `forward` hooks enter around each forward and loss."""
    return [functools.partial(s.forward, getattr(knobs, s.name)) for s in KNOBS.values()
            if s.forward is not None and getattr(knobs, s.name) is not None]  # None = the knob is off


def step_hooks(knobs: Knobs) -> list[Callable[[Any, Any], None]]:
    """The knobs' `before_step` hooks, each bound to its value: call with (model, optimizer).

    A knob set to None (e.g. grad_clip_norm off) has none, so the measured loop does no extra work
    for it (no per-step call, no fp16 unscale)."""
    return [functools.partial(s.before_step, getattr(knobs, s.name)) for s in KNOBS.values()
            if s.before_step is not None and getattr(knobs, s.name) is not None]


def knob_names() -> list[str]:
    """The public knob names, in declaration order."""
    return list(KNOBS)


def grouped() -> dict[str, list[str]]:
    """{panel group: knob names}, groups in GROUPS order (empty ones left out), knobs in declaration order."""
    groups = {g: [n for n, s in KNOBS.items() if s.group == g] for g in GROUPS}
    return {g: names for g, names in groups.items() if names}


@contextlib.contextmanager
def settings(knobs: Knobs) -> Iterator[None]:
    """Hold every process-wide setting the knobs declare (threads, matmul precision...) for the
    block; the caller's settings come back afterwards."""
    with contextlib.ExitStack() as stack:
        for spec in KNOBS.values():
            if spec.settings is not None:
                stack.enter_context(spec.settings(getattr(knobs, spec.name)))
        yield


def adjust_optimizer(optimizer: Any, knobs: Knobs, notes: list[str]) -> Any:
    """Apply every knob's `on_optimizer` hook in turn (each may rebuild the optimizer)."""
    for spec in KNOBS.values():
        if spec.on_optimizer is not None:
            optimizer = spec.on_optimizer(optimizer, getattr(knobs, spec.name), notes)
    return optimizer


def _keywords(knobs: Knobs, hook: str) -> dict[str, Any]:
    """The keywords every knob's `hook` (a KnobSpec field: value -> dict) contributes, merged."""
    out: dict[str, Any] = {}
    for spec in KNOBS.values():
        fn = getattr(spec, hook)
        if fn is not None:
            out.update(fn(getattr(knobs, spec.name)))
    return out


def checkpoint_options(knobs: Knobs) -> dict[str, Any]:
    """Extra keywords for torch.utils.checkpoint.checkpoint gathered from the knobs' hooks."""
    return _keywords(knobs, "checkpoint_kwargs")


def ddp_options(knobs: Knobs) -> dict[str, Any]:
    """Keywords for DistributedDataParallel gathered from the knobs' `ddp_kwargs` hooks."""
    return _keywords(knobs, "ddp_kwargs")


def code_sections(knobs: Knobs) -> dict[str, list[str]]:
    """{section: lines} the knobs' `code` hooks add to the generated training loop."""
    out: dict[str, list[str]] = {s: [] for s in CODE_SECTIONS}
    for spec in KNOBS.values():
        if spec.code is not None:
            for section, lines in spec.code(knobs).items():
                out[section] += lines
    return out


def knob_table() -> str:
    """The README's knob table (Markdown), generated from the declarations."""
    rows = ["| knob | default | values | what it does |", "| --- | --- | --- | --- |"]
    for name, s in KNOBS.items():
        if s.kind == "choice":
            values = " \\| ".join(f"`{c!r}`".replace("'", '"') for c in s.choices)
        elif s.kind == "bool":
            values = "`True` \\| `False`"
        elif s.kind == "blocks":
            values = "block names (`bench.blocks`)"
        else:
            values = f"int >= {s.minimum}" + (" or `None`" if s.optional else "")
        default = f"`{s.default!r}`".replace("'", '"')
        rows.append(f"| `{name}` | {default} | {values} | {s.help.replace('|', '/')} |")
    return "\n".join(rows)


def device_notes(knobs: Knobs, device_type: str, *, has_conv: bool = True) -> list[str]:
    """Knobs that run but do nothing (or hurt) on this device, each as one sentence for `notes`."""
    notes = [n for s in KNOBS.values() if s.note is not None and (n := s.note(knobs, device_type))]
    accel = device_type in ("cuda", "mps", "xpu")
    if knobs.pin_memory and not accel:
        notes.append("pin_memory is a no-op without an accelerator (nothing is copied to a device)")
    if knobs.pin_memory and device_type == "mps":
        notes.append("pin_memory is a no-op on MPS (unified memory): the loader does not pin, copies are synchronous")
    if knobs.prefetch_factor is not None and knobs.num_workers == 0:
        notes.append("prefetch_factor is a no-op with num_workers=0 (the main process loads)")
    if knobs.data == "cached":
        notes.append("data='cached' trains on one batch over and over: its loss is not comparable with the loader's")
    if knobs.persistent_workers and knobs.data == "cached":
        notes.append("persistent_workers is a no-op with data='cached'")
    if knobs.compile == "reduce-overhead" and device_type != "cuda":
        notes.append("compile='reduce-overhead' uses CUDA graphs; on this device it acts like 'default'")
    if knobs.amp == "fp16" and device_type == "cpu":
        notes.append(
            "amp='fp16' on CPU runs, but a CPU without fp16 arithmetic (AVX512-FP16 or AMX-FP16) converts "
            "to and from fp32 around each op, so it can be slower than fp32; compare it with fp32 and "
            "bf16 on this machine before keeping it"
        )
    if knobs.amp == "bf16" and device_type == "mps":
        notes.append("amp='bf16' needs macOS 14+ on MPS; fp16 is the safer choice there")
    if knobs.matmul_precision != "highest" and device_type == "cpu":
        notes.append(
            f"matmul_precision={knobs.matmul_precision!r} only changes float32 matmuls on GPUs "
            "with TF32/bf16 units (and a few oneDNN CPUs); usually a no-op on CPU"
        )
    if knobs.channels_last and not has_conv:
        notes.append("channels_last is a no-op for a model without Conv2d layers")
    cores = usable_cores()  # affinity and container quota, not the host's core count
    if knobs.cpu_threads is not None and knobs.cpu_threads > cores:
        notes.append(
            f"cpu_threads={knobs.cpu_threads} is more than the {cores} cores here "
            "(oversubscription slows every thread)"
        )
    return notes
