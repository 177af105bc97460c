"""Memory-bound demo: residual MLP blocks whose activations, not parameters, fill the memory.

Each block widens a narrow stream (dim) to a wide hidden layer (hidden) for a large batch, so the
saved activations (batch x hidden per block) dwarf the weights. Checkpointing every block
(`bench.run(checkpoint=bench.blocks)`) keeps only each block's narrow input and recomputes the
rest in backward: a several-fold lower peak for roughly one extra forward of time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from .parts import workbench_parts

DESCRIPTION = ("memory-bound: wide residual MLP blocks on a large batch; activations dominate, so "
               "checkpoint=bench.blocks cuts the peak several-fold for extra time")

SIZES = {
    # samples, batch size, stream width, hidden width, number of blocks
    "tiny": dict(samples=256, batch_size=64, dim=16, hidden=64, depth=2),
    "default": dict(samples=8192, batch_size=1024, dim=32, hidden=512, depth=8),
}


def make_regression(samples: int, dim: int, seed: int = 0) -> TensorDataset:
    """Inputs x ~ N(0, 1) of shape (N, dim) and a smooth nonlinear target y = sin(x A) B, (N, 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dim, generator=g)
    a = torch.randn(dim, 8, generator=g) / dim**0.5
    b = torch.randn(8, 1, generator=g) / 8**0.5
    return TensorDataset(x, torch.sin(2 * x @ a) @ b)


class MLPBlock(nn.Module):
    """Pre-norm residual block: x + W2 gelu(W1 LN(x)); keeps (batch, hidden) activations for backward."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    """`depth` MLP blocks in a ModuleList (each one a checkpointing candidate) and a linear head."""

    def __init__(self, dim: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(dim, hidden) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # (B, 1)



def build(size: str) -> dict[str, Any]:
    """Generate the regression data and the model (both seeded) and return the Workbench's parts."""
    cfg = SIZES[size]
    return workbench_parts(lambda: ResidualMLP(cfg["dim"], cfg["hidden"], cfg["depth"]),
                           make_regression(cfg["samples"], cfg["dim"]), loss_fn=nn.MSELoss(), lr=1e-3,
                           batch_size=cfg["batch_size"])
