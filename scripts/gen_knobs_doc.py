"""Write docs/knobs.md: a title, a paragraph, then exactly `wb.knob_table()` of the built-in declarations, so
the page cannot drift.

    python scripts/gen_knobs_doc.py          # rewrite docs/knobs.md (`make docs`)
    python scripts/gen_knobs_doc.py --check  # exit 1 if docs/knobs.md differs from the declarations

`tests/test_docs.py` fails when the committed page is stale: after adding or changing a knob, run
`make docs` and commit docs/knobs.md with the knob.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "knobs.md"

HEADER = """# Knobs

This page answers: which knobs can a trial change, what does each one default to, and what does it
do? Pass any of them to `bench.run(name=value)` or set them in the panel; `wb.knob_table()` prints
the same table in a notebook, with your own knobs added once declared. A knob that cannot change your
step on this device (`pin_memory` without a GPU, say) is said when you run it. How to add a knob of
your own: [architecture.md](architecture.md#add-a-knob).

The table below is generated from the knob declarations (`make docs`): edit those, not this page.

"""


def render() -> str:
    """The page: a title and a paragraph, then exactly `wb.knob_table()` of the built-in declarations (run
    in a fresh process: no user knobs), so the page and the function cannot say different things."""
    sys.path.insert(0, str(ROOT))
    from workbench.core.knobs import knob_table

    return HEADER + knob_table()


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run `make docs` (python scripts/gen_knobs_doc.py)")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
