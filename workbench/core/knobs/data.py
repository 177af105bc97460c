"""The data-pipeline knobs: how the DataLoader is built and how batches reach the device.

Each knob's run-time hook (DataLoader keywords, the device move, traits for the runner), its note
and its code hook sit together. `batch_size` and `data` are structural (the loop reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import tokens
from .spec import Context, Fuzz, declare

DATA_MODES = ("loader", "cached")
PINNING_DEVICES = ("cuda", "xpu")  # page-locked buffers only matter where there is a copy to a device


def pins(ctx: Context) -> bool:
    """Whether pinned host memory means anything on this device (the one rule for run and code)."""
    return ctx.device_type in PINNING_DEVICES


# ---- data: a real loader, or one cached batch (the short-circuit test) ---------------------------
def data_note(value: str, ctx: Context) -> str | None:
    if value != "cached":
        return None
    return "data='cached' trains on one batch over and over: its loss is not comparable with the loader's"


def data_code(k: Any) -> dict[str, list[str]]:
    if k.data != "cached":
        return {}
    return {
        "header": [
            "# data='cached' was a measurement short-circuit (one repeated batch); this loop uses the real data."
        ]
    }


# ---- num_workers -----------------------------------------------------------------------------------
def workers_loader(value: int, ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"num_workers": value}
    if value and ctx.loader_timeout_s:
        out["timeout"] = ctx.loader_timeout_s  # a hung worker becomes an error, not a frozen notebook
    return out


def workers_traits(value: int, ctx: Context) -> dict[str, Any]:
    return {"workers": value}


def workers_code(k: Any) -> dict[str, list[str]]:
    if not k.num_workers:
        return {}
    return {
        "header": ['# Worker processes: on Windows/macOS run this under `if __name__ == "__main__":`.'],
        "loader_args": [f"num_workers={k.num_workers}"],
    }


# ---- pin_memory --------------------------------------------------------------------------------------
def pin_loader(value: bool, ctx: Context) -> dict[str, Any]:
    return {"pin_memory": value and pins(ctx)}


def pin_move(value: bool, ctx: Context) -> dict[str, Any]:
    # pinned host buffers make the copy asynchronous; only then is non_blocking meaningful
    return {"non_blocking": True} if value and pins(ctx) else {}


def pin_note(value: bool, ctx: Context) -> str | None:
    if value and ctx.device_type == "mps":
        return "pin_memory is a no-op on MPS (unified memory): the loader does not pin, copies are synchronous"
    if value and not pins(ctx):
        return "pin_memory is a no-op without an accelerator (nothing is copied to a device)"
    return None


def pin_inert(value: bool, ctx: Context) -> str | None:
    return None if pins(ctx) else f"nothing is copied to an accelerator on {ctx.device_type}, so no buffer is pinned"


def pin_code(k: Any) -> dict[str, list[str]]:
    if not k.pin_memory:
        return {}
    rule = f"device.type in {PINNING_DEVICES!r}"
    return {"loader_args": [f"pin_memory={rule}"], "move_args": [f"non_blocking={rule}"]}


# ---- persistent_workers, prefetch_factor: only with worker processes ----------------------------------
def persistent_loader(value: bool, ctx: Context) -> dict[str, Any]:
    return {"persistent_workers": value} if ctx.knobs.num_workers > 0 else {}


def persistent_traits(value: bool, ctx: Context) -> dict[str, Any]:
    return {"persistent_workers": value}


def persistent_note(value: bool, ctx: Context) -> str | None:
    return "persistent_workers is a no-op with data='cached'" if value and ctx.knobs.data == "cached" else None


def persistent_inert(value: bool, ctx: Context) -> str | None:
    if ctx.knobs.num_workers == 0:
        return "with num_workers=0 there are no worker processes to keep"
    return "data='cached' reuses one batch, so no worker runs" if ctx.knobs.data == "cached" else None


def persistent_code(k: Any) -> dict[str, list[str]]:
    return {"loader_args": ["persistent_workers=True"]} if k.persistent_workers else {}


def prefetch_loader(value: int | None, ctx: Context) -> dict[str, Any]:
    return {"prefetch_factor": value} if value is not None and ctx.knobs.num_workers > 0 else {}


def prefetch_traits(value: int | None, ctx: Context) -> dict[str, Any]:
    """Batches the workers can hold ready: num_workers x prefetch_factor (torch's default 2)."""
    return {"buffered_batches": ctx.knobs.num_workers * (2 if value is None else value)}


def prefetch_note(value: int | None, ctx: Context) -> str | None:
    if value is not None and ctx.knobs.num_workers == 0:
        return "prefetch_factor is a no-op with num_workers=0 (the main process loads)"
    return None


def prefetch_inert(value: int | None, ctx: Context) -> str | None:
    if ctx.knobs.num_workers == 0:
        return "with num_workers=0 the main process loads each batch when asked (nothing is fetched ahead)"
    return "data='cached' reuses one batch, so nothing is fetched ahead" if ctx.knobs.data == "cached" else None


def prefetch_code(k: Any) -> dict[str, list[str]]:
    if k.prefetch_factor is None or not k.num_workers:  # DataLoader refuses it without workers
        return {}
    return {"loader_args": [f"prefetch_factor={k.prefetch_factor}"]}


# ---- the length knobs: group_by_length, pad_to_multiple_of, packing (token batches only) ------------
NOT_TOKENS = "{} is a no-op here: the batches have no input_ids (it acts on token sequences)"


def grouped_loader(value: bool, ctx: Context) -> dict[str, Any]:
    """The Trainer's length-grouped order: the trial's stratified window of grouped batches, or
    (outside a measured trial: diagnose, interleave) a length-grouped sampler over the dataset."""
    if not value or not ctx.token_data or ctx.spec is None or ctx.spec.iterable:
        return {}
    if ctx.window is not None:
        return {"batch_sampler": ctx.window.sampler(grouped=True)}
    indices, lengths = tokens.length_pool(ctx.spec.dataset, 0)
    return {"sampler": tokens.GroupedSampler(lengths, indices, ctx.knobs.batch_size * ctx.knobs.accum_steps, 0)}


def grouped_check(value: bool, ctx: Context) -> None:
    if not value or ctx.spec is None or not ctx.token_data:
        return
    if ctx.spec.iterable:
        raise ValueError("group_by_length=True needs a dataset with a length: an IterableDataset of unknown length "
                         "cannot be sorted into length groups; use a map-style dataset, or set group_by_length=False")
    tokens.lengths_of(ctx.spec.dataset, [0])  # raises naming what it needs when samples carry no lengths


def tokens_inert(value: Any, ctx: Context) -> str | None:
    """The length knobs act on token batches (input_ids) only."""
    return None if ctx.token_data else "the batches hold no input_ids (the length knobs act on token sequences)"


def grouped_note(value: bool, ctx: Context) -> str | None:
    return NOT_TOKENS.format("group_by_length") if value and not ctx.token_data else None


TOKEN_TEST = ("token_data = isinstance(dataset[0], dict) and 'input_ids' in dataset[0]  "
              "# the length knobs act on token samples only")
GROUPED_SOURCE = '''def length_grouped(lengths, group, seed=0):
    """Indices grouped by length as transformers' LengthGroupedSampler does: a seeded permutation cut
    into mega-batches of min(n // (4 * group), 50) groups, each sorted longest first."""
    n = len(lengths)
    size = (min(n // (group * 4), 50) or 1) * group
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    megas = [sorted(perm[i:i + size], key=lambda j: lengths[j], reverse=True) for i in range(0, n, size)]
    top = max(range(len(megas)), key=lambda m: lengths[megas[m][0]])
    megas[0][0], megas[top][0] = megas[top][0], megas[0][0]
    return [j for mega in megas for j in mega]'''


def grouped_code(k: Any) -> dict[str, list[str]]:
    if not k.group_by_length:
        return {}
    return {"functions": [GROUPED_SOURCE],
            "setup": [TOKEN_TEST,
                      f"length_order = (length_grouped([len(s['input_ids']) for s in dataset], {k.batch_size * k.accum_steps})"
                      "\n                if token_data else None)  # group_by_length: token data only"],
            "loader_args": ["sampler=length_order"]}


def pad_loader(value: int | None, ctx: Context) -> dict[str, Any]:
    if value is None or not ctx.token_data or ctx.knobs.packing or ctx.spec is None:
        return {}
    return {"collate_fn": tokens.PadToMultiple(ctx.spec.collate_fn, value)}


def pad_check(value: int | None, ctx: Context) -> None:
    """Refuse a multiple that pads the longest sample past the model's position table: every batch
    holding that sample would fail in the model's position embedding (an index error), not run slower."""
    if value is None or ctx.max_positions is None or not ctx.token_data or ctx.knobs.packing:
        return
    longest = ctx.longest_tokens() if ctx.longest_tokens is not None else None
    if longest is None:
        return  # lengths cannot be read before the collate_fn runs: the trial's error says it instead
    padded = -(-longest // value) * value  # tokens: longest rounded up to the multiple
    if longest <= ctx.max_positions < padded:
        fits = [m for m in (8, 4, 2, 1) if -(-longest // m) * m <= ctx.max_positions]
        raise ValueError(
            f"pad_to_multiple_of={value} pads the longest sample ({longest} tokens) to {padded}, past this model's "
            f"{ctx.max_positions} positions: use a smaller multiple (pad_to_multiple_of={fits[0]}), "
            "or set pad_to_multiple_of=None")


def pad_note(value: int | None, ctx: Context) -> str | None:
    if value is None:
        return None
    if not ctx.token_data:
        return NOT_TOKENS.format("pad_to_multiple_of")
    return "pad_to_multiple_of is a no-op with packing=True (a packed row has no padding)" if ctx.knobs.packing else None


PAD_SOURCE = '''def pad_to_multiple(collate, multiple, pad_id=0):
    """Your collate_fn, then every [batch, seq] tensor padded at the end to a multiple of `multiple`."""
    collate = collate or torch.utils.data.default_collate

    def padded(features):
        batch = collate(features)
        if not isinstance(batch, dict) or "input_ids" not in batch:
            return batch
        ids = batch["input_ids"]
        extra = -ids.shape[1] % multiple
        if extra:
            fill = {"input_ids": pad_id, "labels": -100}
            batch = {key: torch.nn.functional.pad(t, (0, extra), value=fill.get(key, 0))
                     if torch.is_tensor(t) and t.shape == ids.shape else t for key, t in batch.items()}
        return batch
    return padded'''


def pad_code(k: Any) -> dict[str, list[str]]:
    if k.pad_to_multiple_of is None or k.packing:
        return {}
    return {"functions": [PAD_SOURCE],
            "setup": ["collate_fn = globals().get('collate_fn')  # yours, or None (torch's default_collate)",
                      f"collate_fn = pad_to_multiple(collate_fn, {k.pad_to_multiple_of}, "
                      "getattr(getattr(collate_fn, 'tokenizer', None), 'pad_token_id', None) or 0)"],
            "loader_args": ["collate_fn=collate_fn"]}


def packing_loader(value: bool, ctx: Context) -> dict[str, Any]:
    return {"collate_fn": tokens.Packed()} if value and ctx.token_data else {}


def packing_check(value: bool, ctx: Context) -> None:
    if not value or not ctx.token_data:
        return
    if ctx.spec is not None and not ctx.spec.iterable and not tokens.is_token_item(tokens.first_item(ctx.spec.dataset)):
        raise ValueError("packing=True concatenates each sample's input_ids, but the samples are not dicts with "
                         "'input_ids' (your collate_fn makes them): tokenize in the dataset, or set packing=False")
    if ctx.forward_params and "position_ids" not in ctx.forward_params:
        raise ValueError("packing=True needs a model whose forward takes position_ids (they restart at 0 for each "
                         "packed sample); this model's forward takes "
                         f"({', '.join(sorted(ctx.forward_params))}): set packing=False (and try group_by_length)")


def packing_note(value: bool, ctx: Context) -> str | None:
    return NOT_TOKENS.format("packing") if value and not ctx.token_data else None


PACK_SOURCE = '''def packed(features):
    """A batch as one row with no padding (transformers' DataCollatorWithFlattening): position_ids
    restart at 0 for each sample, labels are -100 at each sample's first token."""
    ids, labels, pos = [], [], []
    for f in features:
        x = [int(v) for v in f["input_ids"]]
        y = [int(v) for v in f["labels"]] if "labels" in f else x
        ids += x
        labels += [-100] + y[1:]
        pos += list(range(len(x)))
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]), "position_ids": torch.tensor([pos])}'''


def packing_code(k: Any) -> dict[str, list[str]]:
    if not k.packing:
        return {}
    return {"functions": [PACK_SOURCE],
            "setup": [TOKEN_TEST, "collate_fn = packed if token_data else globals().get('collate_fn')  # packing"],
            "loader_args": ["collate_fn=collate_fn"]}


# ---- the declarations: Knobs (value.py) inherits these fields, in this order ---------------------------
@dataclass(frozen=True, init=False)
class DataKnobs:
    """The data-pipeline knobs, declared once each (Knobs inherits these fields)."""

    batch_size: int = declare(32, interleave=True, kind="int", minimum=1, group="Data pipeline", widget="int", maximum="dataset",
        help="samples per micro-batch (per optimizer step: batch_size * accum_steps)",
        fuzz=Fuzz(range(1, 49), (-2, 0, 49, 10_000)))
    data: str = declare("loader", note=data_note, code=data_code, kind="choice", choices=DATA_MODES,
        group="Data pipeline", widget="dropdown",
        help="loader = real DataLoader; cached = one batch kept on the device (much faster = data-bound)",
        fuzz=Fuzz(DATA_MODES, ("disk",)))
    num_workers: int = declare(0, loader=workers_loader, traits=workers_traits, code=workers_code, kind="int",
        minimum=0, group="Data pipeline", widget="slider", maximum="workers", probe=1, fuzz=Fuzz(range(0, 3), (-1,)),
        help="DataLoader worker processes; 0 = load in the main process (start near half the cores)")
    pin_memory: bool = declare(False, loader=pin_loader, move=pin_move, note=pin_note, inert=pin_inert, code=pin_code, kind="bool",
        group="Data pipeline", widget="checkbox", probe=True, fuzz=Fuzz((False, True)),
        help="page-locked host buffers for faster async host->device copies")
    persistent_workers: bool = declare(False, loader=persistent_loader, traits=persistent_traits,
        note=persistent_note, inert=persistent_inert, code=persistent_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True,
        fuzz=Fuzz((False, True)), help="keep workers alive across epochs (needs num_workers > 0)")
    prefetch_factor: int | None = declare(None, loader=prefetch_loader, traits=prefetch_traits, note=prefetch_note, inert=prefetch_inert,
        code=prefetch_code, kind="int", minimum=1, optional=True, group="Data pipeline", widget="dropdown",
        options=(None, 1, 2, 4, 8), probe=4, fuzz=Fuzz((None, 1, 2, 3, 4), (0,)),
        help="batches buffered per worker; None = torch's default (2); costs host memory")
    group_by_length: bool = declare(False, loader=grouped_loader, check_run=grouped_check, note=grouped_note, inert=tokens_inert,
        code=grouped_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True, fuzz=Fuzz((False, True)),
        help="batches of similar lengths (the Trainer's length-grouped sampler): less padding on token data")
    pad_to_multiple_of: int | None = declare(None, loader=pad_loader, check_run=pad_check, note=pad_note, inert=tokens_inert, code=pad_code,
        kind="int", minimum=1, optional=True, group="Data pipeline", widget="dropdown", options=(None, 8, 64), probe=8,
        fuzz=Fuzz((None, 1, 8, 64), (0,)),  # 64 pads past the transformer demo's positions: refused, naming the fix
        help="pad token batches to a multiple of this length (fewer distinct shapes: tensor cores, fewer recompiles)")
    packing: bool = declare(False, loader=packing_loader, check_run=packing_check, note=packing_note, inert=tokens_inert,
        code=packing_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True,
        fuzz=Fuzz((False,)),  # True needs a model that takes position_ids (tests/test_hf.py); the demos do not
        help="padding-free packing: each batch as one row with position_ids (the model must take position_ids)")
