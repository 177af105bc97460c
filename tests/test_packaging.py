"""Packaging: environment.yml and pyproject.toml list the same dependencies; the core installs and
runs without the notebook stack; the package ships its type marker and version."""

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the [test] extra installs tomli there
    import tomli as tomllib

CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name
SELF = "tuning-workbench"
NOTEBOOK_STACK = ("ipywidgets", "anywidget", "altair", "vl_convert", "jupyterlab", "IPython", "tensorboard")


def _norm(req: str) -> tuple[str, str]:
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", req).groups()
    name = name.lower().replace("_", "-")
    return CONDA_NAMES.get(name, name), spec.replace(" ", "")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _everything(project: dict) -> set[tuple[str, str]]:
    """Core + every extra, without the [test] extra's reference to our own extras and without
    requirements for older Pythons (environment.yml pins python=3.11)."""
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += [r for r in extra if not r.startswith(SELF) and "python_version <" not in r]
    return {_norm(r) for r in reqs}


def test_environment_yml_matches_pyproject():
    wanted = _everything(_project())
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("dependencies:")
    conda = {_norm(line.strip()[2:]) for line in lines[start + 1:] if line.strip().startswith("- ")}
    conda -= {("python", "=3.11"), ("pip", "")}
    assert conda == wanted, f"only in environment.yml: {conda - wanted}; only in pyproject: {wanted - conda}"


def test_set_up_path_pins_the_local_torch_build():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    assert "torch>=2.4" in _project()["dependencies"]  # users bring their own (CUDA) build


def test_core_install_leaves_the_notebook_stack_to_extras():
    project = _project()
    core = {_norm(r)[0] for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert not core & {"ipywidgets", "anywidget", "altair", "vl-convert-python", "jupyterlab", "tensorboard"}
    assert {_norm(r)[0] for r in extras["notebook"]} == {"ipywidgets", "anywidget", "altair", "vl-convert-python",
                                                       "jupyterlab"}
    assert {_norm(r)[0] for r in extras["tensorboard"]} == {"tensorboard"}
    assert f"{SELF}[notebook,tensorboard,cluster]" in extras["test"]  # notebooks are tests; so are the export and jobs
    assert {_norm(r)[0] for r in extras["cluster"]} == {"submitit", "cloudpickle"}
    assert {_norm(r)[0] for r in extras["lightning"]} == {"lightning"}  # from_lightning, wb.LightningCallback
    assert "lightning" in {_norm(r)[0] for r in extras["test"]}  # tests/test_lightning.py, notebook 13
    # make lab installs what the notebooks need; make test adds the test extra (issue 40)
    make = (ROOT / "Makefile").read_text()
    lab = make.split("$(VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert "-e '.[notebook]'" in lab and "test" not in lab.replace(".installed", "")
    assert "-e '.[notebook,test]'" in make.split("$(VENV)/.installed-test:", 1)[1].split("\n\n", 1)[0]
    assert "\ntest: env-test" in make and "\nlab: env\n" in make


def test_ships_py_typed_and_a_version():
    import workbench

    assert (ROOT / "workbench" / "py.typed").exists()
    assert "py.typed" in (ROOT / "pyproject.toml").read_text()
    assert re.match(r"\d", workbench.__version__)


CORE_SCRIPT = """
import json, sys
for name in %r:
    sys.modules[name] = None  # "not installed": any import of it raises ImportError
import torch
import workbench as wb
from conftest import TinyNet, tiny_data

bench = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(),
                     optimizer=lambda p: torch.optim.SGD(p, lr=0.05), steps=3, warmup_steps=1,
                     log=sys.argv[1], knobs=wb.Knobs(batch_size=8))
r = bench.run(progress=False)
errors = {}
for what in ("panel", "chart"):
    try:
        getattr(bench, what)()
    except ImportError as e:
        errors[what] = str(e)
loaded = sorted(m for m in %r if sys.modules.get(m) is not None)
print(json.dumps({"status": r.status, "samples_per_s": r.samples_per_s, "rows": len(bench.results),
                  "errors": errors, "loaded": loaded, "html": "<" in r._repr_html_()}))
"""


def test_core_imports_and_runs_a_trial_without_the_notebook_stack(tmp_path):
    script = CORE_SCRIPT % (NOTEBOOK_STACK, NOTEBOOK_STACK)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "runs")], capture_output=True, text=True,
                         cwd=ROOT / "tests", timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == "ok" and got["samples_per_s"] > 0 and got["rows"] == 1
    assert got["loaded"] == []
    assert got["html"]
    for what in ("panel", "chart"):
        assert 'pip install "tuning-workbench[notebook]"' in got["errors"].get(what, ""), got["errors"]
    assert "needs altair" in got["errors"]["chart"]


@pytest.mark.parametrize("module", ["workbench.faces.cli", "workbench.search.tune", "workbench.diagnose", "workbench.faces.export",
                                    "workbench.core.trace"])
def test_core_modules_import_without_the_notebook_stack(module):
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in NOTEBOOK_STACK)
    out = subprocess.run([sys.executable, "-c", f"import sys; {blocked}; import {module}"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
