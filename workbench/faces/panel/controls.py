"""The knob controls: one widget per declared knob (knobs.KNOBS), grouped, with no-op knobs
disabled and the reason as their tooltip. Reading them gives a Knobs value."""

from __future__ import annotations

from typing import Any

from ...core.knobs import KNOBS, Knobs, KnobSpec, device_notes, grouped
from ...results.protocol import Bench

# {group: knob names} of the built-in knobs; a panel reads the registry when it is built, so your
# own knobs (@wb.knob, declared later in the notebook) get their group "Your knobs" there
GROUPS: dict[str, list[str]] = grouped()
DEFAULT = "default"  # dropdown value standing for a knob's None (torch's own default)
TORCH_DEFAULTS = {"prefetch_factor": 2}
# the distributed knobs folded into an accordion (world_size itself stays in view)
FOLDED = frozenset(n for n in GROUPS.get("Distributed", ()) if n != "world_size")  # what torch uses when the knob is None (dropdown label)


def titled_box(W: Any) -> Any:
    """A Box whose tooltip the page shows as its title attribute. The page's tooltip code reads the
    widget's `description` (a plain Box has none, and its view then fails to render), so this one
    carries an empty description."""
    import traitlets

    class TitledBox(W.Box):
        description = traitlets.Unicode("").tag(sync=True)

    return TitledBox


class KnobControls:
    """`controls` (knob name -> widget, description = knob name), `block_boxes` (checkpoint block
    -> checkbox), `layout()` (the grouped grid) and `knobs()` (the Knobs they describe)."""

    def __init__(self, W: Any, bench: Bench) -> None:
        self.W = W
        self.bench = bench
        self._device = bench._facts.type  # where the trials run (an executor's node)
        self._has_conv = bench.workload.has_conv
        self.groups = grouped()  # the registry now: built-in knobs and yours
        # Knobs are read in this order, so a knob can depend on the ones before it (workers on data mode).
        self.order = [name for group in self.groups.values() for name in group]
        self.controls: dict[str, Any] = self._make_controls(W, bench.defaults)
        # ipywidgets shows a described widget's tooltip on its label only (a checkbox's nowhere): each control
        # sits in a box whose tooltip is the page's title attribute, so hovering anywhere on it says why
        titled = titled_box(W)
        self.boxes: dict[str, Any] = {name: titled([w], tooltip=w.tooltip) for name, w in self.controls.items()}
        for name, box in self.boxes.items():
            box.add_class(f"wb-knob-box-{name}")
        self.block_boxes: dict[str, Any] = {
            name: W.Checkbox(value=name in bench.defaults.checkpoint, description=f"{name} · {n:,} params",
                             indent=False, tooltip=f"checkpoint block {name} ({n:,} parameters)")
            for name, n in bench.blocks.items()
        }

    def observe(self, fn: Any) -> None:
        """Call `fn(change)` whenever any control or block box changes value."""
        for w in [*self.controls.values(), *self.block_boxes.values()]:
            w.observe(fn, names="value")

    # ---- building ------------------------------------------------------------------------------
    def _make_controls(self, W: Any, k: Knobs) -> dict[str, Any]:
        cores = self.bench._facts.cores  # the trials' machine's: affinity and container quota
        spec = self.bench.workload.spec
        max_batch = len(spec) if not spec.iterable else 1 << 16
        style = {"description_width": "130px"}
        lay = W.Layout(width="290px")

        def dropdown(name: str, options: list[Any], value: Any) -> Any:
            value = DEFAULT if value is None else value  # a Dropdown shows value None as "nothing selected"
            options = [o if isinstance(o, tuple) else (str(o), o) for o in options]  # all (label, value)
            if value not in [v for _, v in options]:
                options.append((str(value), value))
            return W.Dropdown(description=name, options=options, value=value, style=style, layout=lay)

        def checkbox(name: str) -> Any:
            return W.Checkbox(description=name, value=getattr(k, name), indent=False, layout=lay)

        bounds = {"dataset": max_batch, "workers": max(4, 2 * cores)}

        def control(name: str, spec: KnobSpec) -> Any:
            value = getattr(k, name)
            top = bounds.get(spec.maximum, spec.maximum)
            if spec.widget == "checkbox":
                return checkbox(name)
            if spec.widget == "slider":
                return W.IntSlider(description=name, value=value, min=spec.minimum or 0, max=max(top, value),
                                   continuous_update=False, style=style, layout=lay)
            if spec.widget == "int":
                return W.BoundedIntText(description=name, value=value, min=spec.minimum or 0, max=max(top, value),
                                        style=style, layout=lay)
            values = spec.choices or (tuple(range(1, cores + 1)) if spec.options == "cores" else spec.options)
            options: list[Any] = list(values)
            if spec.optional:
                label = f"default ({torch_default})" if (torch_default := TORCH_DEFAULTS.get(name)) else "default"
                options = [(label, DEFAULT)] + [v for v in options if v is not None]
            return dropdown(name, options, value)

        c = {name: control(name, spec) for name, spec in KNOBS.items() if spec.widget != "blocks"}
        for name, w in c.items():
            w.tooltip = KNOBS[name].help
            w.add_class(f"wb-knob-{name}")  # stable hooks for browser tests and custom CSS
        return c

    def layout(self) -> Any:
        """The grouped grid. The distributed group shows `world_size` and folds its DDP/FSDP2 options
        into an accordion, collapsed while world_size is 1 (where they do nothing) and opened when
        world_size goes above 1 (`self.distributed`)."""
        W = self.W
        columns = []
        for title, names in self.groups.items():
            items: list[Any] = [W.HTML(f"<b>{title}</b>")]
            folded: list[Any] = []
            for name in names:
                if KNOBS[name].widget == "blocks":
                    boxes = list(self.block_boxes.values()) or [W.HTML("<i>no blocks found</i>")]
                    parts = [W.HTML(f"{name} <small>(per block)</small>", tooltip=KNOBS[name].help),
                             W.VBox(boxes, layout=W.Layout(max_height="160px", overflow="auto"))]
                else:
                    parts = [self.boxes[name]]
                (folded if name in FOLDED else items).extend(parts)
            if folded:
                items.append(self._accordion(folded))
            columns.append(W.VBox(items))
        return W.GridBox(columns, layout=W.Layout(grid_template_columns="repeat(auto-fit, minmax(300px, 1fr))",
                                                  grid_gap="4px 12px"))

    def _accordion(self, children: list[Any]) -> Any:
        """The DDP/FSDP2 options, folded while one process runs (they apply from world_size=2 on)."""
        W = self.W
        self.distributed = W.Accordion(children=[W.VBox(children)], titles=("DDP / FSDP2 options (world_size > 1)",),
                                       selected_index=None if self.controls["world_size"].value <= 1 else 0)
        self.distributed.add_class("wb-distributed")

        def follow(change: Any) -> None:  # more than one process: show what now applies
            self.distributed.selected_index = 0 if change["new"] > 1 else None

        self.controls["world_size"].observe(follow, names="value")
        return self.distributed

    # ---- reading the controls ----------------------------------------------------------------
    def knobs(self) -> Knobs:
        """The Knobs the controls describe; knobs that cannot apply here are disabled and left off."""
        k = Knobs(batch_size=self.controls["batch_size"].value)
        for name in self.order:
            if KNOBS[name].widget == "blocks":
                k = k.replace(checkpoint=tuple(n for n, box in self.block_boxes.items() if box.value))
                continue
            w = self.controls[name]
            reason = self.blocked(name, k)
            w.disabled = reason is not None
            w.tooltip = self.boxes[name].tooltip = f"disabled: {reason}" if reason else KNOBS[name].help
            if reason is None:
                k = k.replace(**{name: None if w.value == DEFAULT else w.value})
        return k

    def blocked(self, name: str, k: Knobs) -> str | None:
        """Why `name` cannot take effect given the knobs before it (device, other knobs), or None."""
        probe = KNOBS[name].probe
        if probe is None:
            return None
        try:
            trial = k.replace(**{name: probe})
        except ValueError as e:
            return str(e)
        before = set(device_notes(k, self._device, has_conv=self._has_conv))
        for note in device_notes(trial, self._device, has_conv=self._has_conv):
            if note not in before and note.startswith(name) and "no-op" in note:
                return note
        return None

