"""Fast batch encoding: texts -> float32 vectors (what `SentenceEncoder.encode` runs).

Where the time goes for short texts on CPU, and what this does about it:
  * tokenisation: one Rust `encode_batch` call per chunk of texts (parallel), no per-batch tokenizer round trips;
  * padding: texts are sorted by *token* count (not characters), so most batches have one length and run with no
    attention mask at all (SDPA's unmasked kernel), and the others waste almost nothing on padding; where lengths
    differ widely (a serving batch of whatever requests arrived) the sorted texts are cut into several calls
    wherever padding would cost more than a call (`length_batches`);
  * the model: `bertforge.model.for_inference`'s copy of the encoder (Q/K/V pre-fused, optionally bf16 / fp16 /
    int8, optionally torch.compile'd), on the encoder's device, cached until the source's parameters change, under
    `torch.inference_mode`; on a GPU, batches go over from pinned memory without blocking; or an exported ONNX
    graph (`bertforge.model.onnx.OnnxModel`), run as it is;
  * order: results are written back to each text's original row, so the output lines up with the input.
Texts longer than the model's max_seq_length are truncated (like sentence-transformers); an empty text is
encoded as [CLS] [SEP] (a valid, if uninformative, vector), so row i always belongs to input line i.

This module knows nothing of the sentence-transformers modules: the caller hands over the encoder, a tokenising
function and the pooling head (`bertforge.embedding.modules` imports this module, never the other way round).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from tqdm.auto import tqdm

from bertforge.errors import BertforgeError
from bertforge.model import Encoder, for_inference
from bertforge.device import check_precision, compile_module, pin
from bertforge.model.folder import ONNX_INT8
from bertforge.model.onnx import OnnxModel

_CHUNK = 16384  # texts tokenised and sorted together; bounds memory for very large inputs
# One model call's fixed cost in padded tokens' worth of compute: MiniLM on a 2-core CPU, fp32, took 8 ms for one
# 8-token text and 0.14 ms per further token (rows x longest), about 65 tokens (see length_batches)
CALL_TOKENS = 64

Features = dict[str, torch.Tensor]

# Inference copies per source encoder and (precision, compiled), with the parameter versions they were built from.
# Weak keys: a copy lives as long as its source does; it is a plain cache, never a submodule, so it is never saved.
_COPIES: weakref.WeakKeyDictionary[Encoder, dict[tuple[str, bool], tuple[tuple[int, ...], Encoder]]] = \
    weakref.WeakKeyDictionary()


def inference_copy(encoder: Encoder, precision: str, compile: bool = False) -> Encoder:
    """`for_inference(encoder, precision)` on the encoder's device (fp16: the fp32 copy in half precision),
    compiled when asked; rebuilt only when a source parameter has changed."""
    # Every in-place update (optimizer.step, load_state_dict) bumps a tensor's version counter.
    # `.to()` swaps the tensors without bumping versions: where they live is part of the stamp, so a copy made
    # before `model.to("cuda")` (or to float64) is never reused after it.
    stamp = tuple((p._version, p.data_ptr(), p.dtype, p.device) for p in encoder.parameters())
    copies = _COPIES.setdefault(encoder, {})
    hit = copies.get((precision, compile))
    if precision in ("bf16", "fp16") and any(isinstance(m, DynamicLinear) for m in encoder.modules()):
        # int8 weights (bertforge quantize) compute with fp32 activations: a bf16 copy fails on a dtype mismatch
        raise BertforgeError(f"--precision {precision}: the model holds int8 weights (bertforge quantize), which run "
                             "with fp32 activations; drop --precision, or use the fp32 model it was quantised from")
    if hit is None or hit[0] != stamp:
        fast = for_inference(encoder, precision) if precision != "fp16" else for_inference(encoder).half()
        hit = (stamp, compile_module(fast, compile))
        copies[(precision, compile)] = hit
    return hit[1]


def length_batches(lengths: Sequence[int], batch_size: int, call_tokens: int = CALL_TOKENS) -> list[np.ndarray]:
    """Index batches over texts sorted by length, longest first (a memory problem shows up at once), each of at
    most `batch_size` texts, cut where padding would cost more than one more model call.

    A batch costs about (rows x its longest text) padded tokens plus a fixed `call_tokens` for the call itself;
    the cuts through the sorted texts that minimise the sum are found by dynamic programming (at most batch_size
    candidates per text). Texts of similar length fill whole batches; a few long texts among short ones (a serving
    batch of whatever arrived) run apart instead of padding every short one to their length. The sort is stable,
    so equal-length texts keep their input order; callers scatter results back by index.
    """
    counts = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-counts, kind="stable")
    longest = counts[order]  # descending: a batch order[j:i] is as wide as longest[j]
    n = len(order)
    best = np.zeros(n + 1)             # best[i]: the cheapest batching of the first i sorted texts
    start = np.zeros(n + 1, dtype=np.int64)  # where the last batch of that batching starts
    for i in range(1, n + 1):
        j = np.arange(max(0, i - batch_size), i)
        cost = best[j] + (i - j) * longest[j] + call_tokens
        k = len(cost) - 1 - int(np.argmin(cost[::-1]))  # on a tie the shorter last batch: a remainder goes last
        best[i], start[i] = cost[k], j[k]
    batches, i = [], n
    while i > 0:
        batches.append(order[start[i]:i])
        i = int(start[i])
    return batches[::-1]


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


def encode(encoder: Encoder | OnnxModel, token_ids: Callable[[list[str]], list[list[int]]], pad_id: int,
           pool: Callable[[Features], torch.Tensor] | None, texts: Sequence[str], dim: int, batch_size: int = 32,
           precision: str = "fp32", normalize: bool = False, progress: bool = True,
           compile: bool = False, precision_checked: bool = False) -> np.ndarray:
    """Encode `texts` to an [N, dim] float32 array in input order.

    token_ids: texts -> unpadded, truncated id lists; pool: features (`token_embeddings`, optional
    `attention_mask`) -> sentence vectors, run in fp32; None takes the `sentence_embedding` output of an exported
    graph that pools itself. precision: "fp32" (matches sentence-transformers to ~1e-6), "bf16" (weights and
    activations in bfloat16), "fp16" (GPU only), "int8" (dynamic int8 quantisation, CPU only). normalize: L2. The model runs on the encoder's device; compile: torch.compile it (see
    `bertforge.device.compile_module`). precision_checked: the caller checked `precision` against this device
    already (the API's one check per call), so it is not checked again.
    """
    if isinstance(texts, str):
        raise BertforgeError("encode expects a list of texts, not a single string")
    device = next(encoder.parameters()).device
    if not precision_checked:
        check_precision(precision, device, "precision")
    if batch_size <= 0:
        raise BertforgeError(f"batch size must be positive, got {batch_size}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise BertforgeError(f"text {i} is a {type(t).__name__}, not a string")
    if pool is None and not (isinstance(encoder, OnnxModel) and "sentence_embedding" in encoder.output_names):
        raise BertforgeError("encode: no pooling given and the model has no sentence_embedding output")
    if isinstance(encoder, OnnxModel):  # an exported graph: its precision is the file's (model.int8.onnx)
        if precision != "fp32":
            raise BertforgeError(f"--precision {precision}: {encoder.file} is an ONNX graph with its own precision; "
                                 f"for int8 pass --model {encoder.file.parent / ONNX_INT8}")
        fast = encoder
    else:
        fast = inference_copy(encoder, precision, compile)
    cuda = device.type == "cuda"
    out = np.zeros((len(texts), dim), dtype=np.float32)
    bar = tqdm(total=len(texts), unit="text", desc="embed", disable=not progress, leave=False)
    with torch.inference_mode():
        for start in range(0, len(texts), _CHUNK):
            ids = token_ids(list(texts[start:start + _CHUNK]))
            for rows in length_batches([len(x) for x in ids], batch_size):
                input_ids, mask = pad_batch([ids[r] for r in rows], pad_id)
                if cuda:  # pinned, so the copy does not wait for the GPU to finish the batch before
                    input_ids, mask = (None if t is None else pin(t).to(device, non_blocking=True)
                                       for t in (input_ids, mask))
                if pool is None:
                    emb = fast(input_ids, mask, outputs=("sentence_embedding",)).sentence_embedding
                else:
                    hidden = fast(input_ids, mask).last_hidden_state
                    # the head (Pooling, Dense) is cheap: fp32 (or the model's own float64), never half precision
                    features = {"token_embeddings": hidden.to(torch.promote_types(hidden.dtype, torch.float32))}
                    if mask is not None:
                        features["attention_mask"] = mask
                    emb = pool(features)
                if normalize:
                    emb = F.normalize(emb, p=2, dim=1)
                out[start + rows] = emb.float().cpu().numpy()
                bar.update(len(rows))
    bar.close()
    return out
