"""Which model a trial measured: a fingerprint of the model's structure.

Each trial carries it (`TrialResult.extra["model"]`), so a log that outlives an edit of the model never
compares the edited model against the old one (results/models.py). A job records it when it is submitted
(launch/jobs.py), so a kernel restarted after an edit records a job left behind as the model it ran.
"""

from __future__ import annotations

import hashlib

from torch import nn


def fingerprint(model: nn.Module) -> str:
    """12 hex digits naming the model's structure: module classes by name, parameter and buffer names, shapes
    and dtypes, and the parameter count. Weights' values are left out (training changes them, not the step)."""
    h = hashlib.sha1()
    for name, m in model.named_modules():
        h.update(f"m {name} {type(m).__module__}.{type(m).__qualname__}\n".encode())
    count = 0
    for kind, tensors in (("p", model.named_parameters()), ("b", model.named_buffers())):
        for name, t in tensors:
            lazy = isinstance(t, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer))
            shape = "lazy" if lazy else tuple(t.shape)
            count += 0 if lazy or kind == "b" else t.numel()
            h.update(f"{kind} {name} {shape} {t.dtype}\n".encode())
    h.update(f"n {count}\n".encode())
    return h.hexdigest()[:12]


UNKNOWN = "unknown"  # the model of a trial whose record does not say (a job an older version left behind)
