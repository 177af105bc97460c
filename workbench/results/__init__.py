"""Results: the names a user imports, gathered from the modules that hold them.

- `log.ResultLog`: the append-only JSONL log of trials, its locking and persistence; `log.read_appended`,
  the one reader of JSONL logs (the workshop's gather uses it too);
- `rules`: the answers (`ANSWERS`) and the "same speed" `MARGIN`, written once;
- `records`: parsing untrusted log lines (`parse_record`, `read_records`, `BadRecord`) and safe
  file names (`safe_file_name`, `default_participant`);
- `table`: the results table behind `ResultLog.frame()` (`SUMMARY_COLUMNS`);
- `comparison`: deciding between configurations from trials already run (`judge`), and the one noise
  estimator (`NoiseTracker`, kept per trial by the table; `noise_of` for a batch);
- `protocol.Bench`: the surface of a Workbench that the layers above type against.

`compare` (alternating rounds of trials before deciding) lives one layer up, in
`workbench.deciding.rounds`, and is `wb.compare`.
"""

from __future__ import annotations

from .comparison import NoiseTracker, Trials, allocator_note, judge, noise_of, usable
from .log import MAX_FILE_BYTES, Appended, ResultLog, Unreadable, read_appended
from .records import (
           FILE_NAME_CHARS,
           MAX_DEPTH,
           MAX_LINE_BYTES,
           MAX_NAME_CHARS,
           BadRecord,
           LoggedComparison,
           bad_lines_text,
           default_participant,
           parse_record,
           read_records,
           safe_file_name,
)
from .rules import ANSWERS, MARGIN
from .stats import Comparison, Noise
from .table import OPTIONAL_INT_KNOBS, SUMMARY_COLUMNS

__all__ = ["ANSWERS", "FILE_NAME_CHARS", "MARGIN", "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_LINE_BYTES", "MAX_NAME_CHARS",
           "OPTIONAL_INT_KNOBS", "SUMMARY_COLUMNS", "Appended", "BadRecord", "Comparison", "LoggedComparison", "Noise",
           "NoiseTracker", "ResultLog", "Trials", "Unreadable", "allocator_note", "bad_lines_text", "default_participant",
           "judge", "noise_of", "parse_record", "read_appended", "read_records", "safe_file_name", "usable"]
