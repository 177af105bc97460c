"""Results: the names a user imports, gathered from the modules that hold them.

- `log.ResultLog`: the append-only JSONL log of trials, its locking and persistence;
- `records`: parsing untrusted log lines (`parse_record`, `read_records`, `BadRecord`) and safe
  file names (`safe_file_name`, `default_participant`);
- `table`: the results table behind `ResultLog.frame()` (`SUMMARY_COLUMNS`);
- `comparison`: deciding between configurations from trials already run (`judge`, `noise_of`);
- `protocol.Bench`: the surface of a Workbench that the layers above type against.

`compare` (alternating rounds of trials before deciding) lives one layer up, in
`workbench.deciding.rounds`, and is `wb.compare`.
"""

from __future__ import annotations

from .comparison import Trials, allocator_note, judge, noise_of, usable
from .log import MAX_FILE_BYTES, ResultLog
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
from .stats import Comparison, Noise
from .table import OPTIONAL_INT_KNOBS, SUMMARY_COLUMNS

__all__ = ["FILE_NAME_CHARS", "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_LINE_BYTES", "MAX_NAME_CHARS", "OPTIONAL_INT_KNOBS",
           "SUMMARY_COLUMNS", "BadRecord", "Comparison", "LoggedComparison", "Noise", "ResultLog", "Trials", "allocator_note",
           "bad_lines_text", "default_participant", "judge", "noise_of", "parse_record", "read_records",
           "safe_file_name", "usable"]
