"""The shared benchmark workload: an MLP whose training step takes ~5 ms on a 2-core CPU."""

import torch
from torch.utils.data import TensorDataset

BATCH = 64


def make() -> tuple[torch.nn.Module, TensorDataset]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    return model, data


def optimizer(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)
