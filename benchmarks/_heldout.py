"""A held-out tuning workload (no demo): a CNN fed by a Dataset that augments in `__getitem__`.

Written for bench_tune.py as a workload the tuner's authors did not shape: random crop, flip and
brightness jitter per sample in the main process (so workers × threads matter), and a conv stack
whose speed depends on batch size and memory layout together (channels_last pays at larger
batches), the two-knob interaction a one-change-at-a-time search misses. A benchmark helper.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

import workbench as wb


class Augmenting(Dataset):
    """Stored 80 px images; each item is a random 64 px crop, flipped and brightness-jittered."""

    def __init__(self, n: int = 768, px: int = 80, out: int = 64, classes: int = 10) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, px, px, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.px, self.out = px, out

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.images[i], self.labels[i]
        top, left = torch.randint(0, self.px - self.out + 1, (2,)).tolist()
        x = x[:, top:top + self.out, left:left + self.out]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        x = (x * (0.8 + 0.4 * torch.rand(()))).clamp(0, 1)
        x = nn.functional.avg_pool2d(nn.functional.pad(x[None], (1, 1, 1, 1), mode="reflect"), 3, 1)[0]  # a blur
        return (x - 0.5) / 0.25, y


def model(classes: int = 10) -> nn.Module:
    """Four conv-BN-ReLU stages, then a linear head."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    cin = 3
    for cout, stride in ((24, 2), (48, 1), (64, 2), (96, 2)):
        layers += [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def bench(steps: int = 10, warmup_steps: int = 3) -> wb.Workbench:
    """A Workbench on the held-out workload (batch 32, no workers: a new user's starting point)."""
    return wb.Workbench(model(), Augmenting(), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), log=None, name="heldout-augment",
                        steps=steps, warmup_steps=warmup_steps, knobs=wb.Knobs(batch_size=32), device="cpu")
