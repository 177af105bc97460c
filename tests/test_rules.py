"""results/rules.py: the answers and the "same speed" margin, and every other shared rule, live in one place each."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
# Each rule's one home: another module that assigns the name (rather than importing it) has written the
# rule a second time. SAME_MARGIN is the race's alias of MARGIN (the same object, checked below).
HOMES = {
    "MARGIN": "results/rules.py", "SAME_MARGIN": "search/race.py", "ANSWERS": "results/rules.py",
    "ANSWER_WORDS": "results/rules.py", "VERDICTS": "results/rules.py", "CONFIRM_ROUNDS": "deciding/rounds.py",
    "DATA_WAIT_LIMIT": "diagnose/data.py", "DATA_BOUND": None,
}


def assignments() -> dict[str, list[tuple[str, ast.expr]]]:
    """name -> [(module path, assigned value)] of every module-level assignment to a HOMES name."""
    found: dict[str, list[tuple[str, ast.expr]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id in HOMES and node.value is not None:
                    found.setdefault(t.id, []).append((path.relative_to(PACKAGE).as_posix(), node.value))
    return found


def test_each_rule_is_written_in_one_module():
    found = assignments()
    for name, home in HOMES.items():
        places = [p for p, _ in found.get(name, [])]
        assert places == ([home] if home else []), f"{name} is assigned in {places}; its one home is {home}"


def test_no_list_of_words_is_spelled_out_twice():
    """A literal tuple, list or set of 3+ words (the answers, a step's phases, ...) appears once in the package;
    everywhere else imports it (a type's Literal[...] counts: derive the tuple with typing.get_args)."""
    seen: dict[tuple[str, ...], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 3:
                words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(words) == len(node.elts):
                    seen.setdefault(tuple(sorted(words)), []).append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    twice = {words: places for words, places in seen.items() if len(places) > 1}
    assert not twice, f"the same words spelled out in several places (keep one, import it): {twice}"


def test_the_aliases_are_the_same_objects():
    from workbench.diagnose import data, report
    from workbench.results import records, rules, stats
    from workbench.search import race, tune

    assert race.SAME_MARGIN is rules.MARGIN is stats.MARGIN and tune.SAME_MARGIN is rules.MARGIN
    assert records.ANSWERS is rules.ANSWERS is tune.ANSWERS and stats.ANSWER_WORDS is rules.ANSWER_WORDS
    assert tuple(rules.ANSWER_WORDS) == rules.ANSWERS and rules.VERDICTS == ("baseline", *rules.ANSWERS)
    from workbench.deciding import rounds

    assert race.CONFIRM_ROUNDS is rounds.CONFIRM_ROUNDS and report.CONFIRM_ROUNDS is rounds.CONFIRM_ROUNDS
    assert tune.DATA_WAIT_LIMIT is data.DATA_WAIT_LIMIT and not hasattr(tune, "DATA_BOUND")


@pytest.mark.parametrize("margin", [0, 1, -0.1, 1.5, True, "0.05", None, float("nan")])
def test_one_margin_check_for_every_verb(margin):
    from fake_trials import fake

    from workbench.results.comparison import judge
    from workbench.results.rules import check_margin
    from workbench.results.stats import decide_interleaved

    for call in (lambda: check_margin(margin), lambda: judge(fake([0.01, 0.01]), fake([0.01, 0.011]), margin=margin),
                 lambda: decide_interleaved([1.0, 1.1, 1.0], [1.0, 1.0, 1.1], margin=margin)):
        with pytest.raises(ValueError, match=r"margin must be a fraction between 0 and 1 \(0\.05 = ±5%\)"):
            call()
