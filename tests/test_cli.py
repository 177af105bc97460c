"""CLI: help lists demos and knobs; run prints a result (or JSON); bad knobs exit 2 with the fix."""

import json
import subprocess
import sys

import pytest

from workbench.cli import main


def test_help_lists_demos_and_knobs():
    out = subprocess.run([sys.executable, "-m", "workbench", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for word in ("jpeg", "cnn", "mlp-memory", "transformer", "--num-workers", "--cpu-threads", "--checkpoint"):
        assert word in out.stdout


def test_run_prints_json(capsys):
    code = main(["run", "--demo", "mlp-memory", "--size", "tiny", "--log", "none", "--steps", "3",
                 "--warmup-steps", "1", "--batch-size", "8", "--checkpoint", "all", "--json", "--quiet"])
    rec = json.loads(capsys.readouterr().out)
    assert code == 0 and rec["status"] == "ok" and rec["batch_size"] == 8
    assert len(rec["step_times_s"]) == 3 and len(rec["checkpoint"]) >= 1


def test_run_prints_a_readable_line(capsys):
    code = main(["run", "--demo", "cnn", "--size", "tiny", "--log", "none", "--steps", "2", "--warmup-steps", "0",
                 "--pin-memory"])
    captured = capsys.readouterr()
    assert code == 0 and "samples/s" in captured.out and "pin_memory is a no-op" in captured.out
    assert "steps/s" in captured.err  # the text progress bar


def test_invalid_combination_exits_2_naming_the_fix(capsys):
    code = main(["run", "--demo", "cnn", "--size", "tiny", "--log", "none", "--persistent-workers"])
    assert code == 2 and "num_workers >= 1" in capsys.readouterr().err


def test_unknown_demo(capsys):
    assert main(["run", "--demo", "resnet9000", "--log", "none"]) == 2
    assert "jpeg" in capsys.readouterr().err


def test_bad_flag_value_is_rejected_by_argparse():
    with pytest.raises(SystemExit):
        main(["run", "--demo", "cnn", "--amp", "fp8"])


def test_model_factory_works_for_a_single_process_verb(tmp_path, monkeypatch, capsys) -> None:
    import json

    (tmp_path / "clifactory.py").write_text(
        "import torch\nfrom torch import nn\nimport workbench as wb\n\n\n"
        "def as_dict():\n"
        "    ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))\n"
        "    return {'model': nn.Linear(8, 3), 'data': ds, 'loss_fn': nn.CrossEntropyLoss(), 'name': 'fac'}\n\n\n"
        "def as_bench():\n"
        "    return wb.Workbench(log=None, device='cpu', **as_dict())\n\n\n"
        "def wrong():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from workbench.cli import main

    assert main(["run", "--model", "clifactory:as_dict", "--device", "cpu", "--steps", "2", "--warmup-steps", "0",
                 "--batch-size", "8", "--json", "--quiet", "--log-path", str(tmp_path / "runs")]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["status"] == "ok" and rec["batch_size"] == 8 and rec["world_size"] == 1
    assert (tmp_path / "runs" / "fac.jsonl").exists()
    assert main(["run", "--model", "clifactory:as_bench", "--steps", "2", "--warmup-steps", "0", "--quiet"]) == 0
    assert main(["run", "--model", "clifactory:wrong", "--quiet"]) == 2
    assert "return a workbench.Workbench or a dict" in capsys.readouterr().err
    assert main(["run", "--model", "no_such_module:f", "--quiet"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
