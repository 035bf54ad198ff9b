"""Fast batch encoding: texts -> float32 vectors.

Where the time goes for short texts on CPU, and what this does about it:
  * tokenisation: one Rust `encode_batch` call per chunk of texts (parallel), no per-batch tokenizer round trips;
  * padding: texts are sorted by *token* count (not characters), so most batches have one length and run with no
    attention mask at all (SDPA's unmasked kernel), and the others waste almost nothing on padding;
  * the model: an inference copy with fused Q/K/V (`bertforge.embed.fast`), under `torch.inference_mode`;
  * order: results are written back to each text's original row, so the output lines up with the input.
Texts longer than the model's max_seq_length are truncated (like sentence-transformers); an empty text is
encoded as [CLS] [SEP] (a valid, if uninformative, vector), so row i always belongs to input line i.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from bertforge.embed.fast import PRECISIONS, EncoderCache
from bertforge.embed.modules import Normalize, SentenceEncoder, Transformer
from bertforge.errors import BertforgeError

_CHUNK = 16384  # texts tokenised and sorted together; bounds memory for very large inputs


def length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Index batches over texts sorted by length, longest first (a memory problem shows up at once).

    The sort is stable, so equal-length texts keep their input order; callers scatter results back by index.
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def pad_batch(ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, T] input ids padded to the longest, and an attention mask, or None when no row is padded."""
    lens = [len(x) for x in ids]
    width = max(lens)
    if min(lens) == width:
        return torch.tensor(ids, dtype=torch.long), None
    arr = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, x in enumerate(ids):
        arr[row, :len(x)] = x
        mask[row, :len(x)] = 1
    return torch.from_numpy(arr), torch.from_numpy(mask)


def encode(model: SentenceEncoder, texts: Sequence[str], batch_size: int = 32, precision: str = "fp32",
           normalize: bool | None = None, progress: bool = True) -> np.ndarray:
    """Encode `texts` to an [N, dim] float32 array in input order.

    precision: "fp32" (matches sentence-transformers to ~1e-6), "bf16" (weights and activations in bfloat16),
    "int8" (dynamic int8 quantisation of every Linear). normalize: None keeps the model's own choice (its final
    Normalize module), True/False forces L2 normalisation on/off.
    """
    if isinstance(texts, str):
        raise BertforgeError("encode expects a list of texts, not a single string")
    if precision not in PRECISIONS:
        raise BertforgeError(f"unknown precision {precision!r} (expected {', '.join(PRECISIONS)})")
    if batch_size <= 0:
        raise BertforgeError(f"batch size must be positive, got {batch_size}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise BertforgeError(f"text {i} is a {type(t).__name__}, not a string")
    transformer: Transformer = model.transformer
    head = [m for m in list(model)[1:] if not isinstance(m, Normalize)]
    do_norm = model.normalizes if normalize is None else normalize
    if not hasattr(model, "_fast_cache"):
        model._fast_cache = EncoderCache()  # a plain attribute: not a submodule, never saved
    fast = model._fast_cache.get(transformer.bert, precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    out = np.zeros((len(texts), model.dim), dtype=np.float32)
    pad_id = transformer.tokenizer.pad_token_id
    bar = tqdm(total=len(texts), unit="text", desc="embed", disable=not progress, leave=False)
    with torch.inference_mode():
        for start in range(0, len(texts), _CHUNK):
            chunk = [t.strip().lower() if transformer.do_lower_case else t.strip()
                     for t in texts[start:start + _CHUNK]]
            ids = transformer.tokenizer(chunk, max_length=transformer.max_seq_length, padding=False,
                                        truncation=True, return_tensors=None)["input_ids"]
            for rows in length_batches([len(x) for x in ids], batch_size):
                input_ids, mask = pad_batch([ids[r] for r in rows], pad_id)
                hidden = fast(input_ids, mask)
                features = {"token_embeddings": hidden.float() if dtype != torch.float32 else hidden}
                if mask is not None:
                    features["attention_mask"] = mask
                for module in head:  # Pooling, Dense (cheap: run in fp32)
                    features = module(features)
                emb = features["sentence_embedding"]
                if do_norm:
                    emb = F.normalize(emb, p=2, dim=1)
                out[start + rows] = emb.numpy()
                bar.update(len(rows))
    bar.close()
    return out
