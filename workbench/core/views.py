"""How plain data is shown in a notebook, without the data knowing the faces: a table of HTML views by type.

`TrialResult` (core) and `Comparison` (results) are data; the module that draws them (`faces/display.py`)
sits above both and may not be imported from below (tests/test_layers.py). So the faces fill `HTML` when
they are imported (`import workbench` does), and each data class's `_repr_html_`, the method Jupyter calls,
looks its view up here: with the faces loaded a notebook draws the same card as before; without them
`_repr_html_` returns None and Jupyter shows the plain `repr`. Pure Python: no torch, no pandas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

HTML: dict[type, Callable[[Any], str]] = {}  # type -> its HTML view; filled by faces/display.py


def html_view(obj: Any) -> str | None:
    """The HTML the faces registered for `obj`'s type (or the nearest base class's), else None."""
    for cls in type(obj).__mro__:
        view = HTML.get(cls)
        if view is not None:
            return view(obj)
    return None
