"""Tokenise a corpus into memory-mapped shards, and read them back.

Layout of a prepared corpus directory::

    manifest.json                      # written last: its presence means the corpus is complete
    shard_00000.ids.bin                # token ids, uint16 (vocab <= 65535) or int32, all sentences back to back
    shard_00000.word_start.bin         # uint8, 1 where a token starts a word (for whole-word / span masking)
    shard_00000.sent_offsets.npy       # int64 [n_sentences + 1]: token offset of each sentence in the shard
    shard_00000.doc_offsets.npy        # int64 [n_documents + 1]: sentence offset of each document in the shard
    shard_00000.doc_hash.npy           # uint64 [n_documents]: content hash, gives the deterministic held-out split

Documents never straddle shards. Tokenisation runs in worker processes (spawned; each receives the Tokenizer,
which pickles as its tokenizer.json string); results are written in input order, so any number of workers gives
the same shards. Every file is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as Backend

from bertforge.data.corpus import corpus_bytes, find_files, iter_documents, split_sentences
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, atomic_write_text, note_written
from bertforge.tokenization import Tokenizer

FORMAT = "bertforge-shards"
VERSION = 1
DEFAULT_SHARD_TOKENS = 64_000_000
DEFAULT_HELDOUT_FRACTION = 0.01
_CHUNK_CHARS = 1 << 20  # text per worker task: large enough to amortise IPC, small enough to keep memory flat


# ---------------------------------------------------------------------------------------------- tokenizer glue

def resolve_tokenizer(tokenizer: Any) -> Any:
    """A bertforge Tokenizer (or anything with its interface) as is; a `tokenizers.Tokenizer`, or a path to a
    tokenizer directory / tokenizer.json, as a bertforge Tokenizer."""
    if isinstance(tokenizer, (str, os.PathLike)):
        return Tokenizer.from_pretrained(tokenizer)
    if isinstance(tokenizer, Backend):
        return Tokenizer(tokenizer)
    missing = [a for a in ("encode_words", "vocab_size", "mask_token_id", "special_ids") if not hasattr(tokenizer, a)]
    if missing:
        raise BertforgeError(f"tokenizer {type(tokenizer).__name__} lacks {', '.join(missing)}")
    return tokenizer


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the serialised tokenizer (or of its vocabulary size and special ids when it has no backend)."""
    backend = getattr(tokenizer, "backend", None)
    text = backend.to_str() if backend is not None else json.dumps(
        [tokenizer.vocab_size, sorted(tokenizer.special_ids), tokenizer.encode_ids(["The quick brown fox."])])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.int32)


# ---------------------------------------------------------------------------------------------- tokenisation

@dataclass
class _Encoded:
    """A batch of tokenised documents (what a worker sends back)."""

    ids: np.ndarray          # all tokens back to back
    word_start: np.ndarray   # uint8 per token
    sent_lens: np.ndarray    # int64 tokens per sentence (no empty sentences)
    doc_sents: np.ndarray    # int64 sentences per document (no empty documents)
    doc_hash: np.ndarray     # uint64 per document
    chars: int


def _encode_documents(texts: list[str], tokenizer: Any, dtype: np.dtype) -> _Encoded:
    # A causal LM's tokenizer (GPT-2's): the sentences keep the spaces and paragraph breaks between them (it learns,
    # and writes, the text as it stands; the masked-LM tokenizers encode each sentence on its own).
    keep_space = bool(getattr(getattr(tokenizer, "layout", None), "keeps_spaces", False))
    per_doc = [split_sentences(t, keep_space=keep_space) for t in texts]
    flat = list(chain.from_iterable(per_doc))
    enc = tokenizer.encode_words(flat) if flat else []
    lens = np.fromiter((len(ids) for ids, _ in enc), np.int64, len(enc))
    total = int(lens.sum())
    ids = np.fromiter(chain.from_iterable(ids for ids, _ in enc), np.int64, total)
    words = np.fromiter(chain.from_iterable(w for _, w in enc), np.int64, total)
    # A token starts a word when its word id differs from the previous token's, and at every sentence start.
    word_start = np.ones(total, np.uint8)
    word_start[1:] = words[1:] != words[:-1]
    nonempty = lens > 0
    word_start[(np.cumsum(lens) - lens)[nonempty]] = 1
    sent_doc = np.repeat(np.arange(len(per_doc)), [len(s) for s in per_doc])
    doc_sents = np.bincount(sent_doc[nonempty], minlength=len(per_doc))
    doc_sents = doc_sents[doc_sents > 0]
    sent_lens = lens[nonempty]
    ids = ids.astype(dtype)
    doc_tok = np.add.reduceat(sent_lens, np.concatenate([[0], np.cumsum(doc_sents)[:-1]])) if len(doc_sents) else sent_lens[:0]
    bounds = np.concatenate([[0], np.cumsum(doc_tok)])
    raw = ids.tobytes()
    isz = ids.itemsize
    doc_hash = np.array([int.from_bytes(hashlib.blake2b(raw[a * isz:b * isz], digest_size=8).digest(), "little")
                         for a, b in zip(bounds[:-1], bounds[1:])], dtype=np.uint64)
    return _Encoded(ids, word_start, sent_lens, doc_sents.astype(np.int64), doc_hash, sum(map(len, texts)))


_WORKER_TOKENIZER: Any = None


def _worker_init(tokenizer: Any) -> None:
    global _WORKER_TOKENIZER
    # One worker per core: the Rust thread pool inside each worker would only oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOKENIZER = tokenizer


def _worker_encode(texts: list[str], dtype_str: str) -> _Encoded:
    return _encode_documents(texts, _WORKER_TOKENIZER, np.dtype(dtype_str))


def _document_batches(paths: Any, doc_boundary: str, text_col: str | None) -> Iterator[list[str]]:
    batch, size = [], 0
    for doc in iter_documents(paths, doc_boundary=doc_boundary, text_col=text_col):
        batch.append(doc.text)
        size += len(doc.text)
        if size >= _CHUNK_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# ---------------------------------------------------------------------------------------------- writing

def _atomic_save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.save would append ".npy" to a path
            np.save(fh, array)
    atomic_write(path, write)


class _ShardWriter:
    """Append tokenised documents; start a new shard (at a document boundary) every `shard_tokens` tokens."""

    def __init__(self, out_dir: Path, dtype: np.dtype, shard_tokens: int):
        self.out_dir, self.dtype, self.shard_tokens = out_dir, dtype, shard_tokens
        self.shards: list[dict] = []
        self._open = False

    def _start(self) -> None:
        self.name = f"shard_{len(self.shards):05d}"
        self._ids = open(self.out_dir / f"{self.name}.ids.bin.tmp", "wb")
        self._ws = open(self.out_dir / f"{self.name}.word_start.bin.tmp", "wb")
        self._sent_lens: list[np.ndarray] = []
        self._doc_sents: list[np.ndarray] = []
        self._doc_hash: list[np.ndarray] = []
        self.tokens = 0
        self._open = True

    def add(self, enc: _Encoded) -> None:
        doc_tok = np.add.reduceat(enc.sent_lens, np.concatenate([[0], np.cumsum(enc.doc_sents)[:-1]])) \
            if len(enc.doc_sents) else np.zeros(0, np.int64)
        d = s = t = 0  # next document / sentence / token of `enc` to write
        while d < len(doc_tok):
            if not self._open:
                self._start()
            # Take documents until this shard reaches shard_tokens (at least one, so huge documents still fit).
            room = self.shard_tokens - self.tokens
            cum = np.cumsum(doc_tok[d:])
            n = max(1, int(np.searchsorted(cum, room, side="left")) + 1)
            n = min(n, len(doc_tok) - d)
            n_sent = int(enc.doc_sents[d:d + n].sum())
            n_tok = int(cum[n - 1])
            self._ids.write(enc.ids[t:t + n_tok].tobytes())
            self._ws.write(enc.word_start[t:t + n_tok].tobytes())
            self._sent_lens.append(enc.sent_lens[s:s + n_sent])
            self._doc_sents.append(enc.doc_sents[d:d + n])
            self._doc_hash.append(enc.doc_hash[d:d + n])
            self.tokens += n_tok
            d, s, t = d + n, s + n_sent, t + n_tok
            if self.tokens >= self.shard_tokens:
                self.close_shard()

    def close_shard(self) -> None:
        if not self._open:
            return
        self._ids.close()
        self._ws.close()
        sent_lens = np.concatenate(self._sent_lens)
        doc_sents = np.concatenate(self._doc_sents)
        base = self.out_dir / self.name
        _atomic_save_npy(Path(f"{base}.sent_offsets.npy"), np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64))
        _atomic_save_npy(Path(f"{base}.doc_offsets.npy"), np.concatenate([[0], np.cumsum(doc_sents)]).astype(np.int64))
        _atomic_save_npy(Path(f"{base}.doc_hash.npy"), np.concatenate(self._doc_hash))
        os.replace(f"{base}.ids.bin.tmp", f"{base}.ids.bin")
        os.replace(f"{base}.word_start.bin.tmp", f"{base}.word_start.bin")
        note_written(f"{base}.ids.bin")
        note_written(f"{base}.word_start.bin")
        self.shards.append({"name": self.name, "num_tokens": self.tokens, "num_sentences": len(sent_lens),
                            "num_documents": len(doc_sents)})
        self._open = False


_PARALLEL_BYTES = 4 << 20  # below this, spawning a worker per core costs more than it saves


def prepare_corpus(paths: Iterable[str | os.PathLike] | str | os.PathLike, tokenizer: Any,
                   out_dir: str | os.PathLike, workers: int | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                   progress: bool = True, doc_boundary: str = "blank",
                   heldout_fraction: float = DEFAULT_HELDOUT_FRACTION, text_col: str | None = None) -> dict:
    """Tokenise the corpus at `paths` into shards under `out_dir` and return the manifest (also manifest.json).

    tokenizer: a bertforge Tokenizer, a `tokenizers.Tokenizer`, or a path to a tokenizer dir / tokenizer.json.
    workers: tokenising processes (1 = in this process; None = one per core for a corpus of more than a few
    megabytes, where they pay for their start-up; the shards are byte-identical either way).
    heldout_fraction: the default evaluation share recorded in the manifest (the split itself is chosen when
    loading, from per-document hashes).
    text_col: the field or column tables and jsonl files give their documents from (`iter_documents`).
    """
    tok = resolve_tokenizer(tokenizer)
    if workers is not None and workers < 1:
        raise BertforgeError(f"workers must be >= 1, got {workers}")
    if shard_tokens < 1:
        raise BertforgeError(f"shard_tokens must be >= 1, got {shard_tokens}")
    if not 0.0 <= heldout_fraction < 1.0:
        raise BertforgeError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    if manifest_path.exists():  # the old shards are about to be overwritten: the old manifest must not survive
        manifest_path.unlink()
    for stale in out.glob("shard_*"):
        stale.unlink()
    dtype = token_dtype(tok.vocab_size)
    files = find_files(paths)
    total_bytes = sum(corpus_bytes(f) for f in files)
    if workers is None:
        workers = (os.cpu_count() or 1) if total_bytes >= _PARALLEL_BYTES else 1
    writer = _ShardWriter(out, dtype, shard_tokens)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", smoothing=0.1)
    t0 = time.perf_counter()
    n_chars = 0

    def consume(enc: _Encoded) -> None:
        nonlocal n_chars
        writer.add(enc)
        n_chars += enc.chars
        if bar is not None:
            bar.update(min(enc.chars, bar.total - bar.n))  # chars ~ bytes: a progress estimate only

    batches = _document_batches(files, doc_boundary, text_col)
    if workers == 1:
        for texts in batches:
            consume(_encode_documents(texts, tok, dtype))
    else:
        # Spawned (not forked) workers: the parent may hold torch / Rust thread pools that do not survive fork.
        ctx = mp.get_context("spawn")
        with ctx.Pool(workers, initializer=_worker_init, initargs=(tok,)) as pool:
            pending: deque = deque()
            for texts in batches:  # bounded queue: reading never runs far ahead of tokenising
                pending.append(pool.apply_async(_worker_encode, (texts, dtype.str)))
                if len(pending) >= 2 * workers:
                    consume(pending.popleft().get())
            while pending:
                consume(pending.popleft().get())
    writer.close_shard()
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    shards = writer.shards
    if not shards:
        raise BertforgeError(f"no tokens in {len(files)} corpus file(s) (first: {files[0]})")
    manifest = {
        "format": FORMAT, "version": VERSION, "dtype": dtype.name,
        "num_tokens": sum(s["num_tokens"] for s in shards),
        "num_sentences": sum(s["num_sentences"] for s in shards),
        "num_documents": sum(s["num_documents"] for s in shards),
        "heldout_fraction": heldout_fraction, "doc_boundary": doc_boundary,
        "tokenizer": {
            "fingerprint": tokenizer_fingerprint(tok), "vocab_size": int(tok.vocab_size),
            "pad_id": tok.pad_token_id, "unk_id": tok.unk_token_id, "cls_id": tok.cls_token_id,
            "sep_id": tok.sep_token_id, "mask_id": tok.mask_token_id, "special_ids": sorted(int(i) for i in tok.special_ids),
        },
        "sources": [str(f) for f in files],
        "shards": shards,
        "stats": {"seconds": round(seconds, 3), "chars": n_chars, "workers": workers,
                  "tokens_per_second": round(sum(s["num_tokens"] for s in shards) / max(seconds, 1e-9))},
    }
    atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------------- reading

class ShardedCorpus:
    """Memory-mapped view of a prepared corpus: documents -> sentences -> token ids.

    split: "all", "train" or "heldout" (documents whose content hash falls below `heldout_fraction`, so the split
    is deterministic and stable under re-sharding). rank/world_size: this rank keeps documents rank, rank+W, ...
    of the split. Token positions ("global offsets") count across all shards in order.
    """

    def __init__(self, out_dir: str | os.PathLike, split: str = "all", heldout_fraction: float | None = None,
                 rank: int = 0, world_size: int = 1, tokenizer: Any = None):
        self.dir = Path(out_dir)
        mpath = self.dir / "manifest.json"
        if not mpath.is_file():
            raise BertforgeError(f"{mpath}: missing (run prepare first; an interrupted prepare leaves none)")
        try:
            self.manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise BertforgeError(f"{mpath}:{err.lineno}: invalid JSON ({err.msg})") from None
        if self.manifest.get("format") != FORMAT:
            raise BertforgeError(f"{mpath}: field 'format' is not {FORMAT!r}")
        if split not in ("all", "train", "heldout"):
            raise BertforgeError(f"split must be 'all', 'train' or 'heldout', not {split!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise BertforgeError(f"invalid rank {rank} for world_size {world_size}")
        if tokenizer is not None:
            fp = tokenizer_fingerprint(resolve_tokenizer(tokenizer))
            if fp != self.manifest["tokenizer"]["fingerprint"]:
                raise BertforgeError(f"{mpath}: field 'tokenizer.fingerprint' does not match the given tokenizer")
        self.dtype = np.dtype(self.manifest["dtype"])
        self._ids, self._ws, self._sent_off, self._doc_off = [], [], [], []
        hashes = []
        for s in self.manifest["shards"]:
            base = self.dir / s["name"]
            try:
                n = s["num_tokens"]
                # Plain ndarray views of the maps: same lazy paging, without np.memmap's per-slice overhead.
                self._ids.append(np.memmap(f"{base}.ids.bin", self.dtype, "r", shape=(n,)).view(np.ndarray)
                                 if n else np.zeros(0, self.dtype))
                self._ws.append(np.memmap(f"{base}.word_start.bin", np.uint8, "r", shape=(n,)).view(np.ndarray)
                                if n else np.zeros(0, np.uint8))
                self._sent_off.append(np.load(f"{base}.sent_offsets.npy", mmap_mode="r"))
                self._doc_off.append(np.load(f"{base}.doc_offsets.npy", mmap_mode="r"))
                hashes.append(np.load(f"{base}.doc_hash.npy"))
            except (OSError, ValueError) as err:
                raise BertforgeError(f"{base}: unreadable shard ({err})") from None
        self._tok_base = np.concatenate([[0], np.cumsum([len(a) for a in self._ids])]).astype(np.int64)
        self._doc_base = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
        all_hash = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        frac = self.manifest.get("heldout_fraction", 0.0) if heldout_fraction is None else heldout_fraction
        # hash / 2**64 < frac, without float rounding of 64-bit values.
        held = all_hash < np.uint64(min(int(frac * 2**64), 2**64 - 1))
        keep = {"all": np.ones_like(held), "train": ~held, "heldout": held}[split]
        self.doc_ids = np.flatnonzero(keep)[rank::world_size].astype(np.int64)
        self.split, self.rank, self.world_size = split, rank, world_size
        t = self.manifest["tokenizer"]
        self.vocab_size = int(t["vocab_size"])
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (t[k] for k in ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id"))
        self.special_ids = set(t["special_ids"])
        self._spans: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.doc_ids)

    @property
    def total_tokens(self) -> int:
        """Tokens in all shards (every split)."""
        return int(self._tok_base[-1])

    def _locate(self, i: int) -> tuple[int, int]:
        g = int(self.doc_ids[i])
        shard = int(np.searchsorted(self._doc_base, g, side="right")) - 1
        return shard, g - int(self._doc_base[shard])

    def sentence_offsets(self, i: int) -> np.ndarray:
        """Global token offsets of document i's sentences: [n_sentences + 1] (boundaries)."""
        shard, d = self._locate(i)
        off = self._doc_off[shard]
        return np.asarray(self._sent_off[shard][off[d]:off[d + 1] + 1], dtype=np.int64) + self._tok_base[shard]

    def document(self, i: int) -> list[np.ndarray]:
        """Document i as a list of sentences (token id arrays)."""
        b = self.sentence_offsets(i)
        flat = self.tokens(int(b[0]), int(b[-1]))
        return np.split(flat, b[1:-1] - b[0])

    def tokens(self, start: int, end: int) -> np.ndarray:
        """Token ids at global offsets [start, end) (may span shards)."""
        return self._read(self._ids, start, end)

    def word_starts(self, start: int, end: int) -> np.ndarray:
        return self._read(self._ws, start, end)

    def _read(self, arrays: list[np.ndarray], start: int, end: int) -> np.ndarray:
        shard = int(np.searchsorted(self._tok_base, start, side="right")) - 1
        base = int(self._tok_base[shard])
        if end <= self._tok_base[shard + 1]:
            return arrays[shard][start - base:end - base]
        parts = []
        while start < end:
            base, stop = int(self._tok_base[shard]), int(self._tok_base[shard + 1])
            parts.append(arrays[shard][start - base:min(end, stop) - base])
            start, shard = min(end, stop), shard + 1
        return np.concatenate(parts)

    def sentence_spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All sentences of this view, vectorised: (doc_ptr [n_docs + 1], starts, ends) with global token
        offsets; sentences of view-document i are starts[doc_ptr[i]:doc_ptr[i + 1]]. Cached."""
        if self._spans is None:
            shard_of = np.searchsorted(self._doc_base, self.doc_ids, side="right") - 1
            s_lo = np.empty(len(self.doc_ids), np.int64)
            s_hi = np.empty(len(self.doc_ids), np.int64)
            for sh in np.unique(shard_of):
                sel = shard_of == sh
                local = self.doc_ids[sel] - self._doc_base[sh]
                off = np.asarray(self._doc_off[sh])
                # Global sentence numbers: shards' sentence counts are stacked.
                s_lo[sel], s_hi[sel] = off[local] + self._sent_base[sh], off[local + 1] + self._sent_base[sh]
            counts = s_hi - s_lo
            doc_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            sent = np.repeat(s_lo - doc_ptr[:-1], counts) + np.arange(doc_ptr[-1])
            starts, ends = self._global_sentence_bounds()
            self._spans = (doc_ptr, starts[sent], ends[sent])
        return self._spans

    @property
    def _sent_base(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(o) - 1 for o in self._sent_off])]).astype(np.int64)

    def _global_sentence_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        starts = [np.asarray(o[:-1], np.int64) + b for o, b in zip(self._sent_off, self._tok_base)]
        ends = [np.asarray(o[1:], np.int64) + b for o, b in zip(self._sent_off, self._tok_base)]
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
        return cat(starts), cat(ends)

    def __repr__(self) -> str:
        return (f"ShardedCorpus({str(self.dir)!r}, split={self.split!r}, documents={len(self)}, "
                f"rank={self.rank}/{self.world_size})")
