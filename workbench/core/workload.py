"""Workload: the user's model, data, loss and optimizer, validated once and snapshotted.

Everything a trial needs to rebuild the same starting point: a pristine copy of the model taken at
construction (the user's object is never trained), the dataset and loader settings, and the
function that turns one batch into a scalar loss.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from .devicefacts import DeviceFacts, facts_here

StepFn = Callable[[nn.Module, Any], torch.Tensor]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


DEVICE_ENV = "WORKBENCH_DEVICE"  # what device="auto" means in this process (e.g. cpu for a test suite)


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' picks cuda, then mps, then cpu, unless WORKBENCH_DEVICE names the device 'auto' means
    (tests/conftest.py sets it to cpu: tests not about the device run on the CPU of a GPU machine too);
    anything else must be a device torch knows."""
    if device == "auto" and os.environ.get(DEVICE_ENV, "auto") not in ("", "auto"):
        try:
            return resolve_device(os.environ[DEVICE_ENV])
        except ValueError as e:
            raise ValueError(f"{DEVICE_ENV}={os.environ[DEVICE_ENV]!r} (what device='auto' means): {e}") from None
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:1' or 'mps'") from e
    else:
        raise TypeError(f"device must be a string or torch.device, got {type(device).__name__}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for CUDA but torch.cuda.is_available() is False: use device='cpu' or 'auto'")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r} asked for MPS but it is not available here: use device='cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"device type {dev.type!r} is not supported: use 'cpu', 'cuda' or 'mps'")
    return dev


def move_to(batch: Any, device: torch.device, *, non_blocking: bool = False, channels_last: bool = False) -> Any:
    """Move every tensor in a (nested) tuple/list/dict batch to `device`, keeping its shape."""
    if isinstance(batch, torch.Tensor):
        # .to() is a dispatcher round trip even when there is nothing to move (hot path)
        t = batch if batch.device == device else batch.to(device, non_blocking=non_blocking)
        if channels_last and t.dim() == 4 and t.is_floating_point():
            t = t.contiguous(memory_format=torch.channels_last)
        return t
    if isinstance(batch, Mapping):
        moved = {k: move_to(v, device, non_blocking=non_blocking, channels_last=channels_last) for k, v in batch.items()}
        try:
            return type(batch)(moved)  # keeps dict subclasses such as HF BatchEncoding
        except TypeError:
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to(v, device, non_blocking=non_blocking, channels_last=channels_last) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device, non_blocking=non_blocking, channels_last=channels_last) for v in batch)
    return batch


def is_lazy(t: torch.Tensor) -> bool:
    """An uninitialized parameter or buffer of a Lazy module (its shape comes with the first forward)."""
    return isinstance(t, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer))


def any_tensor(batch: Any, test: Callable[[torch.Tensor], bool]) -> bool:
    """True when some tensor in a (nested) tuple/list/dict batch passes `test`."""
    if isinstance(batch, torch.Tensor):
        return bool(test(batch))
    if isinstance(batch, dict):
        return any(any_tensor(v, test) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(any_tensor(v, test) for v in batch)
    return False


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (1 if it has none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return 1
    for v in values:
        n = batch_size_of(v) if isinstance(v, (torch.Tensor, Mapping, list, tuple)) else None
        if n is not None and (isinstance(v, torch.Tensor) or n != 1):
            return n
    return 1


def split_batch(batch: Any, has_loss_fn: bool) -> tuple[tuple, dict, Any]:
    """(positional inputs, keyword inputs, target) for the default step.

    (x, y) or (x1, ..., y) feeds all but the last item to the model when there is a loss_fn; a
    dict batch is passed as keywords; a lone tensor is the only input.
    """
    if isinstance(batch, Mapping):
        return (), dict(batch), None
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        if has_loss_fn and len(batch) >= 2:
            return tuple(batch[:-1]), {}, batch[-1]
        return tuple(batch), {}, None
    return (batch,), {}, None


def output_loss(out: Any) -> Any:
    """The loss a model returns itself: `.loss`, a dict's "loss", or the output as is."""
    if isinstance(out, Mapping) and "loss" in out:
        return out["loss"]
    if hasattr(out, "loss"):
        return out.loss
    return out


def optimizer_factory(optimizer: Any) -> OptimizerFactory:
    """Accept a factory `params -> Optimizer`, an Optimizer class, or an instance to rebuild."""
    if optimizer is None:
        return lambda params: torch.optim.AdamW(params, lr=1e-3)
    if isinstance(optimizer, torch.optim.Optimizer):
        cls = type(optimizer)
        hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        accepted = inspect.signature(cls.__init__).parameters
        hyper = {k: v for k, v in hyper.items() if k in accepted}
        return lambda params: cls(params, **hyper)
    if callable(optimizer):
        return optimizer
    raise TypeError(
        "optimizer must be a factory such as `lambda params: torch.optim.AdamW(params, lr=1e-3)` "
        f"or an Optimizer instance, got {type(optimizer).__name__}"
    )


@dataclass
class LoaderSpec:
    """How to rebuild the user's loader: dataset, collate and sampling taken from what they passed."""

    dataset: Dataset
    collate_fn: Callable | None
    shuffle: bool  # seeded shuffle (RandomSampler) or the dataset's order
    sampler: Any  # a custom sampler reused as-is (None when shuffle decides)
    drop_last: bool
    default_batch_size: int
    default_num_workers: int
    iterable: bool

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


def loader_spec(data: Any) -> LoaderSpec:
    """Read a Dataset or DataLoader into a LoaderSpec; anything else raises naming the fix."""
    if isinstance(data, DataLoader):
        iterable = isinstance(data.dataset, IterableDataset)
        sampler = None
        shuffle = False
        if not iterable:
            if isinstance(data.sampler, RandomSampler):
                shuffle = True
            elif not isinstance(data.sampler, SequentialSampler):
                sampler = data.sampler
        return LoaderSpec(
            dataset=data.dataset,
            collate_fn=data.collate_fn,
            shuffle=shuffle,
            sampler=sampler,
            drop_last=data.drop_last,
            default_batch_size=data.batch_size or 32,
            default_num_workers=data.num_workers,
            iterable=iterable,
        )
    if isinstance(data, IterableDataset):
        return LoaderSpec(data, None, False, None, False, 32, 0, iterable=True)
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        return LoaderSpec(data, None, True, None, False, 32, 0, iterable=False)
    raise TypeError(
        f"data must be a torch Dataset (map-style or iterable) or a DataLoader, got {type(data).__name__}; "
        "wrap tensors with torch.utils.data.TensorDataset(x, y)"
    )


class Workload:
    """The validated user inputs plus a pristine model snapshot; trials only ever copy it."""

    def __init__(
        self,
        model: nn.Module,
        data: Any,
        *,
        loss_fn: Callable | None = None,
        optimizer: Any = None,
        step_fn: StepFn | None = None,
        device: str | torch.device = "auto",
        seed: int = 0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(
                "the model has no trainable parameters, so there is nothing to train: pass the "
                "model itself (not a frozen copy) or set requires_grad=True on its parameters"
            )
        if step_fn is not None and not callable(step_fn):
            raise TypeError("step_fn must be a function (model, batch) -> scalar loss tensor")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError("loss_fn must be callable, e.g. torch.nn.CrossEntropyLoss()")
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.device = resolve_device(device)
        # What the space, the knobs' rules and MFU know of the device trials run on: this machine's, until
        # a workbench with an executor takes its node's (faces/nodefacts.py)
        self.facts: DeviceFacts = facts_here(self.device)
        self.spec = loader_spec(data)
        self.loss_fn = loss_fn
        self.step_fn: StepFn | None = step_fn
        self.optimizer_factory = optimizer_factory(optimizer)
        self.seed = seed
        # The snapshot every trial copies: taken now, on the CPU, so later edits to the user's
        # model (or its training) never leak into trials.
        self.pristine = copy.deepcopy(model).to("cpu")
        self.has_conv = any(isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Conv1d)) for m in model.modules())
        # channels_last acts on 4-D tensors only: True when a parameter or buffer is one; else a sample
        # batch decides (`see_batch`), None until one was seen
        tensors = (*self.pristine.parameters(), *self.pristine.buffers())
        self.four_d: bool | None = True if any(not is_lazy(t) and t.dim() == 4 for t in tensors) else None
        self.blocks = blocks_of(self.pristine)
        self.token_data = has_token_batches(self.spec)  # the length knobs act only on token batches
        self.forward_params = forward_params(self.pristine)
        self.max_positions = max_positions(self.pristine)
        self._longest: tuple[int | None] | None = None  # longest_tokens(), read on first use

    def context_kwargs(self) -> dict[str, Any]:
        """What the knobs' hooks know of this workload (besides the device): knobs.Context's fields."""
        return {"spec": self.spec, "blocks": self.blocks, "has_conv": self.has_conv, "four_d": self.four_d,
                "token_data": self.token_data,
                "forward_params": self.forward_params, "max_positions": self.max_positions,
                "longest_tokens": self.longest_tokens}

    def see_batch(self, batch: Any) -> None:
        """Take in what a sample batch shows before any trial: whether it holds a 4-D floating-point tensor."""
        if not self.four_d:
            self.four_d = any_tensor(batch, lambda t: t.dim() == 4 and t.is_floating_point())

    def longest_tokens(self) -> int | None:
        """The longest sample, in tokens (over the samples the length knobs read: tokens.length_pool),
        read once per workload; None when the samples are not token dicts (the collate_fn tokenizes)."""
        if self._longest is None:
            from .tokens import first_item, is_token_item, length_pool

            token_items = not self.spec.iterable and is_token_item(first_item(self.spec.dataset))
            self._longest = (max(length_pool(self.spec.dataset, 0)[1], default=0) if token_items else None,)
        return self._longest[0]

    def compute_loss(self, model: nn.Module, batch: Any, stage: Any) -> Any:
        """Batch -> loss, recording in `stage.name` which part of the user's code is running."""
        if self.step_fn is not None:
            stage.name = "step_fn"
            return self.step_fn(model, batch)
        args, kwargs, target = split_batch(batch, self.loss_fn is not None)
        stage.name = "model"
        out = model(*args, **kwargs)
        stage.name = "loss"
        if self.loss_fn is None:
            return output_loss(out)
        return self.loss_fn(out, target) if target is not None else self.loss_fn(out)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.pristine.parameters())

    def fresh_model(self) -> nn.Module:
        """A trainable copy of the snapshot on the workload's device."""
        return copy.deepcopy(self.pristine).to(self.device)

    def check_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """Build the optimizer, failing with a fix if the factory returns something else."""
        opt = self.optimizer_factory(model.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer: "
                "pass e.g. `optimizer=lambda params: torch.optim.SGD(params, lr=0.1)`"
            )
        return opt


def forward_params(model: nn.Module) -> frozenset:
    """The names the model's forward takes (empty when they cannot be read, or it takes **kwargs only)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


POSITION_TABLES = ("pos", "wpe", "pos_emb", "pos_embedding", "position_embedding", "position_embeddings")


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence, in tokens, the model's position table holds: a Hugging Face config's
    `max_position_embeddings` (GPT-2's `n_positions` maps to it), else the rows of an nn.Embedding named
    like a position table (`pos`, `wpe`, `position_embeddings`...); None when neither is there."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_TABLES:
            return int(module.num_embeddings)
    return None


def has_token_batches(spec: LoaderSpec) -> bool:
    """Whether the data's batches hold `input_ids`: its samples are dicts with them, or the collate_fn
    makes them from the first sample (an IterableDataset is peeked at through a fresh iterator)."""
    from .tokens import first_item, is_token_item

    try:
        item = next(iter(spec.dataset)) if spec.iterable else first_item(spec.dataset)
    except Exception:  # an iterable that cannot restart, or fails: no token knobs
        return False
    if item is None or is_token_item(item):
        return item is not None
    if spec.collate_fn is None:
        return False
    try:
        batch = spec.collate_fn([item])
    except Exception:  # a collate that needs more than one sample: decided by the sample alone
        return False
    return isinstance(batch, Mapping) and "input_ids" in batch


def blocks_of(model: nn.Module) -> dict[str, int]:
    """Candidate blocks for activation checkpointing: {name: parameter count}.

    The children of every outermost ModuleList/Sequential (e.g. 'blocks.0', 'blocks.1'); a model
    without such containers offers its top-level children that have parameters.
    """
    found: dict[str, int] = {}

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if isinstance(child, (nn.ModuleList, nn.Sequential)) and len(child) > 1:
                for sub_name, sub in child.named_children():
                    n = sum(p.numel() for p in sub.parameters())
                    if n:
                        found[f"{full}.{sub_name}"] = n
            else:
                visit(f"{full}.", child)

    if isinstance(model, nn.Sequential):
        for name, child in model.named_children():
            n = sum(p.numel() for p in child.parameters())
            if n:
                found[name] = n
    else:
        visit("", model)
    if not found:
        for name, child in model.named_children():
            n = sum(p.numel() for p in child.parameters())
            if n:
                found[name] = n
    return found
