"""Trials of one model: a log keeps every trial it was given, but a workbench compares only its own model's.

Each trial carries the fingerprint of the model it measured (`TrialResult.extra["model"]`, written by the
Workbench: faces/reloaded.py). A log told its workbench's fingerprint (`ResultLog.model`) takes its baseline,
noise, speedups and verdicts from that model's trials alone; the trials of another model (the model was edited
since they ran, or an older workbench wrote them without a fingerprint) stay in the log and in the table,
with their `model` column, no speedup and no verdict. A trial appended in this process without a fingerprint
(`bench.log.append(...)`) takes the log's: it was given to this workbench. A log without a fingerprint
(`model` None) compares every trial, as a shared workshop folder does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from .table import static_frame

MODEL_KEY = "model"  # TrialResult.extra key of the measured model's fingerprint


def model_of(r: TrialResult) -> str:
    """The fingerprint of the model trial `r` measured ("" when it was written without one)."""
    fp = r.extra.get(MODEL_KEY) if isinstance(r.extra, dict) else None
    return fp if isinstance(fp, str) else ""


def same_model(r: TrialResult, model: str | None) -> bool:
    """True when `r` measured the model `model` names (None: every trial counts)."""
    return model is None or model_of(r) == model


def of_model(trials: list[TrialResult], model: str | None) -> list[TrialResult]:
    """The trials of model `model` (every trial, the same list, when `model` is None)."""
    return trials if model is None else [r for r in trials if model_of(r) == model]


def with_others(df: pd.DataFrame, trials: Sequence[TrialResult], model: str | None,
                defaults: Knobs | None) -> pd.DataFrame:
    """The table of one model's trials (`df`) with the rows of every other model's trials added in trial order:
    their own figures, label and `model`, no speedup, no verdict (never compared with this model's)."""
    if model is None:
        return df
    others = [r for r in trials if model_of(r) != model]
    if not others:
        return df
    rest = static_frame(others)
    rest["label"] = [r.knobs.label(defaults) for r in others]
    rest["speedup"], rest["verdict"], rest["judged_on"] = np.nan, "", ""
    out = pd.concat([df, rest], ignore_index=True) if len(df) else rest
    out = out.sort_values("trial_id", kind="stable").reset_index(drop=True)
    out["baseline"] = out["baseline"].fillna(False).astype(bool)
    out["mode_differs"] = out["mode_differs"].fillna(False).astype(bool) if "mode_differs" in out else False
    out.attrs = df.attrs
    return out
