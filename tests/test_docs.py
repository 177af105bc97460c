"""The docs cannot go stale: links resolve, code parses and runs, no one machine is narrated,
the knob page is the declarations, and every test or script a page names as evidence exists."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "HISTORY.md"]
# Pages that may name the machine a figure came from (with its date and command).
EVIDENCE_PAGES = {ROOT / "docs" / "devices.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "HISTORY.md"}
CPU_MODEL = re.compile(r"\b(EPYC|Xeon|Ryzen|Threadripper|Opteron|Core\s?i[3579]|Core Ultra|Celeron|Pentium"
                       r"|Apple M[1-9]|Graviton|Neoverse|Snapdragon)\b", re.IGNORECASE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
TEST_REF = re.compile(r"\b(tests/test_\w+\.py)(?:::(\w+))?")
SCRIPT_REF = re.compile(r"\b((?:benchmarks|scripts)/\w+\.py)\b")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _without_code(text: str) -> str:
    """Markdown without fenced blocks (a `[x](y)` inside code is not a link)."""
    return FENCE.sub("", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _without_code(path.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            slug = github_slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_and_image_resolves(page):
    broken = []
    for target in LINK.findall(_without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not checked here (offline)
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no {_rel(dest) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {_rel(dest)})")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_test_and_script_named_as_evidence_exists(page):
    """A page that backs a statement with `tests/test_x.py::test_y` or `benchmarks/bench_z.py`
    names something that runs; a renamed test must not leave the claim pointing at nothing."""
    text = page.read_text(encoding="utf-8")
    missing = []
    for file, name in TEST_REF.findall(text):
        if not (ROOT / file).exists():
            missing.append(file)
        elif name and not re.search(rf"^\s*def {name}\(", (ROOT / file).read_text(encoding="utf-8"), re.MULTILINE):
            missing.append(f"{file}::{name}")
    missing += [s for s in SCRIPT_REF.findall(text) if not (ROOT / s).exists()]
    assert not missing, f"{_rel(page)} names evidence that does not exist: {sorted(set(missing))}"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail to docs/"
    head = "\n".join(lines[:40])
    assert "make lab" in head and "make test" in head


def test_readme_shows_the_panel_screenshot():
    images = [t for t in LINK.findall(README.read_text(encoding="utf-8")) if t.endswith(".png")]
    assert "docs/panel.png" in images
    png = (ROOT / "docs" / "panel.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, "docs/panel.png is not a real screenshot (make screenshots)"


@pytest.mark.parametrize("page", [p for p in PAGES if p not in EVIDENCE_PAGES], ids=_rel)
def test_no_cpu_model_is_named(page):
    """A figure tied to one machine lives in docs/devices.md or benchmarks/ with its date and command."""
    hits = CPU_MODEL.findall(page.read_text(encoding="utf-8"))
    assert not hits, f"{_rel(page)} names CPU models {hits}: move that figure to docs/devices.md or benchmarks/README.md"


def test_cpu_model_pattern_catches_the_usual_names():
    for name in ("AMD EPYC 7B13", "Intel Xeon", "Ryzen 7", "Core i7-1165G7", "Apple M2", "core i5"):
        assert CPU_MODEL.search(name), name
    for fine in ("a 2-core CPU", "core count", "the Core library", "Apple MPS"):
        assert not CPU_MODEL.search(fine), fine


def python_blocks(page: Path) -> list[str]:
    return [code for lang, code in FENCE.findall(page.read_text(encoding="utf-8")) if lang in ("python", "py")]


def workbench_names(tree: ast.AST) -> set[tuple[str, str]]:
    """(module, name) for every `from workbench... import name` and every `wb.name` in a code block."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "workbench":
            found |= {(node.module, a.name) for a in node.names if a.name != "*"}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "wb":
            found.add(("workbench", node.attr))
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "HISTORY.md"], ids=_rel)
def test_python_code_blocks_parse_and_name_what_workbench_has(page):
    """Each block parses, and each workbench name it imports or reads (`wb.X`) exists (HISTORY.md, a
    record of past versions, may name what is gone)."""
    import importlib

    missing = []
    for code in python_blocks(page):
        tree = ast.parse(textwrap.dedent(code))  # a SyntaxError names the line; a class body excerpt is dedented
        for module, name in sorted(workbench_names(tree)):
            if not hasattr(importlib.import_module(module), name) and importlib.util.find_spec(f"{module}.{name}") is None:
                missing.append(f"{module}.{name}")
    assert not missing, f"{_rel(page)} names what workbench does not have: {missing}"


def test_the_name_check_finds_a_missing_name():
    tree = ast.parse("import workbench as wb\nfrom workbench.results import ResultLog, Nope\nwb.Workbench; wb.gone")
    assert workbench_names(tree) == {("workbench.results", "ResultLog"), ("workbench.results", "Nope"),
                                     ("workbench", "Workbench"), ("workbench", "gone")}


def test_readme_one_cell_example_runs_on_a_demo(tmp_path, monkeypatch):
    """The README's first Python block, run as written with a demo's model and dataset in place of
    the reader's: it builds the Workbench and shows the panel, and the Workbench then runs a trial."""
    import workbench as wb
    from workbench.demos import DEMOS

    cell = python_blocks(README)[0]
    assert "wb.Workbench(model, train_dataset" in cell and "bench.panel()" in cell
    parts = DEMOS["cnn"].build("tiny")
    monkeypatch.chdir(tmp_path)  # the default log folder, ./workbench-runs
    scope = {"model": parts["model"], "train_dataset": parts["data"]}
    exec(compile(cell, "README.md", "exec"), scope)
    bench = scope["bench"]
    assert isinstance(bench, wb.Workbench)
    bench.steps, bench.warmup_steps = 3, 1  # a short trial: the example's own settings are checked above
    r = bench.run(batch_size=8, progress=False)
    assert r.ok, r.message
    assert len(bench.results) == 1 and (tmp_path / "workbench-runs").is_dir()


def _generator():
    spec = importlib.util.spec_from_file_location("gen_knobs_doc", ROOT / "scripts" / "gen_knobs_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_knobs_page_is_the_declarations():
    """In a fresh process (no knob a notebook or another test declared): the committed page is what
    the generator writes: exactly `wb.knob_table()`, one row per built-in knob."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_knobs_doc.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    page = (ROOT / "docs" / "knobs.md").read_text(encoding="utf-8")
    for name in ("batch_size", "grad_clip_norm", "fsdp_cpu_offload", "ddp_bucket_cap_mb"):
        assert f"| `{name}` |" in page, name


def test_the_staleness_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    gen = _generator()
    monkeypatch.setattr(gen, "PAGE", tmp_path / "knobs.md")
    (tmp_path / "knobs.md").write_text(gen.render().replace("`grad_clip_norm`", "`gone`"), encoding="utf-8")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_results_page_names_every_column_of_the_results(make_bench):
    """Issue 40: docs/results.md names every column `bench.results` has (a real trial, a failed one, a
    logged comparison); a knob's column is named by docs/knobs.md, which the page points to."""
    import workbench as wb
    from workbench.knobs import knob_names
    from workbench.measure import TrialResult
    from workbench.results.stats import decide

    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    knobs_page = (ROOT / "docs" / "knobs.md").read_text(encoding="utf-8")
    bench = make_bench()
    a = bench.run(progress=False)
    b = bench.run(progress=False, batch_size=16)
    bench.log.append(TrialResult(knobs=wb.Knobs(batch_size=4), status="oom", message="out of memory"))
    bench.log.record_comparison(decide([100.0, 101.0], [120.0, 121.0], bench.noise, a_trials=[1], b_trials=[2]),
                                a.knobs, b.knobs)
    df = bench.results
    assert {"decided_by", "baseline", "verdict"} <= set(df.columns) and "oom" in set(df["status"])
    knobs = set(knob_names())
    missing = [c for c in df.columns if (f"`{c}`" not in knobs_page if c in knobs else f"`{c}`" not in page)]
    assert not missing, f"docs/results.md does not name these columns of bench.results: {missing}"
    assert "knobs.md" in page and all(f"**{w}**" in page for w in ("faster", "slower", "same", "undecided"))
