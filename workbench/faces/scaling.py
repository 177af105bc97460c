"""What `bench.scaling()` returns: search/scaling.py's table of one trial per world size, with its picture.

    scale = bench.scaling(world_sizes=(1, 2))
    scale["efficiency"]          # a column of scale.frame
    scale.chart()                # bars per world size against linear scaling (charts.scaling_chart)

The search below the faces returns a plain DataFrame (it may not import the faces); this wraps it.
Importable without altair: only `chart()` needs the notebook extra.
"""

from __future__ import annotations

import html
import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .display import tidy

SHOWN = [  # the columns its table shows (the frame holds more)
    "setup", "world_size", "threads_per_rank", "samples_per_s", "per_rank_samples_per_s", "efficiency",
    "peak_memory_mb", "model_state_mb", "status", "trial_id"]


@dataclass(frozen=True)
class Scaling:
    """What `bench.scaling()` returns: one row per world size (and strategy) in `frame`, its picture in `chart()`.

    `frame` is search/scaling.py's DataFrame (world_size, strategy, setup, samples_per_s,
    per_rank_samples_per_s, efficiency, threads_per_rank, peak_memory_mb, model_state_mb, status, trial_id);
    `scaling["efficiency"]` reads a column of it. With a `budget_s`, `spent` and `notes` say how the seconds went.
    """

    frame: pd.DataFrame

    def __getitem__(self, column: Any) -> Any:
        return self.frame[column]

    def __getattr__(self, name: str) -> Any:
        """DataFrame names (`iloc`, `attrs`, `to_csv`, ...) reach `frame`, deprecated: a FutureWarning names
        `.frame`, and the next release drops them."""
        if name == "frame" or name.startswith("_") or not hasattr(pd.DataFrame, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(f"bench.scaling() returns a Scaling: use .frame.{name} (its DataFrame)", FutureWarning,
                      stacklevel=2)
        return getattr(self.frame, name)

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def spent(self) -> Any:
        """The budget's account (deciding/budget.py `Spend`), the search's own object."""
        return self.frame.attrs.get("spent")

    @property
    def notes(self) -> list[str]:
        """Where the seconds went: a row left out or stopped at the deadline, and why."""
        return self.frame.attrs.get("notes", [])

    def chart(self, *, width: int = 360) -> Any:
        """Global samples/s per world size (bars) against linear scaling (dashed), each bar labelled with its
        efficiency (an altair chart; needs the notebook extra)."""
        from .charts import scaling_chart

        return scaling_chart(self.frame, width=width)

    def _columns(self) -> list[str]:
        return [c for c in SHOWN if c in self.frame.columns and (c != "setup" or self.frame[c].notna().any())]

    def __repr__(self) -> str:
        notes = "".join(f"\n  {n}" for n in self.notes)
        return f"Scaling ({len(self)} row{'s' if len(self) != 1 else ''}; .chart() draws it):\n{self.frame[self._columns()].to_string(index=False)}{notes}"

    def _repr_html_(self) -> str:
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (tidy(self.frame, self._columns()).to_html()
                + (f'<ul style="margin:2px 0;color:#555">{notes}</ul>' if notes else "")
                + "<p><small>scaling.chart() draws it; scaling.frame holds every column</small></p>")
