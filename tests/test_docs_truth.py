"""The docs say what the package is: every path a page names exists, every code name in backticks is a
name the package has, no page, notebook or public docstring uses a retired word (issue 50), no user-facing
text speaks of the project's history (issue numbers, rounds), every measured figure on a page carries its
benchmark link or its date and machine, and the README's install table is pyproject.toml's.

The known names are generated from the package itself (its source's identifiers, parameters, attributes and
string constants such as result columns, plus the knob registry), never listed by hand; the only hand-kept
list is `NOT_OURS`, the few outside names (tools, other libraries) a page may put in backticks.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")

# ---- paths -------------------------------------------------------------------------------------------
# A repository path as pages write it: a top folder, or a package folder written relative to workbench/.
PACKAGE_DIRS = "core|faces|launch|results|search|deciding|diagnose|demos|knobs|panel"
PATH = re.compile(rf"(?<![\w./~-])((?:workbench|tests|benchmarks|scripts|notebooks|docs|\.ci|{PACKAGE_DIRS})"
                  r"/[\w./-]*\w)")
# Paths a page names that are not in the repository on purpose: what a reader's run creates.
MADE_BY_A_RUN = ("workbench-runs/",)


def path_exists(ref: str) -> bool:
    """A page's path, from the repository root, or relative to workbench/ or workbench/core/ (architecture.md
    lists modules by folder)."""
    ref = ref.rstrip(".")
    if ref.startswith(MADE_BY_A_RUN):
        return True
    module = re.sub(r"\.[A-Za-z_]\w*$", "", ref) if not ref.endswith((".py", ".md")) else ref  # deciding/budget.Budget
    candidates = {ref, f"{ref}.py", f"{module}.py"}
    return any((base / c).exists() for base in (ROOT, ROOT / "workbench", ROOT / "workbench" / "core") for c in candidates)


BARE_PAGE = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")  # "DESIGN.md", "results.md": a page by its name alone


def missing_paths(text: str) -> list[str]:
    gone = {m for m in PATH.findall(text) if not path_exists(m)}
    gone |= {m for m in BARE_PAGE.findall(text) if not any((d / m).exists() for d in (ROOT, ROOT / "docs",
                                                                                        ROOT / "benchmarks"))}
    return sorted(gone)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    gone = missing_paths(page.read_text(encoding="utf-8"))
    assert not gone, f"{page.relative_to(ROOT)} names paths that do not exist: {gone}"


def test_every_path_a_docstring_names_exists():
    gone = {}
    for file, text in _docstrings():
        if bad := missing_paths(text):
            gone[str(file.relative_to(ROOT))] = bad
    assert not gone, f"docstrings name paths that do not exist: {gone}"


# ---- code names ----------------------------------------------------------------------------------------
# Outside names a page may put in backticks that the package does not spell itself. Keep it small: a name the
# package lost must not hide here. Dotted names rooted in another library or a reader's object are EXTERNAL_ROOTS.
NOT_OURS = {
    "slurm_partition", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min",  # submitit's parameters
    "TraceAnalysis", "TraceDiff",  # HolisticTraceAnalysis (docs/analysis.md says why it is not used)
    "state_dict",  # torch's
    "get_length_grouped_indices",  # transformers' (group_by_length's sampler, docs/measurement.md)
    "estimated_stepping_batches",  # Lightning's Trainer attribute (docs/lightning.md: what from_lightning refuses)
    "include_num_input_tokens_seen",  # transformers' TrainingArguments flag (docs/lightning.md)
    "slurm_setup",  # submitit's parameter: the setup lines a process knob's environment travels in
    "make_bench",  # a reader's factory in the CLI and torchrun examples (`mypkg.train:make_bench`)
}
EXTERNAL_ROOTS = {"torch", "np", "numpy", "pd", "pandas", "alt", "altair", "os", "sys", "transformers", "accelerate",
                  "submitit", "lightning", "pl", "datasets", "tokenizers", "ipywidgets", "IPython", "psutil", "json",
                  "math", "time", "datetime", "functools", "contextlib", "subprocess", "signal", "mp", "nn", "F",
                  "optim", "torchvision", "pytest", "jupyter", "tensorboard", "ui", "sbatch", "pip", "make",
                  "python", "python3", "trainer", "args", "model", "batch", "output", "out", "step_fn", "loss_fn",
                  "ex", "executor", "job", "self", "x", "f", "dataset", "ray", "distributed", "dask"}
FILE_SUFFIX = re.compile(r"\.(py|md|ipynb|toml|txt|yml|yaml|json|jsonl|csv|html|png|svg|sh|cfg|conf|so|whl|log|pt)\b")
IDENT = re.compile(r"[A-Za-z_][\w-]*")  # a string constant that is a name: a column, a key, a choice
CODE_START = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*")


def _package_files() -> list[Path]:
    return sorted(p for p in (ROOT / "workbench").rglob("*.py"))


@functools.lru_cache(maxsize=1)
def package_names() -> frozenset[str]:
    """Every name the package has: identifiers it defines or reads (functions, classes, parameters, attributes,
    keywords), its identifier-like string constants (result columns, verdict words, knob values, environment
    variables; prose in docstrings and messages does not count, so it cannot keep a gone name alive) and the
    knob registry's names (your own knobs included once declared)."""
    names: set[str] = set()
    for file in _package_files():
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[-1])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if IDENT.fullmatch(node.value):  # a column or key; env["slurm_job_id"] from "SLURM_JOB_ID"
                    names |= {node.value, node.value.lower()}
                else:  # code inside a string: generated scripts' calls and labels' `name=` ("ckpt=2")
                    names |= set(re.findall(r"([A-Za-z_]\w*)(?:\(|=)", node.value))
        names |= {file.stem, file.parent.name}  # modules and their folders (`faces`, `core`)
    from workbench.core.knobs import KNOBS

    names |= set(KNOBS)
    for file in sorted((ROOT / "tests").glob("test_*.py")):  # the pages cite the tests behind a promise by name
        names |= set(re.findall(r"^def (test_\w+)", file.read_text(encoding="utf-8"), re.M))
    return frozenset(names)


def code_names(span: str) -> list[str]:
    """The package names an inline code span claims: a dotted name's parts (after `bench.`, `wb.` ...), a call's
    name and its keyword arguments, a `name=value`'s name. Values, flags, paths and prose are not names."""
    span = span.strip()
    if not span or span[0] in "-\"'<[{(#$!.@0123456789" or "/" in span.split("(")[0] or FILE_SUFFIX.search(span):
        return []
    m = CODE_START.match(span)
    if m is None:
        return []
    head, rest = m.group(0), span[m.end():]
    parts = head.split(".")
    if parts[0] in EXTERNAL_ROOTS or head in NOT_OURS:
        return []
    if len(parts) == 1 and not rest.startswith(("(", "=")) and "_" not in head.strip("_"):
        return []  # a plain word (`label`, `ok`): prose as often as code
    if rest and not rest.startswith(("(", "=", "[", " ", ",", ":")):
        return []
    out = [p for p in parts if p not in NOT_OURS and not p.isupper()]
    if rest.startswith("("):
        out += re.findall(r"(?<![\w.])([a-z_]\w*)=(?!=)", rest)
    return [n for n in out if n not in NOT_OURS]


def unknown_names(text: str) -> list[str]:
    known = package_names()
    found = []
    for span in INLINE.findall(FENCE.sub("", text)):
        found += [n for n in code_names(span) if n not in known]
    return sorted(set(found))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_name_a_page_puts_in_backticks_exists(page):
    gone = unknown_names(page.read_text(encoding="utf-8"))
    assert not gone, (f"{page.relative_to(ROOT)} names, in backticks, what the package does not have: {gone} "
                      "(rename them; an outside name goes in NOT_OURS with a reason)")


def test_the_path_check_can_fail():
    assert missing_paths("see workbench/race.py, docs/nope.md and DESIGN.md; `core/knobs/spec.py`") == [
        "DESIGN.md", "docs/nope.md", "workbench/race.py"]
    assert missing_paths("workbench/search/race.py, deciding/budget.Budget, results.md, `knobs/spec.py`") == []


def test_the_name_check_can_fail():
    """Planted: a method, a parameter, a column and a knob the package does not have; and names it does have."""
    bad = ("`bench.no_such_verb()` `bench.compare(a, b, rounds_max=3)` `wb.Nowhere` `no_such_column` "
           "`frobnicate=True`")
    assert unknown_names(bad) == ["Nowhere", "frobnicate", "no_such_column", "no_such_verb", "rounds_max"]
    fine = ("`bench.compare(a, b, rounds=\"auto\", budget_s=30)` `bench.results` `samples_per_s` `num_workers=2` "
            "`torch.compile` `make lab` `--num-workers` `\"fp16\"` `docs/results.md` `pip install x`")
    assert unknown_names(fine) == []


# ---- retired words ---------------------------------------------------------------------------------------
# The words the project retired, with what replaced them. A sentence that names an old keyword as such
# ("the old name", "deprecated", a FutureWarning) is allowed: it is how a rename is announced.
RETIRED = {
    r"\bbeyond (the )?noise\b": "the answer itself: \"faster\" or \"slower\"",
    r"\bwithin (the )?noise\b": '"same" (shown within ±margin) or "undecided" (cannot tell), never one word for both',
    r"\bno clear difference\b": '"same" or "undecided"',
    r"\.beyond_noise\b": "`.answer` (or `.differs`)",
    r"(?<![\w.])budget=": "`n_trials=` (trials) or `budget_s=` (seconds)",
    r"\bbudget_bytes\b": "`max_bytes`",
    r"\bmemory_budget\b": "`max_bytes`",
    r"\bfit_memory\(budget\b": "`fit_memory(max_bytes, ...)`",
    r"\b(turns?|interleav\w*)\b[^.\n]{0,30}\bblocks?\b|\bBlocks: about": 'interleaving runs "turns", not blocks',
    r"\bcompare\([^)\n]*\binterleave=": '`compare(..., method="trials" | "interleave")`',
    r"\bno_change\b|\bsame_speed\b|\bhelped\b.{0,20}\bhurt\b": "the four answers: faster, same, slower, undecided",
}
ANNOUNCES_A_RENAME = re.compile(r"old name|deprecated|FutureWarning|DeprecationWarning|is now", re.IGNORECASE)


def retired_words(text: str) -> list[str]:
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        for pattern, instead in RETIRED.items():
            for m in re.finditer(pattern, paragraph, re.IGNORECASE):
                end = paragraph.find("\n", m.end())
                line = paragraph[paragraph.rfind("\n", 0, m.start()) + 1:None if end == -1 else end]
                if not ANNOUNCES_A_RENAME.search(line):
                    found.append(f"{m.group(0)!r} (say {instead})")
    return found


def _docstrings() -> list[tuple[Path, str]]:
    """Every docstring of the package's public modules, classes and functions (what help() shows)."""
    out = []
    for file in _package_files():
        tree = ast.parse(file.read_text(encoding="utf-8"))
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                    ast.ClassDef)) and not n.name.startswith("_"))]
        out += [(file, doc) for n in nodes if (doc := ast.get_docstring(n))]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_uses_a_retired_word(page):
    found = retired_words(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_uses_a_retired_word(notebook):
    nb = nbformat.read(notebook, as_version=4)
    found = [f"cell {i}: {w}" for i, cell in enumerate(nb.cells) for w in retired_words(cell.source)]
    assert not found, f"{notebook.name}: {found}"


def test_no_public_docstring_uses_a_retired_word():
    found = {f"{file.relative_to(ROOT)}": words for file, doc in _docstrings() if (words := retired_words(doc))}
    assert not found, found


def test_the_retired_word_check_can_fail():
    planted = ("The gap is beyond noise. Within the noise. if c.beyond_noise: bench.tune(budget=20) "
               "fit_memory(budget, 64) budget_bytes Blocks: about 30 ms; turns of short blocks "
               "bench.compare(a, b, interleave=False) no_change")
    assert len(retired_words(planted)) >= 10
    assert retired_words("`budget=` is the old name of `n_trials` (FutureWarning)") == []
    assert retired_words('bench.tune(budget_s=60); compare(a, b, method="trials"); checkpoint the blocks') == []


# ---- generated from the source: the add-a-knob example, the notebooks' extras ------------------------
def test_the_add_a_knob_example_is_the_source_as_it_is():
    """docs/architecture.md's worked knob (`cudnn_benchmark`): its hook and its declaration, as the source has
    them (a declaration that drops `interleave=True` teaches a knob that never interleaves)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    source = (ROOT / "workbench" / "core" / "knobs" / "precision.py").read_text(encoding="utf-8")
    section = page[page.index("### A built-in knob, worked"):page.index("### Your own knob")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2 and "declare(" in blocks[1]
    flat = "\n".join(line.strip() for line in source.splitlines())
    for block in blocks:
        assert "\n".join(line.strip() for line in block.strip().splitlines()) in flat, f"not the source as it is:\n{block}"


EXTRAS = {"transformers": "hf", "accelerate": "hf", "submitit": "cluster", "lightning": "lightning"}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_that_needs_an_extra_says_which_in_its_first_cell(notebook):
    """`make lab` installs the notebook extra only: a notebook that imports more names the extra and the command
    in its first code cell, where a reader without it stops or learns what is skipped."""
    nb = nbformat.read(notebook, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    imported = {m for src in code for m in re.findall(r"^\s*(?:import|from)\s+(\w+)", src, re.MULTILINE)}
    needed = sorted({EXTRAS[m] for m in imported if m in EXTRAS})
    for extra in needed:
        assert f'pip install "tuning-workbench[{extra}]"' in code[0] or \
            f"pip install 'tuning-workbench[{extra}]'" in code[0], \
            f"{notebook.name} imports what the {extra} extra installs: say so in its first code cell, with the command"


def test_no_page_counts_the_notebooks_by_hand():
    """A count goes stale with the next notebook: pages say "every notebook" or list them."""
    counted = re.compile(r"\b(all|the)\s+(two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
                         r"fourteen|\d+)\s+(tutorial\s+)?notebooks\b(?! of that day)", re.IGNORECASE)
    found = {str(p.relative_to(ROOT)): counted.findall(p.read_text(encoding="utf-8"))
             for p in [*PAGES, ROOT / "benchmarks" / "README.md"]}
    assert not {k: v for k, v in found.items() if v}, found


# ---- no history in user-facing text ----------------------------------------------------------------------
# A reader does not know what "issue 48" or "round 5" was: a page says what is true now, and history lives in
# git and benchmarks/HISTORY.md. User-facing text: README, docs/, notebooks (every cell), and every string the
# package holds (docstrings, messages, labels; comments are not strings and stay the developers').
HISTORY = re.compile(r"\bissues? #?\d+\b|#\d{2,}\b(?=[^\n]{0,20}\b(?:fix|issue))|\bround \d+\b", re.IGNORECASE)


def history_words(text: str) -> list[str]:
    return sorted({m.group(0) for m in HISTORY.finditer(text)})


def _package_strings() -> list[tuple[Path, str]]:
    out = []
    for file in _package_files():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append((file, node.value))
    return out


def test_no_user_facing_text_speaks_of_the_project_s_history():
    found: dict[str, list[str]] = {}
    for page in PAGES:
        if words := history_words(page.read_text(encoding="utf-8")):
            found[str(page.relative_to(ROOT))] = words
    for notebook in NOTEBOOKS:
        nb = nbformat.read(notebook, as_version=4)
        if words := history_words("\n".join(c.source for c in nb.cells)):
            found[notebook.name] = words
    for file, text in _package_strings():
        if words := history_words(text):
            found.setdefault(str(file.relative_to(ROOT)), []).extend(words)
    assert not found, f"issue numbers or rounds in user-facing text (say what is true now): {found}"


def test_the_history_check_can_fail():
    assert history_words("before the issue 48 fixes; logs before round 5; see issues 30 and 34") == [
        "issue 48", "issues 30", "round 5"]
    assert history_words('compare(a, b, rounds="auto") ran 3 rounds; a round of trials; 48 steps') == []


# ---- figures with their conditions ---------------------------------------------------------------------
# A measured figure goes stale with the machine it came from, so the reader must be able to tell where and when
# it was measured. The rule, for README.md and docs/: a paragraph (or a table row) that states a measured figure
# either links the benchmark that made it (benchmarks/README.md#section, or docs/devices.md for a device run)
# or gives its conditions: a date (2026-12-04) and a machine. A measured figure is
#   - a rate: N samples/s, tokens/s or steps/s (only a measurement has one);
#   - a spread or change of figures: 1.54–1.68×, 433.7 → 435.4 MB, 176 vs 20 ms;
#   - any figure with a unit in a sentence that says it was measured: "measured: ...", "in CI", "tried on ...",
#     "on an H200", "on a 2-core CPU".
# Settings and rules (a 5% margin, a 120 s timeout, the 20% data-wait line) are not measurements and pass.
# Code (fenced or in backticks) is not prose and is skipped.
UNIT = r"(?:samples/s|tokens/s|steps/s|ms|µs|s|min|×|x|%|[KMG]i?B)"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.=/#+-]){NUMBER}(?P<spread>\s?(?:–|→|vs\.?)\s?{NUMBER})?\s?(?P<unit>{UNIT})(?![\w/])")
RATES = ("samples/s", "tokens/s", "steps/s")
SAYS_MEASURED = re.compile(r"\bmeasured(?::| at| as)|\bin CI\b|\btried on\b|"
                           r"\bon (?:an?|one) (?:H100|H200|A100|GPU|\d+-core)\b", re.IGNORECASE)
SENTENCE = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(])|\n(?=\s*(?:[-*]|\d+\.) )")
CITES = re.compile(r"benchmarks/README\.md#[\w-]+|devices\.md")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"\b(?:H100|H200|A100|GPU|CPU|cores?|VM|laptop|machine)\b", re.IGNORECASE)


def measured_figures(paragraph: str) -> list[str]:
    out = []
    for sentence in SENTENCE.split(paragraph):
        said = SAYS_MEASURED.search(sentence)
        out += [m.group(0) for m in FIGURE.finditer(sentence) if said or m.group("spread") or m.group("unit") in RATES]
    return out


def figures_without_conditions(text: str) -> list[str]:
    """The measured figures of a page whose paragraph or table row neither cites a benchmark nor gives a date and
    a machine."""
    prose = re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))
    bare = []
    for paragraph in re.split(r"\n\s*\n|\n(?=\|)", prose):  # a table row is a paragraph of its own
        figures = measured_figures(paragraph)
        if figures and not CITES.search(paragraph) and not (DATE.search(paragraph) and MACHINE.search(paragraph)):
            bare += figures
    return bare


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measured_figure_has_its_benchmark_or_its_conditions(page):
    bare = figures_without_conditions(page.read_text(encoding="utf-8"))
    assert not bare, (f"{page.relative_to(ROOT)} states measured figures {bare} without their conditions: link the "
                      "benchmarks/README.md section that made them (or docs/devices.md), or give the date and machine "
                      "in the same paragraph")


def test_the_figure_check_can_fail():
    """A planted page: a rate, a spread and a figure said to be measured, each bare; then each made good."""
    planted = ("# A page\n\nThe cnn demo runs at 20,668 samples/s.\n\nThe effect is 1.54–1.68× too fast.\n\n"
               "| soak | RSS grew < 5% (measured: 433.7 → 435.4 MB) |\n\nIt took 143 s in CI.\n")
    assert figures_without_conditions(planted) == ["20,668 samples/s", "1.54–1.68×", "5%", "433.7 → 435.4 MB", "143 s"]
    fine = ("The margin is 5% and a trial times out after 120 s; the 20% line marks data-bound.\n\n"
            "The cnn demo runs at 20,668 samples/s ([benchmarks](../benchmarks/README.md#gpu-check)).\n\n"
            "It took 143 s in CI (2026-12-04, the 2-core CPU VM).\n\n`bench.run()  # 1,000 samples/s`\n")
    assert figures_without_conditions(fine) == []


# ---- the README's install table is pyproject.toml's ------------------------------------------------------
def _requirement_names(requirements: list[str]) -> set[str]:
    """Package names of requirement strings, leaving out this package's own extras and environment-only ones."""
    names = set()
    for req in requirements:
        if ";" in req or req.startswith("tuning-workbench"):
            continue
        names.add(re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower())
    return names


def install_rows_missing(readme: str, project: dict) -> list[str]:
    """What the README's install table leaves out: an extra without its row, a package its row does not name."""
    rows = [line for line in readme.splitlines() if line.startswith("|") and "pip install" in line]
    core = next((r for r in rows if "`pip install tuning-workbench`" in r), "")
    missing = [f"core: {n}" for n in sorted(_requirement_names(project["dependencies"])) if n not in core.lower()]
    for extra, requirements in project["optional-dependencies"].items():
        row = next((r for r in rows if f"tuning-workbench[{extra}]" in r), None)
        if row is None:
            missing.append(f"[{extra}]: no row")
            continue
        missing += [f"[{extra}]: {n}" for n in sorted(_requirement_names(requirements)) if n not in row.lower()]
    return missing


def test_the_readme_install_table_names_every_extra_and_what_it_adds():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    missing = install_rows_missing((ROOT / "README.md").read_text(encoding="utf-8"), project)
    assert not missing, f"README.md's install table leaves out: {missing}"


def test_the_install_table_check_can_fail():
    project = {"dependencies": ["torch>=2.4", "cloudpickle>=2.2"],
               "optional-dependencies": {"hf": ["transformers>=4.40"], "lightning": ["lightning>=2.1"],
                                         "test": ["tuning-workbench[hf]", "pytest>=8", "tomli; python_version < '3.11'"]}}
    readme = ("| the core (torch) | `pip install tuning-workbench` |\n| Hugging Face (adds transformers) | "
              '`pip install "tuning-workbench[hf]"` |\n| tests (adds nbval) | `pip install "tuning-workbench[test]"` |\n')
    assert install_rows_missing(readme, project) == ["core: cloudpickle", "[lightning]: no row", "[test]: pytest"]
