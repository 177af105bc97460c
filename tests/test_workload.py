"""Workload: validation errors that name the fix, nested batch movement, loader reuse, blocks."""

from collections import namedtuple

import pytest
import torch
from conftest import TinyNet, tiny_data
from torch.utils.data import DataLoader, SequentialSampler

import workbench as wb
from workbench.core.workload import Workload, batch_size_of, blocks_of, loader_spec, move_to, optimizer_factory

Pair = namedtuple("Pair", "x y")


def test_move_to_handles_nested_structures():
    batch = {"a": (torch.ones(2, 3), [torch.zeros(2)]), "b": Pair(torch.ones(2, 1, 4, 4), 7), "s": "text"}
    out = move_to(batch, torch.device("cpu"), channels_last=True)
    assert isinstance(out, dict) and isinstance(out["a"], tuple) and isinstance(out["a"][1], list)
    assert isinstance(out["b"], Pair) and out["b"].y == 7 and out["s"] == "text"
    assert out["b"].x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out["a"][0], batch["a"][0])


def test_batch_size_of():
    assert batch_size_of((torch.ones(5, 2), torch.ones(5))) == 5
    assert batch_size_of({"ids": torch.ones(3, 9)}) == 3
    assert batch_size_of([[torch.ones(4)], torch.ones(4)]) == 4


def test_optimizer_instance_is_rebuilt_with_its_hyperparameters():
    m = torch.nn.Linear(2, 2)
    factory = optimizer_factory(torch.optim.SGD(m.parameters(), lr=0.123, momentum=0.5))
    opt = factory(torch.nn.Linear(2, 2).parameters())
    assert isinstance(opt, torch.optim.SGD)
    assert opt.param_groups[0]["lr"] == 0.123 and opt.param_groups[0]["momentum"] == 0.5


def test_dataloader_settings_are_reused():
    ds = tiny_data(32)
    dl = DataLoader(ds, batch_size=4, shuffle=True, drop_last=True, collate_fn=None)
    spec = loader_spec(dl)
    assert spec.shuffle and spec.drop_last and spec.default_batch_size == 4
    spec2 = loader_spec(DataLoader(ds, sampler=SequentialSampler(ds)))
    assert not spec2.shuffle and spec2.sampler is None
    bench = wb.Workbench(TinyNet(), dl, loss_fn=torch.nn.CrossEntropyLoss(), log=None, steps=2, warmup_steps=0)
    assert bench.defaults.batch_size == 4


def test_model_without_parameters():
    with pytest.raises(ValueError, match="no trainable parameters"):
        Workload(torch.nn.ReLU(), tiny_data())


def test_frozen_model():
    m = TinyNet().requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad=True"):
        Workload(m, tiny_data())


def test_unknown_device():
    with pytest.raises(ValueError, match="use 'auto'"):
        Workload(TinyNet(), tiny_data(), device="tpu9")


def test_cuda_absent_names_the_fix():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="device='cpu'"):
        Workload(TinyNet(), tiny_data(), device="cuda")


def test_data_must_be_a_dataset():
    with pytest.raises(TypeError, match="TensorDataset"):
        Workload(TinyNet(), [1, 2, 3][0])


def test_loss_not_scalar(make_bench):
    with pytest.raises(TypeError, match="scalar"):
        make_bench(loss_fn=torch.nn.CrossEntropyLoss(reduction="none"))


def test_optimizer_factory_returning_something_else(make_bench):
    with pytest.raises(TypeError, match=r"torch\.optim\.SGD"):
        make_bench(optimizer=lambda p: "adam")


def test_empty_dataset(make_bench):
    with pytest.raises(ValueError, match="empty"):
        make_bench(data=tiny_data(0))


def test_model_error_at_construction_names_the_stage(make_bench):
    class Bad(TinyNet):
        def forward(self, x):
            raise RuntimeError("shape trouble")

    with pytest.raises(ValueError, match="in model: shape trouble"):
        make_bench(model=Bad())


def test_blocks_of_finds_container_children():
    assert blocks_of(TinyNet()) == {"blocks.0": 2128, "blocks.1": 2128}  # 16*64+64 + 64*16+16
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    assert list(blocks_of(seq)) == ["0", "2"]
