"""The trial's number against the script's: five real Hugging Face architectures (and the cnn demo), each
trial against the script `to_code()` exports from it, run as written in a fresh `python` process.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_script_truth.py [--rounds 3] [--archs vit bert ...] \
        [--sides worker kernel] [--steps 30] [--script-steps 100]

Per architecture, two knob sets: the defaults at batch 16 and batch 64 (the speedup knob, batch x4).
Before any trial, this process runs torch on its main thread and on a second thread (what a notebook
does when it tries the model in a cell, or when another workbench's analysis ran): the kernel's past.
Each round then runs, alternating the order (A B, B A, ...), the trial on every side asked for and the
exported script of the worker's trial:
  worker  the default: the trial in the workbench's worker process (launch/local.py)
  kernel  the trial in this process (`trials_in="kernel"`), to show what the worker removes
  script  `result.to_code()` (its allocator mode as the trial's process ran), a fresh process
Reported per architecture: each side's median samples/s at both batches, trial/script, the speedups,
and the speedups' ratio with a 95% interval over rounds; with the machine, threads, OpenMP runtime
and the load before and after. Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

import workbench as wb
from workbench.core.codegen import script_warmup
from workbench.core.measure import environment
from workbench.core.system import allocator_env
from workbench.launch.fresh import child_env
from workbench.results.stats import t_quantile

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("llama", "t5", "vit", "resnet", "bert", "cnn")
PREAMBLE = """\
import sys

sys.path.insert(0, {folder!r})
from bench_script_truth import parts

model, dataset, loss_fn, make_optimizer = parts({arch!r})

"""


class Tokens(Dataset):
    """Seeded token sequences as dict samples (input_ids, attention_mask, labels: LM, seq2seq or class)."""

    def __init__(self, task: str, n: int = 512, seq: int = 32, vocab: int = 1000) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)
        self.out = torch.randint(1, vocab, (n, seq // 2), generator=g)
        self.cls = torch.randint(0, 2, (n,), generator=g)
        self.task = task

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = {"lm": self.ids[i], "seq2seq": self.out[i], "class": self.cls[i]}[self.task]
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": labels}


class Images(Dataset):
    """Seeded 3x32x32 images as dict samples (pixel_values, labels)."""

    def __init__(self, n: int = 512, classes: int = 10) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def parts(arch: str) -> tuple:
    """(model, dataset, loss_fn, make_optimizer) for `arch`, seeded: small configs, random init, no download."""
    import transformers as tf

    torch.manual_seed(0)
    opt = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    if arch == "cnn":
        from workbench.demos import DEMOS

        d = DEMOS["cnn"].build("default")
        return d["model"], d["data"], d["loss_fn"], d["optimizer"]
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    if arch == "llama":
        cfg = tf.LlamaConfig(vocab_size=1000, max_position_embeddings=64, num_key_value_heads=4, **small)
        return tf.LlamaForCausalLM(cfg), Tokens("lm"), None, opt
    if arch == "t5":
        cfg = tf.T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                          decoder_start_token_id=0, pad_token_id=0)
        return tf.T5ForConditionalGeneration(cfg), Tokens("seq2seq"), None, opt
    if arch == "vit":
        cfg = tf.ViTConfig(image_size=32, patch_size=4, num_labels=10, **small)
        return tf.ViTForImageClassification(cfg), Images(), None, opt
    if arch == "resnet":
        cfg = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=10)
        return tf.ResNetForImageClassification(cfg), Images(), None, opt
    if arch == "bert":
        cfg = tf.BertConfig(vocab_size=1000, max_position_embeddings=64, num_labels=2, **small)
        return tf.BertForSequenceClassification(cfg), Tokens("class"), None, opt
    raise ValueError(f"unknown architecture {arch!r}: choose from {', '.join(ARCHS)}")


def kernel_past() -> None:
    """What a notebook does before its trials: torch on the main thread and on a second thread (the
    second OpenMP team that slowed every later trial in the kernel)."""
    x = torch.randn(256, 256)
    for _ in range(20):
        x = torch.tanh(x @ x)
    t = threading.Thread(target=lambda: [torch.randn(256, 256) @ torch.randn(256, 256) for _ in range(20)])
    t.start()
    t.join()


def script_rate(arch: str, result: wb.TrialResult, workdir: Path, steps: int, warmup: int) -> float:
    """The trial's exported script, run as written in a fresh process (started in the allocator mode its
    header names); the samples/s it prints."""
    path = workdir / f"loop_{arch}.py"
    w = script_warmup(result.knobs, warmup)
    path.write_text(PREAMBLE.format(folder=str(ROOT / "benchmarks"), arch=arch) +
                    result.to_code(steps=w + steps, warmup=w))
    env = child_env(allocator_env(result.pinned_knobs().allocator or "glibc"))  # as its header's launch line says
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=900)
    m = re.search(r"([\d.]+) samples/s", out.stdout)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"the exported script of {arch} failed:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def interval(ratios: list[float]) -> str:
    """The geometric mean of per-round ratios with its 95% interval."""
    d = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if len(d) < 2:
        return f"{math.exp(d[0]):.2f}" if d else "n/a"
    mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
    h = t_quantile(0.975, len(d) - 1) * se
    return f"{math.exp(mean):.2f} ({math.exp(mean - h):.2f}…{math.exp(mean + h):.2f})"


def openmp_runtime() -> str:
    """The OpenMP library torch loaded (libgomp, libiomp5, ...), from this process's memory map."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    libs = sorted({Path(line.split()[-1]).name for line in maps.splitlines() if "omp" in line.split()[-1]})
    return ", ".join(libs) or "none found"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    p.add_argument("--sides", nargs="+", default=["worker"], choices=["worker", "kernel"])
    p.add_argument("--batches", nargs=2, type=int, default=[16, 64])
    p.add_argument("--steps", type=int, default=30, help="a trial's measured steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--script-steps", type=int, default=100, help="the script's timed steps")
    args = p.parse_args()
    load0, t0 = os.getloadavg(), time.perf_counter()
    kernel_past()
    rows = []
    malloc: set[str] = set()  # the trials' malloc state (env["malloc"]): settled before each, or not
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            model, data, loss_fn, opt = parts(arch)
            benches = {side: wb.Workbench(model, data, loss_fn=loss_fn, optimizer=opt, log=None, name=arch,
                                          steps=args.steps, warmup_steps=args.warmup, device="cpu", trials_in=side,
                                          knobs=wb.Knobs(batch_size=args.batches[0]))
                       for side in args.sides}
            rates: dict[tuple[str, int], list[float]] = {}
            for r in range(args.rounds):
                for bs in args.batches[:: 1 if r % 2 == 0 else -1]:
                    for side in args.sides[:: 1 if r % 2 == 0 else -1]:
                        res = benches[side].run(batch_size=bs, progress=False)
                        rates.setdefault((side, bs), []).append(res.samples_per_s if res.ok else float("nan"))
                        malloc.add(f"{side}: {res.env.get('malloc', '?')}")
                        if side == args.sides[0]:
                            rates.setdefault(("script", bs), []).append(
                                script_rate(arch, res, Path(tmp), args.script_steps, args.warmup))
                    line = ", ".join(f"{s} {rates[(s, bs)][-1]:,.0f}" for s in [*args.sides, "script"])
                    print(f"round {r + 1}, {arch} batch {bs}: {line} samples/s (load {os.getloadavg()[0]:.2f})",
                          flush=True)
            a, b = args.batches
            row = {"arch": arch}
            for s in [*args.sides, "script"]:
                row[f"{s} {a}"] = statistics.median(rates[(s, a)])
                row[f"{s} {b}"] = statistics.median(rates[(s, b)])
                row[f"{s} speedup"] = statistics.median(x / y for x, y in zip(rates[(s, b)], rates[(s, a)]))
            for s in args.sides:
                for bs in (a, b):
                    row[f"{s}/script {bs}"] = interval([x / y for x, y in zip(rates[(s, bs)], rates[("script", bs)])])
                row[f"{s}/script speedup"] = interval([(x1 / x0) / (y1 / y0) for x0, x1, y0, y1 in
                                                       zip(rates[(s, a)], rates[(s, b)], rates[("script", a)],
                                                           rates[("script", b)])])
            rows.append(row)
            for bench in benches.values():
                if bench._worker is not None:
                    bench._worker.close()
    import pandas as pd

    env = environment(torch.device("cpu"))
    print(f"\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {env['cpu_model']}, "
          f"{os.cpu_count()} cores ({env['cpu_capability']}), torch {env['torch']} with {torch.get_num_threads()} "
          f"threads, OpenMP {openmp_runtime()}, malloc ({'; '.join(sorted(malloc))}), Python "
          f"{platform.python_version()}; {args.rounds} rounds, trials "
          f"{args.steps} steps, scripts {args.script_steps} timed steps; load {load0[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {time.perf_counter() - t0:.0f} s")
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(pd.DataFrame(rows).round(2).to_string(index=False))


if __name__ == "__main__":
    main()
