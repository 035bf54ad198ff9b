"""Tokenizer and shards for a pretraining run, made once and reused while the corpus files stay the same.

    OUT/tokenizer/   the tokenizer (trained here unless given or taken from --init-from)
    OUT/data/        prepared shards (manifest.json + memmaps)
Both carry `corpus_fingerprint.json` ([path, size, mtime_ns] of every corpus file): a changed --corpus, or an edited
file, must not silently reuse them. In a distributed run rank 0 writes and the others wait at a barrier.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bertforge.data import ShardedCorpus, find_files, prepare_corpus
from bertforge.data.corpus import corpus_bytes, iter_texts
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write_text
from bertforge.model.folder import ModelFolder
from bertforge.pretraining.default_corpus import default_corpus
from bertforge.pretraining.recipes import LEFT_TO_RIGHT, PLM, SEQ2SEQ_OBJECTIVES
from bertforge.pretraining.options import DEFAULT_VOCAB, DEFAULT_VOCAB_EMBEDDED, PREPARE_HELDOUT, PretrainOptions
from bertforge.tokenization import Tokenizer
from bertforge.training.distributed import barrier

FINGERPRINT = "corpus_fingerprint.json"


def corpus_paths(opts: PretrainOptions, is_main: bool, world: int) -> list[str]:
    """The corpus files of the run: --corpus, or the embedded stdlib-docs corpus (built once, by rank 0 first)."""
    if opts.corpus is not None or opts.data is not None:
        return [str(p) for p in (opts.corpus or [])]
    paths = [str(default_corpus())] if is_main else []
    if world > 1:
        barrier()
        paths = [str(default_corpus())]
    if is_main:
        print(f"corpus: the Python standard library's documentation ({paths[0]})", flush=True)
    return paths


def corpus_fingerprint(paths: list[str], text_col: str | None = None) -> list[list]:
    """[path, size, mtime_ns] of every corpus file (a saved dataset: its folder's files together), sorted, and the
    text column when one is named: what decides whether OUT/tokenizer and OUT/data were made from this corpus (a
    changed --corpus or --text-col, or an edited file, must not silently reuse them)."""
    files = sorted(str(Path(p).resolve()) for p in find_files(paths))
    stamp = lambda p: max((f.stat().st_mtime_ns for f in [p, *p.rglob("*")]), default=0)  # noqa: E731
    found = [[f, corpus_bytes(Path(f)), stamp(Path(f))] for f in files]
    return found + ([["text_col", text_col]] if text_col else [])


def _fingerprint_matches(directory: Path, fingerprint: list[list]) -> bool:
    try:
        return json.loads((directory / FINGERPRINT).read_text()) == fingerprint
    except (OSError, ValueError):
        return False


def _write_fingerprint(directory: Path, fingerprint: list[list]) -> None:
    atomic_write_text(directory / FINGERPRINT, json.dumps(fingerprint) + "\n")


def prepare_tokenizer(opts: PretrainOptions, corpus_paths: list[str], is_main: bool):
    """The tokenizer: --init-from's, --tokenizer, a previously trained OUT/tokenizer, or one trained now."""
    out_tok = opts.out / "tokenizer"
    src = opts.init_from if opts.init_from is not None else opts.tokenizer
    if src is not None:  # a model folder's tokenizer (checked against its vocabulary), or a tokenizer folder
        tok = (ModelFolder.open(src, "--init-from").tokenizer() if opts.init_from is not None
               else Tokenizer.from_pretrained(src))
        masks = opts.recipe.objective not in (*LEFT_TO_RIGHT, PLM, *SEQ2SEQ_OBJECTIVES)
        if masks and tok.mask_token_id is None:  # e.g. a GPT-2 model folder: no [MASK] to corrupt inputs with
            flag = "--init-from" if opts.init_from is not None else "--tokenizer"
            raise BertforgeError(f"{flag} {src}: a {tok.kind} tokenizer without a mask token cannot feed the "
                                 f"{opts.recipe.objective} objective (it masks tokens); use a wordpiece / bpe / "
                                 "unigram tokenizer, or --recipe gpt for a left-to-right model")
        return tok
    vocab = opts.vocab_size or (DEFAULT_VOCAB_EMBEDDED if opts.corpus is None else DEFAULT_VOCAB)
    fingerprint = corpus_fingerprint(corpus_paths, opts.text_col)  # every rank: all must take the same branch
    if (out_tok / "tokenizer.json").is_file():
        # A resumed run must keep its tokenizer; a fresh one reuses it only when it is what would be trained
        # anyway: same kind, same vocabulary size, same corpus files (paths, sizes, mtimes).
        old = Tokenizer.from_pretrained(out_tok)
        if opts.resume or (old.kind == opts.recipe.tokenizer_kind and old.vocab_size == vocab
                           and _fingerprint_matches(out_tok, fingerprint)):
            return old
    barrier()  # every rank has looked at the old tokenizer before rank 0 replaces it
    if is_main:
        t0 = time.perf_counter()
        tok = Tokenizer.train(iter_texts(corpus_paths, text_col=opts.text_col), kind=opts.recipe.tokenizer_kind, vocab_size=vocab,
                              model_max_length=max(512, opts.seq_len),
                              workers=opts.workers or os.cpu_count() or 1)  # same tokenizer for any count
        tok.save_pretrained(out_tok)
        _write_fingerprint(out_tok, fingerprint)
        print(f"trained {opts.recipe.tokenizer_kind} tokenizer: vocab {tok.vocab_size} "
              f"({time.perf_counter() - t0:.1f} s) -> {out_tok}", flush=True)
    barrier()
    return Tokenizer.from_pretrained(out_tok)


def prepare_data(opts: PretrainOptions, corpus_paths: list[str], tok, is_main: bool) -> Path:
    """Shards for the corpus (reused when OUT/data holds them for this tokenizer and these corpus files)."""
    if opts.data is not None:
        return opts.data
    data_dir = opts.out / "data"
    if is_main:
        reuse = False
        if (data_dir / "manifest.json").is_file():
            try:
                ShardedCorpus(data_dir, tokenizer=tok)  # raises when the shards were made by another tokenizer
                reuse = _fingerprint_matches(data_dir, corpus_fingerprint(corpus_paths, opts.text_col))
            except BertforgeError:
                reuse = False
        if not reuse:
            fingerprint = corpus_fingerprint(corpus_paths, opts.text_col)
            frac = PREPARE_HELDOUT if opts.heldout_fraction is None else opts.heldout_fraction
            manifest = prepare_corpus(corpus_paths, tok, data_dir, workers=opts.workers, progress=opts.progress,
                                      heldout_fraction=frac, text_col=opts.text_col)
            _write_fingerprint(data_dir, fingerprint)
            print(f"prepared {manifest['num_tokens']:,} tokens in {manifest['num_documents']:,} documents "
                  f"({manifest['stats']['seconds']:.1f} s) -> {data_dir}", flush=True)
    barrier()
    return data_dir
