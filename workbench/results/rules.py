"""The words a decision answers in and the "same speed" margin, written once.

Everything that decides (the deciders in stats.py, the table, the log's comparisons, the tuner's race)
and everything that shows a decision imports these; no other module spells them out.
"""

from __future__ import annotations

from typing import Literal, get_args

Answer = Literal["faster", "slower", "same", "undecided"]  # B against A, in one word (Comparison.answer)
ANSWERS: tuple[Answer, ...] = get_args(Answer)
ANSWER_WORDS = dict(zip(ANSWERS, ("faster", "slower", "same speed", "undecided"), strict=True))  # as a sentence says them
VERDICTS = ("baseline", *ANSWERS)  # the results table's verdict column (a failed trial's is "")
MARGIN = 0.05  # "same speed": the whole interval lies within ±MARGIN (symmetric in log: 1/1.05 … 1.05)


def check_margin(margin: float) -> None:
    """ValueError unless `margin` is a fraction between 0 and 1 (every verb that takes `margin=` calls this)."""
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 < margin < 1:
        raise ValueError(f"margin must be a fraction between 0 and 1 (0.05 = ±5%), got {margin!r}")


__all__ = ["ANSWERS", "ANSWER_WORDS", "MARGIN", "VERDICTS", "Answer", "check_margin"]
