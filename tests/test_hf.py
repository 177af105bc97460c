"""Hugging Face where its users train (issue 41): token counting, the length-stratified window, the
length knobs (group_by_length, pad_to_multiple_of, packing), Workbench.from_trainer, and the
TrainingArguments / Trainer script back out. A tiny GPT-2 from a config and a word-level tokenizer
built here: no download."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ROOT
from torch.utils.data import IterableDataset

import workbench as wb
from workbench.core import tokens
from workbench.core.knobs import device_notes
from workbench.faces.hf import arguments_accepted, checkpointing_name

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it (the [hf] extra)

WORDS = [f"w{i}" for i in range(60)]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]")


def skewed_lengths(n: int, seed: int = 0, scale: float = 6, alpha: float = 1.4, top: int = 96) -> list[int]:
    """Pareto lengths: most samples short, a few long (the padding problem)."""
    rng = random.Random(seed)
    return [min(top, max(2, int(scale * rng.paretovariate(alpha)))) for _ in range(n)]


def texts(n: int = 192, seed: int = 0) -> list[dict]:
    tok, rng = tokenizer(), random.Random(seed + 1)
    return [dict(tok(" ".join(rng.choice(WORDS) for _ in range(length)))) for length in skewed_lengths(n, seed)]


def tiny_gpt2():
    cfg = transformers.GPT2Config(vocab_size=len(WORDS) + 2, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def trainer_of(data=None, **args):
    tok = tokenizer()
    kw = dict(output_dir="/tmp/wb-hf-test", use_cpu=True, report_to=[], save_strategy="no", max_steps=2,
              per_device_train_batch_size=16)
    kw.update(args)
    return transformers.Trainer(model=tiny_gpt2(), args=transformers.TrainingArguments(**kw),
                                train_dataset=texts() if data is None else data,
                                data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False))


# ---- counting ---------------------------------------------------------------------------------------
def test_count_says_where_the_tokens_came_from():
    ids = torch.ones(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    c = tokens.count({"input_ids": ids, "attention_mask": mask})
    assert (c.sequences, c.tokens, c.slots, c.counted_from) == (2, 5, 8, tokens.FROM_MASK)
    labels = torch.tensor([[5, -100, -100, -100], [5, 5, -100, -100]])
    c = tokens.count({"input_ids": ids, "labels": labels})
    assert (c.tokens, c.counted_from) == (3, tokens.FROM_LABELS)
    packed = tokens.Packed()([{"input_ids": [3, 4, 5]}, {"input_ids": [6, 7]}])
    c = tokens.count(packed)
    assert (c.sequences, c.tokens, c.slots, c.packed) == (2, 5, 5, True)
    assert packed["labels"].tolist() == [[-100, 4, 5, -100, 7]] and packed["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert tokens.count((torch.ones(2, 3), torch.zeros(2))) is None  # not a token batch


def test_pad_to_multiple_pads_every_sequence_tensor_with_its_own_fill():
    from transformers import DataCollatorForLanguageModeling

    tok = tokenizer()
    pad = tokens.PadToMultiple(DataCollatorForLanguageModeling(tok, mlm=False), 8)
    batch = pad([dict(tok("w1 w2 w3")), dict(tok("w1"))])
    assert batch["input_ids"].shape == (2, 8) and batch["attention_mask"][:, 3:].sum() == 0
    assert (batch["labels"][:, 3:] == -100).all() and tokens.count(batch).tokens == 4


# ---- the measured window ----------------------------------------------------------------------------
@pytest.mark.parametrize("grouped", [False, True])
def test_the_window_is_a_length_stratified_sample_wherever_it_starts(grouped):
    """Any run of `steps` batches of the trial's loader holds each chosen batch once, and their tokens per
    sample match the data's mean; a plain 30-batch slice of the grouped order does not."""
    lengths = skewed_lengths(2048)
    window = tokens.TokenWindow(list(range(2048)), lengths, batch_size=16, accum_steps=1, batches=30, seed=0,
                                natural_batches=128)
    sampler = window.sampler(grouped=grouped)
    batches = list(sampler)
    assert len(sampler) % 30 == 0 and len(batches) == len(sampler)
    mean = statistics.mean(lengths)
    for start in (0, 7, 29):
        run = batches[start:start + 30]
        assert sorted(map(tuple, run)) == sorted(map(tuple, batches[:30]))  # the same batches, any start
        per_sample = sum(lengths[i] for b in run for i in b) / (30 * 16)
        assert abs(per_sample / mean - 1) < 0.1, (per_sample, mean)
    if grouped:  # the unstratified grouped order: a 10-batch slice sees one length band
        order = tokens.grouped_order(lengths, 16, torch.Generator().manual_seed(0))
        naive = [sum(lengths[i] for i in order[s * 16:(s + 10) * 16]) / (10 * 16) for s in range(0, 118, 10)]
        assert max(abs(x / mean - 1) for x in naive) > 0.2, (naive, mean)
        widths = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches[:30]]
        assert statistics.median(widths) <= 2  # grouped batches: similar lengths inside each


# ---- the knobs on non-token data, and bad input --------------------------------------------------------
@pytest.mark.parametrize("change", [{"group_by_length": True}, {"pad_to_multiple_of": 8}, {"packing": True}])
def test_length_knobs_say_they_are_no_ops_on_non_token_data(change):
    notes = device_notes(wb.Knobs(**change), "cpu", token_data=False)
    assert any(next(iter(change)) in n and "no-op" in n for n in notes), notes
    assert not device_notes(wb.Knobs(**change), "cpu", token_data=True)


def test_a_multiple_that_pads_past_the_position_table_is_refused_naming_a_fit():
    bench = wb.demo("transformer", size="tiny")  # 16 positions, every sample 16 tokens
    assert bench.workload.max_positions == 16 and bench.workload.longest_tokens() == 16  # read once, kept
    with pytest.raises(ValueError, match=r"pads the longest sample \(16 tokens\) to 64.*16 positions.*pad_to_multiple_of=8"):
        bench.run(bench.knobs(pad_to_multiple_of=64))
    assert bench.run(bench.knobs(pad_to_multiple_of=8)).ok  # 16 is already a multiple of 8: it fits


def test_max_positions_reads_the_config_else_a_position_table():
    from workbench.core.workload import max_positions

    assert max_positions(tiny_gpt2()) == 128  # GPT2Config(n_positions=128)
    assert max_positions(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None
    model = torch.nn.Module()
    model.wpe = torch.nn.Embedding(40, 4)
    assert max_positions(model) == 40


def test_group_by_length_without_lengths_says_what_it_needs():
    with pytest.raises(ValueError, match=r"needs each sample's length.*input_ids.*'length' column"):
        tokens.lengths_of([{"text": "w1 w2"}], [0])
    assert tokens.lengths_of([{"input_ids": [1, 2, 3]}], [0]) == [3]


class Stream(IterableDataset):
    def __iter__(self):
        yield from texts(32)


def test_bad_trainer_input_gets_clear_errors():
    trainer = trainer_of()
    trainer.train_dataset = None
    with pytest.raises(ValueError, match="no train_dataset"):
        wb.Workbench.from_trainer(trainer, log=None)
    with pytest.raises(ValueError, match="IterableDataset of unknown length"):
        wb.Workbench.from_trainer(trainer_of(Stream(), train_sampling_strategy="group_by_length", max_steps=2),
                                  log=None)
    with pytest.raises(TypeError, match=r"takes a transformers\.Trainer"):
        wb.Workbench.from_trainer(tiny_gpt2(), log=None)


def test_a_collator_without_input_ids_is_said_plainly():
    trainer = trainer_of()
    trainer.data_collator = lambda rows: {"labels": torch.tensor([[1, 2]] * len(rows))}
    with pytest.raises(ValueError, match="input_ids"):
        wb.Workbench.from_trainer(trainer, log=None)


def test_packing_refuses_a_model_without_position_ids():
    class NoPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 4)

        def forward(self, input_ids, attention_mask=None, labels=None):
            return self.emb(input_ids).mean()

    bench = wb.Workbench(NoPositions(), torch.utils.data.DataLoader(
        texts(32), batch_size=4, collate_fn=transformers.DataCollatorForLanguageModeling(tokenizer(), mlm=False)),
        log=None, steps=2, warmup_steps=0)
    with pytest.raises(ValueError, match=r"position_ids.*set packing=False"):
        bench.run(packing=True, progress=False)


# ---- from_trainer and back out ---------------------------------------------------------------------------
def test_from_trainer_takes_the_arguments_as_starting_knobs_and_lists_what_it_cannot_map():
    class MyLoss(transformers.Trainer):
        def compute_loss(self, model, inputs, **kw):
            return super().compute_loss(model, inputs, **kw)

    args = transformers.TrainingArguments(output_dir="/tmp/wb-hf-test", use_cpu=True, report_to=[],
                                          per_device_train_batch_size=8, gradient_accumulation_steps=3,
                                          dataloader_num_workers=1, **{checkpointing_name(): True},
                                          optim="adamw_torch_fused", weight_decay=0.1,
                                          train_sampling_strategy="group_by_length", lr_scheduler_type="cosine")
    trainer = MyLoss(model=tiny_gpt2(), args=args, train_dataset=texts(),
                     data_collator=transformers.DataCollatorForLanguageModeling(tokenizer(), mlm=False))
    with pytest.warns(UserWarning, match="could not map.*cosine.*compute_loss"):
        bench = wb.Workbench.from_trainer(trainer, log=None)
    k = bench.defaults
    assert (k.batch_size, k.accum_steps, k.num_workers, k.group_by_length) == (8, 3, 1, True)
    assert k.optimizer_impl == "fused" and set(k.checkpoint) == set(bench.blocks)
    assert "transformer.h.0" in bench.blocks
    opt = bench.workload.check_optimizer(bench.workload.fresh_model())
    assert isinstance(opt, torch.optim.AdamW) and sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.1]
    assert any("compute_loss" in x for x in bench._hf.left_out)


def test_to_training_arguments_lists_the_knobs_it_cannot_say():
    bench = wb.Workbench.from_trainer(trainer_of(), log=None)
    k = bench.defaults.replace(group_by_length=True, cpu_threads=1, pad_to_multiple_of=8,
                               checkpoint=("transformer.h.0",))
    with pytest.warns(UserWarning, match="checkpoint.*cpu_threads.*pad_to_multiple_of"):
        kw = bench.to_training_arguments(k)
    assert kw["train_sampling_strategy"] == "group_by_length" and checkpointing_name() not in kw
    assert not arguments_accepted(kw)
    transformers.TrainingArguments(output_dir="/tmp/wb-hf-test", use_cpu=True, report_to=[], **kw)


@pytest.mark.slow
def test_a_trainer_wraps_counts_tokens_groups_by_length_and_goes_back_out(tmp_path):
    data = texts(1024, seed=3)  # the Trainer groups within mega-batches of up to 50 batches: enough data to fill them
    bench = wb.Workbench.from_trainer(trainer_of(data), log=None, steps=8, warmup_steps=1)
    plain = bench.run(progress=False)
    grouped = bench.run(group_by_length=True, progress=False)
    assert plain.ok and grouped.ok, (plain.message, grouped.message)
    mean = statistics.mean(len(d["input_ids"]) for d in data)
    per_sample = plain.extra["tokens"]["tokens_per_sample"]
    assert abs(per_sample / mean - 1) < 0.15 and plain.extra["tokens"]["counted_from"] == "attention_mask"
    assert grouped.padding_share <= plain.padding_share / 2, (plain.padding_share, grouped.padding_share)
    assert {"tokens_per_s", "padding_share"} <= set(bench.results.columns)
    c = bench.compare(plain, grouped)
    assert c.rate == "tokens/s"
    row = bench.results.set_index("trial_id").loc[grouped.trial_id]  # the table's row judges what compare judged
    assert (row["judged_on"], row["verdict"]) == ("tokens/s", c.verdict)
    packed = bench.run(packing=True, progress=False)
    assert packed.ok and packed.padding_share == 0 and packed.extra["tokens"]["sequences"] == 8 * 16, packed.message
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = bench.to_training_arguments(grouped)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                                          max_steps=2, **kw)
    trainer = transformers.Trainer(model=tiny_gpt2(), args=args, train_dataset=data,
                                   data_collator=transformers.DataCollatorForLanguageModeling(tokenizer(), mlm=False))
    assert trainer.train().global_step == 2


SETUP = ("import sys\nsys.path.insert(0, {tests!r})\nfrom test_hf import texts, tiny_gpt2, tokenizer\n"
         "from transformers import DataCollatorForLanguageModeling\n"
         "model, train_dataset = tiny_gpt2(), texts(64)\n"
         "data_collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)\n")


@pytest.mark.slow
@pytest.mark.parametrize("change", [{"group_by_length": True}, {"packing": True}, {"pad_to_multiple_of": 8}])
def test_the_trainer_script_runs_as_it_is(change, tmp_path):
    bench = wb.Workbench.from_trainer(trainer_of(), log=None)
    script = bench.to_code(bench.defaults.replace(**change), style="trainer",
                           setup=SETUP.format(tests=str(ROOT / "tests")), max_steps=2, output_dir=str(tmp_path))
    path = tmp_path / "train.py"
    path.write_text(script)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "global_step=2" in out.stdout


# ---- compile and shapes ----------------------------------------------------------------------------
def test_recompiles_from_varying_lengths_are_counted_and_named_with_their_fixes():
    from workbench.core.compat import CompileWatch
    from workbench.diagnose.compile import explain_compile

    torch._dynamo.reset()
    emb = torch.nn.Embedding(10, 4)
    step = torch.compile(lambda ids: emb(ids).sum(), backend="eager")  # dynamo only: no inductor codegen
    with CompileWatch() as watch:
        for length in (3, 5, 7):
            step(torch.zeros(2, length, dtype=torch.long))
    assert watch.info["recompiles"] >= 1, watch.info
    lines = explain_compile(watch.info)
    assert any("recompile" in line and "pad_to_multiple_of=8" in line and "dynamic=True" in line for line in lines)


def test_the_verdict_names_recompiles_and_suggests_padding():
    from types import SimpleNamespace

    from workbench.diagnose.verdict import decide

    base = SimpleNamespace(ok=True, status="ok")
    data = SimpleNamespace(baseline=base)
    info = {"recompiles": 4, "dynamo_compile_s": 2.5, "recompile_reasons": ["size mismatch at index 1"]}
    v = decide(wb.Knobs(compile="default"), data, {"cores": 2}, device=torch.device("cpu"), compile_info=info)
    assert v.bottleneck == "compile" and v.next_knobs == {"pad_to_multiple_of": 8}
    assert "4 recompiles" in v.evidence[0] and "2.5 s" in v.evidence[0]


def test_the_chart_plots_tokens_per_s_when_every_trial_counted_tokens():
    import pandas as pd

    from workbench.faces.charts import chart_frame, comparison_chart

    rows = pd.DataFrame({"trial_id": [1, 2], "label": ["defaults", "group_by_length"], "status": ["ok", "ok"],
                         "verdict": ["baseline", "faster"], "speedup": [1.0, 2.0], "samples_per_s": [10.0, 20.0],
                         "samples_per_s_low": [9.0, 18.0], "samples_per_s_high": [11.0, 22.0],
                         "tokens_per_s": [300.0, 640.0], "padding_share": [0.7, 0.3]})
    frame = chart_frame(rows)
    assert frame["throughput"].tolist() == [300.0, 640.0] and frame["throughput_low"].tolist() == [270.0, 576.0]
    spec = comparison_chart(rows).to_dict()
    assert spec["vconcat"][0]["layer"][2]["encoding"]["y"]["title"] == "tokens / s"
    plain = chart_frame(rows.assign(tokens_per_s=[None, None]))
    assert plain["throughput"].tolist() == [10.0, 20.0] and "tokens_per_s" not in plain


def test_training_arguments_name_the_allocator_mode_they_cannot_set():
    """TrainingArguments cannot choose the process's allocator: the left-out list says the launch line."""
    from workbench.faces.hf import training_kwargs

    out = training_kwargs(wb.Knobs(allocator="glibc-kept"), blocks=[], optim=None, device_type="cpu")
    said = [line for line in out.left_out if line.startswith("allocator=")]
    assert len(said) == 1 and "MALLOC_MMAP_THRESHOLD_=" in said[0] and "python train.py" in said[0], out.left_out
    assert not any(line.startswith("allocator=") for line in
                   training_kwargs(wb.Knobs(), blocks=[], optim=None, device_type="cpu").left_out)


def test_a_compile_mode_without_a_knob_value_is_listed_as_unmapped_not_a_crash():
    """torch.compile takes modes the compile knob has no value for (max-autotune-no-cudagraphs): the Trainer
    is valid, so from_trainer says what it did with the mode instead of raising."""
    trainer = trainer_of(torch_compile=True, torch_compile_mode="max-autotune-no-cudagraphs")
    with pytest.warns(UserWarning, match=r"could not map.*torch_compile_mode='max-autotune-no-cudagraphs'"):
        bench = wb.Workbench.from_trainer(trainer, log=None)
    assert bench.defaults.compile == "default"
    assert any("max-autotune-no-cudagraphs" in x for x in bench._hf.left_out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a mode the knob has is mapped as it is, with nothing to say
        mapped = wb.Workbench.from_trainer(trainer_of(torch_compile=True, torch_compile_mode="reduce-overhead"),
                                           log=None)
    assert mapped.defaults.compile == "reduce-overhead"


def test_weight_decay_follows_the_trainer_s_groups_or_refuses_saying_why():
    """The optimizer decays exactly the parameters the Trainer decays; handed parameters it cannot match to
    the Trainer's names, it refuses with the reason rather than decaying every one."""
    trainer = trainer_of(weight_decay=0.1)
    bench = wb.Workbench.from_trainer(trainer, log=None)
    model = bench.workload.fresh_model()
    opt = bench.workload.check_optimizer(model)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    names = set(trainer.get_decay_parameter_names(model))
    assert {n: id(p) in decayed for n, p in model.named_parameters()} == {n: n in names for n, _ in
                                                                          model.named_parameters()}
    assert 0 < len(decayed) < len(list(model.parameters()))  # both groups hold parameters
    params = list(model.parameters())
    with pytest.raises(ValueError, match=r"weight-decay groups.*parameters"):
        bench.workload.optimizer_factory(params[:-1])
