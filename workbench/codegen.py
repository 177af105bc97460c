"""Knobs -> a plain-PyTorch training loop that reproduces the configuration outside the workbench.

One program with sections: the header, imports, the device (one process, or a torchrun rank with
DDP), the data, the model, the loop. Every knob writes into those sections through its declared
`code` hook (knobs.py: what `TrainStep` does at the same seam at run time); this module only lays
the sections out, so a new knob never edits it. With `world_size > 1` the program is a
torchrun-ready DDP script (init_process_group, a DistributedSampler with set_epoch, DDP with the
ddp_* knobs, no_sync during accumulation), or with strategy="fsdp2" an FSDP2 script (fully_shard per
shard unit, then the root; set_requires_gradient_sync during accumulation); its header and
`torchrun_command()` give the command.

The snippet expects four names to exist where it runs (rename them with keyword arguments):
`model` (nn.Module), `dataset` (a Dataset yielding (inputs..., target)), `loss_fn(output, target)`
and `make_optimizer(params)`. Only the knobs that differ from PyTorch's defaults produce code, so
the snippet stays as short as the configuration.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from .knobs import Knobs, code_sections
from .steady import planned_warmup


def _identifier(name: str, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{what} must be a Python identifier for the generated code, got {name!r}")
    return name


def torchrun_command(knobs: Knobs, script: str | None = None, *, nnodes: int = 1) -> str:
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
    """What every section needs: the knobs, their code sections, the four names and the options."""

    k: Knobs
    extra: dict[str, list[str]]
    model: str
    dataset: str
    loss_fn: str
    optimizer: str
    steps: int
    shuffle: bool
    drop_last: bool
    seed: int | None
    warmup: int
    setup: str | None

    @property
    def ddp(self) -> bool:
        return self.k.world_size > 1

    @property
    def fsdp(self) -> bool:
        return self.ddp and self.k.strategy == "fsdp2"

    @property
    def accum(self) -> int:
        return self.k.accum_steps


def knobs_to_code(knobs: Knobs, *, model: str = "model", dataset: str = "dataset", loss_fn: str = "loss_fn",
                  optimizer: str = "make_optimizer", steps: int = 100, shuffle: bool = True,
                  drop_last: bool = False, seed: int | None = None, warmup: int = 5, setup: str | None = None) -> str:
    """Python source of a training loop for `steps` optimizer steps under these knobs.

    With `seed`, the loop seeds torch and the loader's shuffle the way a trial does (same batches
    in the same order as `run_trial` with `Workbench(seed=...)`). It prints the samples/s of the
    steps after the first `warmup` (start-up and compilation are not timed), the figure a trial
    reports, so the script can referee the workbench. `warmup` is a minimum: the script warms up
    as a quiet trial does (`script_warmup`: the loader's buffer drained, then 8 steps), within
    `steps - 1`; pass `steps=script_warmup(knobs, warmup) + timed` for `timed` timed steps. With
    `world_size > 1` it is a whole DDP script for torchrun; `setup` is code placed after the imports that defines the four names
    (otherwise a comment marks where they go).
    """
    if not isinstance(knobs, Knobs):
        raise TypeError(f"knobs_to_code takes a Knobs value, got {type(knobs).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (untimed steps), got {warmup!r}")
    m = _identifier(model, "model")
    extra = {section: [line.replace("{model}", m) for line in lines]  # {model} = the model's variable
             for section, lines in code_sections(knobs).items()}
    p = Program(knobs, extra, m, _identifier(dataset, "dataset"), _identifier(loss_fn, "loss_fn"),
                _identifier(optimizer, "optimizer"), steps, shuffle, drop_last, seed, warmup, setup)
    out: list[str] = []
    for section in (header, imports, device, data, model_and_optimizer, loop):
        out += section(p)
    return "\n".join(out) + "\n"


# ---- the sections, in program order -------------------------------------------------------------
def header(p: Program) -> list[str]:
    """What the script is, what it expects, and (DDP) how to launch it and its global batch."""
    k = p.k
    out = [f"# Training loop generated by Tuning Workbench for {k}",
           f"# Expects: {p.model} (nn.Module), {p.dataset} (yields (inputs..., target)), {p.loss_fn}(output, target),",
           f"# {p.optimizer}(params) -> torch.optim.Optimizer."]
    if p.ddp:
        out += [f"# Run it on this machine:  {torchrun_command(k)}",
                f"# Or on each of 2 nodes:   {torchrun_command(k, nnodes=2)} (plus --node-rank=0|1)",
                f"# Global batch per optimizer step = {k.batch_size} per rank x {k.accum_steps} accumulated x "
                f"{k.world_size} ranks = {k.batch_size * k.accum_steps * k.world_size}; scale the learning rate "
                "with it."]
    return out + p.extra["header"]


def imports(p: Program) -> list[str]:
    """The imports, then the knobs' helper functions (your @wb.knob functions among them)."""
    out = ["import contextlib", "import os", ""] if p.ddp else []
    out += ["import time", "", "import torch", "from torch.utils.data import DataLoader"]
    if p.ddp:
        out += ["import torch.distributed as dist"]
        out += [] if p.fsdp else ["from torch.nn.parallel import DistributedDataParallel as DDP"]
        out += ["from torch.utils.data.distributed import DistributedSampler"]
    out += list(dict.fromkeys(p.extra["imports"]))
    for source in dict.fromkeys(p.extra["functions"]):
        out += ["", "", source]
    return out


def device(p: Program) -> list[str]:
    """The device: one process (CUDA if present), or this torchrun rank's (process group first)."""
    if p.ddp:
        where = p.setup.rstrip() if p.setup else (f"# ---- define {p.model}, {p.dataset}, {p.loss_fn} and "
                                                   f"{p.optimizer} here (or import them) ----")
        out = ["", where, "",
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


def data(p: Program) -> list[str]:
    """The DataLoader (each rank its own shard under DDP) with the knobs' loader keywords."""
    out: list[str] = []
    args = [p.dataset, f"batch_size={p.k.batch_size}"]
    if p.ddp:  # each rank reads its own shard; set_epoch reshuffles every epoch, alike on all ranks
        out += ["", f"sampler = DistributedSampler({p.dataset}, shuffle={p.shuffle}, seed={int(p.seed or 0)})"]
        args.append("sampler=sampler")
    else:
        args.append(f"shuffle={p.shuffle}")
    if p.drop_last:
        args.append("drop_last=True")
    if p.seed is not None and not p.ddp:
        args.append(f"generator=torch.Generator().manual_seed({int(p.seed)})")
    out += ["", "loader = DataLoader(" + ", ".join(args + p.extra["loader_args"]) + ")"]
    return out


def model_and_optimizer(p: Program) -> list[str]:
    """The model on the device with the knobs' model code, (DDP), the optimizer, the step's model."""
    m, out = p.model, ["", f"{p.model} = {p.model}.to(device)"]
    out += p.extra["model"]
    wrapped = m
    out += p.extra["shard"]  # FSDP2: fully_shard in place (the optimizer below sees the sharded parameters)
    if p.ddp and not p.fsdp:
        out += ["# all-reduces gradients in buckets during backward", "ddp_model = DDP(", f"    {m},",
                '    device_ids=[local_rank] if device.type == "cuda" else None,']
        for arg in p.extra["ddp_args"]:  # the ddp_* knobs' declared code (knobs.py)
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


def micro_batch(p: Program) -> list[str]:
    """One micro-batch: device move, the batch code, forward + loss under the forward contexts,
    backward (through the scaler), inside no_sync on all but the last micro-batch under DDP."""
    move = "non_blocking=True" if p.k.pin_memory else ""
    body = [f"*inputs, target = [t.to(device{', ' + move if move else ''}) for t in batch]",
            "seen += len(target)"] + p.extra["batch"]
    forward = f"loss = {p.loss_fn}(step_model(*inputs), target)"
    contexts = p.extra["forward"]
    compute = [f"with {', '.join(contexts)}:", "    " + forward] if contexts else [forward]
    scaled = "loss / accum_steps" if p.accum > 1 else "loss"
    compute.append(f"scaler.scale({scaled}).backward()" if p.extra["scaler"] else f"({scaled}).backward()"
                   if p.accum > 1 else "loss.backward()")
    if p.fsdp and p.accum > 1:  # FSDP2's no_sync: no reduce-scatter until the last micro-batch
        return [*body, f"{p.model}.set_requires_gradient_sync((micro + 1) % accum_steps == 0)", *compute]
    if p.ddp and p.k.ddp_no_sync and p.accum > 1:
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
    update += ["optimizer.zero_grad(set_to_none=True)", "step += 1", "if step == warmup_steps:  # the timed window starts",
               "    sync()", "    t0, seen0 = time.perf_counter(), seen", "if step == num_steps:", "    break"]
    return update


def script_warmup(knobs: Knobs, warmup: int = 5) -> int:
    """Untimed steps the script `knobs.to_code(warmup=...)` runs (given enough `steps`): at least
    `warmup`, and as many as a quiet trial's steady warm-up (steady.planned_warmup, no memory
    probe), so the script drains the loader's buffer before its window as a trial does."""
    return planned_warmup(warmup, num_workers=knobs.num_workers, prefetch_factor=knobs.prefetch_factor,
                          accum_steps=knobs.accum_steps)


def warmup_line(p: Program) -> str:
    """`warmup_steps = N  # why`: the steady warm-up of a trial, capped to leave one timed step."""
    warm = min(script_warmup(p.k, p.warmup), p.steps - 1)
    if warm <= p.warmup:
        return f"warmup_steps = {warm}  # not timed: start-up, compilation"
    drained = (f"the loader's {p.k.num_workers} workers x {p.k.prefetch_factor or 2} buffered batches drained, "
               if p.k.num_workers else "")
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
    else:
        out.append('print(f"{(seen - seen0) / (time.perf_counter() - t0):.1f} samples/s '
                   'over {num_steps - warmup_steps} timed steps")')
    return out
