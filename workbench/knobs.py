"""`workbench.knobs`, as imported before the knobs moved into `workbench/core/knobs/`: a re-export."""

from .core.knobs import *  # noqa: F403
from .core.knobs import __all__  # noqa: F401
