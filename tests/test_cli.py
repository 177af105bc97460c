"""CLI: help lists demos and knobs; run prints a result (or JSON); bad knobs exit 2 with the fix."""

import json
import subprocess
import sys

import pytest

from workbench.faces.cli import main


def test_help_lists_demos_and_knobs():
    out = subprocess.run([sys.executable, "-m", "workbench", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for word in ("jpeg", "cnn", "mlp-memory", "transformer", "--num-workers", "--cpu-threads", "--checkpoint"):
        assert word in out.stdout


TINY = ["--size", "tiny", "--log", "none", "--steps", "3", "--warmup-steps", "1", "--batch-size", "8"]


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, timeout=600,
                          **kwargs)


def _document(out: subprocess.CompletedProcess, command: str) -> dict:
    doc = json.loads(out.stdout)  # exactly one JSON document: json.loads rejects anything more
    assert set(doc) == {"schema", "command", "version", "ok", "exit_code", "error", "result"}
    assert doc["schema"] == 2 and doc["command"] == command and doc["exit_code"] == out.returncode
    return doc


def test_run_prints_json(capsys):
    code = main(["run", "--demo", "mlp-memory", *TINY, "--checkpoint", "all", "--json", "--quiet"])
    doc = json.loads(capsys.readouterr().out)
    rec = doc["result"]
    assert code == 0 and doc["ok"] and rec["status"] == "ok" and rec["batch_size"] == 8
    assert len(rec["step_times_s"]) == 3 and len(rec["checkpoint"]) >= 1


def test_run_json_in_a_subprocess_has_no_progress_on_a_pipe():
    out = _cli("run", "--demo", "mlp-memory", *TINY, "--json")
    doc = _document(out, "run")
    assert doc["ok"] and doc["result"]["status"] == "ok" and doc["result"]["trace_path"] is None
    assert "\r" not in out.stderr and "steps" not in out.stderr  # stderr is a pipe: no bar frames


def test_run_json_with_a_trace():
    out = _cli("run", "--demo", "mlp-memory", *TINY, "--json", "--trace")
    rec = _document(out, "run")["result"]
    trace = json.loads(open(rec["trace_path"]).read())
    from workbench.launch.runner import TRACE_STEPS

    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == TRACE_STEPS  # the profiled optimizer steps, after the window, one event each


def test_errors_are_one_json_document_too():
    out = _cli("run", "--demo", "cnn", *TINY, "--persistent-workers", "--json")
    doc = _document(out, "run")
    assert out.returncode == 2 and not doc["ok"] and "num_workers >= 1" in doc["error"] and doc["result"] is None
    out = _cli("run", "--demo", "cnn", "--amp", "fp8", "--json")
    doc = _document(out, "run")
    assert out.returncode == 2 and doc["error"].startswith("invalid arguments")


@pytest.mark.slow
def test_diagnose_json():
    out = _cli("diagnose", "--demo", "mlp-memory", *TINY, "--json")
    doc = _document(out, "diagnose")
    res = doc["result"]
    assert doc["ok"] and res["bottleneck"] and res["verdict"]["bottleneck"] == res["bottleneck"]
    assert res["knobs"]["batch_size"] == 8 and res["data"]["baseline"]["status"] == "ok"
    assert isinstance(res["stages"], list) and {row["stage"] for row in res["stages"]} >= {"forward", "backward"}
    assert json.loads(open(res["trace_path"]).read())["traceEvents"]


@pytest.mark.slow
def test_tune_json():
    out = _cli("tune", "--demo", "mlp-memory", *TINY, "--n-trials", "2", "--budget-s", "600", "--json")
    doc = _document(out, "tune")
    res = doc["result"]
    assert doc["ok"] and res["trials_used"] <= 2 and res["n_trials"] == 2 and res["budget_s"] == 600
    assert res["best_knobs"]["batch_size"] >= 1 and res["start"]["status"] == "ok"
    assert isinstance(res["steps"], list) and res["steps"][0]["stage"] == "start"


def test_progress_bar_only_when_stderr_is_a_terminal():
    import fcntl
    import os
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
    try:
        proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", "--demo", "mlp-memory", *TINY, "--json"],
                                stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            err += chunk
        stdout, _ = proc.communicate(timeout=600)
    finally:
        os.close(master)
    assert proc.returncode == 0 and json.loads(stdout)["ok"]
    text = err.decode(errors="replace")
    assert "\r" in text and "step" in text and "done" in text, text[-500:]  # frames, ending on "done"


def test_run_prints_a_readable_line(capsys):
    code = main(["run", "--demo", "cnn", "--size", "tiny", "--log", "none", "--steps", "2", "--warmup-steps", "0",
                 "--pin-memory"])
    captured = capsys.readouterr()
    assert code == 0 and "samples/s" in captured.out and "pin_memory is a no-op" in captured.out
    assert "\r" not in captured.err  # not a terminal: no progress frames


def test_jsonable_turns_tables_and_nan_into_plain_json():
    import math

    import pandas as pd

    from workbench.faces.cli import jsonable

    got = jsonable({"t": pd.DataFrame({"a": [1.0, math.nan]}), "s": pd.Series({"x": 2}), "k": (math.inf,)})
    assert got == {"t": [{"a": 1.0}, {"a": None}], "s": {"x": 2}, "k": [None]}
    json.dumps(got, allow_nan=False)


def test_invalid_combination_exits_2_naming_the_fix(capsys):
    code = main(["run", "--demo", "cnn", "--size", "tiny", "--log", "none", "--persistent-workers"])
    assert code == 2 and "num_workers >= 1" in capsys.readouterr().err


def test_unknown_demo(capsys):
    assert main(["run", "--demo", "resnet9000", "--log", "none"]) == 2
    assert "jpeg" in capsys.readouterr().err


def test_bad_flag_value_is_rejected_by_argparse():
    with pytest.raises(SystemExit):
        main(["run", "--demo", "cnn", "--amp", "fp8"])


def test_every_verb_offers_json():
    from workbench.faces.cli import VERBS, build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(VERBS)
    for verb, parser in sub.choices.items():
        assert "--json" in parser._option_string_actions, verb
def test_model_factory_works_for_a_single_process_verb(tmp_path, monkeypatch, capsys) -> None:
    import json

    (tmp_path / "clifactory.py").write_text(
        "import torch\nfrom torch import nn\nimport workbench as wb\n\n\n"
        "def as_dict():\n"
        "    ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))\n"
        "    return {'model': nn.Linear(8, 3), 'data': ds, 'loss_fn': nn.CrossEntropyLoss(), 'name': 'fac'}\n\n\n"
        "def as_bench():\n"
        "    return wb.Workbench(log=None, device='cpu', **as_dict())\n\n\n"
        "def as_learner():\n"
        "    return wb.Workbench(log=None, device='cpu', participant='ana', **as_dict())\n\n\n"
        "def wrong():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from workbench.faces.cli import main

    assert main(["run", "--model", "clifactory:as_dict", "--device", "cpu", "--steps", "2", "--warmup-steps", "0",
                 "--batch-size", "8", "--json", "--quiet", "--log-path", str(tmp_path / "runs")]) == 0
    rec = json.loads(capsys.readouterr().out)["result"]  # the one --json document (docs/cli.md: the JSON envelope)
    assert rec["status"] == "ok" and rec["batch_size"] == 8 and rec["world_size"] == 1
    assert (tmp_path / "runs" / "fac.jsonl").exists()
    assert main(["run", "--model", "clifactory:as_bench", "--steps", "2", "--warmup-steps", "0", "--quiet"]) == 0
    assert main(["run", "--model", "clifactory:as_learner", "--steps", "2", "--warmup-steps", "0", "--quiet",
                 "--log-path", str(tmp_path / "shared")]) == 0
    assert (tmp_path / "shared" / "ana" / "fac.jsonl").exists()  # the participant's folder, as Workbench does
    assert main(["run", "--model", "clifactory:wrong", "--quiet"]) == 2
    assert "return a workbench.Workbench or a dict" in capsys.readouterr().err
    assert main(["run", "--model", "no_such_module:f", "--quiet"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
