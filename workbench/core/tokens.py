"""Token batches: what a trial trains on when its batches hold `input_ids` (language models).

Three things live here, all plain torch (the core never imports transformers):

- **Counting.** `count(batch)` reads a batch *before* it moves to the device (host tensors, so no
  device sync): its sequences, its trained tokens and its slots (`input_ids.numel()`, padding
  included). Trained tokens come from `attention_mask` when the batch has one, from `position_ids`
  for a packed row (every slot is a token), else from `labels != -100`, else every slot; the
  result says which. `TokenMeter` sums them over a window (tensors already on a device are summed
  there and read once, at the end).
- **The measured window.** With skewed lengths a 30-step window of a length-grouped sampler sees
  only the batches of one length band. `TokenWindow` gives every trial a fixed, length-stratified
  sample of the batches its sampler would make over the whole data: the sampler's batches (random,
  or grouped by the Trainer's rule) are sorted by their tokens, cut into as many strata as
  the window has batches, and from each the batch nearest the stratum's mean is taken. The loader cycles through
  exactly those batches, so any window of that many batches reads each once, wherever warm-up
  ended. docs/measurement.md "Tokens and the length-stratified window".
- **The length knobs' collators.** `PadToMultiple` pads a collated batch's sequence dimension to a
  multiple; `Packed` flattens a batch into one row with `position_ids` (the rule of transformers'
  `DataCollatorWithFlattening`: labels get -100 at each sequence start).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler

IGNORE_INDEX = -100  # the label torch's cross-entropy (and every HF model) skips
LENGTH_POOL = 20_000  # samples whose length is read (a seeded random pool on bigger data)
MEGABATCH_MULT = 50  # transformers' get_length_grouped_indices: mega-batches of up to 50 batches
# how a batch's trained tokens were counted (TrialResult.extra["tokens"]["counted_from"])
FROM_MASK, FROM_POSITIONS, FROM_LABELS, FROM_SLOTS = ("attention_mask", "position_ids (packed)", "labels != -100",
                                                      "input_ids (no mask: every slot)")


@dataclass(frozen=True)
class Count:
    """One batch: sequences, trained tokens, slots (padding included) and how tokens were counted.
    `tokens`/`slots` are ints for host tensors, 0-d tensors for tensors already on a device."""

    sequences: int
    tokens: Any
    slots: int
    counted_from: str
    packed: bool = False


def count(batch: Any) -> Count | None:
    """The batch's token figures (None when it has no `input_ids` tensor): read on the host before
    the batch moves, so counting never waits for the device."""
    if not isinstance(batch, Mapping):
        return None
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() == 0:
        return None
    slots = ids.numel()
    rows = int(ids.shape[0]) if ids.dim() > 1 else 1
    mask, pos, labels = batch.get("attention_mask"), batch.get("position_ids"), batch.get("labels")
    if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
        return Count(rows, _total(mask != 0), slots, FROM_MASK)
    if isinstance(pos, torch.Tensor) and rows == 1 and pos.numel() == slots:
        flat = pos.reshape(-1)
        starts = 1 + (int((flat[1:] <= flat[:-1]).sum()) if flat.device.type == "cpu" else 0)
        return Count(starts if flat.device.type == "cpu" else rows, slots, slots, FROM_POSITIONS, packed=True)
    if isinstance(labels, torch.Tensor) and labels.shape == ids.shape:
        return Count(rows, _total(labels != IGNORE_INDEX), slots, FROM_LABELS)
    return Count(rows, slots, slots, FROM_SLOTS)


def _total(flags: torch.Tensor) -> Any:
    """A sum: an int for host tensors, a 0-d tensor left on its device otherwise (no sync)."""
    total = flags.sum()
    return int(total) if total.device.type == "cpu" else total


class TokenMeter:
    """Tokens, slots and sequences of the batches a source delivered; `snapshot()` before and after a
    window gives the window's figures (device sums are read there: the one read per window)."""

    def __init__(self) -> None:
        self.tokens: Any = 0
        self.slots = 0
        self.sequences = 0
        self.counted_from: set[str] = set()

    def add(self, c: Count | None) -> None:
        if c is None:
            return
        self.tokens = self.tokens + c.tokens
        self.slots += c.slots
        self.sequences += c.sequences
        self.counted_from.add(c.counted_from)

    def snapshot(self) -> tuple[int, int, int]:
        """(tokens, slots, sequences) so far, as host ints."""
        tokens = self.tokens
        return (int(tokens.item()) if isinstance(tokens, torch.Tensor) else int(tokens)), self.slots, self.sequences


def window_figures(before: tuple[int, int, int], after: tuple[int, int, int], wall_s: float,
                   counted_from: set[str]) -> dict[str, Any] | None:
    """The window's token figures from two snapshots (None when no token batch was read)."""
    tokens, slots, sequences = (a - b for a, b in zip(after, before))
    if slots <= 0 or wall_s <= 0:
        return None
    return {"tokens": tokens, "slots": slots, "sequences": sequences, "tokens_per_s": tokens / wall_s,
            "padding_share": 1.0 - tokens / slots, "tokens_per_sample": tokens / max(1, sequences),
            "counted_from": " + ".join(sorted(counted_from))}


# ---- what the data says about lengths ----------------------------------------------------------------
def first_item(dataset: Any) -> Any:
    """The dataset's first sample, or None when it cannot be read by index."""
    try:
        return dataset[0]
    except Exception:  # an IterableDataset, an empty one, a dataset that fails: no length info
        return None


def is_token_item(item: Any) -> bool:
    """Whether a sample is a dict with `input_ids` (what length grouping and packing read)."""
    return isinstance(item, Mapping) and "input_ids" in item


def lengths_of(dataset: Any, indices: Sequence[int]) -> list[int]:
    """Lengths of the samples at `indices`: a `lengths` attribute or a 'length' column (Hugging Face
    datasets) when the dataset has one, else `len(sample["input_ids"])`. Raises ValueError saying what
    it needs when neither is there."""
    given = getattr(dataset, "lengths", None)
    if given is None and "length" in (getattr(dataset, "column_names", None) or ()):
        given = dataset["length"]
    if given is not None:
        return [int(given[i]) for i in indices]
    out = []
    for i in indices:
        item = dataset[i]
        if not is_token_item(item):
            raise ValueError(
                "group_by_length needs each sample's length: use samples that are dicts with 'input_ids' (their "
                f"length is len(input_ids)), or a dataset with a `lengths` list or a 'length' column; sample {i} "
                f"is a {type(item).__name__}" + (f" with keys {sorted(item)}" if isinstance(item, Mapping) else ""))
        out.append(len(item["input_ids"]))
    return out


def length_pool(dataset: Any, seed: int) -> tuple[list[int], list[int]]:
    """(indices, lengths) of the samples whose length is read: all of them, or a seeded random pool of
    LENGTH_POOL on bigger data (reading every length of a big dataset would tokenize it)."""
    n = len(dataset)
    indices = list(range(n)) if n <= LENGTH_POOL else sorted(random.Random(seed).sample(range(n), LENGTH_POOL))
    return indices, lengths_of(dataset, indices)


def grouped_order(lengths: Sequence[int], group: int, generator: torch.Generator) -> list[int]:
    """Positions in `lengths` ordered by transformers' `get_length_grouped_indices` rule: a random
    permutation cut into mega-batches of min(n // (4 * group), 50) groups, each sorted by length,
    longest first; the longest sample's mega-batch leads."""
    n = len(lengths)
    mult = min(n // (group * 4), MEGABATCH_MULT) or 1
    perm = torch.randperm(n, generator=generator).tolist()
    size = mult * group
    megas = [sorted(perm[i:i + size], key=lambda j: lengths[j], reverse=True) for i in range(0, n, size)]
    top = max(range(len(megas)), key=lambda m: lengths[megas[m][0]])
    megas[0][0], megas[top][0] = megas[top][0], megas[0][0]
    return [j for mega in megas for j in mega]


class CycleBatches(Sampler):
    """A batch sampler that yields the same batches in the same order, `repeats` times per epoch: any
    run of len(batches) consecutive batches holds each batch once."""

    def __init__(self, batches: list[list[int]], repeats: int = 1) -> None:
        self.batches = batches
        self.repeats = max(1, repeats)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for _ in range(self.repeats):
            yield from (list(b) for b in self.batches)

    def __len__(self) -> int:
        return len(self.batches) * self.repeats


class GroupedSampler(Sampler):
    """group_by_length outside a measured window (diagnose, interleave): the Trainer's rule over the
    whole dataset, reshuffled every epoch from a seeded generator."""

    def __init__(self, lengths: list[int], indices: list[int], group: int, seed: int) -> None:
        self.lengths, self.indices, self.group = lengths, indices, group
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([self.indices[j] for j in grouped_order(self.lengths, self.group, self.generator)])

    def __len__(self) -> int:
        return len(self.indices)


@dataclass
class TokenWindow:
    """The plan of a token trial's data: which batches its loader cycles through so that the measured
    window (`batches` long) is a length-stratified sample of the batches its sampler makes."""

    indices: list[int]  # dataset positions whose lengths were read
    lengths: list[int]
    batch_size: int
    accum_steps: int
    batches: int  # batches in the measured window: steps * accum_steps
    seed: int
    natural_batches: int  # batches in one pass over the dataset (the epoch the loader repeats up to)

    def sampler(self, grouped: bool) -> CycleBatches:
        """The loader's batch sampler: the stratified batches of the random or the grouped order."""
        g = torch.Generator().manual_seed(self.seed)
        order = (grouped_order(self.lengths, self.batch_size * self.accum_steps, g) if grouped
                 else torch.randperm(len(self.lengths), generator=g).tolist())
        chunks = [order[i:i + self.batch_size] for i in range(0, len(order) - self.batch_size + 1, self.batch_size)]
        chosen = stratified(chunks, [sum(self.lengths[j] for j in c) for c in chunks], self.batches)
        random.Random(self.seed).shuffle(chosen)
        batches = [[self.indices[j] for j in c] for c in chosen]
        return CycleBatches(batches, repeats=math.ceil(self.natural_batches / max(1, len(batches))))


def stratified(items: list[Any], keys: Sequence[float], n: int) -> list[Any]:
    """`n` of `items`: the items sorted by key are cut into n equal strata, and from each the item whose
    key is nearest the stratum's mean, so the sample's total key estimates the whole's (n/len share);
    all of them when there are no more than n."""
    if len(items) <= n:
        return list(items)
    ranked = sorted(range(len(items)), key=lambda i: keys[i])
    edges = [round(s * len(ranked) / n) for s in range(n + 1)]
    out = []
    for s in range(n):
        stratum = ranked[edges[s]:edges[s + 1]]
        mean = sum(keys[i] for i in stratum) / len(stratum)
        out.append(items[min(stratum, key=lambda i: abs(keys[i] - mean))])
    return out


def token_window(dataset: Any, *, batch_size: int, accum_steps: int, steps: int, seed: int) -> TokenWindow | None:
    """A TokenWindow for a map-style token dataset whose lengths vary; None when lengths cannot be read
    or are all equal (every window is then alike already)."""
    if not is_token_item(first_item(dataset)) and getattr(dataset, "lengths", None) is None:
        return None
    indices, lengths = length_pool(dataset, seed)
    if len(set(lengths)) <= 1:
        return None
    return TokenWindow(indices, lengths, batch_size, accum_steps, steps * accum_steps, seed,
                       natural_batches=max(1, len(dataset) // batch_size))


# ---- the collators of the length knobs ----------------------------------------------------------------
PAD_VALUES = {"attention_mask": 0, "labels": IGNORE_INDEX, "position_ids": 0, "token_type_ids": 0}


def pad_id_of(collate: Any) -> int:
    """The tokenizer's pad id when the collator carries a tokenizer (Hugging Face collators), else 0."""
    tok = getattr(collate, "tokenizer", None) or getattr(collate, "processing_class", None)
    pad = getattr(tok, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0


class PadToMultiple:
    """A collate_fn: the user's collate, then every [batch, seq] tensor of the batch padded at the end
    to a multiple of `multiple` (input_ids with the pad id, masks 0, labels -100)."""

    def __init__(self, collate: Callable | None, multiple: int) -> None:
        from torch.utils.data import default_collate

        self.collate = collate or default_collate
        self.multiple = multiple
        self.pad_id = pad_id_of(collate)

    def __call__(self, features: list[Any]) -> Any:
        batch = self.collate(features)
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return batch
        seq = ids.shape[1]
        extra = -seq % self.multiple
        if not extra:
            return batch
        out = dict(batch)
        for key, t in batch.items():
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape == ids.shape:
                value = self.pad_id if key == "input_ids" else PAD_VALUES.get(key, 0)
                out[key] = torch.nn.functional.pad(t, (0, extra), value=value)
        try:
            return type(batch)(out)
        except TypeError:
            return out


class Packed:
    """A collate_fn: a batch flattened into one row with no padding, as transformers'
    `DataCollatorWithFlattening` does: input_ids concatenated, position_ids restarting at 0 for each
    sample, labels with -100 at each sample's first token (from the sample's labels, or its ids)."""

    def __call__(self, features: list[Any]) -> dict[str, torch.Tensor]:
        ids: list[int] = []
        labels: list[int] = []
        pos: list[int] = []
        for f in features:
            x = _as_list(f["input_ids"])
            if not x:
                continue
            y = _as_list(f["labels"]) if "labels" in f else x
            y = y if len(y) == len(x) else x
            ids += x
            labels += [IGNORE_INDEX, *y[1:]]
            pos += list(range(len(x)))
        if not ids:
            raise ValueError("packing=True received a batch whose samples are all empty (no input_ids)")
        return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]), "position_ids": torch.tensor([pos])}


def _as_list(x: Any) -> list[int]:
    return x.tolist() if hasattr(x, "tolist") else list(x)
