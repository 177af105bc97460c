"""Knobs: every tunable setting of a trial, as one frozen, validated, diff-able value.

Each field is declared once with `declare(...)` (spec.py): its type, default, help, panel group,
widget, fuzz range and hooks, the hooks taken from the family modules (data, precision, memory,
optimizer, parallel). Validation that needs nothing but the values happens here, so a bad
combination fails before any work starts; `registry.check_run` adds the checks that need the device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from . import data as pipeline  # `data` is also a knob: the class body would shadow the module
from . import memory, optimizer, parallel, precision
from .spec import BLOCK_KNOBS, KNOBS, Fuzz, declare, knob_names

BUCKET = parallel.ddp_arg("ddp_bucket_cap_mb", "bucket_cap_mb", None)


def ddp_flag(name: str, ddp_arg: str, *, help: str) -> Any:
    """A DDP constructor flag as a knob (default False): a checkbox in "Distributed", passed as
    DDP(..., ddp_arg=True), a note while world_size == 1."""
    kwargs, code = parallel.ddp_arg(name, ddp_arg, False)
    return declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
                   note=parallel.ddp_note(name, False), ddp_kwargs=kwargs, code=code, fuzz=Fuzz((False, True)), help=help)


@dataclass(frozen=True, init=False)
class Knobs:
    """One configuration of the training step. Build with keywords; `replace()` to vary one.

    Each field is declared once with `declare(...)`: its type, default, help, panel group and widget,
    fuzz range and hooks (see KnobSpec). Adding a knob = adding a field here (+ its tests).
    """

    batch_size: int = declare(32, kind="int", minimum=1, group="Data pipeline", widget="int", maximum="dataset",
                           help="samples per micro-batch (per optimizer step: batch_size * accum_steps)",
                           fuzz=Fuzz(range(1, 49), (-2, 0, 49, 10_000)))
    data: str = declare("loader", note=pipeline.data_note, code=pipeline.data_code, kind="choice", choices=pipeline.DATA_MODES, group="Data pipeline", widget="dropdown",
                     help="loader = real DataLoader; cached = one batch kept on the device (much faster = data-bound)",
                     fuzz=Fuzz(pipeline.DATA_MODES, ("disk",)))
    num_workers: int = declare(0, loader=pipeline.workers_loader, traits=pipeline.workers_traits, code=pipeline.workers_code, kind="int", minimum=0, group="Data pipeline", widget="slider", maximum="workers",
                            probe=1, fuzz=Fuzz(range(0, 3), (-1,)),
                            help="DataLoader worker processes; 0 = load in the main process (start near half the cores)")
    pin_memory: bool = declare(False, loader=pipeline.pin_loader, move=pipeline.pin_move, note=pipeline.pin_note, code=pipeline.pin_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True,
                            fuzz=Fuzz((False, True)),
                            help="page-locked host buffers for faster async host->device copies")
    persistent_workers: bool = declare(False, loader=pipeline.persistent_loader, traits=pipeline.persistent_traits, note=pipeline.persistent_note, code=pipeline.persistent_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True,
                                    fuzz=Fuzz((False, True)),
                                    help="keep workers alive across epochs (needs num_workers > 0)")
    prefetch_factor: int | None = declare(None, loader=pipeline.prefetch_loader, traits=pipeline.prefetch_traits, note=pipeline.prefetch_note, code=pipeline.prefetch_code, kind="int", minimum=1, optional=True, group="Data pipeline",
                                       widget="dropdown", options=(None, 1, 2, 4, 8), probe=4,
                                       fuzz=Fuzz((None, 1, 2, 3, 4), (0,)),
                                       help="batches buffered per worker; None = torch's default (2); costs host memory")
    amp: str = declare("off", forward=precision.amp_forward, scaler=precision.amp_scaler, traits=precision.amp_traits, note=precision.amp_note, code=precision.amp_code, kind="choice", choices=precision.AMP_MODES, group="Precision & compile", widget="dropdown",
                    fuzz=Fuzz(precision.AMP_MODES, ("fp8", "BF16", "")),
                    help='autocast dtype: "off" | "bf16" | "fp16" (fp16 adds a GradScaler)')
    compile: str = declare("off", wrap=precision.compile_wrap, traits=precision.compile_traits, note=precision.compile_note, code=precision.compile_code, kind="choice", choices=precision.COMPILE_MODES, group="Precision & compile", widget="dropdown",
                        # a cold compile costs 10-70 s per graph on a 2-core CPU: compiled trials have their own tests
                        fuzz=Fuzz(("off",), ("fast", "inductor")),
                        help="torch.compile mode; the first steps compile (seconds to minutes) and are not measured")
    matmul_precision: str = declare("highest", kind="choice", choices=precision.MATMUL_PRECISIONS, group="Precision & compile",
                                 widget="dropdown", probe="high", settings=precision.matmul_settings, note=precision.matmul_note, code=precision.matmul_code,
                                 fuzz=Fuzz(precision.MATMUL_PRECISIONS, ("low",)),
                                 help="torch.set_float32_matmul_precision: allow TF32/bf16 for float32 matmuls")
    channels_last: bool = declare(False, on_model=precision.channels_last_model, move=precision.channels_last_move, note=precision.channels_last_note, code=precision.channels_last_code, kind="bool", group="Precision & compile", widget="checkbox", probe=True,
                               fuzz=Fuzz((False, True)),
                               help="NHWC memory format for the model and 4-D inputs (convnets, best with AMP)")
    cudnn_benchmark: bool = declare(False, kind="bool", group="Precision & compile", widget="checkbox", probe=True,
                                 settings=precision.cudnn_settings, note=precision.cudnn_note, code=precision.cudnn_code,
                                 fuzz=Fuzz((False, True)),
                                 help="torch.backends.cudnn.benchmark: autotune conv algorithms for fixed shapes (GPU)")
    accum_steps: int = declare(1, kind="int", minimum=1, group="Memory", widget="int", maximum=1024,
                            fuzz=Fuzz(range(1, 4), (0,)),
                            help="micro-batches per optimizer step (gradient accumulation): a large batch in small memory")
    checkpoint: tuple[str, ...] = declare((), on_model=memory.checkpoint_model, release=memory.checkpoint_release, code=memory.checkpoint_code, kind="blocks", group="Memory", widget="blocks",
                                       fuzz=Fuzz("blocks", ("no.such.block", "")),
                                       help="block names wrapped in torch.utils.checkpoint: recompute activations in backward")
    optimizer_impl: str = declare("as-given", kind="choice", choices=optimizer.OPTIMIZER_IMPLS, group="Precision & compile",
                               widget="dropdown", on_optimizer=optimizer.rebuild_optimizer, code=optimizer.optimizer_code,
                               fuzz=Fuzz(optimizer.OPTIMIZER_IMPLS, ("apex", "")),
                               help="optimizer kernels: as given, or rebuilt with foreach=True / fused=True "
                                    "(multi-tensor or fused update)")
    checkpoint_mode: str = declare("full", kind="choice", choices=memory.CHECKPOINT_MODES, group="Memory", widget="dropdown",
                                probe="selective", checkpoint_kwargs=memory.selective_options, note=memory.selective_note,
                                code=memory.selective_code, fuzz=Fuzz(memory.CHECKPOINT_MODES, ("some",)),
                                help="full = recompute everything in checkpointed blocks; selective = keep "
                                     "matmul/conv outputs, recompute the cheap ops")
    grad_clip_norm: float | None = declare(None, kind="float", minimum=0.0, optional=True, group="Memory",
                                           widget="dropdown", options=(None, 0.5, 1.0, 5.0),
                                           before_step=memory.clip_before_step, code=memory.clip_code,
                                           fuzz=Fuzz((None, 0.5, 1.0), (-1.0,)),
                                           help="clip the gradients' total norm before each optimizer step")
    cpu_threads: int | None = declare(None, kind="int", minimum=1, optional=True, group="CPU", widget="dropdown",
                                   options="cores", settings=precision.threads_settings, note=precision.threads_note, code=precision.threads_code,
                                   fuzz=Fuzz((None, 1, 2, 3), (0,)),
                                   help="main-process intra-op threads; None = torch's default (with workers, fewer can be faster)")
    world_size: int = declare(1, kind="int", minimum=1, group="Distributed", widget="dropdown", options=(1, 2, 4),
                           note=parallel.world_size_note, fuzz=Fuzz((1,), (0, -1)),  # multi-process trials: test_distributed
                           help="processes under DDP or FSDP2 (see strategy): one per GPU (NCCL), or gloo CPU "
                                "processes with 1 thread each unless cpu_threads says otherwise")
    strategy: str = declare("ddp", kind="choice", choices=parallel.STRATEGIES, group="Distributed", widget="dropdown",
                            probe="fsdp2", note=parallel.strategy_note, code=parallel.fsdp_code, fuzz=Fuzz(parallel.STRATEGIES, ("fsdp", "zero3")),
                            help='data parallelism at world_size > 1: "ddp" replicates the model and all-reduces '
                                 'gradients; "fsdp2" shards parameters, gradients and optimizer state (fully_shard)')
    ddp_no_sync: bool = declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
                             parallel=parallel.no_sync_parallel, note=parallel.no_sync_note, code=parallel.no_sync_code, fuzz=Fuzz((False, True)),
                             help="skip the gradient all-reduce on all but the last accumulation micro-batch")
    ddp_bucket_cap_mb: int | None = declare(None, kind="int", minimum=1, optional=True, group="Distributed",
                                         widget="dropdown", options=(None, 1, 5, 25, 100), probe=5,
                                         note=parallel.ddp_note("ddp_bucket_cap_mb", None), ddp_kwargs=BUCKET[0], code=BUCKET[1],
                                         fuzz=Fuzz((None, 1, 25), (0,)),
                                         help="DDP gradient bucket size in MB; None = torch's 25 (the first bucket "
                                              "is 1 MB); bigger = fewer all-reduces, later start")
    ddp_comm_hook: str = declare("none", kind="choice", choices=parallel.COMM_HOOKS, group="Distributed", widget="dropdown",
                              probe="fp16", note=parallel.ddp_note("ddp_comm_hook", "none"), parallel=parallel.comm_hook_parallel,
                              check_run=parallel.comm_hook_check, code=parallel.comm_hook_code,
                              fuzz=Fuzz(parallel.COMM_HOOKS, ("int8",)),
                              help='compress gradients before the all-reduce: "none" | "fp16" | "bf16" (NCCL only)')
    ddp_gradient_as_bucket_view: bool = ddp_flag("ddp_gradient_as_bucket_view", "gradient_as_bucket_view",
                                                  help="gradients are views into the all-reduce buckets: one copy less")
    ddp_static_graph: bool = ddp_flag("ddp_static_graph", "static_graph",
                                       help="DDP static_graph=True: the same parameters get gradients every step")
    ddp_find_unused_parameters: bool = ddp_flag("ddp_find_unused_parameters", "find_unused_parameters",
                                                 help="DDP walks the graph each step for parameters without gradients")
    ddp_broadcast_buffers: bool = declare(True, kind="bool", group="Distributed", widget="checkbox", probe=False,
                                       note=parallel.ddp_note("ddp_broadcast_buffers", True), ddp_kwargs=parallel.broadcast_kwargs,
                                       code=parallel.broadcast_code, fuzz=Fuzz((True, False)),
                                       help="DDP broadcasts rank 0's buffers (BatchNorm statistics) every forward")
    fsdp_reshard_after_forward: bool = declare(True, parallel=parallel.fsdp_option("reshard_after_forward"), code=parallel.RESHARD_CODE, kind="bool", group="Distributed", widget="checkbox", probe=False,
                                               fuzz=Fuzz((True,), ("yes",)),
                                               help="FSDP2 frees each shard unit's gathered parameters after forward "
                                                    "and gathers them again in backward (less memory, more "
                                                    "communication); the root follows FSDP2's default")
    fsdp_param_dtype: str = declare("fp32", parallel=parallel.fsdp_option("param_dtype", parallel.torch_dtype), code=parallel.PARAM_DTYPE_CODE, kind="choice", choices=parallel.FSDP_DTYPES, group="Distributed",
                                    widget="dropdown", probe="bf16", fuzz=Fuzz(("fp32",), ("fp16",)),
                                    help="FSDP2 MixedPrecisionPolicy: dtype of the gathered parameters for compute")
    fsdp_reduce_dtype: str = declare("fp32", parallel=parallel.fsdp_option("reduce_dtype", parallel.torch_dtype), code=parallel.REDUCE_DTYPE_CODE, kind="choice", choices=parallel.FSDP_DTYPES, group="Distributed",
                                     widget="dropdown", probe="bf16", fuzz=Fuzz(("fp32",), ("fp16",)),
                                     help="FSDP2 MixedPrecisionPolicy: dtype of the gradient reduce-scatter")
    fsdp_prefetch: int | None = declare(None, parallel=parallel.fsdp_option("prefetch"), code=parallel.prefetch_code, kind="int", minimum=0, optional=True, group="Distributed",
                                        widget="dropdown", options=(None, 0, 1, 2), probe=1,
                                        fuzz=Fuzz((None,), (-1,)),
                                        help="FSDP2 units gathered ahead in forward and backward; None = FSDP2's "
                                             "default (one ahead in backward)")
    fsdp_cpu_offload: bool = declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
                                     parallel=parallel.offload_option, note=parallel.offload_note, code=parallel.offload_code, fuzz=Fuzz((False,), ("no",)),
                                     help="FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in "
                                          "CPU memory (GPU only)")
    fsdp_shard: tuple[str, ...] = declare((), parallel=parallel.fsdp_option("units"), code=parallel.UNITS_CODE, kind="blocks", group="Distributed", widget="dropdown", options=(("bench.blocks, then the root", ()),),
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
        parallel.check_strategy(self)

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
        from ..codegen import knobs_to_code

        return knobs_to_code(self, **kwargs)

    def __str__(self) -> str:
        changes = Knobs().diff(self)
        inner = ", ".join(f"{k}={v!r}" + (" (unknown knob)" if k in self.unknown else "")
                          for k, (_, v) in changes.items())
        return f"Knobs({inner})"


BUILTIN_FIELDS = tuple(f for f in fields(Knobs) if f.name != "user")
BUILTIN_KNOBS = frozenset(f.name for f in BUILTIN_FIELDS)
KNOBS.update((f.name, dataclasses.replace(f.metadata["spec"], name=f.name)) for f in BUILTIN_FIELDS)
