"""Tutorial hygiene: committed without outputs, no machine narrated as fact, every notebook on the README map
and its run time in benchmarks/README.md.

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


def test_readme_tutorial_map_lists_every_notebook_with_its_claim():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        row = next((line for line in readme.splitlines()
                    if line.startswith(f"| [`{path.stem}`](notebooks/{path.name}) |")), None)
        assert row is not None, f"{path.name} is missing from the README's tutorial map (a linked row)"
        assert len(row.split("|")[-2].split()) >= 5, f"{path.name}: the map row names no claim"


def test_every_notebook_has_a_measured_run_time_in_the_benchmarks():
    """Run times are one machine's figures: they live with date and machine in benchmarks/README.md."""
    bench = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert "\n## Notebook run times\n" in bench, "benchmarks/README.md has no 'Notebook run times' section"
    section = bench.split("## Notebook run times", 1)[-1].split("\n## ", 1)[0]
    for path in NOTEBOOKS:
        row = next((line for line in section.splitlines() if line.startswith(f"| `{path.stem}`")), None)
        assert row is not None, f"{path.name} is missing from benchmarks/README.md's 'Notebook run times'"
        assert re.search(r"\d+ s", row.split("|")[-2]), f"{path.name} has no measured run time there"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ends_by_printing_its_run_time(path):
    """benchmarks/README.md's run times come from this line, and a reader sees their own machine's."""
    cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    first, last = "".join(cells[0]["source"]), "".join(cells[-1]["source"])
    if path.name == QUICKSTART:  # it imports only workbench: its clock is its first trial's start
        assert "notebook ran in" in last and 'bench.results["started_at"]' in last, path.name
        return
    assert "notebook_start = time.perf_counter()" in first, f"{path.name}: start the clock in the first code cell"
    assert "notebook ran in" in last and "notebook_start" in last, f"{path.name}: end with 'notebook ran in N s'"


QUICKSTART = "01_quickstart.ipynb"
IMPORT = re.compile(r"^\s*(?:import\s+([\w.]+)|from\s+([\w.]+)\s+import)", re.MULTILINE)


def test_quickstart_is_ten_minutes_long_and_imports_only_workbench():
    """Issue 40: at most 12 code cells and 700 words of prose (markdown, code samples included); its code
    imports `workbench` and nothing else (no test helpers); its first cell links the page that explains
    every number."""
    cells = json.loads((ROOT / "notebooks" / QUICKSTART).read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    prose = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    words = sum(len(re.findall(r"\S+", text)) for text in prose)
    assert len(code) <= 12, f"{QUICKSTART} has {len(code)} code cells (at most 12)"
    assert words <= 700, f"{QUICKSTART} has {words} words of prose (at most 700)"
    imported = {a or b for text in code for a, b in IMPORT.findall(text)}
    assert imported == {"workbench"}, f"{QUICKSTART} imports {sorted(imported)}; only workbench"
    assert cells[0]["cell_type"] == "markdown" and "docs/results.md" in "".join(cells[0]["source"])


def test_the_import_pattern_sees_every_form():
    text = "import time\nfrom workbench.faces.charts import chart_data\n  import workbench as wb\nx = 'import'"
    assert {a or b for a, b in IMPORT.findall(text)} == {"time", "workbench.faces.charts", "workbench"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_no_unexplained_jargon(path):
    """'The seeds' (the source articles behind the project) mean nothing to a reader."""
    hits = re.findall(r"\bthe seeds\b|\bseeds'", path.read_text(encoding="utf-8"), flags=re.IGNORECASE)
    assert not hits, f"{path.name} says {hits}: name the source ('the tuning guides') or leave it out"
