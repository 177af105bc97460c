"""The built-in demos: each builds and trains, deterministically, and shows its bottleneck."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

import workbench as wb
from workbench.demos import DEMOS, SIZES, Demo
from workbench.faces.rebuild import demo

NAMES = ["jpeg", "cnn", "mlp-memory", "transformer"]
TINY = dict(size="tiny", log=None, steps=3, warmup_steps=1)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine two OpenMP threads stall each other when
    another process holds a core (steps 10-100x slower), and these tests check behaviour, not speed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_registry_lists_every_demo_with_a_description():
    assert list(DEMOS) == NAMES
    for name, d in DEMOS.items():
        assert isinstance(d, Demo) and d.name == name
        assert d.description and "\n" not in d.description
    assert SIZES == ("tiny", "default")


@pytest.mark.parametrize("name", NAMES)
def test_tiny_demo_builds_and_runs_ok(name):
    bench = wb.demo(name, **TINY)
    assert bench.name == f"demo-{name}"
    assert bench.blocks, "every demo offers blocks for checkpointing"
    r = bench.run()
    assert r.status == "ok", r.message
    assert len(r.losses) == 3 and all(math.isfinite(x) for x in r.losses)
    assert r.knobs.batch_size == DEMOS[name].build("tiny")["knobs"].batch_size


@pytest.mark.fixed_warmup
@pytest.mark.parametrize("name", NAMES)
def test_tiny_runs_are_deterministic(name):
    """Same seed, num_workers=0: data order, augmentations and initial weights repeat exactly."""
    a = wb.demo(name, **TINY).run(num_workers=0)
    b = wb.demo(name, **TINY).run(num_workers=0)
    assert a.losses == b.losses
    other_seed = wb.demo(name, **TINY, seed=1).run(num_workers=0)
    assert other_seed.losses != a.losses  # the seed reaches the data order (and augmentation)


def test_unknown_demo_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown demo 'resnet'.*jpeg, cnn, mlp-memory, transformer"):
        wb.demo("resnet")
    with pytest.raises(ValueError, match="tiny, default"):
        demo("cnn", size="huge")
    with pytest.raises(TypeError, match="builds its own model"):
        demo("cnn", size="tiny", model=torch.nn.Linear(2, 2))


def test_workbench_kwargs_pass_through(tmp_path):
    bench = demo("cnn", size="tiny", log=tmp_path, steps=2, warmup_steps=0, device="cpu",
                 knobs=wb.Knobs(batch_size=4))
    assert bench.steps == 2 and bench.warmup_steps == 0 and bench.device.type == "cpu"
    assert bench.defaults.batch_size == 4
    r = bench.run()
    assert r.ok and r.samples_per_step == 4
    assert (tmp_path / "demo-cnn.jsonl").exists()


@pytest.mark.fixed_warmup
def test_jpeg_runs_with_worker_processes():
    """Workers fork with the module-level dataset and collate; augmentations still seeded."""
    bench = wb.demo("jpeg", **TINY)
    r = bench.run(num_workers=2, persistent_workers=True)
    assert r.status == "ok", r.message
    again = bench.run(num_workers=2, persistent_workers=True)
    assert again.losses == r.losses


def test_jpeg_items_are_normalised_images():
    parts = DEMOS["jpeg"].build("tiny")
    x, label = parts["data"][0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert 0 <= label < 6
    assert -4 < x.mean().item() < 4


def test_transformer_uses_dict_batches_and_step_fn():
    parts = DEMOS["transformer"].build("tiny")
    item = parts["data"][0]
    assert set(item) == {"input_ids", "labels"}
    assert item["input_ids"].dtype == torch.long
    assert torch.equal(item["input_ids"][1:], item["labels"][:-1])  # labels are the next tokens
    assert parts["loss_fn"] is None and parts["step_fn"] is not None
    batch = torch.utils.data.default_collate([parts["data"][i] for i in range(4)])
    loss = parts["step_fn"](parts["model"], batch)
    assert loss.dim() == 0 and loss.requires_grad


@pytest.mark.fixed_warmup
@pytest.mark.slow
def test_mlp_memory_checkpointing_lowers_peak_threefold():
    bench = wb.demo("mlp-memory", log=None, steps=2, warmup_steps=1)  # peak comes from the warm-up step
    plain = bench.run()
    ckpt = bench.run(checkpoint=bench.blocks)
    assert plain.ok and ckpt.ok
    assert plain.peak_memory_bytes >= 3 * ckpt.peak_memory_bytes, (plain.peak_memory_bytes, ckpt.peak_memory_bytes)
    assert ckpt.losses == pytest.approx(plain.losses, rel=1e-4)  # recomputation changes memory, not maths


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_default_demo_loss_falls_within_one_trial(name):
    r = wb.demo(name, log=None).run()
    assert r.status == "ok", r.message
    assert len(r.losses) == 30
    assert statistics.mean(r.losses[-5:]) < statistics.mean(r.losses[:5]), r.losses


def test_the_default_size_is_sized_for_the_device():
    """A pure function of the device's type: CUDA gets the sizes where the lessons hold, the CPU sizes stay."""
    from workbench.demos import cnn, size_for, transformer

    for name in NAMES:
        assert size_for(name, "default", "cpu") == "default" and size_for(name, "tiny", "cuda") == "tiny"
        assert size_for(name, "default", "mps") == "default"
    assert size_for("cnn", "default", "cuda") == "cuda" == size_for("transformer", "default", torch.device("cuda", 1))
    assert size_for("jpeg", "default", "cuda") == "default" == size_for("mlp-memory", "default", "cuda:0")
    assert cnn.SIZES["default"] == dict(samples=512, px=64, batch_size=32, widths=(16, 16, 32, 64))  # the CPU sizes, exactly
    assert transformer.SIZES["default"] == dict(sequences=1024, seq_len=32, vocab=64, dim=96, heads=4, depth=3,
                                                batch_size=32)
    big = transformer.SIZES["cuda"]
    assert big["dim"] >= 512 and big["seq_len"] >= 256 and big["dim"] % big["heads"] == 0
    conv = cnn.SIZES["cuda"]
    assert min(conv["widths"]) >= 64 and conv["px"] >= 128 and conv["depth"] == 2
    model = cnn.SmallResNet(conv["widths"], depth=conv["depth"])  # ResNet-18's stages: 2 blocks each
    assert len(model.blocks) == 6 and len(cnn.SmallResNet((8, 8, 16, 16)).blocks) == 3


def test_a_demo_without_a_cuda_size_builds_its_default_and_its_script_says_so():
    """size="cuda" of a demo whose lesson holds at its default size (jpeg: data-bound anywhere) builds the
    default, and the exported script's source names the size built. (The CUDA sizes themselves are too
    big to probe on a 2-core CPU: gpu_check.py runs them.)"""
    assert demo("jpeg", size="cuda", log=None, device="cpu").step_shape.factory == "demo:jpeg:default"
    with pytest.raises(ValueError, match="tiny, default"):
        demo("jpeg", size="gpu", log=None, device="cpu")
