"""Hugging Face where its users train: a `Trainer` into a Workbench, and the winning knobs back out
as `TrainingArguments` keywords or a `Trainer` script.

    bench = wb.Workbench.from_trainer(trainer)          # model, data, collator, optimizer, starting knobs
    kwargs = bench.to_training_arguments(best)           # TrainingArguments(**kwargs, output_dir=...)
    print(bench.to_code(best, style="trainer"))          # a Trainer script that runs as it is

This face is the only module that imports `transformers`, and only when called (install hint
otherwise): the core never does. What a Trainer holds that the workbench cannot measure (a custom
`compute_loss`, callbacks, DeepSpeed or FSDP configs, the learning-rate schedule) is listed in one
warning and kept on the bench (`bench._hf.left_out`); what a trial's knobs cannot say in
`TrainingArguments` (channels_last, cpu_threads, a subset of checkpointed blocks, your own knobs) is
listed in a warning and in the script's comments. Nothing is dropped in silence.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..core.knobs import COMPILE_MODES, Knobs, user_knob_names

HINT = 'Hugging Face support needs transformers and accelerate: pip install "tuning-workbench[hf]"'
SCHEDULE_NOTE = "lr_scheduler_type={!r} (the workbench steps a constant learning rate: throughput does not depend on it)"


def transformers_module() -> Any:
    """`transformers`, imported now (never by the core), or ImportError with the install line."""
    try:
        return importlib.import_module("transformers")
    except ImportError as e:
        raise ImportError(HINT) from e


@dataclass
class TrainerOrigin:
    """What a Workbench built from a Trainer keeps of it: its arguments, collator and model class,
    and what it could not map (the from_trainer warning's lines)."""

    args: Any
    collator: Any
    optim: str
    left_out: list[str] = field(default_factory=list)


class TrainerOptimizer:
    """The optimizer the Trainer would build (`Trainer.get_optimizer_cls_and_kwargs`), with its
    weight-decay groups: decay for the parameters `Trainer.get_decay_parameter_names` names, none for
    the rest. Parameters are matched by position, which a fresh copy of the model keeps; parameters that
    do not match the Trainer's model (another count or shapes) are refused with the reason, never all
    decayed."""

    def __init__(self, cls: type, kwargs: dict[str, Any], decays: list[bool], weight_decay: float,
                 shapes: list[tuple[int, ...]] | None = None) -> None:
        self.cls, self.kwargs, self.decays, self.weight_decay = cls, kwargs, decays, weight_decay
        self.shapes = shapes

    def __call__(self, params: Any) -> torch.optim.Optimizer:
        params = list(params)
        shapes = [tuple(p.shape) for p in params]
        if len(self.decays) != len(params) or (self.shapes is not None and shapes != self.shapes):
            raise ValueError(
                f"the Trainer's weight-decay groups cannot be matched: its model has {len(self.decays)} parameters, "
                f"the optimizer was given {len(params)}" + (" of other shapes" if len(self.decays) == len(params)
                                                             else "") + ". A knob or step_fn that adds or replaces "
                "parameters needs its own optimizer: pass Workbench.from_trainer(trainer, optimizer=lambda params: "
                "...), or Trainer(optimizers=(...)).")
        decays = self.decays
        groups = [{"params": [p for p, d in zip(params, decays) if d and p.requires_grad],
                   "weight_decay": self.weight_decay},
                  {"params": [p for p, d in zip(params, decays) if not d and p.requires_grad], "weight_decay": 0.0}]
        return self.cls([g for g in groups if g["params"]], **self.kwargs)


def optimizer_of(trainer: Any, model: torch.nn.Module) -> tuple[TrainerOptimizer | None, str, list[str]]:
    """(the factory, optimizer_impl knob, what could not be mapped) from the Trainer's arguments."""
    args = trainer.args
    if getattr(trainer, "optimizer", None) is not None:
        return None, "as-given", ["optimizers=(...) passed to the Trainer: the workbench rebuilds that optimizer "
                                  "from its class and first group's hyperparameters"]
    try:
        cls, kwargs = type(trainer).get_optimizer_cls_and_kwargs(args, model)
    except Exception as e:  # an optimizer that needs packages or the model in ways we cannot copy
        return None, "as-given", [f"optim={args.optim!r} ({type(e).__name__}: {e}); trials use AdamW(lr=1e-3)"]
    kwargs = dict(kwargs)
    impl = "fused" if kwargs.pop("fused", None) else "foreach" if kwargs.pop("foreach", None) else "as-given"
    names = set(trainer.get_decay_parameter_names(model))
    named = list(model.named_parameters())
    decays = [n in names for n, _ in named]
    return TrainerOptimizer(cls, kwargs, decays, float(args.weight_decay), [tuple(p.shape) for _, p in named]), impl, []


def sampling_strategy(args: Any) -> str:
    """'group_by_length' when the arguments ask for the length-grouped sampler (either spelling)."""
    if getattr(args, "group_by_length", False):
        return "group_by_length"
    return str(getattr(args, "train_sampling_strategy", "random"))


def knobs_from_args(args: Any, blocks: list[str], impl: str) -> tuple[dict[str, Any], list[str]]:
    """(starting knobs, what has no knob) from a TrainingArguments."""
    k: dict[str, Any] = {"batch_size": int(args.per_device_train_batch_size),
                         "accum_steps": int(args.gradient_accumulation_steps),
                         "num_workers": int(args.dataloader_num_workers),
                         "pin_memory": bool(args.dataloader_pin_memory), "optimizer_impl": impl}
    left: list[str] = []
    if args.dataloader_num_workers:
        k["persistent_workers"] = bool(args.dataloader_persistent_workers)
        k["prefetch_factor"] = args.dataloader_prefetch_factor
    k["amp"] = "bf16" if args.bf16 else "fp16" if args.fp16 else "off"
    if args.torch_compile:
        mode = args.torch_compile_mode or "default"
        k["compile"] = mode if mode in COMPILE_MODES else "default"
        if mode not in COMPILE_MODES:
            left.append(f"torch_compile_mode={mode!r} (no compile knob value: trials start from compile='default')")
        if args.torch_compile_backend not in (None, "inductor"):
            left.append(f"torch_compile_backend={args.torch_compile_backend!r} (trials compile with inductor)")
    if getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing:
        k["checkpoint"] = tuple(blocks)  # the Trainer checkpoints every layer: here every block
        if args.gradient_checkpointing_kwargs:
            left.append(f"gradient_checkpointing_kwargs={args.gradient_checkpointing_kwargs!r}")
    if getattr(args, "tf32", None):
        k["matmul_precision"] = "high"
    if args.max_grad_norm:
        k["grad_clip_norm"] = float(args.max_grad_norm)
    strategy = sampling_strategy(args)
    if strategy == "group_by_length":
        k["group_by_length"] = True
    elif strategy not in ("random",):
        left.append(f"train_sampling_strategy={strategy!r} (trials shuffle, or group by length)")
    schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if schedule not in ("constant", "linear"):
        left.append(SCHEDULE_NOTE.format(schedule))
    for name in ("deepspeed", "fsdp", "fsdp_config"):
        if getattr(args, name, None):
            left.append(f"{name}={getattr(args, name)!r} (use the workbench's world_size/strategy knobs: DDP, FSDP2)")
    return k, left


def trainer_leftovers(trainer: Any) -> list[str]:
    """A custom compute_loss (a Trainer subclass) and your own callbacks: the workbench does not run them."""
    tf = transformers_module()
    left = []
    if type(trainer).compute_loss is not tf.Trainer.compute_loss:
        left.append(f"{type(trainer).__name__}.compute_loss (trials use the loss the model returns)")
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    mine = [type(c).__name__ for c in callbacks if not type(c).__module__.startswith("transformers.")]
    if mine:
        left.append("callbacks " + ", ".join(mine) + " (not run in trials)")
    return left


def from_trainer(cls: type, trainer: Any, **workbench_kwargs: Any) -> Any:
    """A Workbench (`cls`) on the Trainer's model, train dataset and collator, with the optimizer its
    arguments build and its arguments as the starting knobs; one warning lists what was not mapped."""
    tf = transformers_module()
    if not isinstance(trainer, tf.Trainer):
        raise TypeError(f"from_trainer takes a transformers.Trainer, got {type(trainer).__name__}; for a model, "
                        "dataset and collator use Workbench(model, DataLoader(dataset, collate_fn=collator))")
    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("the Trainer has no train_dataset: pass Trainer(..., train_dataset=...) so there is "
                         "something to measure")
    args = trainer.args
    model = trainer.model
    iterable = isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")
    if iterable and sampling_strategy(args) == "group_by_length":
        raise ValueError("train_sampling_strategy='group_by_length' needs a dataset with a length, but the "
                         "train_dataset is an IterableDataset of unknown length: set "
                         "train_sampling_strategy='random' or pass a map-style dataset")
    collator = trainer.data_collator
    remove = getattr(trainer, "_get_collator_with_removed_columns", None)  # what the Trainer itself feeds the model
    collate = remove(collator, description="training") if callable(remove) and args.remove_unused_columns else collator
    check_token_batches(dataset, collate, iterable)
    factory, impl, left = optimizer_of(trainer, model)
    loader = DataLoader(dataset, batch_size=args.per_device_train_batch_size, shuffle=not iterable, collate_fn=collate,
                        drop_last=args.dataloader_drop_last)
    workbench_kwargs.setdefault("seed", int(args.seed))
    workbench_kwargs.setdefault("device", "cpu" if args.use_cpu else "auto")
    bench = cls(model, loader, optimizer=factory or trainer.optimizer, **workbench_kwargs)
    start, more = knobs_from_args(args, list(bench.workload.blocks), impl)
    bench.defaults = Knobs(**start)
    left += more + trainer_leftovers(trainer)
    bench._hf = TrainerOrigin(args=args, collator=collator, optim=str(getattr(args.optim, "value", args.optim)),
                              left_out=left)
    if left:
        warnings.warn("from_trainer could not map: " + "; ".join(left) + " (kept in bench._hf.left_out)",
                      UserWarning, stacklevel=3)
    return bench


def check_token_batches(dataset: Any, collate: Any, iterable: bool) -> None:
    """ValueError when the collator's batch has no input_ids: from_trainer measures token batches."""
    if iterable:
        return
    try:
        batch = collate([dataset[0], dataset[min(1, len(dataset) - 1)]])
    except Exception as e:  # the trial would fail the same way: say it now
        raise ValueError(f"the Trainer's data_collator failed on two samples ({type(e).__name__}: {e}): fix it so "
                         "Trainer.train() can run") from e
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(f"the Trainer's data_collator returned a batch without input_ids ({keys}): from_trainer "
                         "measures token batches; for other batches use Workbench(model, DataLoader(dataset, "
                         "collate_fn=collator))")


# ---- back out --------------------------------------------------------------------------------------
class TrainingKwargs(dict):
    """Keyword arguments for `TrainingArguments(**kwargs, output_dir=...)`; `.left_out` lists the knobs
    they cannot say, `.collator` the data-collator settings (pad_to_multiple_of, packing)."""

    left_out: list[str]
    collator: list[str]


ADAMW = ("adamw_torch", "adamw_torch_fused")
NO_TRAINER = {"channels_last": "channels_last", "cpu_threads": "cpu_threads (torch.set_num_threads in your script)",
              "cudnn_benchmark": "cudnn_benchmark (torch.backends.cudnn.benchmark = True in your script)",
              "ddp_no_sync": "ddp_no_sync", "ddp_comm_hook": "ddp_comm_hook",
              "ddp_gradient_as_bucket_view": "ddp_gradient_as_bucket_view", "ddp_static_graph": "ddp_static_graph"}


def training_kwargs(knobs: Knobs, *, blocks: list[str], optim: str | None, device_type: str) -> TrainingKwargs:
    """The TrainingArguments keywords for `knobs`, with what they cannot say."""
    k = knobs
    out = TrainingKwargs(per_device_train_batch_size=k.batch_size, gradient_accumulation_steps=k.accum_steps,
                         dataloader_num_workers=k.num_workers, dataloader_pin_memory=k.pin_memory,
                         bf16=k.amp == "bf16", fp16=k.amp == "fp16", max_grad_norm=k.grad_clip_norm or 0.0)
    left: list[str] = []
    if k.num_workers:
        out["dataloader_persistent_workers"] = k.persistent_workers
        if k.prefetch_factor is not None:
            out["dataloader_prefetch_factor"] = k.prefetch_factor
    if k.compile != "off":
        out.update(torch_compile=True, torch_compile_mode=k.compile)
    if k.checkpoint:
        if set(k.checkpoint) >= set(blocks) and k.checkpoint_mode == "full":
            out[checkpointing_name()] = True
        else:
            left.append(f"checkpoint={list(k.checkpoint)} (gradient_checkpointing checkpoints every layer; "
                        "a subset needs torch.utils.checkpoint in the model)"
                        + (f", checkpoint_mode={k.checkpoint_mode!r}" if k.checkpoint_mode != "full" else ""))
    if k.optimizer_impl != "as-given":
        if optim in ADAMW or optim is None:
            out["optim"] = "adamw_torch_fused" if k.optimizer_impl == "fused" else "adamw_torch"
            if k.optimizer_impl == "foreach":
                left.append("optimizer_impl='foreach' (optim='adamw_torch' uses foreach kernels by default)")
        else:
            left.append(f"optimizer_impl={k.optimizer_impl!r} (optim={optim!r} has no fused/foreach variant)")
    elif optim is not None:
        out["optim"] = optim
    if k.matmul_precision != "highest":
        if device_type == "cuda":
            out["tf32"] = True
        else:
            left.append(f"matmul_precision={k.matmul_precision!r} (tf32 needs a CUDA GPU in TrainingArguments)")
    if k.group_by_length:
        out["train_sampling_strategy"] = "group_by_length"
    if k.world_size > 1:
        out.update(ddp_bucket_cap_mb=k.ddp_bucket_cap_mb, ddp_find_unused_parameters=k.ddp_find_unused_parameters,
                   ddp_broadcast_buffers=k.ddp_broadcast_buffers)
        left.append(f"world_size={k.world_size} (launch with torchrun --nproc-per-node {k.world_size})")
        if k.strategy != "ddp":
            left.append(f"strategy={k.strategy!r} (the Trainer's fsdp= options)")
    for name, text in NO_TRAINER.items():
        if getattr(k, name) != Knobs.__dataclass_fields__[name].default:
            left.append(text)
    if k.data == "cached":
        left.append("data='cached' (a measurement short-circuit: train on your data)")
    if k.allocator is not None:  # a process setting: the launch line, not an argument
        from ..core.knobs.process import launch_words

        left.append(f"allocator={k.allocator!r} (the process's memory allocator: {launch_words(k.allocator)})")
    left += [f"{name} (your @wb.knob: apply it to the model before the Trainer)" for name in user_knob_names()
             if name in dict(k.user)]
    out.collator = collator_lines(k)
    out.left_out = left
    return out


def checkpointing_name() -> str:
    """`activation_checkpointing` (transformers 5) or `gradient_checkpointing` (before)."""
    names = {f.name for f in dataclasses.fields(transformers_module().TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def collator_lines(k: Knobs) -> list[str]:
    """The data-collator settings of the length knobs (they are not TrainingArguments)."""
    if k.packing:
        return ["data_collator = DataCollatorWithFlattening()  # packing=True: padding-free, with position_ids"]
    if k.pad_to_multiple_of is not None:
        return [f"data_collator.pad_to_multiple_of = {k.pad_to_multiple_of}  # pad_to_multiple_of"]
    return []


def to_training_arguments(bench: Any, knobs: Knobs) -> TrainingKwargs:
    """TrainingArguments keywords for a trial's knobs; a warning lists the knobs they cannot say."""
    origin = getattr(bench, "_hf", None)
    out = training_kwargs(knobs, blocks=list(bench.workload.blocks), optim=origin.optim if origin else None,
                          device_type=bench.workload.device.type)
    said = out.left_out + [f"{line.split('#')[1].strip()}: {line.split('#')[0].strip()}" for line in out.collator]
    if said:
        warnings.warn("TrainingArguments cannot say: " + "; ".join(said) + " (see .left_out and .collator)",
                      UserWarning, stacklevel=3)
    return out


def trainer_script(bench: Any, knobs: Knobs, *, setup: str | None = None, max_steps: int = 50,
                   output_dir: str = "trainer-out") -> str:
    """A `Trainer` script for `knobs` that runs as it is: `setup` defines model, train_dataset and
    data_collator (the script stops naming them when they are missing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = to_training_arguments(bench, knobs)
    origin = getattr(bench, "_hf", None)
    lines = [f"# Trainer script from Tuning Workbench: knobs {knobs.label()}",
             "# TrainingArguments from the measured knobs; what they cannot say is listed here:"]
    lines += [f"#   not in TrainingArguments: {item}" for item in kw.left_out] or ["#   (nothing left out)"]
    if origin is not None and origin.left_out:
        lines += [f"#   not measured (from your Trainer): {item}" for item in origin.left_out]
    lines += ["import torch", "from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments", ""]
    lines += [setup.rstrip(), ""] if setup else []
    lines += ["_missing = [n for n in ('model', 'train_dataset', 'data_collator') if n not in globals()]",
              "if _missing:",
              "    raise SystemExit('This Trainer script needs ' + ', '.join(_missing) + ' defined above it')", ""]
    lines += kw.collator
    args = {**dict(kw), "output_dir": output_dir, "max_steps": max_steps, "report_to": [], "save_strategy": "no"}
    if bench.workload.device.type == "cpu":
        args["use_cpu"] = True
    lines += ["args = TrainingArguments("] + [f"    {k}={v!r}," for k, v in args.items()] + [")"]
    lines += ["trainer = Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator)",
              "print(trainer.train())"]
    return "\n".join(lines) + "\n"


def arguments_accepted(kwargs: dict[str, Any]) -> list[str]:
    """The keywords TrainingArguments does not know (empty when it accepts them all)."""
    names = {f.name for f in dataclasses.fields(transformers_module().TrainingArguments)}
    return [k for k in kwargs if k not in names]
