"""stepshape.py: the step's shape read from one batch, described, and read back from untrusted logs."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset

from workbench.core.stepshape import StepShape, function_path, shape_of
from workbench.core.workload import loader_spec


def module_level_step(model, batch):
    return model(batch).sum()


def spec_of(data=None):
    return loader_spec(data if data is not None else TensorDataset(torch.zeros(4, 2), torch.zeros(4)))


@pytest.mark.parametrize("batch, has_loss_fn, kind, loss, splits", [
    ((torch.zeros(2, 3), torch.zeros(2)), True, "tuple", "loss_fn", True),
    ([torch.zeros(2, 3)], True, "tuple", "loss_fn", False),  # one item: the loss_fn gets the output alone
    ((torch.zeros(2, 3), torch.zeros(2)), False, "tuple", "model", False),
    ({"input_ids": torch.zeros(2, 3), "labels": torch.zeros(2)}, False, "dict", "model", False),
    (torch.zeros(2, 3), True, "tensor", "loss_fn", False),
    (collections.namedtuple("B", "x y")(torch.zeros(2), torch.zeros(2)), True, "tensor", "loss_fn", False),
])
def test_shape_follows_the_batch_and_the_loss(batch, has_loss_fn, kind, loss, splits):
    shape = shape_of(batch, has_loss_fn=has_loss_fn, step_fn=None, spec=spec_of())
    assert (shape.batch, shape.loss, shape.splits_target) == (kind, loss, splits)
    assert "loss" in shape.describe()


def test_nested_batches_and_keys_are_seen():
    shape = shape_of({"inputs": {"x": torch.zeros(2)}, "labels": torch.zeros(2)}, has_loss_fn=False, step_fn=None,
                     spec=spec_of())
    assert shape.nested and shape.keys == ("inputs", "labels")
    assert "nested" in shape.describe() and "inputs, labels" in shape.describe()


def test_loader_sampling_is_read_from_the_users_dataloader():
    data = TensorDataset(torch.zeros(4, 2), torch.zeros(4))
    custom = DataLoader(data, sampler=list(range(4)), collate_fn=lambda b: b, drop_last=True)
    shape = shape_of((1, 2), has_loss_fn=True, step_fn=None, spec=spec_of(custom))
    assert shape.sampler and shape.collate_fn and shape.drop_last and not shape.shuffle
    plain = shape_of((1, 2), has_loss_fn=True, step_fn=None, spec=spec_of(DataLoader(data, sampler=SequentialSampler(data))))
    assert not (plain.sampler or plain.collate_fn or plain.shuffle)


def test_a_step_fn_is_imported_by_path_or_refused_with_the_fix():
    assert function_path(module_level_step) == (f"{__name__}:module_level_step", None)
    path, why = function_path(lambda m, b: m(b).sum())
    assert path is None and "lambda" in why and "module" in why
    scale = 2.0

    def closure(model, batch):
        return model(batch).sum() * scale

    path, why = function_path(closure)
    assert path is None and "closure over scale" in why
    notebook = type(module_level_step)(module_level_step.__code__, {"__name__": "__main__"})
    notebook.__module__ = "__main__"
    assert function_path(notebook) == (None, None)  # defined in the notebook: called by name


def test_records_round_trip_and_untrusted_ones_are_refused():
    shape = StepShape(batch="dict", loss="step_fn", items=0, keys=("a", "b"), step_fn="pkg.mod:step",
                      factory="demo:mlp-memory:tiny", sampler=True)
    assert StepShape.from_record(shape.to_record()) == shape
    assert StepShape.from_record(None) is None
    assert StepShape.from_record({"batch": "pickle", "loss": "model"}) is None
    assert StepShape.from_record({"batch": "tuple", "loss": "model", "items": "2"}) is None
    hostile = StepShape.from_record({**shape.to_record(), "step_fn": "os:system; rm -rf /", "factory": "x y:z"})
    assert hostile.step_fn is None and hostile.factory is None  # never rendered into an import line
