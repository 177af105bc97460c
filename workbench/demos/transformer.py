"""A small GPT-style decoder on synthetic token sequences, trained through a `step_fn`.

Batches are dicts `{"input_ids": (B, T), "labels": (B, T)}` as from a tokenizer pipeline; the
step function computes the next-token loss itself. The sequences are arithmetic progressions
modulo the vocabulary (start and stride vary), so a model that attends to the previous two
tokens predicts the rest and the loss visibly falls within one trial.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from .parts import workbench_parts

DESCRIPTION = ("a small GPT (causal attention, dict batches, step_fn): try amp='bf16', compile and "
               "checkpointing its blocks")

SIZES = {
    # sequences, tokens per sequence, vocabulary, model width, heads, blocks, batch size
    "tiny": dict(sequences=64, seq_len=16, vocab=16, dim=32, heads=2, depth=2, batch_size=8),
    "default": dict(sequences=1024, seq_len=32, vocab=64, dim=96, heads=4, depth=3, batch_size=32),
    # a CUDA device (demos.size_for): a realistic width and context (d=512, 256 tokens, 6 blocks), where
    # the matmuls fill the step and bf16 pays on tensor cores
    "cuda": dict(sequences=4096, seq_len=256, vocab=256, dim=512, heads=8, depth=6, batch_size=32),
}


class ModularSequences(Dataset):
    """Token sequences t_i = (start + i * stride) mod vocab; items are dicts of LongTensor[T]."""

    def __init__(self, sequences: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (sequences, 1), generator=g)
        stride = torch.randint(1, vocab, (sequences, 1), generator=g)
        self.tokens = (start + stride * torch.arange(seq_len + 1)) % vocab  # (N, T + 1) int64

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        seq = self.tokens[i]
        return {"input_ids": seq[:-1], "labels": seq[1:]}  # next-token targets


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask, via scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D/H)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + position embeddings, `depth` blocks in a ModuleList, final norm, an untied LM head."""

    def __init__(self, vocab: int, seq_len: int, dim: int, heads: int, depth: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))  # (B, T, dim)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # (B, T, vocab) logits


def lm_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy over every position of a dict batch."""
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())



def build(size: str) -> dict[str, Any]:
    """Generate the token data and the model (both seeded) and return the Workbench's parts."""
    cfg = SIZES[size]
    return workbench_parts(lambda: TinyGPT(cfg["vocab"], cfg["seq_len"], cfg["dim"], cfg["heads"], cfg["depth"]),
                           ModularSequences(cfg["sequences"], cfg["seq_len"], cfg["vocab"]), loss_fn=None,
                           lr=3e-3, batch_size=cfg["batch_size"], step_fn=lm_step)
