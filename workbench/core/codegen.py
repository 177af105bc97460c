"""Knobs -> a plain-PyTorch training loop that reproduces the configuration outside the workbench.

One program with sections: the header, imports, what the script needs (the user's objects), the
device (one process, or a torchrun rank with DDP), the helpers, the data, the model, the loop.
Every knob writes into those sections through its declared `code` hook (knobs/spec.py: what
`TrainStep` does at the same seam at run time); this module only lays the sections out, so a new
knob never edits it. With `world_size > 1` the program is a torchrun-ready DDP script
(init_process_group, a DistributedSampler with set_epoch, DDP with the ddp_* knobs, no_sync during
accumulation), or with strategy="fsdp2" an FSDP2 script (fully_shard per shard unit, then the
root; set_requires_gradient_sync during accumulation); its header and `torchrun_command()` give
the command.

The step is the workload's own (a StepShape, stepshape.py): tuple, dict or nested batches moved to
the device at any depth; the user's `loss_fn`, the model's own `.loss`, or the user's `step_fn`.
The script needs the user's objects by name (`model`, `dataset`, `loss_fn` or `step_fn`,
`make_optimizer`; rename them with keyword arguments) and stops with the list of what is missing.
A workbench built from `--model pkg:factory` or a demo gets a script that rebuilds them itself.
Only the knobs that differ from PyTorch's defaults produce code, so the script stays as short as
the configuration.
"""

from __future__ import annotations

import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any

from .knobs.spec import code_sections, traits  # the declarations' hooks; Knobs.to_code imports this module
from .steady import planned_warmup
from .stepshape import StepShape, is_demo_source, is_import_path


def _identifier(name: str, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{what} must be a Python identifier for the generated code, got {name!r}")
    return name


def torchrun_command(knobs: Any, script: str | None = None, *, nnodes: int = 1) -> str:
    """The torchrun line for the DDP (or FSDP2) script: `world_size` processes on one node (standalone
    rendezvous), or per node of `nnodes` with a c10d rendezvous at HOST:29500."""
    script = script or f"train_{knobs.strategy}.py"
    if nnodes == 1:
        return f"torchrun --standalone --nproc-per-node={knobs.world_size} {script}"
    per_node = max(1, knobs.world_size // nnodes)
    return (f"torchrun --nnodes={nnodes} --nproc-per-node={per_node} --rdzv-backend=c10d "
            f"--rdzv-endpoint=HOST:29500 {script}")


@dataclass
class Program:
    """What every section needs: the knobs, their code sections, the step's shape, the user's names."""

    k: Any  # a Knobs value (not imported: knobs imports this module for Knobs.to_code)
    extra: dict[str, list[str]]
    shape: StepShape
    model: str
    dataset: str
    loss_fn: str
    step_fn: str
    optimizer: str
    steps: int
    shuffle: bool
    drop_last: bool
    seed: int | None
    warmup: int
    setup: str | None
    lost: list[str] = field(default_factory=list)  # what the script could not carry over (its header says)
    shapes: dict[str, Any] = field(default_factory=dict)  # the trial's input shapes (extra["shapes"]), {} if unknown

    @property
    def varied(self) -> bool:
        """Whether the trial's input shapes varied: the script then keeps its steps' first calls out of its figure."""
        distinct = self.shapes.get("distinct")
        return isinstance(distinct, int) and distinct > 1 and not self.ddp

    @property
    def ddp(self) -> bool:
        return self.k.world_size > 1

    @property
    def fsdp(self) -> bool:
        return self.ddp and self.k.strategy == "fsdp2"

    @property
    def accum(self) -> int:
        return self.k.accum_steps

    @property
    def loss_name(self) -> str:
        """The user's object that makes the loss: loss_fn, step_fn, or none (the model's own)."""
        return {"loss_fn": self.loss_fn, "step_fn": self.step_fn}.get(self.shape.loss, "")


def knobs_to_code(knobs: Any, *, model: str = "model", dataset: str = "dataset", loss_fn: str = "loss_fn",
                  step_fn: str = "step_fn", optimizer: str = "make_optimizer", steps: int = 100,
                  shuffle: bool | None = None, drop_last: bool | None = None, seed: int | None = None,
                  warmup: int = 5, setup: str | None = None, shape: StepShape | None = None,
                  shapes: Any = None) -> str:
    """Python source of a training loop for `steps` optimizer steps under these knobs.

    `shape` is the workload's step (batch format, loss source, sampling: `Workbench.step_shape`);
    without one, the classic (inputs..., target) batches and `loss_fn(output, target)`. `shuffle`
    and `drop_last` default to the shape's. With `seed`, the loop seeds torch and the loader's
    shuffle the way a trial does (same batches in the same order as `run_trial` with
    `Workbench(seed=...)`). It prints the samples/s of the steps after the first `warmup`
    (start-up and compilation are not timed), the figure a trial reports, so the script can
    referee the workbench. `warmup` is a minimum: the script warms up as a quiet trial does
    (`script_warmup`: the loader's buffer drained, then 8 steps), within `steps - 1`; pass
    `steps=script_warmup(knobs, warmup) + timed` for `timed` timed steps. With `world_size > 1` it is a whole DDP script for torchrun. `setup` is
    code placed after the imports that defines the user's objects; otherwise the script lists what
    it needs there and stops, naming each missing one, when run without them. A step the script
    cannot carry over (a lambda or closure `step_fn`) is said at its top and warned about.
    `shapes` (the trial's `extra["shapes"]`, or its `shapes` count): when the trial's input shapes varied,
    the script counts the shapes its steps meet, and when the trial repeated a fixed sample of batches
    (`pass_batches`) its loop repeats one too, read once in warm-up (`shape_pass`); a window step that meets
    a new shape anyway is timed apart between syncs and left out of the figure. Its summary line says how
    many shapes were first seen in the timed window and their seconds, as a trial keeps first calls apart.
    """
    if type(knobs).__name__ != "Knobs" or not callable(getattr(knobs, "to_dict", None)):
        raise TypeError(f"knobs_to_code takes a Knobs value, got {type(knobs).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (untimed steps), got {warmup!r}")
    if shape is not None and not isinstance(shape, StepShape):
        raise TypeError(f"shape must be a StepShape (Workbench.step_shape), got {type(shape).__name__}")
    shape = shape or StepShape()
    m = _identifier(model, "model")
    extra = {section: [line.replace("{model}", m) for line in lines]  # {model} = the model's variable
             for section, lines in code_sections(knobs).items()}
    p = Program(knobs, extra, shape, m, _identifier(dataset, "dataset"), _identifier(loss_fn, "loss_fn"),
                _identifier(step_fn, "step_fn"), _identifier(optimizer, "optimizer"), steps,
                shape.shuffle if shuffle is None else bool(shuffle),
                shape.drop_last if drop_last is None else bool(drop_last), seed, warmup, setup,
                shapes=_shapes_info(shapes))
    if shape.step_fn_problem:
        p.lost.append(shape.step_fn_problem)
        warnings.warn(f"to_code(): {shape.step_fn_problem}. The script calls {p.step_fn}(model, batch) and stops "
                      "until you do.", UserWarning, stacklevel=3)
    if shape.sampler and p.ddp:
        p.lost.append("your DataLoader's sampler: under torchrun each rank reads its shard through a "
                      "DistributedSampler, as the trial did")
    out: list[str] = []
    for section in (header, imports, needs, device, helpers, data, model_and_optimizer, loop):
        out += section(p)
    return "\n".join(out) + "\n"


def _shapes_info(shapes: Any) -> dict[str, Any]:
    """knobs_to_code's `shapes` as a dict: a trial's extra["shapes"], or a count of distinct shapes; {} for none."""
    if isinstance(shapes, dict):
        return dict(shapes)
    if isinstance(shapes, int) and not isinstance(shapes, bool):
        return {"distinct": shapes}
    if shapes is not None:
        raise TypeError(f"shapes must be a trial's extra['shapes'] dict or a count, got {type(shapes).__name__}")
    return {}


def trial_shapes(result: Any) -> Any:
    """What a trial recorded of its input shapes, for knobs_to_code's `shapes`: extra["shapes"], else its count."""
    info = result.extra.get("shapes") if isinstance(getattr(result, "extra", None), dict) else None
    return info if isinstance(info, dict) else getattr(result, "shapes", None)


# ---- the sections, in program order -------------------------------------------------------------
def trial_to_code(result: Any, **kwargs: Any) -> str:
    """Plain-PyTorch code reproducing one trial (`TrialResult.to_code`): its knobs with the allocator mode its
    process ran in (`pinned_knobs`), and the step it ran (batch format, loss, sampling: stamped by the
    Workbench that logged it, `extra["step"]`) unless `shape=` says otherwise, over the input shapes it met.
    Keywords: `knobs_to_code`'s."""
    kwargs.setdefault("shape", StepShape.from_record(result.extra.get("step")))
    kwargs.setdefault("shapes", trial_shapes(result))
    return knobs_to_code(result.pinned_knobs(), **kwargs)


def header(p: Program) -> list[str]:
    """What the script is, its step, what it could not carry over, and (DDP) how to launch it."""
    k = p.k
    out = [f"# Training loop generated by Tuning Workbench for {k}",
           f"# The step: {p.shape.describe()}."]
    for lost in p.lost:
        out.append(f"# NOT CARRIED OVER: {lost}.")
    if p.ddp:
        out += [f"# Run it on this machine:  {torchrun_command(k)}",
                f"# Or on each of 2 nodes:   {torchrun_command(k, nnodes=2)} (plus --node-rank=0|1)",
                f"# Global batch per optimizer step = {k.batch_size} per rank x {k.accum_steps} accumulated x "
                f"{k.world_size} ranks = {k.batch_size * k.accum_steps * k.world_size}; scale the learning rate "
                "with it."]
    return out + p.extra["header"]


def imports(p: Program) -> list[str]:
    """The imports (the user's step_fn among them when a script can import it), then the knobs'
    helper functions (your @wb.knob functions among them)."""
    out = ["import contextlib", "import os", ""] if p.ddp else []
    out += ["import time", "", "import torch", "from torch.utils.data import DataLoader"]
    if p.ddp:
        out += ["import torch.distributed as dist"]
        out += [] if p.fsdp else ["from torch.nn.parallel import DistributedDataParallel as DDP"]
        out += ["from torch.utils.data.distributed import DistributedSampler"]
    out += list(dict.fromkeys(p.extra["imports"]))
    if p.shape.loss == "step_fn" and p.shape.step_fn and not p.shape.factory:
        module, _, qualname = p.shape.step_fn.partition(":")
        head, _, rest = qualname.partition(".")
        if rest:
            out += [f"from {module} import {head}", "", f"{p.step_fn} = {qualname}  # your step_fn"]
        else:
            out.append(f"from {module} import {head}" + (f" as {p.step_fn}" if head != p.step_fn else "")
                       + "  # your step_fn")
    for source in dict.fromkeys(p.extra["functions"]):
        out += ["", "", source]
    return out


def needed(p: Program) -> dict[str, str]:
    """{name: a one-line example} for every object of the user's the script uses."""
    s = p.shape
    yields = {"dict": f"yields dicts ({', '.join(s.keys[:4])})" if s.keys else "yields dict batches",
              "tuple": "yields (inputs..., target)" if s.splits_target else f"yields {s.items}-item tuples",
              "tensor": "yields one tensor per sample"}[s.batch]
    out = {p.model: f"{p.model} = MyModel()  # the nn.Module you wrapped in the Workbench",
           p.dataset: f"{p.dataset} = MyDataset()  # {yields}, as the Workbench's data did"}
    if s.loss == "loss_fn":
        out[p.loss_fn] = (f"{p.loss_fn} = torch.nn.CrossEntropyLoss()  # called as "
                          + (f"{p.loss_fn}(output, target)" if s.splits_target else f"{p.loss_fn}(output)"))
    elif s.loss == "step_fn" and (not s.step_fn or s.factory):
        out[p.step_fn] = f"def {p.step_fn}(model, batch): return model(**batch).loss  # your step_fn, pasted here"
    out[p.optimizer] = f"{p.optimizer} = lambda params: torch.optim.AdamW(params, lr=1e-3)"
    if s.collate_fn:
        out["collate_fn"] = "collate_fn = my_collate  # the collate_fn your DataLoader had"
    if s.sampler and not p.ddp:
        out["sampler"] = "sampler = my_sampler  # the sampler your DataLoader had"
    return out


def needs(p: Program) -> list[str]:
    """The user's objects: rebuilt from the factory or demo the workbench came from, or `setup`, or
    defined above the script; a check stops the script naming each missing one and its fix."""
    names = needed(p)
    if p.shape.factory and (is_import_path(p.shape.factory) or is_demo_source(p.shape.factory)):
        return factory_lines(p, names)
    out = [""] + ([p.setup.rstrip(), ""] if p.setup else [])
    out += ["# ---- what this script needs: define these above it (or import them), e.g. ----",
            "_needed = {"] + [f"    {name!r}: {example!r}," for name, example in names.items()] + ["}",
            "_missing = [name for name in _needed if name not in globals()]",
            "if _missing:  # stop here, naming each one and an example, rather than fail at first use",
            '    raise SystemExit("This training script needs " + ", ".join(_missing) + " defined above it, e.g.\\n  "',
            '                     + "\\n  ".join(_needed[name] for name in _missing))']
    return out


def factory_lines(p: Program, names: dict[str, str]) -> list[str]:
    """The user's objects from the factory (`--model pkg.mod:fn`) or demo the workbench was built from."""
    source = p.shape.factory
    keys = {p.model: "model", p.dataset: "dataset", p.loss_fn: "loss_fn", p.step_fn: "step_fn",
            p.optimizer: "make_optimizer", "collate_fn": "collate_fn", "sampler": "sampler"}
    out = ["", f"# ---- the objects, rebuilt from {source!r} as the workbench built them ----",
           "from workbench.faces.rebuild import load_parts", "",
           f"parts = load_parts({source!r})  # model, dataset, loss_fn, step_fn, make_optimizer, collate_fn, sampler"]
    return out + [f"{name} = parts[{keys[name]!r}]" for name in names]


def device(p: Program) -> list[str]:
    """The device: one process (CUDA if present), or this torchrun rank's (process group first)."""
    if p.ddp:
        out = ["",
               'dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # torchrun sets RANK, WORLD_SIZE',
               'local_rank = int(os.environ.get("LOCAL_RANK", 0))',
               "if torch.cuda.is_available():",
               "    torch.cuda.set_device(local_rank)  # one GPU per process",
               '    device = torch.device("cuda", local_rank)',
               "else:",
               '    device = torch.device("cpu")  # gloo: CPU processes (torchrun gives each 1 thread)']
    else:
        out = ["", 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")']
    if p.seed is not None:
        out.append(f"torch.manual_seed({int(p.seed)})  # the workbench's seed: same data order as the trial")
    return out + p.extra["setup"]


def helpers(p: Program) -> list[str]:
    """Batch helpers that mirror the trial: tensors at any depth, samples per batch, the model's loss."""
    out = ["", "", "def each_tensor(fn, batch):",
           '    """fn applied to every tensor of the batch, at any depth (tuples, lists, dicts)."""',
           "    if isinstance(batch, torch.Tensor):",
           "        return fn(batch)",
           "    if isinstance(batch, dict):",
           "        return {key: each_tensor(fn, value) for key, value in batch.items()}",
           "    if isinstance(batch, (list, tuple)):",
           "        items = [each_tensor(fn, value) for value in batch]",
           '        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)',
           "    return batch  # strings, numbers: as they are",
           "", "",
           "def samples_in(batch):",
           '    """Samples in a batch: the length of its first tensor, as the trial counts them."""',
           "    if isinstance(batch, torch.Tensor):",
           "        return len(batch) if batch.dim() else 1",
           "    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()",
           "    for value in values:",
           "        n = samples_in(value) if isinstance(value, (torch.Tensor, dict, list, tuple)) else 1",
           "        if isinstance(value, torch.Tensor) or n != 1:",
           "            return n",
           "    return 1"]
    if p.varied:
        out += ["", "", "def shape_of(batch):",
                '    """Every tensor\'s shape in the batch, as one key: a step\'s first call on a new one is a one-time cost."""',
                "    return repr(each_tensor(lambda t: tuple(t.shape), batch))"]
    if p.shape.loss == "model":
        out += ["", "", "def model_loss(output):",
                '    """The loss the model computes itself: output.loss (Hugging Face), output["loss"], or the output."""',
                '    if isinstance(output, dict) and "loss" in output:',
                '        return output["loss"]',
                '    return getattr(output, "loss", output)']
    return out


def data(p: Program) -> list[str]:
    """The DataLoader (each rank its own shard under DDP) with the knobs' loader keywords."""
    out: list[str] = []
    args = [p.dataset, f"batch_size={p.k.batch_size}"]
    if shape_pass(p):
        out, args = shape_sample(p), [p.dataset, "batch_sampler=sample"]
    elif p.ddp:  # each rank reads its own shard; set_epoch reshuffles every epoch, alike on all ranks
        out += ["", f"sampler = DistributedSampler({p.dataset}, shuffle={p.shuffle}, seed={int(p.seed or 0)})"]
        args.append("sampler=sampler")
    elif p.shape.sampler:
        args.append("sampler=sampler")  # your DataLoader's sampler, as the trial reused it
    else:
        given = next((a.split("=", 1)[1] for a in p.extra["loader_args"] if a.startswith("sampler=")), None)
        # a knob's sampler (group_by_length), when it gives one, replaces the shuffle
        args.append(f"shuffle={p.shuffle}" if given is None else f"shuffle={p.shuffle} if {given} is None else False")
    if p.shape.collate_fn and "collate_fn=collate_fn" not in p.extra["loader_args"]:
        args.append("collate_fn=collate_fn")
    if p.drop_last and not shape_pass(p):
        args.append("drop_last=True")
    if p.seed is not None and not p.ddp and not p.shape.sampler and not shape_pass(p):
        args.append(f"generator=torch.Generator().manual_seed({int(p.seed)})")
    out += ([] if shape_pass(p) else ["", ""]) + ["loader = DataLoader(" + ", ".join(args + list(dict.fromkeys(p.extra["loader_args"]))) + ")"]
    return out


def shape_pass(p: Program) -> int:
    """Timed steps of the fixed sample of batches the loop repeats (0: it repeats none). When the trial's
    input shapes varied over a sample it repeated (`pass_batches`: token data's length-stratified window),
    the script repeats one too, one timed window long, and warm-up reads it once first (`warmup_line`),
    so the window meets no shape for the first time. Not with your sampler or a knob's, nor under DDP."""
    if not p.varied or not p.shapes.get("pass_batches") or p.shape.sampler or \
            any(arg.startswith("sampler=") for arg in p.extra["loader_args"]):
        return 0
    warm = min(script_warmup(p.k, p.warmup), p.steps - 1)
    return max(0, min(p.steps - warm, p.steps // 2))


def shape_sample(p: Program) -> list[str]:
    """The sample the loop repeats (shape_pass): the first batches of the seeded order, as index lists."""
    bs, batches = p.k.batch_size, shape_pass(p) * p.accum
    order = (f"torch.randperm(len({p.dataset}), generator=torch.Generator().manual_seed({int(p.seed or 0)})).tolist()"
             if p.shuffle else f"list(range(len({p.dataset})))")
    return ["", "", f"# Input shapes vary: the trial met {p.shapes['distinct']} distinct shapes, each one's first call a "
            "one-time cost per process", "# (plans, autotune, recompiles). As the trial did, the loop repeats a fixed "
            "sample of batches one timed", "# window long, and warm-up reads it once first: the timed window meets "
            "no shape for the first time.", f"order = {order}",
            f"sample = [order[i:i + {bs}] for i in range(0, len(order) - {bs} + 1, {bs})][:{batches}]  # sample "
            "indices per batch", f"sample *= max(1, len({p.dataset}) // ({bs} * len(sample)))  # repeated up to "
            "one epoch's length, as the trial's"]


def model_and_optimizer(p: Program) -> list[str]:
    """The model on the device with the knobs' model code, (DDP), the optimizer, the step's model."""
    m, out = p.model, ["", f"{p.model} = {p.model}.to(device)"]
    out += p.extra["model"]
    wrapped = m
    out += fsdp(p)  # FSDP2: fully_shard in place (the optimizer below sees the sharded parameters)
    if p.ddp and not p.fsdp:
        out += ["# all-reduces gradients in buckets during backward", "ddp_model = DDP(", f"    {m},",
                '    device_ids=[local_rank] if device.type == "cuda" else None,']
        for arg in p.extra["ddp_args"]:  # the ddp_* knobs' declared code (knobs/parallel.py)
            code, _, comment = arg.partition("  #")
            out.append(f"    {code},  #{comment}" if comment else f"    {code},")
        out += [")"] + p.extra["ddp_model"]
        wrapped = "ddp_model"
    out.append(f"optimizer = {p.optimizer}({m}.parameters())")
    out += p.extra["optimizer"]
    for wrap in p.extra["wrap"]:  # e.g. torch.compile
        code, _, comment = wrap.partition("  #")
        wrapped = code.replace("{inner}", wrapped) + (f"  #{comment}" if comment else "")
    out.append(f"step_model = {wrapped}")
    out += p.extra["scaler"]
    if p.accum > 1:
        ranks = f" x {p.k.world_size} ranks" if p.ddp else ""
        out.append(f"accum_steps = {p.accum}  # global batch = {p.k.batch_size} x {p.accum}{ranks} = "
                   f"{p.k.batch_size * p.accum * p.k.world_size}")
    return out


def fsdp(p: Program) -> list[str]:
    """FSDP2's section: fully_shard per shard unit (deepest first), then the root, with the fsdp_*
    knobs' pieces; checkpoint wrappers (the model section) are already on the blocks."""
    if not p.fsdp:
        return []
    x = p.extra
    return ["# FSDP2: each shard unit gathers its parameters for its forward/backward and frees them after",
            f"units = {x['fsdp_units'][0]}",
            f"fsdp_options = dict({', '.join(x['fsdp_options'])}, mp_policy=MixedPrecisionPolicy({', '.join(x['fsdp_mp'])}))",
            *x["fsdp_before"],
            f"for unit in sorted(units, key=lambda u: -len(next(n for n, m in {p.model}.named_modules() if m is u)"
            ".split('.'))):",
            "    fully_shard(unit, **fsdp_options)  # deepest first: a unit inside another is sharded before it",
            "# the root: every parameter left over; None = FSDP2 keeps a root's parameters for backward",
            f'fully_shard({p.model}, **{{**fsdp_options, "reshard_after_forward": None}})',
            *x["fsdp_after"]]


def forward(p: Program) -> tuple[list[str], str]:
    """(lines before the forward, the forward + loss line) for the workload's batch and loss."""
    s, model = p.shape, "step_model"
    if s.loss == "step_fn":
        return [], f"loss = {p.step_fn}({model}, batch)  # your step_fn"
    if s.splits_target:
        return ["*inputs, target = batch"], f"loss = {p.loss_fn}({model}(*inputs), target)"
    call = {"dict": f"{model}(**batch)", "tuple": f"{model}(*batch)", "tensor": f"{model}(batch)"}[s.batch]
    return [], f"loss = {p.loss_fn}({call})" if s.loss == "loss_fn" else f"loss = model_loss({call})"


def micro_batch(p: Program) -> list[str]:
    """One micro-batch: device move, the batch code, forward + loss under the forward contexts,
    backward (through the scaler), inside no_sync on all but the last micro-batch under DDP."""
    move = "".join(f", {arg}" for arg in p.extra["move_args"])  # e.g. pin_memory's non_blocking
    before, compute_loss = forward(p)
    body = [f"batch = each_tensor(lambda t: t.to(device{move}), batch)",
            "seen += samples_in(batch)"] + p.extra["batch"] + before
    if p.varied:  # read on the host before the move: reading .shape never waits for the device
        body = ["shape = shape_of(batch)",
                "if shape not in shapes:  # a new input shape: its first call is a one-time cost",
                "    shapes.add(shape)",
                "    if step >= warmup_steps:  # inside the timed window: its step is timed apart",
                "        new_in_window += 1",
                "        if first_call is None:",
                "            sync()",
                "            first_call = (time.perf_counter(), seen)", *body]
    contexts = p.extra["forward"]
    compute = [f"with {', '.join(contexts)}:", "    " + compute_loss] if contexts else [compute_loss]
    scaled = "loss / accum_steps" if p.accum > 1 else "loss"
    compute.append(f"scaler.scale({scaled}).backward()" if p.extra["scaler"] else f"({scaled}).backward()"
                   if p.accum > 1 else "loss.backward()")
    if p.fsdp and p.accum > 1:  # FSDP2's no_sync: no reduce-scatter until the last micro-batch
        return [*body, f"{p.model}.set_requires_gradient_sync((micro + 1) % accum_steps == 0)", *compute]
    if p.ddp and p.extra["no_sync"] and p.accum > 1:  # ddp_no_sync's code hook
        return body + ["last_micro = (micro + 1) % accum_steps == 0",
                       "# no all-reduce until the last micro-batch of the optimizer step",
                       "with contextlib.nullcontext() if last_micro else ddp_model.no_sync():"] + [
            "    " + line for line in compute]
    return body + compute


def optimizer_step(p: Program) -> list[str]:
    """The knobs' before-step code (gradients unscaled first), the step, zero_grad, the window."""
    scaler = bool(p.extra["scaler"])
    update = (["scaler.unscale_(optimizer)  # the hooks below see the true gradients"]
              if p.extra["before_step"] and scaler else []) + p.extra["before_step"]
    update += ["scaler.step(optimizer)", "scaler.update()"] if scaler else ["optimizer.step()"]
    update += ["optimizer.zero_grad(set_to_none=True)"]
    if p.varied:  # the step that met a new shape leaves the timed window: its seconds and samples
        update += ["if first_call is not None:  # it met a new shape: its time and samples leave the timed window",
                   "    sync()", "    spent = time.perf_counter() - first_call[0]",
                   "    first_s, t0, seen0 = first_s + spent, t0 + spent, seen0 + seen - first_call[1]",
                   "    first_call, left_out = None, left_out + 1"]
    update += ["step += 1", "if step == warmup_steps:  # the timed window starts",
               "    sync()", "    t0, seen0 = time.perf_counter(), seen", "if step == num_steps:", "    break"]
    return update


def script_warmup(knobs: Any, warmup: int = 5) -> int:
    """Untimed steps the script `knobs.to_code(warmup=...)` runs (given enough `steps`): at least
    `warmup`, and as many as a quiet trial's steady warm-up (steady.planned_warmup, no memory
    probe), so the script drains the loader's buffer before its window as a trial does."""
    told = traits(knobs)  # the data knobs' traits: workers and the batches they buffer
    workers = told["workers"]
    return planned_warmup(warmup, num_workers=workers, prefetch_factor=told["buffered_batches"] // workers
                          if workers else None, accum_steps=knobs.accum_steps)


def warmup_line(p: Program) -> str:
    """`warmup_steps = N  # why`: the steady warm-up of a trial, capped to leave one timed step."""
    warm = min(script_warmup(p.k, p.warmup), p.steps - 1)
    if shape_pass(p):
        return (f"warmup_steps = {p.steps - shape_pass(p)}  # not timed: start-up, compilation, then one pass over "
                "the sample the timed window repeats (every input shape's first call)")
    if warm <= p.warmup:
        return f"warmup_steps = {warm}  # not timed: start-up, compilation"
    told = traits(p.k)
    drained = (f"the loader's {told['workers']} workers' {told['buffered_batches']} buffered batches drained, "
               if told["workers"] else "")
    return (f"warmup_steps = {warm}  # not timed: start-up, compilation, {drained}then steps without a trend "
            "(a workbench trial's steady warm-up)")


def loop(p: Program) -> list[str]:
    """The training loop over epochs (set_epoch under DDP), timed after `warmup` steps."""
    body = micro_batch(p)
    update = optimizer_step(p)
    if p.accum > 1:
        body += ["micro += 1", "if micro % accum_steps == 0:"] + ["    " + u for u in update]
    else:
        body += update
    out = ["", "", "def sync():", '    """Wait for queued GPU work, so the clock measures it."""',
           '    if device.type == "cuda":', "        torch.cuda.synchronize()", "", "",
           f"num_steps = {p.steps}", warmup_line(p),
           "step = micro = seen = 0" if p.accum > 1 else "step = seen = 0",
           "t0, seen0 = time.perf_counter(), 0", f"{p.model}.train()"]
    if p.varied:
        out.insert(-1, "shapes, new_in_window = set(), 0  # input shapes met; those first met in the timed window")
        out.insert(-1, "first_s, first_call, left_out = 0.0, None, 0  # those steps: seconds; (start, samples) of one; count")
    if p.ddp:
        out += ["epoch = 0", "while step < num_steps:", "    sampler.set_epoch(epoch)  # a new shuffle each epoch",
                "    epoch += 1", "    for batch in loader:"]
    else:
        out += ["while step < num_steps:", "    for batch in loader:"]
    out += [textwrap.indent(line, " " * 8) for line in body] + ["sync()"]
    if p.ddp:
        out += ["rate = (seen - seen0) / (time.perf_counter() - t0) * dist.get_world_size()  # every rank: one shard",
                "if dist.get_rank() == 0:",
                '    print(f"{rate:.1f} samples/s (all ranks) over {num_steps - warmup_steps} timed steps")',
                "",
                "# Every rank done with its collectives, and the DDP reducer (which holds the group) gone",
                "# before the group is: a gloo group torn down at interpreter exit can abort the process.",
                "dist.barrier()",
                "del step_model" if p.fsdp else "del step_model, ddp_model",
                "dist.destroy_process_group()"]
    elif p.varied:
        out += ['print(f"{(seen - seen0) / (time.perf_counter() - t0):.1f} samples/s over '
                '{num_steps - warmup_steps - left_out} timed steps; "', '      f"{len(shapes)} input shapes, {new_in_window} first seen in the timed window '
                '({first_s:.2f} s one-time, left out)")']
    else:
        out.append('print(f"{(seen - seen0) / (time.perf_counter() - t0):.1f} samples/s '
                   'over {num_steps - warmup_steps} timed steps")')
    return out
