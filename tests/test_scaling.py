"""faces/scaling.py: what bench.scaling() returns, its table, its repr and its chart; the deprecated name."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
from IPython.core.formatters import DisplayFormatter

from workbench.faces.display import STATUS_COLORS, tidy
from workbench.faces.scaling import Scaling


def scaling_frame() -> pd.DataFrame:
    frame = pd.DataFrame({"world_size": [1, 2], "strategy": ["one process", "ddp"], "setup": ["1", "2 x ddp"],
                          "samples_per_s": [100.0, 150.0], "per_rank_samples_per_s": [100.0, 75.0],
                          "efficiency": [1.0, 0.75], "threads_per_rank": [2, 1], "exposed_comm_share": [None, 0.1],
                          "step_time_ms": [10.0, 13.3], "peak_memory_mb": [5.0, 5.5], "model_state_mb": [1.0, 1.0],
                          "status": ["ok", "ok"], "trial_id": [1, 2]})
    frame.attrs.update(spent="spent", notes=["world_size=4: not run"])
    return frame


def test_scaling_holds_the_frame_and_draws_its_chart():
    s = Scaling(scaling_frame())
    assert list(s["efficiency"]) == [1.0, 0.75] and len(s) == 2 and s.frame.iloc[1]["setup"] == "2 x ddp"
    assert s.spent == "spent" and s.notes == ["world_size=4: not run"]
    spec = s.chart().to_dict()
    assert len(spec["layer"]) == 3 and spec["layer"][0]["mark"]["color"] == STATUS_COLORS["ok"]
    text = repr(s)
    assert text.startswith("Scaling (2 rows; .chart() draws it)") and "2 x ddp" in text and "world_size=4" in text
    page = DisplayFormatter().format(s)[0]["text/html"]
    assert "efficiency" in page and "75%" in page and "world_size=4: not run" in page and "scaling.chart()" in page
    with pytest.warns(FutureWarning, match=r"use \.frame\.iloc"):
        assert s.iloc[1]["setup"] == "2 x ddp"  # the DataFrame it was until issue 42, for one release
    with pytest.warns(FutureWarning, match=r"\.frame\.attrs"):
        assert s.attrs["notes"] is s.notes
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        s.nope  # noqa: B018
    with pytest.raises(TypeError, match=r"got Scaling \(pass its \.frame\)"):
        tidy(s, ["world_size"])
    bare = Scaling(pd.DataFrame({"world_size": [1], "samples_per_s": [9.0]}))
    assert bare.notes == [] and bare.spent is None and repr(bare).startswith("Scaling (1 row;")


def test_the_deprecated_scaling_chart_points_to_the_result(make_bench):
    bench = make_bench(steps=2)
    with pytest.warns(FutureWarning, match=r"bench\.scaling\(\.\.\.\)\.chart\(\)"):
        chart = bench.scaling_chart(scaling_frame())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert chart.to_dict() == Scaling(scaling_frame()).chart().to_dict()


def test_bench_scaling_returns_the_result_of_its_trials(make_bench):
    bench = make_bench(steps=2)
    s = bench.scaling((1,), progress=False)
    assert isinstance(s, Scaling) and list(s["world_size"]) == [1] and list(s["status"]) == ["ok"]
    assert list(s["trial_id"]) == [bench.trials[-1].trial_id] and s["efficiency"].iloc[0] == pytest.approx(1.0)
    assert s.spent.budget_s is None and s.spent.not_started == 0 and s.notes == []  # no budget_s: nothing left out
    assert len(s.chart().to_dict()["layer"]) == 3
