"""Real Hugging Face models (GPT-2, BERT from tiny configs: random init, no download) through the
whole path a user takes: wrap, trial, checkpoint blocks, export, run the script. Dict batches, and
the model computes its own loss, as `transformers` models do."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from rank_failures import job_output
from test_codegen_shapes import script_losses_for, trial_window
from torch.utils.data import Dataset

import workbench as wb

transformers = pytest.importorskip("transformers")  # the test extra installs it; the core never imports it


class Tokens(Dataset):
    """Seeded token sequences as dict samples: input_ids, attention_mask, labels (LM or class)."""

    def __init__(self, task: str, n: int = 32, seq: int = 16, vocab: int = 100) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)
        self.classes = torch.randint(0, 2, (n,), generator=g)
        self.task = task

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.ids[i] if self.task == "lm" else self.classes[i]
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": labels}


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=4, n_head=2)
    return transformers.GPT2LMHeadModel(cfg), Tokens("lm")


def bert():
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=2)
    return transformers.BertForSequenceClassification(cfg), Tokens("class")


MODELS = {"gpt2": (gpt2, "transformer.h.0"), "bert": (bert, "bert.encoder.layer.0")}
SETUP = {  # what a user pastes above the exported script: their objects
    "gpt2": ("import torch\nimport transformers\nfrom test_hf_models import gpt2\ntorch.manual_seed(0)\nmodel, dataset = gpt2()\n"
             "make_optimizer = lambda params: torch.optim.AdamW(params, lr=1e-3)\n"),
    "bert": ("import torch\nimport transformers\nfrom test_hf_models import bert\ntorch.manual_seed(0)\nmodel, dataset = bert()\n"
             "make_optimizer = lambda params: torch.optim.AdamW(params, lr=1e-3)\n"),
}


def workbench_for(name: str) -> tuple[wb.Workbench, dict]:
    make, _ = MODELS[name]
    torch.manual_seed(0)
    model, data = make()
    model.config.use_cache = False  # GPT-2: no KV cache in training
    opt = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    bench = wb.Workbench(model, data, optimizer=opt, steps=3, warmup_steps=2, log=None)
    return bench, {"model": model, "dataset": data, "make_optimizer": opt}


@pytest.mark.slow
@pytest.mark.fixed_warmup  # plain and checkpointed trials compared step by step: the same warm-up count
@pytest.mark.parametrize("name", list(MODELS))
def test_a_hugging_face_model_wraps_runs_checkpoints_and_exports_its_own_step(name):
    bench, names = workbench_for(name)
    block = MODELS[name][1]
    assert bench.step_shape.batch == "dict" and bench.step_shape.loss == "model"
    assert block in bench.blocks
    plain = bench.run(wb.Knobs(batch_size=8), progress=False)
    checkpointed = bench.run(wb.Knobs(batch_size=8, checkpoint=(block, list(bench.blocks)[1])), progress=False)
    assert plain.ok and checkpointed.ok, (plain.message, checkpointed.message)
    assert checkpointed.losses == pytest.approx(plain.losses, abs=1e-4)  # recompute, same numbers
    for knobs in (wb.Knobs(batch_size=8), wb.Knobs(batch_size=4, accum_steps=2, checkpoint=(block,))):
        trial = bench.run(knobs, progress=False)
        script = script_losses_for(bench, knobs, {**names, "model": copy.deepcopy(names["model"])}, trial)
        assert trial.losses == pytest.approx(trial_window(trial, script), abs=1e-5, rel=0)
    code = bench.to_code(wb.Knobs(batch_size=8))
    assert "loss = model_loss(step_model(**batch))" in code and "input_ids, attention_mask, labels" in code


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_the_exported_script_runs_with_the_users_objects_pasted_above_it(name, tmp_path):
    bench, _ = workbench_for(name)
    script = tmp_path / "train.py"
    script.write_text(SETUP[name] + bench.to_code(wb.Knobs(batch_size=8), steps=4, warmup=1))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, job_output(proc)
    assert re.search(r"samples/s over \d+ timed steps", proc.stdout), proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_the_torchrun_scripts_take_dict_batches_and_the_models_loss(strategy, tmp_path):
    bench, _ = workbench_for("gpt2")
    knobs = wb.Knobs(batch_size=4, world_size=2, strategy=strategy, accum_steps=2, cpu_threads=1)
    script = tmp_path / f"train_{strategy}.py"
    script.write_text(bench.to_code(knobs, steps=3, warmup=1, setup=SETUP["gpt2"]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, job_output(proc)
    assert "samples/s (all ranks)" in proc.stdout
