"""Compute-bound demo: a small ResNet-style convnet with BatchNorm on cached image tensors.

The data is already a tensor in RAM (TensorDataset), so the step is forward + backward of the
convolutions. Knobs that act on compute: `channels_last`, `amp="bf16"`, `cpu_threads`,
`compile`. Whether bf16 pays depends on the hardware (bf16 units: recent GPUs, AVX512-BF16/AMX
CPUs); on a CPU without them it can be slower than fp32, and the workbench will say so.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from .parts import workbench_parts

DESCRIPTION = ("compute-bound: a small ResNet on cached tensors; try channels_last, amp='bf16', "
               "cpu_threads and compile (bf16 only pays on hardware with bf16 units)")

CLASSES = 10
SIZES = {
    # samples, image side in px, batch size, channel widths of the stem and the three stages (, blocks per stage)
    "tiny": dict(samples=64, px=16, batch_size=8, widths=(8, 8, 16, 16)),
    "default": dict(samples=512, px=64, batch_size=32, widths=(16, 16, 32, 64)),
    # a CUDA device (demos.size_for): ResNet-18's widths and depth at 128 px, so the convolutions (not the
    # host's launches and copies) fill the step: where bf16 and channels_last pay on tensor cores
    "cuda": dict(samples=1024, px=128, batch_size=64, widths=(64, 128, 256, 512), depth=2),
}


def make_images(samples: int, px: int, seed: int = 0) -> TensorDataset:
    """Learnable random images: a fixed smooth pattern per class plus noise; (N, 3, px, px) float32."""
    g = torch.Generator().manual_seed(seed)
    # One low-frequency pattern per class: an 8x8 random image upsampled to px x px.
    coarse = torch.randn(CLASSES, 3, 8, 8, generator=g)
    patterns = nn.functional.interpolate(coarse, size=(px, px), mode="bilinear", align_corners=False)
    labels = torch.arange(samples) % CLASSES
    images = patterns[labels] + 1.5 * torch.randn(samples, 3, px, px, generator=g)
    return TensorDataset(images, labels)


class ResBlock(nn.Module):
    """Two 3x3 convs with BatchNorm and a shortcut (1x1 conv when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class SmallResNet(nn.Module):
    """Stem (stride 2) -> residual stages (side px/2, px/4, px/8) -> average pool -> linear."""

    def __init__(self, widths: tuple[int, int, int, int], classes: int = CLASSES, depth: int = 1) -> None:
        super().__init__()
        stem, w1, w2, w3 = widths
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(stem), nn.ReLU())
        blocks = []
        for cin, cout, stride in ((stem, w1, 1), (w1, w2, 2), (w2, w3, 2)):  # `depth` blocks per stage
            blocks += [ResBlock(cin, cout, stride)] + [ResBlock(cout, cout, 1) for _ in range(depth - 1)]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(w3, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))  # (B, w3, px/8, px/8)
        return self.head(x.mean(dim=(2, 3)))



def build(size: str) -> dict[str, Any]:
    """Generate the cached tensors and the model (both seeded) and return the Workbench's parts."""
    cfg = SIZES[size]
    return workbench_parts(lambda: SmallResNet(cfg["widths"], depth=cfg.get("depth", 1)),
                           make_images(cfg["samples"], cfg["px"]),
                           loss_fn=nn.CrossEntropyLoss(), lr=3e-3, batch_size=cfg["batch_size"])
