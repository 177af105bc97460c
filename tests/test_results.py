"""results: every public name still importable from it, and trials' derived figures."""

from dataclasses import replace

import pytest
from fake_trials import fake

import workbench as wb
from workbench.core.measure import TrialResult


def test_median_and_iqr_are_derived_from_the_raw_samples():
    r = fake([0.1, 0.2, 0.3, 0.4, 0.5])
    pooled = replace(r, step_times_s=(*r.step_times_s, 1.0, 1.1, 1.2, 1.3))  # a pooled repeat
    assert r.step_time_s == pytest.approx(0.3) and pooled.step_time_s == pytest.approx(0.5)
    assert pooled.step_time_iqr_s > r.step_time_iqr_s
    stale = TrialResult(knobs=wb.Knobs(), status="ok", step_time_s=9.0, step_times_s=(0.1, 0.3))
    assert stale.step_time_s == pytest.approx(0.2)


# Every name users imported from workbench.results before it split into its modules (issue 32) and became the
# results/ folder (issue 42): each must still import from here, as the very object its module holds. `compare`
# runs trials, so it lives a layer up (workbench.deciding.rounds) and users import it as wb.compare.
PUBLIC = {
    "log": ["ResultLog", "MAX_FILE_BYTES", "read_appended", "Appended", "Unreadable"],
    "rules": ["ANSWERS", "MARGIN"],
    "records": ["BadRecord", "parse_record", "read_records", "bad_lines_text", "safe_file_name", "default_participant",
                "MAX_LINE_BYTES", "MAX_DEPTH", "MAX_NAME_CHARS", "FILE_NAME_CHARS"],
    "table": ["SUMMARY_COLUMNS", "OPTIONAL_INT_KNOBS"],
    "comparison": ["noise_of", "NoiseTracker", "allocator_note", "Trials"],
    "stats": ["Comparison", "Noise"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_still_imports_from_results(module):
    import importlib

    import workbench.results as results

    home = importlib.import_module(f"workbench.results.{module}")
    for name in PUBLIC[module]:
        assert getattr(results, name) is getattr(home, name), name
        assert name in results.__all__, name


def test_the_package_exports_the_results_names():
    import workbench.results as results
    from workbench.deciding.rounds import compare

    assert wb.ResultLog is results.ResultLog and wb.compare is compare and wb.Comparison is results.Comparison
