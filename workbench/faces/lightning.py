"""Lightning where its users train: a `LightningModule` (+ `LightningDataModule`, `Trainer`) into a
Workbench, and a trial's knobs back out as `Trainer` keywords, DataLoader arguments and a snippet.

    bench = wb.Workbench.from_lightning(module, datamodule, trainer)   # step, optimizer, data, knobs
    out = bench.to_lightning(best)            # Trainer(**out); out.dataloader; print(out.code)

The step a trial times is the module's own `training_step(batch, batch_idx)` on the trial's copy
of the module (`LightningStep`, an nn.Module whose forward is that step: DDP and torch.compile wrap
it as Lightning's strategies wrap the module). `self.log` and `self.log_dict` are no-ops on that
copy (outside a Trainer Lightning would warn on every call). The optimizer and scheduler are what
`configure_optimizers` returns, rebuilt on each trial's copy; the scheduler steps as Lightning steps
it (after optimizer steps, every `frequency` steps or epochs per its `interval`).

This face (with lightning_parallel.py, the strategies, and lightning_run.py, the real run) is the only
place that imports `lightning`, and only when called: the core never does.
What cannot be mapped is listed in one warning and kept in `bench.unmapped`; what the knobs cannot say
as Trainer flags is in `out.left_out` and in the snippet.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.knobs import SAVED_OPS, Knobs, user_knob_names
from ..results.comparison import LENGTH_KNOBS
from .lightning_parallel import (
    FSDP_KNOBS,
    lightning_pl,
    lightning_strategy,
    shard_lines,
    strategy_knobs,
    strip,
)

LOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
PRECISION_AMP = {"32-true": "off", "32": "off", "16-mixed": "fp16", "16": "fp16", "bf16-mixed": "bf16", "bf16": "bf16"}
AMP_PRECISION = {"off": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


class SkippedBatch(ValueError):
    """training_step returned None: Lightning skips such a batch, a trial cannot time a skipped step."""


def _no_log(*args: Any, **kwargs: Any) -> None:
    """`self.log` on a trial's copy: nothing to log to outside a Trainer (and no warning per call)."""


def step_loss(out: Any, batch_idx: int) -> Any:
    """The loss of a training_step's output: the tensor, or a dict's "loss"; SkippedBatch for None."""
    if out is None:
        raise SkippedBatch(f"training_step returned None at batch_idx {batch_idx}: Lightning skips that batch, but a "
                           "trial times every step, so there is no step to measure. Return the loss for every "
                           "batch (drop the batches you skip from the DataModule's data instead)")
    if isinstance(out, dict):
        if "loss" not in out:
            raise TypeError(f"training_step returned a dict without 'loss' (keys {sorted(out)}): return "
                            "{'loss': loss, ...} or the loss tensor")
        return out["loss"]
    return out


class LightningStep(nn.Module):
    """The module's `training_step` as a forward: `step(batch, batch_idx)` calls
    `module.training_step(batch, batch_idx)` on this copy's module and returns its loss.

    `batch_idx` is an argument, counted by `run_step` outside the module: torch.compile treats an int
    attribute of a module as a constant, so a counter kept (and bumped) inside the compiled forward
    would recompile the step every step until Dynamo's recompile limit, then run it eagerly. As an
    argument it is what Lightning's compiled `training_step` sees: a plain int that Dynamo makes dynamic
    after the second step (two graphs in all)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        module.log = _no_log  # instance attributes shadow LightningModule.log / log_dict on this copy only
        module.log_dict = _no_log
        self.calls = 0  # the next batch_idx: read and bumped by run_step, never inside the compiled forward

    def forward(self, batch: Any, batch_idx: int = 0) -> Any:
        return step_loss(self.module.training_step(batch, batch_idx), batch_idx)


def step_of(model: nn.Module) -> LightningStep:
    """The LightningStep inside a trial's model (under torch.compile's OptimizedModule, DDP, FSDP2)."""
    found = next((m for m in model.modules() if isinstance(m, LightningStep)), None)
    if found is None:
        raise TypeError(f"run_step needs a model built on a LightningStep, got {type(model).__name__}")
    return found


def run_step(model: nn.Module, batch: Any) -> Any:
    """The step_fn: the (wrapped, compiled) LightningStep on one batch; batch_idx counts this copy's
    calls, on the host, outside the compiled region."""
    step = step_of(model)
    idx = step.calls
    step.calls += 1
    return model(batch, idx)


@dataclass
class Schedule:
    """How Lightning steps a scheduler: every `frequency` optimizer steps ('step') or epochs ('epoch')."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    epoch_steps: int = 1  # optimizer steps per epoch (the datamodule's batches / accumulate_grad_batches)


class Stepper:
    """A step post-hook on the trial's optimizer that steps its scheduler as Lightning would; it follows
    the optimizer when a knob rebuilds it (optimizer_impl: the hooks are carried to the new one)."""

    def __init__(self, schedule: Schedule, scheduler: Any) -> None:
        self.schedule, self.scheduler, self.steps = schedule, scheduler, 0

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.steps += 1
        s = self.schedule
        unit = self.steps if s.interval == "step" else self.steps // s.epoch_steps
        if s.interval != "step" and self.steps % s.epoch_steps:
            return
        if unit % s.frequency:
            return
        self.scheduler.optimizer = optimizer
        with warnings.catch_warnings():  # "optimizer.step() overridden": the scheduler was made on another copy
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()


class ModuleOptimizer:
    """The optimizer (and scheduler) `configure_optimizers` built on a reference copy, rebuilt on a
    trial's parameters: same class, param groups (matched by position) and hyperparameters; the
    scheduler is a copy of the reference's bound to the new optimizer."""

    def __init__(self, reference: nn.Module, optimizer: torch.optim.Optimizer, schedule: Schedule | None) -> None:
        index = {id(p): i for i, p in enumerate(reference.parameters())}
        self.optimizer, self.schedule = optimizer, schedule
        missing = [i for i, g in enumerate(optimizer.param_groups) for p in g["params"] if id(p) not in index]
        if missing:
            raise ValueError("configure_optimizers optimizes tensors that are not the module's parameters (param "
                             f"group {missing[0]}): the workbench rebuilds the optimizer on each trial's copy "
                             "from self.parameters()")
        # each group's parameters by position in parameters(): positions, not ids, survive the trip to a worker
        self.positions = [[index[id(p)] for p in g["params"]] for g in optimizer.param_groups]

    def __call__(self, params: Any) -> torch.optim.Optimizer:
        params = list(params)
        ref = self.optimizer
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [params[i] for i in where]}
                  for g, where in zip(ref.param_groups, self.positions)]
        accepted = inspect.signature(type(ref).__init__).parameters
        opt = type(ref)(groups, **{k: v for k, v in ref.defaults.items() if k in accepted})
        if self.schedule is not None:
            scheduler = copy.deepcopy(self.schedule.scheduler, memo={id(ref): opt})
            opt.register_step_post_hook(Stepper(self.schedule, scheduler))
        return opt


@dataclass
class LightningOrigin:
    """What a Workbench built from Lightning keeps: the loader's arguments, whether the module compiled
    itself, and what could not be mapped (the from_lightning warning's lines)."""

    loader: dict[str, Any]
    compiled: bool = False
    unmapped: list[str] = field(default_factory=list)
    batch_sampler: str | None = None  # the class of a batch_sampler that sets the batches (not a trial's)


def optimizer_of(module: nn.Module, epoch_steps: int) -> tuple[ModuleOptimizer, list[str]]:
    """(the factory, what could not be mapped) from `module.configure_optimizers()` (module: a copy)."""
    pl = lightning_pl()
    parse = importlib.import_module("lightning.pytorch.core.optimizer")._configure_optimizers
    try:
        conf = module.configure_optimizers()
    except Exception as e:  # e.g. self.trainer.estimated_stepping_batches: no Trainer attached here
        raise ValueError(f"configure_optimizers failed outside a Trainer ({type(e).__name__}: {e}): build the "
                         "optimizer from the module alone (pass the number of steps as an argument)") from e
    if conf is None:
        raise ValueError("configure_optimizers returned None (Lightning then trains without an optimizer): return "
                         "an optimizer so a trial can take optimizer steps")
    try:
        optimizers, schedulers, _ = parse(conf)
    except pl.utilities.exceptions.MisconfigurationException as e:
        raise ValueError(str(e)) from e
    if len(optimizers) != 1:
        raise ValueError(f"configure_optimizers returned {len(optimizers)} optimizers: Lightning trains several only "
                         "with manual optimization, and a trial times one optimizer step; return one optimizer "
                         "(measure each model's step with a workbench of its own)")
    left, schedule = [], None
    for i, sched in enumerate(schedulers):
        cfg = sched if isinstance(sched, dict) else {"scheduler": sched}
        s = cfg["scheduler"]
        if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau) or i > 0:
            left.append(f"lr scheduler {type(s).__name__} (steps on a monitored metric or is a second scheduler: "
                        "trials keep the learning rate it leaves)")
            continue
        schedule = Schedule(s, cfg.get("interval", "epoch"), int(cfg.get("frequency", 1)), max(1, epoch_steps))
    return ModuleOptimizer(module, optimizers[0], schedule), left


def train_loader(module: Any, datamodule: Any) -> Any:
    """The DataLoader Lightning would train on: the datamodule's train_dataloader() (after
    prepare_data and setup('fit')), else the module's own; ValueError naming the fix."""
    pl = lightning_pl()
    source, base = (datamodule, pl.LightningDataModule) if datamodule is not None else (module, pl.LightningModule)
    what = "the datamodule" if datamodule is not None else "the module (no datamodule given)"
    made = getattr(source, "train_dataloader", None)
    if made is None or getattr(made, "__func__", None) is base.train_dataloader:
        raise ValueError(f"{what} has no train_dataloader(): define it to return the DataLoader trainer.fit trains "
                         "on" + ("" if datamodule is not None else ", or pass datamodule="))
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    loader = source.train_dataloader()
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise ValueError(f"train_dataloader() of {what} returned {type(loader).__name__}, not one DataLoader: a trial "
                         "reads one loader (measure each of several loaders with a workbench of its own)")
    return loader


@dataclass
class Batching:
    """How the user's loader forms its batches, as a trial's loader (batch_size over a sampler) can."""

    batch_size: int
    sampler: Any  # the order of the indices (None: the dataset's order)
    drop_last: bool
    custom: str | None = None  # a batch_sampler whose own batches a trial does not rebuild (its class name)

    def unmapped(self) -> str | None:
        """The line for bench.unmapped when the loader's batch_sampler is not torch's plain BatchSampler."""
        if self.custom is None:
            return None
        order = f"its sampler {type(self.sampler).__name__}" if self.sampler is not None else "the dataset in order"
        return (f"batch_sampler {self.custom} (trials batch batch_size={self.batch_size} over {order}: the batches "
                "it forms, such as length buckets, are not rebuilt, so their sizes and padding are not what a trial "
                "measures; on token data the knob group_by_length=True batches similar lengths together)")


def batching(loader: Any) -> Batching:
    """The loader's batch size, sampler and drop_last, read through a `batch_sampler` when it has one
    (DataLoader(batch_sampler=...) has batch_size None): its `batch_size`, else its first batch's length."""
    made = loader.batch_sampler
    if loader.batch_size is not None or made is None:  # batch_size=None without a batch_sampler: no batching
        return Batching(int(loader.batch_size or 1), loader.sampler, bool(loader.drop_last))
    size = getattr(made, "batch_size", None)
    if not isinstance(size, int) or size < 1:
        first = next(iter(made), None)  # indices only: the dataset is not read
        size = len(first) if first else 1
    inner = getattr(made, "sampler", None)
    inner = inner if isinstance(inner, torch.utils.data.Sampler) else None
    custom = None if type(made) is torch.utils.data.BatchSampler else type(made).__name__
    return Batching(size, inner, bool(getattr(made, "drop_last", False)), custom)


def trial_loader(loader: Any, batches: Batching) -> Any:
    """The loader a Workbench reads (dataset, collate, sampler, batch size, drop_last, workers): the user's
    own, or for a batch_sampler one with the same batch size over the batch_sampler's own sampler."""
    if loader.batch_sampler is None or loader.batch_size is not None:
        return loader
    return torch.utils.data.DataLoader(loader.dataset, batch_size=batches.batch_size, sampler=batches.sampler,
                                       drop_last=batches.drop_last, collate_fn=loader.collate_fn,
                                       num_workers=loader.num_workers)


def loader_knobs(loader: Any, batches: Batching | None = None) -> dict[str, Any]:
    """Starting data knobs from the loader: batch size (a batch_sampler's: `batches`, read here when not
    given), workers, pinning, persistence, prefetch."""
    size = (batches or batching(loader)).batch_size
    k: dict[str, Any] = {"batch_size": size, "num_workers": int(loader.num_workers),
                         "pin_memory": bool(loader.pin_memory)}
    if loader.num_workers:
        k["persistent_workers"] = bool(loader.persistent_workers)
        if loader.prefetch_factor not in (None, 2):
            k["prefetch_factor"] = int(loader.prefetch_factor)
    return k


def trainer_knobs(trainer: Any) -> tuple[dict[str, Any], list[str]]:
    """(starting knobs, what has no knob) from a Trainer's flags; ValueError for what cannot run."""
    pl = lightning_pl()
    if not isinstance(trainer, pl.Trainer):
        raise TypeError(f"trainer must be a lightning.pytorch.Trainer, got {type(trainer).__name__}")
    if trainer.max_steps == 0 or trainer.max_epochs == 0:
        raise ValueError("the Trainer trains no step (max_steps=0 or max_epochs=0): there is nothing to measure; "
                         "use max_steps=-1 (the default) or a positive number")
    precision = str(trainer.precision)
    if precision not in PRECISION_AMP:
        raise ValueError(f"precision={precision!r} keeps the weights in a low precision (no autocast, or another "
                         "plugin); the workbench's amp knob is autocast over float32 weights: measure with "
                         "precision='bf16-mixed' or '16-mixed' (the closest autocast), or '32-true'")
    k: dict[str, Any] = {"amp": PRECISION_AMP[precision], "accum_steps": int(trainer.accumulate_grad_batches),
                         "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}  # Trainer(benchmark=) sets it
    left: list[str] = []
    if trainer.gradient_clip_val:
        algorithm = str(getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm) or "norm")
        if algorithm == "norm":
            k["grad_clip_norm"] = float(trainer.gradient_clip_val)
        else:
            left.append(f"gradient_clip_algorithm={algorithm!r} (clips by value; trials clip only the norm, so they "
                        "run without clipping)")
    more, said = strategy_knobs(trainer.strategy, int(trainer.world_size), int(trainer.num_devices), k["accum_steps"])
    k.update(more)
    left += said + debug_flags(trainer)
    mine = [type(c).__name__ for c in trainer.callbacks if not type(c).__module__.startswith(("lightning.",
                                                                                            "workbench."))]
    if mine:
        left.append("callbacks " + ", ".join(mine) + " (not run in trials)")
    return k, left


def debug_flags(trainer: Any) -> list[str]:
    """The unmapped lines for Trainer flags with no knob that change the step's speed: `deterministic`,
    `detect_anomaly`, `sync_batchnorm`."""
    left = []
    if torch.are_deterministic_algorithms_enabled():  # Trainer(deterministic=True or "warn") sets it process-wide
        warn = ' or "warn"' if torch.is_deterministic_algorithms_warn_only_enabled() else ""
        left.append(f"deterministic=True{warn} (torch.use_deterministic_algorithms, no knob: it is on for this "
                    "whole process (the Trainer's flag sets it), so trials in this process run with it and trials "
                    "in other processes (world_size > 1, an executor) without it; deterministic kernels can be "
                    "slower, on CUDA most)")
    if getattr(trainer, "_detect_anomaly", False):
        left.append("detect_anomaly=True (autograd's anomaly mode checks every backward op and keeps forward "
                    "tracebacks: a run with it is far slower than its trials, which run without it; a debugging "
                    "flag, turn it off to train)")
    if getattr(trainer._accelerator_connector, "_layer_sync", None) is not None:
        left.append("sync_batchnorm=True (SyncBatchNorm all-reduces each BatchNorm's statistics in every forward "
                    "across the ranks, no knob: trials keep plain BatchNorm, so a multi-process run with it can be "
                    "slower than its trials)")
    return left


def uncompile(module: nn.Module) -> bool:
    """Replace compiled submodules (torch.compile in configure_model) by their originals; whether any were:
    trials compile through the compile knob, so a compiled start becomes compile='default'."""
    compiled = False
    for child in list(module.modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, torch._dynamo.eval_frame.OptimizedModule):
                setattr(child, attr, sub._orig_mod)
                compiled = True
    return compiled


def from_lightning(cls: type, module: Any, datamodule: Any = None, trainer: Any = None,
                   **workbench_kwargs: Any) -> Any:
    """A Workbench (`cls`) on a LightningModule's training_step, configure_optimizers and train data, with
    the loader's and the Trainer's flags as starting knobs; one warning lists what was not mapped."""
    pl = lightning_pl()
    if isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
        module, compiled_outside = module._orig_mod, True
    else:
        compiled_outside = False
    if not isinstance(module, pl.LightningModule):
        raise TypeError(f"from_lightning takes a LightningModule, got {type(module).__name__}; for a plain "
                        "nn.Module use Workbench(model, data, loss_fn=..., optimizer=...)")
    if not module.automatic_optimization:
        raise ValueError("the module uses manual optimization (automatic_optimization=False): its training_step "
                         "runs backward and the optimizer itself, so a trial cannot time or vary those parts; "
                         "measure with automatic optimization")
    start, left = trainer_knobs(trainer) if trainer is not None else ({}, [])
    loader = train_loader(module, datamodule)
    batches = batching(loader)
    start.update(loader_knobs(loader, batches))
    if batches.unmapped():
        left.append(batches.unmapped())
    mine = copy.deepcopy(module)  # the user's module is never changed (configure_model, log stubs)
    try:
        mine.configure_model()
    except Exception as e:  # e.g. fully_shard(mesh=self.device_mesh): the mesh exists only inside fit
        raise ValueError(f"configure_model failed outside a Trainer ({type(e).__name__}: {e}): a trial builds the "
                         "module without one; where it shards or parallelizes with self.device_mesh (None outside "
                         "fit), skip that part when self.device_mesh is None (trials shard with the strategy "
                         "knob)") from e
    compiled = uncompile(mine) or compiled_outside or getattr(module, "_compiler_ctx", None) is not None
    if compiled:
        start["compile"] = "default"
    step = LightningStep(mine)
    epoch_steps = len(loader) // max(1, start.get("accum_steps", 1)) if hasattr(loader, "__len__") else 1
    factory, more = optimizer_of(mine, epoch_steps)
    left += more
    if trainer is not None:
        workbench_kwargs.setdefault("device", str(trainer.strategy.root_device))
    workbench_kwargs.setdefault("name", type(module).__name__)
    bench = cls(step, trial_loader(loader, batches), step_fn=run_step, optimizer=factory, knobs=Knobs(**start),
                **workbench_kwargs)
    bench._lightning = LightningOrigin(loader=loader_arguments(loader), compiled=compiled, unmapped=left,
                                       batch_sampler=batches.custom)
    bench.unmapped = left
    if left:
        warnings.warn("from_lightning could not map: " + "; ".join(left) + " (kept in bench.unmapped)",
                      UserWarning, stacklevel=3)
    return bench


def loader_arguments(loader: Any) -> dict[str, Any]:
    """The DataLoader arguments the data knobs set, as the user's loader has them."""
    return {"batch_size": loader.batch_size, "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers, "prefetch_factor": loader.prefetch_factor}


# ---- back out --------------------------------------------------------------------------------------
class LightningKwargs(dict):
    """Keyword arguments for `Trainer(**kwargs)`; `.dataloader` the DataLoader arguments for the
    datamodule, `.code` a snippet for what Lightning has no flag for, `.left_out` those knobs by name."""

    dataloader: dict[str, Any]
    code: str
    left_out: list[str]


def snippet(k: Knobs, *, device_type: str, blocks: list[str]) -> tuple[list[str], list[str]]:
    """(code lines, knob names) for what Lightning's Trainer has no flag for. `blocks`: the default FSDP2
    shard units (bench.blocks, named inside the LightningModule)."""
    lines: list[str] = []
    said: list[str] = []
    if k.cpu_threads is not None:
        lines.append(f"torch.set_num_threads({k.cpu_threads})  # cpu_threads: before trainer.fit")
        said.append("cpu_threads")
    if k.matmul_precision != "highest":
        lines.append(f'torch.set_float32_matmul_precision("{k.matmul_precision}")  # matmul_precision')
        said.append("matmul_precision")
    if k.channels_last:
        lines += ["# channels_last: in your LightningModule (the model, and every 4-D float tensor of the batch)",
                  "def on_fit_start(self):",
                  "    self.to(memory_format=torch.channels_last)",
                  "def on_after_batch_transfer(self, batch, dataloader_idx):",
                  "    from lightning_utilities.core.apply_func import apply_to_collection",
                  "    return apply_to_collection(batch, torch.Tensor, lambda t: t.contiguous("
                  "memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t)"]
        said.append("channels_last")
    checkpointing, sharding = checkpoint_lines(k), shard_lines(k, blocks, offload=device_type == "cuda")
    if checkpointing or sharding:
        lines += ["# configure_model: in your LightningModule (Lightning calls it in fit, before the optimizer)",
                  "def configure_model(self):", *checkpointing, *sharding]
    if checkpointing:
        said += ["checkpoint"] + (["checkpoint_mode"] if k.checkpoint_mode != "full" else [])
    if sharding:
        said += ["strategy", *(n for n in FSDP_KNOBS if getattr(k, n) != getattr(Knobs(), n))]
    if k.compile != "off":
        mode = "" if k.compile == "default" else f', mode="{k.compile}"'
        lines.append(f"module = torch.compile(module{mode})  # compile: trainer.fit(module) takes the compiled module")
        said.append("compile")
    if k.optimizer_impl != "as-given":
        lines.append(f"# optimizer_impl={k.optimizer_impl!r}: in configure_optimizers pass {k.optimizer_impl}=True")
        said.append("optimizer_impl")
    if k.allocator is not None:
        from ..core.knobs.process import launch_words

        lines.append(f"# allocator={k.allocator!r}: {launch_words(k.allocator)}")
        said.append("allocator")
    for name in user_knob_names():
        if name in dict(k.user):
            lines.append(f"# {name}={dict(k.user)[name]!r}: your @wb.knob, apply it to the module before trainer.fit")
            said.append(name)
    return lines, said


def checkpoint_lines(k: Knobs) -> list[str]:
    """configure_model's lines for checkpointed blocks (full, or selective as trials run it: the outputs
    of SAVED_OPS kept, the rest recomputed), each block wrapped once however often fit calls it."""
    if not k.checkpoint:
        return []
    names = [strip(n) for n in k.checkpoint]
    lines = [f"    # checkpoint={names}, checkpoint_mode={k.checkpoint_mode!r}",
             "    from torch.utils.checkpoint import checkpoint"]
    if k.checkpoint_mode == "selective":
        lines += ["    import functools",
                  "    from torch.utils.checkpoint import create_selective_checkpoint_contexts",
                  f"    saved = [getattr(torch.ops.aten, n).default for n in {list(SAVED_OPS)!r} "
                  "if hasattr(torch.ops.aten, n)]",
                  "    keep = {'context_fn': functools.partial(create_selective_checkpoint_contexts, saved)}"]
    else:
        lines.append("    keep = {}")
    return [
        *lines,
        "    def checkpointed(forward):",
        "        def run(*args, **kwargs):",
        "            if not torch.is_grad_enabled():",
        "                return forward(*args, **kwargs)",
        "            return checkpoint(forward, *args, use_reentrant=False, **keep, **kwargs)",
        "        return run",
        f"    for name in {names!r}:",
        "        block = self.get_submodule(name)",
        '        if "forward" not in vars(block):  # wrapped once',
        "            block.forward = checkpointed(block.forward)"]


def to_lightning(bench: Any, knobs: Knobs) -> LightningKwargs:
    """Trainer keywords, DataLoader arguments and a snippet for a trial's knobs; every knob they do not
    carry is named in `left_out`."""
    k = knobs
    device_type = bench.workload.device.type
    out = LightningKwargs(accelerator={"cuda": "gpu"}.get(device_type, device_type), devices=k.world_size,
                          precision=AMP_PRECISION[k.amp], accumulate_grad_batches=k.accum_steps,
                          gradient_clip_val=k.grad_clip_norm, benchmark=k.cudnn_benchmark)
    carried = {"world_size", "amp", "accum_steps", "grad_clip_norm", "cudnn_benchmark", *LOADER_KNOBS, "data"}
    if k.grad_clip_norm is not None:
        out["gradient_clip_algorithm"] = "norm"
    left: list[str] = []
    if k.world_size > 1:
        out["strategy"], more, lines = lightning_strategy(k)
        carried.update(more)
        left += lines
    out.dataloader = {"batch_size": k.batch_size, "num_workers": k.num_workers, "pin_memory": k.pin_memory,
                      "persistent_workers": k.persistent_workers}
    if k.num_workers and k.prefetch_factor is not None:
        out.dataloader["prefetch_factor"] = k.prefetch_factor
    lines, said = snippet(k, device_type=device_type, blocks=[strip(n) for n in bench.workload.blocks])
    for name in LENGTH_KNOBS:
        if getattr(k, name) != Knobs.__dataclass_fields__[name].default:
            left.append(f"{name} (the DataLoader's sampler/collate_fn in your DataModule)")
    origin = getattr(bench, "_lightning", None)
    if origin is not None and origin.batch_sampler:
        left.append(f"batch_size (your batch_sampler {origin.batch_sampler} forms the batches: give it "
                    f"batch_size={k.batch_size}; a DataLoader takes batch_size or batch_sampler, not both)")
    if k.data == "cached":
        left.append("data='cached' (a measurement short-circuit: train on your data)")
    named = {line.split(" ")[0].split("=")[0] for line in left} | set(said) | carried
    for name, (_, value) in Knobs().diff(k).items():  # every other knob the trial set: named, never dropped
        if name not in named:
            one = k.world_size == 1 and (name == "strategy" or name.startswith(("ddp_", "fsdp_")))
            left.append(f"{name}={value!r}" + (" (a no-op at world_size=1)" if one else
                                               " (no Trainer flag, and not in the snippet)"))
    out.code = "\n".join(["import torch", *lines]) + "\n" if lines else ""
    out.left_out = said + left
    return out
