"""The terminal face of the workbench: `python -m workbench run|diagnose|tune --demo NAME [knobs]`.

Knob flags are generated from the Knobs dataclass, so the CLI always offers every knob.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from .knobs import AMP_MODES, COMM_HOOKS, COMPILE_MODES, DATA_MODES, MATMUL_PRECISIONS, Knobs

CHOICES = {"amp": AMP_MODES, "compile": COMPILE_MODES, "data": DATA_MODES, "matmul_precision": MATMUL_PRECISIONS,
           "ddp_comm_hook": COMM_HOOKS}
FLOATS = ("ddp_bucket_cap_mb",)


def _knob_help() -> dict[str, str]:
    """Each knob's trailing comment in knobs.py is its help text (one source of truth)."""
    import inspect

    from . import knobs as knobs_module

    text = inspect.getsource(knobs_module.Knobs)
    names = {f.name for f in dataclasses.fields(Knobs)}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        name = line.split(":", 1)[0]
        if name in names and "#" in line:
            out[name] = line.split("#", 1)[1].strip()
    return out


def _demo_lines() -> str:
    try:
        from .demos import DEMOS
    except ImportError:  # pragma: no cover - demos ship with the package
        return ""
    return "\n".join(f"  {name:<12} {d.description}" for name, d in DEMOS.items())


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: run / diagnose / tune, each with --demo and every knob as a flag."""
    helps = _knob_help()
    knob_lines = "\n".join(f"  --{name.replace('_', '-'):<20} {text}" for name, text in helps.items())
    epilog = ("demos:\n" + _demo_lines() + "\n\nknobs (flags of run, diagnose and tune):\n" + knob_lines
              + "\n\nexample:\n  python -m workbench run --demo jpeg --num-workers 2 --cpu-threads 1")
    parser = argparse.ArgumentParser(
        prog="python -m workbench",
        description="Measure a PyTorch training step under different knobs (30 measured steps after warm-up).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for cmd, text in (("run", "run one measured trial and print its result"),
                      ("diagnose", "find the bottleneck: short-circuit test, profiler, memory, FLOPs, verdict"),
                      ("tune", "greedy search in the recommended order, keeping only wins beyond noise")):
        p = sub.add_parser(cmd, help=text, description=text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--demo", required=True, help="built-in workload (see the list below)")
        p.add_argument("--size", default="default", choices=("default", "tiny"), help="demo size (tiny: for quick checks)")
        p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
        p.add_argument("--steps", type=int, default=30, help="measured optimizer steps (default 30)")
        p.add_argument("--warmup-steps", type=int, default=5, help="unmeasured warm-up steps (default 5)")
        p.add_argument("--log", default="workbench-runs", help="results directory (JSONL); 'none' to keep nothing")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        if cmd == "tune":
            p.add_argument("--budget", type=int, default=12, help="maximum number of trials")
        knobs = p.add_argument_group("knobs (defaults: the demo's own)")
        for f in dataclasses.fields(Knobs):
            flag = "--" + f.name.replace("_", "-")
            h = helps.get(f.name, "")
            if isinstance(f.default, bool):
                knobs.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=h)
            elif f.name == "checkpoint":
                knobs.add_argument(flag, default=None, help=h + "; comma-separated, or 'all'")
            elif f.name in CHOICES:
                knobs.add_argument(flag, choices=CHOICES[f.name], default=None, help=h)
            elif f.name in FLOATS:
                knobs.add_argument(flag, type=float, default=None, help=h)
            else:
                knobs.add_argument(flag, type=int, default=None, help=h)
    return parser


def knob_changes(args: argparse.Namespace, blocks: Sequence[str]) -> dict[str, Any]:
    """The knob flags the user actually gave, as Knobs keyword arguments."""
    changes = {}
    for f in dataclasses.fields(Knobs):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if f.name == "checkpoint":
            value = tuple(blocks) if value == "all" else tuple(x for x in value.split(",") if x)
        changes[f.name] = value
    return changes


class TextProgress:
    """A one-line terminal progress bar fed by the runner's (phase, done, total) callback."""

    def __init__(self, stream: Any = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.t0 = time.perf_counter()
        self._last = (None, -1)

    def __call__(self, phase: str, done: int, total: int) -> None:
        if (phase, done) == self._last:
            return
        self._last = (phase, done)
        fill = int(self.width * done / max(1, total))
        rate = done / max(1e-9, time.perf_counter() - self.t0)
        end = "\n" if phase == "done" else ""
        self.stream.write(f"\r[{'#' * fill}{'.' * (self.width - fill)}] {done}/{total} steps "
                          f"{rate:5.1f} steps/s  {phase:<18}{end}")
        self.stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m workbench` and the `workbench` script; returns the exit code."""
    args = build_parser().parse_args(argv)
    from . import demo

    log = None if args.log.lower() == "none" else args.log
    try:
        bench = demo(args.demo, size=args.size, device=args.device, steps=args.steps,
                     warmup_steps=args.warmup_steps, log=log)
        changes = knob_changes(args, bench.blocks)
        progress = None if args.quiet else TextProgress()
        if args.command == "run":
            result = bench.run(progress=progress, **changes)
            if args.json:
                print(json.dumps(result.to_record(), indent=2, default=str))
            else:
                print(repr(result))
                for note in result.notes:
                    print(f"  note: {note}")
            return 0 if result.ok else 1
        if changes:
            bench.defaults = bench.knobs(**changes)
        if args.command == "diagnose":
            out = bench.diagnose()
        else:
            out = bench.tune(budget=args.budget)
        if args.json and hasattr(out, "to_dict"):
            print(json.dumps(out.to_dict(), indent=2, default=str))
        else:
            print(str(out))
        return 0
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted (the trial was recorded as 'interrupted')", file=sys.stderr)
        return 130
