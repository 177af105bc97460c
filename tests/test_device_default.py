"""Tests not about the device run on the CPU of a GPU machine too (issue 48 item 6): WORKBENCH_DEVICE
(set to cpu by tests/conftest.py) is what device="auto" means; `@pytest.mark.any_device` opts out."""

from __future__ import annotations

import os

import pytest
import torch

from workbench.core.workload import DEVICE_ENV, resolve_device


def test_the_suite_runs_auto_on_the_cpu():
    assert os.environ.get(DEVICE_ENV) == "cpu"
    assert resolve_device("auto") == torch.device("cpu")


def test_workbench_device_names_what_auto_means_and_a_bad_value_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert resolve_device("auto").type == "cpu" and resolve_device("cpu").type == "cpu"
    monkeypatch.setenv(DEVICE_ENV, "bogus")
    with pytest.raises(ValueError, match="WORKBENCH_DEVICE='bogus'"):
        resolve_device("auto")
    monkeypatch.setenv(DEVICE_ENV, "auto")
    found = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert resolve_device("auto").type == found  # "auto" in WORKBENCH_DEVICE: the usual pick


@pytest.mark.any_device
@pytest.mark.skipif(not torch.cuda.is_available(), reason="about the CUDA path: needs a visible CUDA device")
def test_a_device_test_keeps_auto_and_gets_the_gpu():
    assert DEVICE_ENV not in os.environ
    assert resolve_device("auto").type == "cuda"
