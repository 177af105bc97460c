"""`workbench.measure`, as imported before it moved to `workbench/core/measure.py`: a re-export."""

from .core.measure import *  # noqa: F403
