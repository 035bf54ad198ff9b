"""Deterministic vocabulary training for `bertforge.tokenization`: the same texts and options give the same files.

The `tokenizers` trainers keep their word counts in hash maps seeded at random in every process (Rust's
RandomState), and the iteration order leaks into what they produce. Threads are not the cause: with
RAYON_NUM_THREADS=1 three runs still give three different files.
  * WordPiece: the "##x" continuation tokens get their ids in hash order, and merges of equal count are chosen
    by smallest id, so the vocabulary's order (and, near the end, its content and size) changes from run to run.
    Ties at the `limit_alphabet` cut are broken in hash order too.
  * Unigram: the EM sums run over the words in hash order, so scores differ in their last bits (reordering pieces
    of equal score), and the characters the trainer re-adds at the end get penalty scores in hash order.
  * Byte-level BPE is deterministic: its alphabet is fixed and sorted, so every id is assigned in a fixed order.
So WordPiece is trained here from word counts made in Python: as BPE over an alphabet where a character that
continues a word is a symbol of its own (what "##x" is), so that every id is assigned in sorted order; and the
Unigram trainer's result is put in a canonical form.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import struct
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from itertools import chain

from tokenizers import AddedToken, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE, WordPiece

# While training, the continuation form of the i-th alphabet character is chr(_CONTINUATION + i): plane-15 private
# use, above every alphabet character (characters from there up are left out of the alphabet: they become [UNK]).
_CONTINUATION = 0xF0000
_PENALTY_SPAN = 0.01  # the Unigram trainer re-adds missing characters at min_score + k * 1e-4
_CHUNK_CHARS = 1 << 20  # texts per counting task
_SERIAL_CHUNKS = 4      # counted in this process; a corpus with more goes to worker processes


def train_wordpiece(backend: Backend, texts: Iterable[str], vocab_size: int, min_frequency: int,
                    specials: list[AddedToken], limit_alphabet: int = 1000, show_progress: bool = False,
                    workers: int = 1) -> None:
    """Give `backend` (normaliser and pre-tokenizer already set) a WordPiece model trained on `texts`, as
    `tokenizers.trainers.WordPieceTrainer` trains it (same alphabet rule, same merges by count) but with ties
    broken by character order instead of hash order."""
    if show_progress:
        from tqdm.auto import tqdm

        texts = tqdm(texts, desc="count words", unit=" docs", smoothing=0.1)
    counts = word_counts(backend, texts, workers)
    chars: Counter[str] = Counter()
    for word, n in counts.items():
        for c in word:
            chars[c] += n
    # The `limit_alphabet` most frequent characters (ties: lower code point first) are kept; the rest become [UNK].
    ranked = sorted((c for c in chars if ord(c) < _CONTINUATION), key=lambda c: (-chars[c], c))
    alphabet = sorted(ranked[:limit_alphabet])
    keep = set(alphabet)
    continuation = {c: chr(_CONTINUATION + i) for i, c in enumerate(alphabet)}
    symbols: Counter[str] = Counter()
    # As in the WordPiece trainer: characters outside the alphabet are left out, and "first" means the word's first
    # character, so when that one is left out the next is still a continuation.
    for word, n in counts.items():
        sym = "".join(c if i == 0 else continuation[c] for i, c in enumerate(word) if c in keep)
        if sym:
            symbols[sym] += n

    def repeated() -> Iterator[str]:
        for sym, n in symbols.items():
            yield " ".join([sym] * n)

    scratch = Backend(BPE())
    scratch.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=show_progress)
    scratch.train_from_iterator(repeated(), trainer=trainer, length=len(symbols))
    plain = {v: k for k, v in continuation.items()}
    special_set = {t.content for t in specials}

    def readable(sym: str) -> str:
        if sym in special_set:
            return sym
        text = "".join(plain.get(c, c) for c in sym)
        return "##" + text if sym[0] in plain else text

    vocab: dict[str, int] = {}
    for sym, _ in sorted(scratch.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1]):
        vocab.setdefault(readable(sym), len(vocab))
    backend.model = WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100, continuing_subword_prefix="##")
    backend.add_special_tokens(specials)


def checked_texts(texts: Iterable[str], seen: list[int]) -> Iterator[str]:
    """`texts`, refusing anything but strings, and a first "text" that is the name of an existing file (paths
    would otherwise be trained on as the text of their names); seen[0] counts the non-blank texts."""
    for i, text in enumerate(texts):
        if not isinstance(text, str) or (i == 0 and len(text) < 4096 and not any(c.isspace() for c in text)
                                         and os.path.isfile(text)):
            what = type(text).__name__ if not isinstance(text, str) else f"the path {text!r}"
            raise TypeError(f"Tokenizer.train takes texts, got {what}: read corpus files with "
                            "bertforge.data.corpus.iter_texts(paths)")
        if text.strip():
            seen[0] += 1
            yield text


def word_counts(backend: Backend, texts: Iterable[str], workers: int = 1) -> Counter[str]:
    """How often each word (after `backend`'s normaliser and pre-tokenizer) occurs in `texts`. With workers > 1,
    the first few megabytes are counted here and the rest of a larger corpus in that many spawned processes (so a
    calling script needs the `if __name__ == "__main__":` guard). Sums do not depend on the order, so neither
    does the result."""
    counts: Counter[str] = Counter()
    chunks = _chunks(texts)
    for i, chunk in enumerate(chunks):
        _count_into(counts, backend, chunk)
        if i + 1 == _SERIAL_CHUNKS and workers > 1:
            break
    else:
        return counts
    first = next(chunks, None)
    if first is None:
        return counts
    ctx = mp.get_context("spawn")  # not fork: this process holds the Rust thread pools
    with ctx.Pool(workers, initializer=_worker_init, initargs=(backend.to_str(),)) as pool:
        pending: deque = deque()
        for chunk in chain([first], chunks):  # a bounded queue: reading never runs far ahead of counting
            pending.append(pool.apply_async(_worker_count, (chunk,)))
            if len(pending) >= 2 * workers:
                counts.update(pending.popleft().get())
        while pending:
            counts.update(pending.popleft().get())
    return counts


def _chunks(texts: Iterable[str]) -> Iterator[list[str]]:
    chunk, size = [], 0
    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= _CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _count_into(counts: Counter[str], backend: Backend, texts: list[str]) -> None:
    normalize, pre_tokenize = backend.normalizer.normalize_str, backend.pre_tokenizer.pre_tokenize_str
    for text in texts:
        counts.update(word for word, _ in pre_tokenize(normalize(text)))


_WORKER_BACKEND: Backend | None = None


def _worker_init(tokenizer_json: str) -> None:
    global _WORKER_BACKEND
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER_BACKEND = Backend.from_str(tokenizer_json)


def _worker_count(texts: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    _count_into(counts, _WORKER_BACKEND, texts)
    return counts


def canonical_unigram(backend: Backend, n_special: int, append: Iterable[str] = ()) -> Backend:
    """The trained Unigram `backend` in a canonical form: scores rounded to float32 (SentencePiece's precision;
    the hash-order noise is in the last bits of a float64), pieces sorted by score then text, and the rarest
    single characters (the ones the trainer re-added with penalty scores in hash order) given their scores in
    character order. The first `n_special` pieces (the special tokens) stay where they are; `append` (special
    tokens that follow the pieces, as XLM-R's <mask>) become the last pieces, at score 0 as transformers'
    converter writes them."""
    data = json.loads(backend.to_str())
    pieces = data["model"]["vocab"]
    head, rest = pieces[:n_special], [[p, _f32(s)] for p, s in pieces[n_special:]]
    if rest:
        floor = min(s for _, s in rest) + _PENALTY_SPAN
        rare = sorted(i for i, (p, s) in enumerate(rest) if len(p) == 1 and s <= floor)
        scores = sorted((rest[i][1] for i in rare), reverse=True)
        for i, s in zip(sorted(rare, key=lambda i: rest[i][0]), scores):
            rest[i][1] = s
    rest.sort(key=lambda ps: (-ps[1], ps[0]))
    data["model"]["vocab"] = head + rest + [[token, 0.0] for token in append]
    return Backend.from_str(json.dumps(data, ensure_ascii=False))


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]
