"""environment.yml and pyproject.toml list the same dependencies with the same lower bounds."""

import re

import tomllib
from conftest import ROOT

CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def _norm(req: str) -> tuple[str, str]:
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", req).groups()
    name = name.lower().replace("_", "-")
    return CONDA_NAMES.get(name, name), spec.replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("dependencies:")
    conda = {_norm(line.strip()[2:]) for line in lines[start + 1:] if line.strip().startswith("- ")}
    conda -= {("python", "=3.11"), ("pip", "")}
    assert conda == wanted, f"only in environment.yml: {conda - wanted}; only in pyproject: {wanted - conda}"


def test_set_up_path_pins_the_local_torch_build():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=2.4" in deps  # users bring their own (CUDA) build
