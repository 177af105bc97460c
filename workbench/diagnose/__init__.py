"""Why is the step slow? One module per analysis; `diagnose(bench)` runs them all.

An analysis is one file here: it declares itself with `@analysis(name, title=..., steps=...)`
(analysis.py) and `diagnose()` finds it (`discover()` imports every module of this folder).

    data.py      short-circuit test, loader-alone rate, the 20% data-wait rule
    threads.py   main-process threads + workers vs cores
    profile.py   torch.profiler stages and top ops
    memory.py    parameters / gradients / optimizer state / activations; activations per block
    flops.py     FLOPs per step, peak FLOP/s, MFU
    analysis.py  the declaration (`@analysis`, `Context`), its registry and `discover()`
    compile.py   CompileWatch (graph breaks, recompiles, fallbacks) and explanations
    explain.py   why B is faster than A: two trials' traced steps, phase by phase and op by op
    verdict.py   the decision tree -> bottleneck + next knob
    report.py    Diagnosis (text + HTML) and diagnose()
"""

from .analysis import Analysis, Context, analysis, discover
from .compile import CompileWatch, explain_compile
from .explain import Explanation
from .report import Diagnosis, diagnose
from .verdict import Verdict

__all__ = ["Analysis", "CompileWatch", "Context", "Diagnosis", "Explanation", "Verdict", "analysis", "diagnose", "explain_compile"]

discover()  # import every module of this folder: their declared analyses run and show in any Diagnosis
