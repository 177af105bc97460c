"""tune(budget_s=120) from a Trainer's own settings on skewed-length data (issue 41's benchmark).

A tiny GPT-2 from a config, a word-level tokenizer built here (no download), 2,048 texts with Pareto
lengths (most short, a few long), `DataCollatorForLanguageModeling`, `TrainingArguments(
per_device_train_batch_size=16)`. The workbench starts from the Trainer's arguments; the tuner races
candidates for `budget_s` seconds. Prints the tokens/s the tuner reached against the start, its decision
(faster / same / undecided, and the rate it decided on), the knobs it chose, the machine, date and load.
Run:
    flock -x /tmp/cpu.lock .venv/bin/python benchmarks/bench_hf_tune.py [budget_s]
"""

from __future__ import annotations

import datetime
import os
import random
import statistics
import subprocess
import sys
import warnings

import torch

import workbench as wb

N_TEXTS, BUDGET_S = 2048, float(sys.argv[1]) if len(sys.argv) > 1 else 120.0


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    except (OSError, subprocess.SubprocessError):
        name = "?"
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


def trainer() -> tuple[object, float]:
    """The user's Trainer on skewed-length texts, and the data's mean length in tokens."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(60)]
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]")
    rng = random.Random(3)
    lengths = [min(96, max(2, int(6 * rng.paretovariate(1.4)))) for _ in range(N_TEXTS)]
    data = [dict(tok(" ".join(rng.choice(words) for _ in range(n)))) for n in lengths]
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    args = transformers.TrainingArguments(output_dir="/tmp/wb-bench-hf", use_cpu=True, report_to=[],
                                          save_strategy="no", per_device_train_batch_size=16)
    t = transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=args, train_dataset=data,
                             data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False))
    return t, statistics.mean(len(d["input_ids"]) for d in data)


def main() -> None:
    load0 = os.getloadavg()
    start = datetime.datetime.now(datetime.timezone.utc)
    t, mean = trainer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bench = wb.Workbench.from_trainer(t, log=None)
    k0 = bench.defaults
    res = bench.tune(budget_s=BUDGET_S, progress=False)
    print(res, "\n", flush=True)
    s, b = res.start, res.best
    c = res.confirmation
    print(f"start: {k0.label()}: {s.tokens_per_s:,.0f} tokens/s, padding {s.padding_share:.0%} "
          f"(data mean {mean:.1f} tokens)")
    kept = res.best_knobs.label(k0)
    reached = 1.0 if res.best_knobs == k0 else b.tokens_per_s / s.tokens_per_s
    print(f"kept:  {kept}: tokens/s speedup reached {reached:.2f}x; decision {res.answer}")
    if c is not None:  # the best rival against the start, and how it was decided
        print(f"best rival: {c.speedup:.2f}x (95% interval {c.low:.2f}..{c.high:.2f}) on {c.rate} ({c.method}): {c.verdict}")
    print(f"{res.trials_used} trials in {res.seconds:.0f} s (budget {BUDGET_S:.0f} s)")
    print(f"{start:%Y-%m-%d %H:%M} UTC; {machine()}; load {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
