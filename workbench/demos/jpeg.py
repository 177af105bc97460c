"""Data-bound demo: in-memory JPEGs decoded and augmented per sample, feeding a tiny CNN.

The model is cheap, so most of each step is `__getitem__` (decode, crop, rotate, flip, jitter).
Lessons on a small CPU: worker processes move that work off the training loop, but only pay when
the main process's intra-op threads stop fighting them for cores (`num_workers=2, cpu_threads=1`
on 2 cores); `persistent_workers=True` saves the re-fork at every epoch boundary.

The Dataset is module-level and holds plain bytes, so workers can fork or spawn it.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import Dataset

from .parts import workbench_parts

DESCRIPTION = ("data-bound: per-sample JPEG decode + augmentation dominates the step; try num_workers "
               "with cpu_threads (cores are shared) and persistent_workers")

CLASSES = ("circle", "square", "triangle", "stripes", "checker", "ring")
PALETTE = np.array([(230, 40, 40), (40, 200, 40), (40, 60, 230), (230, 220, 40), (220, 40, 220), (40, 220, 220)], float)
MEAN, STD = 0.5, 0.25  # normalisation of [0, 1] pixels
SIZES = {
    # images (encoded once), stored px, crop output px, batch size, CNN width
    "tiny": dict(images=48, stored=40, out=32, batch_size=8, width=8),
    "default": dict(images=384, stored=128, out=96, batch_size=32, width=16),
}


def make_image(rng: np.random.Generator, label: int, px: int) -> Image.Image:
    """One procedurally drawn RGB image of class `label`: a shape in the class's colour on a noisy gradient."""
    # Background: a random two-colour gradient plus per-pixel noise (texture for the JPEG codec).
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = np.linspace(0.0, 1.0, px, dtype=np.float32)[None, :, None]  # (1, px, 1)
    bg = a * (1 - t) + b * t + rng.normal(0, 12, (px, px, 3))
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    # Shape colour: the class's palette colour plus noise, so the tiny CNN learns within one trial.
    fill = tuple(int(c) for c in np.clip(PALETTE[label] + rng.normal(0, 25, 3), 0, 255))
    r = rng.uniform(0.2, 0.35) * px  # shape radius in px
    cx, cy = rng.uniform(r, px - r, 2)
    box = (cx - r, cy - r, cx + r, cy + r)
    name = CLASSES[label]
    if name == "circle":
        draw.ellipse(box, fill=fill)
    elif name == "square":
        draw.rectangle(box, fill=fill)
    elif name == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    elif name == "stripes":
        step = max(2, int(r / 3))
        for x in range(int(cx - r), int(cx + r), 2 * step):
            draw.rectangle((x, cy - r, x + step - 1, cy + r), fill=fill)
    elif name == "checker":
        step = max(2, int(r / 2))
        for i, x in enumerate(range(int(cx - r), int(cx + r), step)):
            for j, y in enumerate(range(int(cy - r), int(cy + r), step)):
                if (i + j) % 2 == 0:
                    draw.rectangle((x, y, x + step - 1, y + step - 1), fill=fill)
    else:  # ring
        draw.ellipse(box, outline=fill, width=max(2, int(r / 4)))
    return img


def encode_images(count: int, px: int, seed: int = 0) -> tuple[list[bytes], list[int]]:
    """`count` JPEG-encoded images (quality 90) with balanced class labels, deterministic."""
    rng = np.random.default_rng(seed)
    jpegs, labels = [], []
    for i in range(count):
        label = i % len(CLASSES)
        buf = io.BytesIO()
        make_image(rng, label, px).save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())
        labels.append(label)
    return jpegs, labels


class JpegDataset(Dataset):
    """Map-style dataset of JPEG bytes; `__getitem__` decodes and augments (the slow part).

    Randomness comes from torch's RNG, which the DataLoader seeds per worker and the trial seeds
    in the main process, so augmentations are reproducible for a given seed.
    """

    def __init__(self, jpegs: list[bytes], labels: list[int], out: int) -> None:
        self.jpegs = jpegs
        self.labels = labels
        self.out = out  # output side in px

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.open(io.BytesIO(self.jpegs[i])).convert("RGB")  # JPEG decode
        u = torch.rand(6).tolist()  # crop scale, crop x, crop y, flip, brightness, contrast
        angle = 20 * torch.rand(()).item() - 10  # small rotation, degrees
        img = img.rotate(angle, resample=Image.Resampling.BILINEAR)
        side = int(img.width * (0.6 + 0.4 * u[0]))  # random-resized crop: 60-100% of the side
        x0, y0 = int((img.width - side) * u[1]), int((img.height - side) * u[2])
        img = img.crop((x0, y0, x0 + side, y0 + side)).resize((self.out, self.out), Image.Resampling.BILINEAR)
        if u[3] < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)  # (3, out, out)
        mean = x.mean()
        x = (x - mean) * (0.8 + 0.4 * u[5]) + mean * (0.8 + 0.4 * u[4])  # contrast, brightness jitter
        return (x - MEAN) / STD, self.labels[i]


def conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 2) -> nn.Sequential:
    """Convolution + BatchNorm + ReLU; the default 3x3 stride 2 halves the side."""
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=(kernel - stride + 1) // 2, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU())


class TinyCNN(nn.Module):
    """A 4x4 stride-4 patch stem, two stride-2 conv blocks, average pool, linear head: cheap next to the data."""

    def __init__(self, width: int, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.blocks = nn.Sequential(conv_bn(3, width, kernel=4, stride=4), conv_bn(width, 2 * width), conv_bn(2 * width, 4 * width))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)  # (B, 4*width, out/16, out/16)
        return self.head(x.mean(dim=(2, 3)))



def build(size: str) -> dict[str, Any]:
    """Encode the images once (deterministic) and return the Workbench's parts."""
    cfg = SIZES[size]
    jpegs, labels = encode_images(cfg["images"], cfg["stored"])
    return workbench_parts(lambda: TinyCNN(cfg["width"]), JpegDataset(jpegs, labels, cfg["out"]),
                           loss_fn=nn.CrossEntropyLoss(), lr=3e-3, batch_size=cfg["batch_size"])
