"""A knob of your own, end to end: a model with two attention paths (naive softmax(QK^T)V and
torch's scaled_dot_product_attention) gets an `attention` knob with @wb.knob, runs trials under
both, and the comparison says whether the gap is beyond this machine's noise.

    PYTHONPATH=. python benchmarks/user_knob_attention.py [--rounds 2]

Prints the two samples/s, the verdict, the results columns and the generated code's knob lines.
Speed depends on the machine and its load: record `uptime` with any figure you quote.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F

import workbench as wb


class Attention(nn.Module):
    """Multi-head self-attention with a switchable kernel: `impl` is "naive" or "sdpa"."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.out, self.heads, self.impl = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads, "naive"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        if self.impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the textbook path: materialises the t x t score matrix
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class TwoPathModel(nn.Module):
    """Embedding, two attention blocks, a head; `set_attention` switches every block's kernel."""

    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4, depth: int = 2) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)
        self.blocks = nn.ModuleList(Attention(dim, heads) for _ in range(depth))

    def set_attention(self, impl: str) -> None:
        for block in self.blocks:
            block.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h).mean(1)


@wb.knob(choices=["naive", "sdpa"], default="naive", help="attention implementation")
def attention(model, value):  # applied to each trial's fresh copy of the model
    model.set_attention(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="extra alternating trials per side for the verdict")
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randint(0, 64, (512, args.seq), generator=g),
                                          torch.randint(0, 64, (512,), generator=g))
    bench = wb.Workbench(TwoPathModel(), data, loss_fn=nn.CrossEntropyLoss(),
                         optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), log=None, steps=10, warmup_steps=2,
                         knobs=wb.Knobs(batch_size=16), name="two-path")
    try:
        bench.run(attention="flash")
    except ValueError as e:
        print("bad value, before any trial:", e, f"(trials: {len(bench.trials)})")
    naive, sdpa = bench.run(attention="naive"), bench.run(attention="sdpa")
    print(f"naive {naive.samples_per_s:.1f} samples/s, sdpa {sdpa.samples_per_s:.1f} samples/s")
    verdict = bench.compare(naive, sdpa, rounds=args.rounds)
    print("compare:", verdict)
    print(bench.results[["trial_id", "attention", "samples_per_s", "verdict"]].to_string())
    print("Knobs:", sdpa.knobs, "| tunable:", wb.tunable_knobs())
    code = sdpa.to_code()
    print("to_code() has the function:", "def attention(model, value):" in code,
          "and its call:", "model = attention(model, 'sdpa') or model" in code)
    print("load average:", os.getloadavg())


if __name__ == "__main__":
    main()
