"""The terminal face of the workbench: `python -m workbench run|diagnose|tune --demo NAME [knobs]`.

Knob flags come from the knob declarations (knobs.KNOBS), so the CLI always offers every knob.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from ..core.knobs import KNOBS, Knobs


def number_parser(kind: str, optional: bool) -> Any:
    """argparse type of an int or float knob; an optional one also takes 'default'/'none' (None)."""
    cast = float if kind == "float" else int

    def parse(text: str) -> Any:
        if optional and text.lower() in ("default", "none"):
            return None
        try:
            return cast(text)
        except ValueError:
            extra = " or 'default'" if optional else ""
            raise argparse.ArgumentTypeError(f"expected {'a float' if cast is float else 'an int'}{extra}, "
                                             f"got {text!r}") from None

    parse.__name__ = cast.__name__  # argparse names the type in its messages
    return parse


def add_knob_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """One flag per declared knob (knobs.KNOBS): type, choices and help come from its declaration."""
    for name, spec in KNOBS.items():
        h = spec.help
        if spec.kind == "bool":
            parser.add_argument(spec.flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=h)
        elif spec.kind == "blocks":
            parser.add_argument(spec.flag, dest=name, default=None, help=h + "; comma-separated, or 'all'")
        elif spec.kind == "choice":
            parser.add_argument(spec.flag, dest=name, choices=spec.choices, default=None, help=h)
        else:  # int or float
            parser.add_argument(spec.flag, dest=name, type=number_parser(spec.kind, spec.optional), default=None,
                                metavar="N|default" if spec.optional else "N", help=h)


def knobs_from_args(args: argparse.Namespace, blocks: Sequence[str]) -> dict[str, Any]:
    """The knob flags the user actually gave, as Knobs keyword arguments."""
    changes = {}
    for name, spec in KNOBS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if spec.kind == "blocks":
            value = tuple(blocks) if value == "all" else tuple(x for x in value.split(",") if x)
        changes[name] = value
    return changes


def _demo_lines() -> str:
    try:
        from ..demos import DEMOS
    except ImportError:  # pragma: no cover - demos ship with the package
        return ""
    return "\n".join(f"  {name:<12} {d.description}" for name, d in DEMOS.items())


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: run / diagnose / tune, each with --demo and every knob as a flag."""
    knob_lines = "\n".join(f"  {spec.flag:<22} {spec.help}" for spec in KNOBS.values())
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
                      ("tune", "race candidates (the recommended order, pairs, stacks of near-misses) and keep a winner only if it is faster than the start"),
                      ("explain", "why B is faster than A (the defaults): traced steps compared by phase and op")):
        p = sub.add_parser(cmd, help=text, description=text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("--demo", help="built-in workload (see the list below)")
        source.add_argument("--model", metavar="PKG.MODULE:FACTORY",
                            help="your workload: FACTORY() returns a Workbench or a dict of Workbench arguments; "
                                 "under torchrun every rank joins the job and rank 0 reports")
        p.add_argument("--size", default="default", choices=("default", "tiny"), help="demo size (tiny: for quick checks)")
        p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N | mps (default auto)")
        p.add_argument("--steps", type=int, default=None, help="measured optimizer steps (default 30)")
        p.add_argument("--warmup-steps", type=int, default=None, help="unmeasured warm-up steps, at least (default 5); warm-up goes on to steady state (docs/steady_state.md)")
        p.add_argument("--log", "--log-path", dest="log", default=None,
                       help="results directory (JSONL; default workbench-runs); 'none' to keep nothing "
                            "(under torchrun write --log-path: torchrun's own parser claims --log)")
        p.add_argument("--json", action="store_true",
                       help="print exactly one JSON document on stdout (shape: docs/cli.md)")
        p.add_argument("--quiet", action="store_true", help="no progress bar (there is none unless stderr is a terminal)")
        if cmd == "run":
            p.add_argument("--trace", action="store_true",
                           help="profile 3 steps after the measured window into a Chrome-trace JSON next to the log")
            p.add_argument("--code", metavar="FILE", default=None,
                           help="also write the trial's plain-PyTorch training script to FILE (runs as it is "
                                "with --demo or --model)")
        if cmd == "tune":
            p.add_argument("--n-trials", type=int, default=None, dest="n_trials",
                           help="maximum number of trials (default 24 without --budget-s, else no cap)")
            p.add_argument("--budget", type=int, default=None, dest="old_budget", help=argparse.SUPPRESS)
            p.add_argument("--budget-s", type=float, default=None, dest="budget_s",
                           help="seconds the search may take (the primary budget; e.g. 300)")
        if cmd == "explain":
            add_explain_arguments(p)
        add_knob_arguments(p.add_argument_group("knobs (defaults: the demo's own)"))
    return parser


JSON_SCHEMA = 2  # bump when a key of the --json document changes meaning or disappears


def jsonable(obj: Any) -> Any:
    """Plain JSON values for the --json document: results as their records, tables as lists of
    row dicts, dataclasses as dicts of their fields, NaN/inf as null."""
    import math
    from pathlib import PurePath

    from ..core.measure import TrialResult

    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, TrialResult):
        return jsonable(obj.to_record())
    if isinstance(obj, Knobs):
        return jsonable(obj.to_dict())
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):  # a DataFrame: one dict per row
        return jsonable(obj.to_dict(orient="records"))
    if hasattr(obj, "to_dict") and hasattr(obj, "index") and hasattr(obj, "dtype"):  # a Series
        return jsonable({str(k): v for k, v in obj.to_dict().items()})
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in dir(type(obj)):  # derived figures (speedup, verdict, bottleneck, ...) too
            if not name.startswith("_") and name not in out and isinstance(getattr(type(obj), name), property):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("error", DeprecationWarning)  # a deprecated alias is left out
                        out[name] = jsonable(getattr(obj, name))
                except Exception:  # a property that cannot be computed for this object is left out
                    pass
        return out
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        try:
            return jsonable(obj.item())
        except (TypeError, ValueError):
            pass
    return str(obj)


def document(command: str, *, result: Any = None, error: str | None = None, exit_code: int = 0) -> dict[str, Any]:
    """The one JSON document a verb prints with --json (the shape docs/cli.md documents)."""
    from ..core.system import package_version

    return {"schema": JSON_SCHEMA, "command": command, "version": package_version(), "ok": error is None and exit_code == 0,
            "exit_code": exit_code, "error": error, "result": jsonable(result)}


def build_workbench(args: argparse.Namespace, *, rank: int = 0) -> Any:
    """The Workbench a CLI verb works on: a demo, or the user's factory (`--model`).

    Flags given on the command line override the factory's settings; only rank 0 of a torchrun
    job writes the log.
    """
    from .bench import Workbench
    from .rebuild import demo, load_factory

    given = {"device": args.device, "steps": args.steps, "warmup_steps": args.warmup_steps}
    given = {k: v for k, v in given.items() if v is not None}
    log = args.log if args.log is not None else "workbench-runs"
    log = None if log.lower() == "none" or rank != 0 else log
    if args.demo is not None:
        return demo(args.demo, size=args.size, **{"steps": 30, "warmup_steps": 5, "device": "auto", **given}, log=log)
    made = load_factory(args.model)
    if isinstance(made, dict):
        kwargs = {**made, **given}
        if args.log is not None or rank != 0 or "log" not in made:
            kwargs["log"] = log
        made = Workbench(**kwargs)
        made._came_from(args.model)  # its to_code() script rebuilds the objects from the factory
        return made
    if not isinstance(made, Workbench):
        raise TypeError(f"--model {args.model}: the factory returned {type(made).__name__}; return a "
                        "workbench.Workbench or a dict of its arguments (model, data, loss_fn, ...)")
    if "device" in given and str(made.device) != given["device"]:
        raise ValueError(f"--device {given['device']} differs from the factory's Workbench ({made.device}): "
                         "set the device in the factory, or return a dict so the CLI builds the Workbench")
    made._came_from(args.model)
    made.steps = given.get("steps", made.steps)
    made.warmup_steps = given.get("warmup_steps", made.warmup_steps)
    if rank != 0 or args.log is not None:
        made._log_to(log)  # the workbench's own layout: <log>/<participant>/<name>.jsonl
    return made


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m workbench` and the `workbench` script; returns the exit code.

    With --json, stdout carries exactly one JSON document (`document()`), whatever happens;
    anything else the verb prints goes to stderr. Progress bars go to stderr, and only when
    stderr is a terminal. Under torchrun (RANK/WORLD_SIZE set) every rank runs the verb with
    world_size = the job's size; rank 0 prints (and writes the log), the other ranks print nothing.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    want_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, message on stderr)
        if want_json and e.code not in (0, None):
            command = next((a for a in argv if a in VERBS), "")
            _emit(document(command, error="invalid arguments (see stderr)", exit_code=2))
        raise
    from ..launch.join import in_launched_job

    rank = int(os.environ.get("RANK", "0")) if in_launched_job() else 0
    if in_launched_job():
        if args.command != "run":
            error = f"under torchrun only `run` joins the job (got `{args.command}`)"
            print(f"error: {error}", file=sys.stderr)
            if args.json and rank == 0:
                _emit(document(args.command, error=error, exit_code=2))
            return 2
        import torch

        if torch.cuda.is_available():  # one GPU per rank, before the Workbench probes on "auto"/"cuda"
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not args.json or rank != 0:
        return _run(args, rank=rank)
    out = sys.stdout
    code, result, error = 1, None, None
    with contextlib.redirect_stdout(sys.stderr):  # stray prints cannot break the document
        try:
            code, result = _run(args, as_json=True)
        except (ValueError, TypeError) as e:
            code, error = 2, f"{type(e).__name__}: {e}"
            print(f"error: {e}", file=sys.stderr)
        except KeyboardInterrupt:
            code, error = 130, "interrupted (the trial was recorded as 'interrupted')"
            print(f"\n{error}", file=sys.stderr)
    _emit(document(args.command, result=result, error=error, exit_code=code), out)
    return code


VERBS = ("run", "diagnose", "tune", "explain")


def _emit(doc: dict[str, Any], stream: Any = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    stream.flush()


def _run(args: argparse.Namespace, as_json: bool = False, rank: int = 0) -> Any:
    """Do the verb. Text mode prints and returns the exit code; JSON mode returns (code, result)
    and lets ValueError/TypeError/KeyboardInterrupt through to main(). Ranks other than 0 of a
    torchrun job print nothing but their own failure."""
    from ..launch.join import in_launched_job, job_world_size

    progress = False if args.quiet or rank != 0 else None  # None: a bar only when stderr is a terminal
    try:
        bench = build_workbench(args, rank=rank)
        changes = knobs_from_args(args, bench.blocks)
        if in_launched_job() and "world_size" not in changes:
            changes["world_size"] = job_world_size()
        if args.command == "run":
            result = bench.run(progress=progress, trace=args.trace, **changes)
            code = 0 if result.ok else 1
            if args.code and rank == 0:  # the step that ran, for these knobs (Workbench.to_code)
                with open(args.code, "w") as f:
                    f.write(bench.to_code(result))
            if rank != 0:
                if not result.ok:
                    print(f"rank {rank}: {result.message}", file=sys.stderr)
                return code
            if as_json:
                return code, result
            print(repr(result))
            for note in result.notes:
                print(f"  note: {note}")
            if result.trace_path:
                print(f"  trace: {result.trace_path}  (open in https://ui.perfetto.dev or chrome://tracing)")
            return code
        if changes:
            bench.defaults = bench.knobs(**changes)
        if args.command == "explain":
            return run_explain(bench, args, progress, as_json)
        if args.command == "diagnose":
            out = bench.diagnose(progress=progress)
        else:
            n_trials = args.n_trials
            if args.old_budget is not None:  # the old name of --n-trials: works one more release
                print("warning: --budget is now --n-trials (a cap on trials; seconds are --budget-s)", file=sys.stderr)
                n_trials = args.old_budget if n_trials is None else n_trials
            out = bench.tune(n_trials=n_trials, budget_s=args.budget_s, progress=progress)
        if as_json:
            return 0, out
        print(str(out))
        return 0
    except (ValueError, TypeError) as e:
        if as_json:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if as_json:
            raise
        print("\ninterrupted (the trial was recorded as 'interrupted')", file=sys.stderr)
        return 130


# ---- explain: B's knobs named by --b, A is the defaults ---------------------------------------------
def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    """`--b KNOB[=VALUE] ...`: the knobs of B (a bare name turns a bool knob on)."""
    p.add_argument("--b", dest="b_knobs", nargs="+", action="extend", required=True, metavar="KNOB[=VALUE]",
                   help="B's knob changes against the defaults, e.g. --b channels_last amp=bf16")


def b_changes(specs: Sequence[str], blocks: Sequence[str]) -> dict[str, Any]:
    """Knobs keyword arguments from `--b` specs, parsed by the knob flags' own types and choices."""
    argv: list[str] = []
    for spec in specs:
        name, eq, value = spec.partition("=")
        name = name.strip().replace("-", "_")
        if name not in KNOBS:
            raise ValueError(f"--b {spec}: unknown knob {name!r}; the knobs are listed by `python -m workbench explain -h`")
        if KNOBS[name].kind == "bool" and (not eq or value.lower() in ("1", "true", "yes", "on")):
            argv.append(KNOBS[name].flag)
        elif KNOBS[name].kind == "bool" and value.lower() in ("0", "false", "no", "off"):
            argv.append("--no-" + KNOBS[name].flag[2:])
        elif not eq:
            raise ValueError(f"--b {spec}: {name} needs a value, e.g. --b {name}=VALUE")
        else:
            argv += [KNOBS[name].flag, value]
    parser = argparse.ArgumentParser(prog="--b", exit_on_error=False, add_help=False)
    add_knob_arguments(parser)
    try:
        parsed = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        raise ValueError(f"--b {' '.join(specs)}: {e}") from None
    return knobs_from_args(parsed, blocks)


def run_explain(bench: Any, args: argparse.Namespace, progress: Any, as_json: bool) -> Any:
    """Run A (the defaults) and B with traces, then print the explanation (or return it for --json)."""
    knobs_b = bench.knobs(**b_changes(args.b_knobs, bench.blocks))
    if knobs_b == bench.defaults:
        print("note: B's knobs equal the defaults; the explanation compares two runs of the same knobs", file=sys.stderr)
    explanation = bench.explain(bench.defaults, knobs_b, progress=progress)
    if as_json:
        return 0, {**explanation.to_dict(), "comparison": jsonable(explanation.comparison)}
    print(str(explanation))
    import pandas as pd

    with pd.option_context("display.width", 140, "display.max_colwidth", 60, "display.float_format", "{:,.3f}".format):
        print("\nphases (ms per traced step):\n" + explanation.phases.to_string(index=False))
        print("\ntop ops:\n" + explanation.ops.head(10).to_string(index=False))
    return 0
