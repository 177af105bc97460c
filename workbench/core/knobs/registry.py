"""The registry's verbs: declare your own knob (@knob), and run every knob's hook at one seam.

The running core calls these loops instead of reading knob values: `loader_kwargs` for the
DataLoader, `move_kwargs` for the device move, `transform_model` / `release_model` around the
model copy, `adjust_optimizer`, `wrap_model` (compile), `make_scaler`, `forward_hooks`,
`step_hooks`, `ddp_options` / `parallel_options` for the strategy, `traits` for what the runner
must know, `check_run` for refusals that need the device, and `device_notes` for the sentences of
knobs that run but do nothing here. Each loop walks the knobs in declaration order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from .spec import GROUPS, KNOBS, USER_GROUP, Context, Fuzz, KnobSpec, function_source
from .value import BUILTIN_FIELDS, Knobs

USER_WHERE = ("model", "forward", "before_step")
# What traits() says when no knob speaks to it (a user-only registry, say).
TRAIT_DEFAULTS: dict[str, Any] = {
    "compiles": False,
    "workers": 0,
    "persistent_workers": False,
    "buffered_batches": 0,
    "loss_scaling": False,
}


def context(knobs: Knobs, device: Any = None, **kwargs: Any) -> Context:
    """A Context for the hooks (device None = CPU)."""
    return Context(knobs=knobs, device=device, **kwargs)


# ---- your own knobs ---------------------------------------------------------------------------------
def knob(
    *, choices: Any = (), default: Any = None, help: str = "", where: str = "model", interleave: bool = True
) -> Callable[[Callable], Callable]:
    """Declare your own knob from a notebook cell; the function's name is the knob's name.

        @wb.knob(choices=["naive", "sdpa"], default="naive", help="attention implementation")
        def attention(model, value):      # applied to each trial's fresh copy of the model
            model.set_attention(value)

    `where` says when the function runs: "model" = fn(model, value) on each trial's model copy
    (return a new model or None); "forward" = fn(value) -> a context manager around every forward
    and loss; "before_step" = fn(value, model, optimizer) after backward, before optimizer.step.
    A knob takes `choices` (what tune() tries), or is a switch with default True/False. Running
    the cell again replaces the knob. It then shows up in the panel, results, compare, the log,
    tune() and to_code() like a built-in knob.

    `interleave=False` says the function changes something global (a torch flag, an environment
    variable, a module-level setting) rather than the model or the step it is given: then
    `bench.compare(..., rounds="auto")` compares its values by separate trials instead of taking
    turns on two live models in one process.
    """
    if where not in USER_WHERE:
        raise ValueError(f"where={where!r} is not one of {', '.join(map(repr, USER_WHERE))}")
    if not isinstance(interleave, bool):
        raise TypeError(f"interleave takes True or False, got {interleave!r}")
    choices = tuple(choices)
    if not choices and not isinstance(default, bool):
        raise TypeError(
            "a knob needs choices=[...] (the values to try), or default=True/False for a switch; "
            f"got choices={list(choices)} and default={default!r}"
        )
    if choices and default is None:
        default = choices[0]

    def register(fn: Callable) -> Callable:
        name = getattr(fn, "__name__", "")
        if not name.isidentifier() or name in {f.name for f in BUILTIN_FIELDS} or name in ("user", "unknown"):
            raise ValueError(f"cannot name a knob {name!r}: it is built in (or not an identifier); rename the function")
        kind = "choice" if choices else "bool"
        hooks = {
            "model": {"on_model": lambda model, value, ctx: fn(model, value)},
            "forward": {"forward": lambda value, ctx: fn(value)},
            "before_step": {"before_step": lambda value, model, opt, ctx: fn(value, model, opt)},
        }[where]
        spec = KnobSpec(
            default=default,
            kind=kind,
            choices=choices,
            help=help or first_doc_line(fn, name),
            group=USER_GROUP,
            widget="dropdown" if choices else "checkbox",
            fuzz=Fuzz(choices or (False, True)),
            code=user_code(name, where),
            function=fn,
            name=name,
            interleave=interleave,
            **hooks,
        )
        spec.check(default)
        KNOBS.pop(name, None)  # a re-run cell replaces the knob (and moves it to the end)
        KNOBS[name] = spec
        return fn

    return register


def first_doc_line(fn: Callable, name: str) -> str:
    """The first line of the function's docstring, or a stand-in naming the knob."""
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else f"your knob {name} (@wb.knob)"


def forget_knob(name: str) -> None:
    """Remove one of your own knobs (built-in ones stay)."""
    if name not in KNOBS or KNOBS[name].function is None:
        raise ValueError(f"{name!r} is not one of your knobs; yours: {', '.join(user_knob_names()) or '(none)'}")
    del KNOBS[name]


def user_knob_names() -> list[str]:
    """Names of the knobs declared with @knob, in definition order."""
    return [n for n, s in KNOBS.items() if s.function is not None]


def user_knob_specs() -> dict[str, KnobSpec]:
    """{name: spec} of the knobs declared with @knob: what a trial's process needs to apply them (a worker
    process or a job has only the built-in knobs; `adopt_user_knobs` there)."""
    return {n: s for n, s in KNOBS.items() if s.function is not None}


def adopt_user_knobs(specs: dict[str, KnobSpec]) -> None:
    """Declare in this process the @knob specs another process sent (`user_knob_specs`), replacing any of
    the same name; a built-in knob's name is never taken."""
    builtin = {f.name for f in BUILTIN_FIELDS}
    for name, spec in specs.items():
        if name not in builtin and isinstance(spec, KnobSpec) and spec.function is not None:
            KNOBS[name] = spec


def tunable_knobs(*, user_only: bool = True) -> dict[str, tuple]:
    """{knob: its choices} for the knobs with `choices` (your @knob ones; all with `user_only=False`):
    what a search such as tune() can try."""
    return {n: s.choices for n, s in KNOBS.items() if s.choices and (s.function is not None or not user_only)}


def user_code(name: str, where: str) -> Callable[[Any], dict[str, list[str]]]:
    """The code hook of a user knob: its function's source, and the call at its seam."""

    def code(k: Knobs) -> dict[str, list[str]]:
        value = getattr(k, name)
        call = {
            "model": f"{{model}} = {name}({{model}}, {value!r}) or {{model}}",
            "forward": f"{name}({value!r})",
            "before_step": f"{name}({value!r}, {{model}}, optimizer)",
        }[where]
        return {"functions": [function_source(KNOBS[name].function)], where: [call]}

    return code


# ---- the hook loops: the core's only way to a knob's effect -------------------------------------------
def _with(hook: str) -> list[KnobSpec]:
    """Every knob declaring `hook`, in declaration order."""
    return [s for s in KNOBS.values() if getattr(s, hook) is not None]


def _merged(knobs: Knobs, hook: str, ctx: Context) -> dict[str, Any]:
    """The dicts every knob's `hook` (value, ctx) -> dict returns, merged in declaration order."""
    out: dict[str, Any] = {}
    for spec in _with(hook):
        out.update(getattr(spec, hook)(getattr(knobs, spec.name), ctx))
    return out


@contextlib.contextmanager
def settings(knobs: Knobs, ctx: Context | None = None) -> Iterator[None]:
    """Hold every process-wide setting the knobs declare (threads, matmul precision...) for the
    block; the caller's settings come back afterwards."""
    ctx = ctx or context(knobs)
    with contextlib.ExitStack() as stack:
        for spec in _with("settings"):
            stack.enter_context(spec.settings(getattr(knobs, spec.name), ctx))
        yield


def loader_kwargs(knobs: Knobs, ctx: Context) -> dict[str, Any]:
    """DataLoader keywords from the data knobs (workers, pinning, persistence, prefetch, timeout)."""
    return _merged(knobs, "loader", ctx)


def move_kwargs(knobs: Knobs, ctx: Context) -> dict[str, Any]:
    """Keywords of the batch's move to the device (`workload.move_to`: non_blocking, channels_last)."""
    return _merged(knobs, "move", ctx)


def checkpoint_options(knobs: Knobs, ctx: Context | None = None) -> dict[str, Any]:
    """Extra keywords for torch.utils.checkpoint.checkpoint gathered from the knobs' hooks."""
    return _merged(knobs, "checkpoint_kwargs", ctx or context(knobs))


def transform_model(model: Any, knobs: Knobs, ctx: Context | None = None) -> Any:
    """Every knob's `on_model` hook in turn on a fresh model copy (a hook may return a new model):
    channels_last, checkpoint wrappers, your @wb.knob functions."""
    ctx = ctx or context(knobs)
    ctx.checkpoint_kwargs = checkpoint_options(knobs, ctx)
    for spec in _with("on_model"):
        out = spec.on_model(model, getattr(knobs, spec.name), ctx)
        model = model if out is None else out
    return model


def release_model(model: Any, knobs: Knobs, ctx: Context | None = None) -> None:
    """Undo what the `on_model` hooks attached (wrappers referring back to their block: cycles)."""
    if model is None:
        return
    ctx = ctx or context(knobs)
    for spec in _with("release"):
        spec.release(model, getattr(knobs, spec.name), ctx)


def adjust_optimizer(optimizer: Any, knobs: Knobs, notes: list[str], ctx: Context | None = None) -> Any:
    """Apply every knob's `on_optimizer` hook in turn (each may rebuild the optimizer; notes go to `notes`)."""
    ctx = ctx or context(knobs)
    ctx.notes = notes
    for spec in _with("on_optimizer"):
        optimizer = spec.on_optimizer(optimizer, getattr(knobs, spec.name), ctx)
    return optimizer


def wrap_model(model: Any, knobs: Knobs, ctx: Context) -> Any:
    """The model the step calls: every knob's `wrap` hook in turn (torch.compile)."""
    for spec in _with("wrap"):
        model = spec.wrap(model, getattr(knobs, spec.name), ctx)
    return model


def make_scaler(knobs: Knobs, ctx: Context) -> Any:
    """The loss scaler (GradScaler) a knob asks for, or None."""
    for spec in _with("scaler"):
        scaler = spec.scaler(getattr(knobs, spec.name), ctx)
        if scaler is not None:
            return scaler
    return None


def forward_hooks(knobs: Knobs, ctx: Context | None = None) -> list[Callable[[], contextlib.AbstractContextManager]]:
    """Factories of the contexts the knobs' `forward` hooks enter around each forward and loss
    (autocast, your @wb.knob contexts); a knob that is off (None, or a hook returning None) adds none."""
    ctx = ctx or context(knobs)
    out = []
    for spec in _with("forward"):
        value = getattr(knobs, spec.name)
        if value is None or (spec.function is None and spec.forward(value, ctx) is None):
            continue
        out.append(lambda hook=spec.forward, value=value: hook(value, ctx))
    return out


def step_hooks(knobs: Knobs, ctx: Context | None = None) -> list[Callable[[Any, Any], None]]:
    """The knobs' `before_step` hooks, each bound to its value: call with (model, optimizer).

    A knob set to None (e.g. grad_clip_norm off) has none, so the measured loop does no extra work
    for it (no per-step call, no fp16 unscale)."""
    ctx = ctx or context(knobs)
    return [
        lambda model, opt, hook=s.before_step, value=getattr(knobs, s.name): hook(value, model, opt, ctx)
        for s in _with("before_step")
        if getattr(knobs, s.name) is not None
    ]


def ddp_options(knobs: Knobs, ctx: Context | None = None) -> dict[str, Any]:
    """Keywords for DistributedDataParallel gathered from the knobs' `ddp_kwargs` hooks."""
    return _merged(knobs, "ddp_kwargs", ctx or context(knobs))


def parallel_options(knobs: Knobs, ctx: Context | None = None) -> dict[str, Any]:
    """The data-parallel strategy's options from the knobs' `parallel` hooks: comm_hook, no_sync,
    and FSDP2's reshard_after_forward, param_dtype, reduce_dtype, prefetch, cpu_offload, units."""
    return _merged(knobs, "parallel", ctx or context(knobs))


def check_run(knobs: Knobs, ctx: Context) -> None:
    """Every knob's `check_run` hook: a ValueError naming the fix when it cannot run on this device."""
    for spec in _with("check_run"):
        spec.check_run(getattr(knobs, spec.name), ctx)


def device_notes(knobs: Knobs, device_type: str, *, has_conv: bool = True, token_data: bool = False) -> list[str]:
    """Knobs that run but do nothing (or hurt) on this device or data, each as one sentence for `notes`."""
    ctx = context(knobs, device_type, has_conv=has_conv, token_data=token_data)
    return [n for s in KNOBS.values() if s.note is not None and (n := s.note(getattr(knobs, s.name), ctx))]


# ---- the panel's groups and the docs' table ----------------------------------------------------------------
def grouped() -> dict[str, list[str]]:
    """{panel group: knob names}, groups in GROUPS order (empty ones left out), knobs in declaration order."""
    groups = {g: [n for n, s in KNOBS.items() if s.group == g] for g in GROUPS}
    return {g: names for g, names in groups.items() if names}


def knob_table() -> str:
    """The knob table (Markdown) generated from the declarations: docs/knobs.md holds the built-in ones (make docs)."""
    rows = ["| knob | default | values | what it does |", "| --- | --- | --- | --- |"]
    for name, s in KNOBS.items():
        if s.kind == "choice":
            values = " \\| ".join(f"`{c!r}`".replace("'", '"') for c in s.choices)
        elif s.kind == "bool":
            values = "`True` \\| `False`"
        elif s.kind == "blocks":
            values = "block names (`bench.blocks`)"
        else:
            values = f"{s.kind} >= {s.minimum}" + (" or `None`" if s.optional else "")  # kind: "int" or "float"
        default = f"`{s.default!r}`".replace("'", '"')
        rows.append(f"| `{name}` | {default} | {values} | {s.help.replace('|', '/')} |")
    return "\n".join(rows)


def process_env(knobs: Knobs, ctx: Context | None = None) -> dict[str, str | None]:
    """The variables the trial's process must start with, from every knob's `process_env` hook."""
    ctx = ctx or Context(knobs=knobs)
    env: dict[str, str | None] = {}
    for spec in KNOBS.values():
        if spec.process_env is not None:
            env.update(spec.process_env(getattr(knobs, spec.name), ctx))
    return env


def process_differs(knobs: Knobs, ctx: Context | None = None) -> list[str]:
    """Why this process cannot run the trial as its knobs ask (empty: it can), one sentence per knob."""
    ctx = ctx or Context(knobs=knobs)
    out = []
    for spec in KNOBS.values():
        if spec.process_differs is not None:
            why = spec.process_differs(getattr(knobs, spec.name), ctx)
            if why:
                out.append(why)
    return out
