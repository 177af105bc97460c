"""display.py: tables rounded, with units in the headers, the cached batch's loss marked."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from workbench.faces.display import tidy


def cells(styler) -> list[str]:
    return re.findall(r">([^<>]+)</t[dh]>", styler.to_html())


def test_tidy_rounds_names_units_and_marks_the_cached_loss():
    df = pd.DataFrame({"label": ["baseline", "data=cached"], "samples_per_s": [4842.835992, 10000.1],
                       "speedup": [1.0, 2.0625], "final_loss": [0.85, 0.0612], "data": ["loader", "cached"],
                       "compile_s": [np.nan, None], "other": [1.123456, 2.0]})
    text = cells(tidy(df, ["label", "samples_per_s", "speedup", "final_loss", "compile_s", "other"]))
    assert text[:6] == ["label", "samples/s", "speedup ×", "final loss", "compile s", "other"]
    assert "4,842.8" in text and "2.06×" in text and "1.12" in text
    assert "0.8500" in text and "0.0612 (1 batch: not comparable)" in text  # from the full frame's data knob
    assert "–" in text and not any("4842.835992" in t or "nan" in t for t in text)


def test_tidy_refuses_what_it_cannot_show():
    with pytest.raises(TypeError, match="DataFrame"):
        tidy([1, 2])
    with pytest.raises(ValueError, match="no column"):
        tidy(pd.DataFrame({"a": [1]}), ["b"])
