"""Tutorial hygiene: committed without outputs, no machine narrated as fact, every notebook on the README map.

(Executing the notebooks is nbval's job: `pytest --nbval-lax notebooks`.)
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# A sentence that names the machine it was written on, or one vendor's CPU, is another reader's untruth.
MACHINE_CLAIM = re.compile(r"EPYC|Xeon|Ryzen|AVX2 only|this AMD|this Intel|notebook was written on")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_names_no_machine(path):
    hits = MACHINE_CLAIM.findall(path.read_text(encoding="utf-8"))
    assert not hits, f"{path.name} narrates a specific machine ({hits}); compute the sentence from the reader's trials"


def test_readme_tutorial_map_lists_every_notebook_with_a_run_time():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{path.stem}`")), None)
        assert row is not None, f"{path.name} is missing from the README's tutorial map"
        assert re.search(r"\d+ s", row.split("|")[-2]), f"{path.name} has no measured run time in the map"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ends_by_printing_its_run_time(path):
    """The README's tutorial map takes its times from this line, on the reader's own machine."""
    cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    first, last = "".join(cells[0]["source"]), "".join(cells[-1]["source"])
    assert "notebook_start = time.perf_counter()" in first, f"{path.name}: start the clock in the first code cell"
    assert "notebook ran in" in last and "notebook_start" in last, f"{path.name}: end with 'notebook ran in N s'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_no_unexplained_jargon(path):
    """'The seeds' (the source articles behind the project) mean nothing to a reader."""
    hits = re.findall(r"\bthe seeds\b|\bseeds'", path.read_text(encoding="utf-8"), flags=re.IGNORECASE)
    assert not hits, f"{path.name} says {hits}: name the source ('the tuning guides') or leave it out"
