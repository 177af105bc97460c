"""Why is the step slow? One module per analysis; `diagnose(bench)` runs them all.

    data.py      short-circuit test, loader-alone rate, the 20% data-wait rule
    threads.py   main-process threads + workers vs cores
    profile.py   torch.profiler stages and top ops
    memory.py    parameters / gradients / optimizer state / activations; activations per block
    flops.py     FLOPs per step, peak FLOP/s, MFU
    compile.py   CompileWatch (graph breaks, recompiles, fallbacks) and explanations
    explain.py   why B is faster than A: two trials' traced steps, phase by phase and op by op
    verdict.py   the decision tree -> bottleneck + next knob
    report.py    Diagnosis (text + HTML) and diagnose()
"""

from .compile import CompileWatch, explain_compile
from .explain import Explanation
from .report import Diagnosis, diagnose
from .verdict import Verdict

__all__ = ["CompileWatch", "Diagnosis", "Explanation", "Verdict", "diagnose", "explain_compile"]
