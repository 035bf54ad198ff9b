"""A request's texts before the model sees them: cut to a character bound when `truncate` allows it, counted in
tokens, and tokenized off the event loop.

Tokenizing is the one piece of a request's work proportional to its characters: a 7.5 MB text took the tokenizer
9-14 s, and on the event loop that stalled every other client. So:
  - a request of more than a few thousand characters is tokenized on a small thread pool (`Preparer.run`), never
    on the event loop (the tokenizer releases the GIL). The loop and the pool each have their own copy of every
    model's tokenizer: a tokenizer serializes its calls, and a long text on the pool (or a batch on the inference
    thread) must not make the loop wait;
  - with `truncate`, each text (each side of a pair) is first cut to `max_length x CHARS_PER_TOKEN` characters, at
    a space, so neither the tokenizer here nor the model's own tokenizer on the inference thread reads the rest.
    The model sees the same tokens: the cut keeps more than `max_length` tokens (checked; a text with fewer, long
    runs of spaces say, is cut again four times longer, up to the whole text), and truncation keeps the first
    `max_length`. Tokens never span a space, so cutting at one changes none of the tokens before it;
  - without `truncate`, a text whose cut already holds more than `max_length` tokens is over the limit: it is
    refused without reading the rest.
The caller bounds a request's characters (`--max-request-chars`) before any of this.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 10   # generous: English averages 4-5 characters a token, space included
INLINE_CHARS = 4096    # a request this small is tokenized on the loop: the thread hop would cost more
_SPACES = " \n\t\r\f\v"


def cut(text: str, bound: int) -> str:
    """`text` if it has at most `bound` characters, else its start up to the last space before `bound` (if one
    lies in the second half of it; else exactly `bound` characters: text without spaces, CJK say)."""
    if len(text) <= bound:
        return text
    space = max(text.rfind(c, bound // 2, bound + 1) for c in _SPACES)
    return text[:space] if space > 0 else text[:bound]


@dataclass
class Prepared:
    texts: list[str]
    pairs: list[str | None] | None
    lengths: list[int]     # tokens (with specials); with truncate at most the model's max_length
    partial: list[bool]    # only a cut was counted (no truncate): the text holds more than lengths[i] tokens


def count(tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[int]:
    """Untruncated token counts (with special tokens), as `ServedModel.lengths`."""
    enc = tokenizer([t.strip() for t in texts], pairs=pairs, padding=False, truncation=False, return_tensors=None)
    return [len(ids) for ids in enc["input_ids"]]


def prepare(tokenizer: Any, limit: int, texts: Sequence[str], pairs: Sequence[str | None] | None,
            truncate: bool) -> Prepared:
    """Cut (see the module docstring) and count `texts` (with `pairs[i]` as the second text of pair i, None for
    a single text) for a model of `limit` tokens."""
    texts, sides = list(texts), list(pairs) if pairs is not None else [None] * len(texts)
    bound = limit * CHARS_PER_TOKEN
    cut_texts = [cut(t, bound) for t in texts]
    cut_pairs = [None if p is None else cut(p, bound) for p in sides]
    # a cut side must hold more than `limit` tokens by itself: then truncation never reaches the cut
    pending = [(i, side) for i in range(len(texts)) for side in (0, 1)
               if _was_cut(i, side, texts, sides, cut_texts, cut_pairs)]
    while pending:
        counts = count(tokenizer, [cut_texts[i] if side == 0 else cut_pairs[i] for i, side in pending])
        bound *= 4
        again = []
        for (i, side), n in zip(pending, counts):
            if n > limit + 1:
                continue
            if side == 0:
                cut_texts[i] = cut(texts[i], bound)
            else:
                cut_pairs[i] = cut(sides[i], bound)
            if _was_cut(i, side, texts, sides, cut_texts, cut_pairs):
                again.append((i, side))
        pending = again
    lengths = [0] * len(texts)
    for want_pair in (False, True):  # the tokenizer takes single texts and pairs in separate calls
        rows = [i for i in range(len(texts)) if (cut_pairs[i] is not None) == want_pair]
        if rows:
            counts = count(tokenizer, [cut_texts[i] for i in rows], [cut_pairs[i] for i in rows] if want_pair else None)
            for i, n in zip(rows, counts):
                lengths[i] = n
    partial = [cut_texts[i] is not texts[i] or (sides[i] is not None and cut_pairs[i] is not sides[i])
               for i in range(len(texts))]
    if truncate:
        lengths = [min(n, limit) for n in lengths]
        partial = [False] * len(texts)
    return Prepared(cut_texts, cut_pairs if pairs is not None else None, lengths, partial)


def _was_cut(i: int, side: int, texts: list, sides: list, cut_texts: list, cut_pairs: list) -> bool:
    whole, part = (texts[i], cut_texts[i]) if side == 0 else (sides[i], cut_pairs[i])
    return whole is not None and part is not whole and len(part) < len(whole)


def tokens_json(tokenizer: Any, texts: Sequence[str], add_special_tokens: bool, chunk: int = 2048) -> bytes:
    """`/tokenize`'s answer as JSON bytes, exactly as Starlette's JSONResponse renders it: per text, its tokens
    `{"id", "text", "special", "start", "stop"}`. Written as text `chunk` tokens at a time, handing the GIL to the
    event loop between chunks: one `json.dumps` of a long text's tokens held the loop for seconds, and a dict per
    token (millions, for a long text) made the garbage collector stop the loop too."""
    enc = tokenizer(list(texts), padding=False, truncation=False, return_tensors=None, return_offsets=True,
                    return_special_tokens_mask=True)
    text = json.JSONEncoder(ensure_ascii=False).encode
    row = '{"id":%d,"text":%s,"special":%s,"start":%d,"stop":%d}'
    out = []
    for ids, offsets, special in zip(enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"]):
        parts = []
        for at in range(0, len(ids), chunk):
            span = slice(at, at + chunk)
            names = tokenizer.convert_ids_to_tokens(ids[span])
            rows = [row % (i, text(name), "true" if s else "false", a, b)
                    for i, name, (a, b), s in zip(ids[span], names, offsets[span], special[span])
                    if add_special_tokens or not s]
            if rows:
                parts.append(",".join(rows))
            time.sleep(0)  # hand the GIL over
        out.append("[" + ",".join(parts) + "]")
    return ("[" + ",".join(out) + "]").encode("utf-8")


def _lower_priority() -> None:
    """A tokenizing thread yields the CPU to the event loop and the inference thread (Linux: threads have their
    own nice value); elsewhere nothing changes."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + 5, 19))
    except (AttributeError, OSError):
        pass


class Preparer:
    """Runs `prepare` (or any function of a tokenizer) inline for small requests, else on its own threads (not the
    inference thread: a long text must not hold the batches up either), each with its own copy of the model's
    tokenizer."""

    def __init__(self, models: Sequence[Any], threads: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bertforge-tokenize",
                                        initializer=_lower_priority)
        self._tokenizers = {id(m): (copy.deepcopy(m.tokenizer), copy.deepcopy(m.tokenizer)) for m in models}

    async def run(self, model: Any, chars: int, fn: Any, *args: Any) -> Any:
        """`fn(tokenizer, *args)` with a copy of `model`'s tokenizer: on the loop if `chars` is small, else on
        the pool."""
        on_loop, pooled = self._tokenizers[id(model)]
        if chars <= INLINE_CHARS:
            return fn(on_loop, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, pooled, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
