"""From raw text to a model: `train_tokenizer`, `prepare` (a corpus tokenised into memory-mapped shards) and
`pretrain` (a BERT-family model, or a GPT / T5 / BART, by recipe).

    tok = bertforge.train_tokenizer("corpus.txt", vocab_size=8000, out="runs/tok")
    result = bertforge.pretrain("corpus.txt", recipe="roberta", size="bert-mini", max_steps=2000, out="runs/rob")
    result.metrics                                  # held-out MLM accuracy, loss, ...

A corpus is a file, folder or glob (or a list of them: .txt documents separated by blank lines, .jsonl, tables),
a table in memory (its `text_col`), or `texts`: documents as strings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.inputs import corpus_files, make_config, model_name, read_history, trackers
from bertforge.api.results import PretrainResult
from bertforge.config.arguments import (BOOL, COUNT, DATA, DEVICE, FRACTION, LENGTH, MODEL, PATH, POSITIVE, SEED,
                                        STEPS, TEXT, check_args, choice, maybe)
from bertforge.errors import ArgumentError

# The options that change the recipe (`pretraining.recipes.Recipe`), not the run.
RECIPE_OPTIONS = ("objective", "masking", "dynamic", "input_format", "dupe_factor", "plm_k", "mask_prob", "schedule",
                  "embedding_sharing")


def train_tokenizer(corpus: Any = None, *, texts: Any = None, out: Any = None, kind: str = "wordpiece",
                    vocab_size: int = 30522, lowercase: bool = True, min_frequency: int = 2,
                    model_max_length: int = 512, workers: int = 1, text_col: str | None = None,
                    progress: bool = False, overwrite: bool = False):
    """A `Tokenizer` trained on the corpus (the same texts and options always give the same tokenizer), saved to
    `out` when given (tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.txt for WordPiece).

    `kind`: wordpiece (BERT), bpe (RoBERTa's byte-level BPE), unigram (ALBERT), gpt2, t5, or a family's own
    SentencePiece layout (deberta-v2, xlm-roberta). Project Gutenberg headers
    and footers in text files are skipped."""
    from bertforge.data.corpus import find_files, iter_texts
    from bertforge.io.rundir import claim_output_dir
    from bertforge.tokenization import Tokenizer

    check_args(locals(), corpus=maybe(DATA), texts=maybe(DATA), out=maybe(PATH), kind=TEXT, vocab_size=COUNT,
               lowercase=BOOL, min_frequency=COUNT, model_max_length=COUNT, workers=COUNT, text_col=maybe(TEXT),
               progress=BOOL, overwrite=BOOL)
    files, column = corpus_files(corpus, texts, text_col)
    if files is None:
        raise ArgumentError("corpus=None, texts=None: give a corpus (files) or texts")
    documents = iter_texts(find_files(files), text_col=column)  # a missing file is named before `out` is made

    def train():
        return Tokenizer.train(documents, kind=kind, vocab_size=vocab_size, lowercase=lowercase,
                               min_frequency=min_frequency, show_progress=progress,
                               model_max_length=model_max_length, workers=workers)

    if out is None:
        return train()
    folder = _writable_dir(out)
    # an existing tokenizer (or anything else) in `out` is refused like every verb's earlier output
    with claim_output_dir(folder, resume=False, overwrite=overwrite, resume_flag=None):
        tok = train()
        tok.save_pretrained(folder)
    return tok


def _writable_dir(path: Any) -> Path:
    """`path`, created now: a folder that cannot hold the output fails before minutes of work, not after."""
    import os

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ArgumentError.about("out", path, f"cannot create directory ({err.strerror or err})") from None
    if not os.access(out, os.W_OK):
        raise ArgumentError.about("out", path, "directory is not writable")
    return out


def _tokenizer(tokenizer: Any, revision: str | None):
    """A Tokenizer object as it is; a tokenizer folder, tokenizer.json or a model's Hub id, loaded."""
    from bertforge.tokenization import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    return Tokenizer.from_pretrained(model_name(tokenizer, revision, "tokenizer="))


def prepare(corpus: Any = None, *, texts: Any = None, tokenizer: Any, out: Any, text_col: str | None = None,
            workers: int | None = None, doc_boundary: str = "blank", heldout_fraction: float = 0.05,
            progress: bool = True, overwrite: bool = False, revision: str | None = None) -> dict[str, Any]:
    """Tokenise the corpus with `tokenizer` (a Tokenizer, a folder, or a model's Hub id) into memory-mapped shards
    in `out`, for `pretrain(data=out)`; returns the manifest (tokens, sentences, documents, shards, timings).
    `doc_boundary`: "blank" (a blank line ends a document) or "file"."""
    from bertforge.data import prepare_corpus
    from bertforge.io.rundir import claim_output_dir

    check_args(locals(), corpus=maybe(DATA), texts=maybe(DATA), tokenizer=MODEL, out=PATH, text_col=maybe(TEXT),
               workers=maybe(COUNT), doc_boundary=choice("blank", "file"), heldout_fraction=FRACTION, progress=BOOL,
               overwrite=BOOL, revision=maybe(TEXT))
    files, column = corpus_files(corpus, texts, text_col)
    if files is None:
        raise ArgumentError("corpus=None, texts=None: give a corpus (files) or texts")
    # one writer at a time; earlier shards are replaced only with overwrite; a failure leaves no empty new folder
    with claim_output_dir(out, resume=False, overwrite=overwrite, resume_flag=None):
        tok = _tokenizer(tokenizer, revision)
        return prepare_corpus(files, tok, out, workers=workers, doc_boundary=doc_boundary,
                              heldout_fraction=heldout_fraction, progress=progress, text_col=column)


def pretrain(corpus: Any = None, *, texts: Any = None, out: Any = None, recipe: str | None = None, size: str | None = None,
             seq_len: int | None = None, batch_size: int = 32, max_steps: int | None = None,
             time_budget: str | float | None = None, lr: float | None = None, tokenizer: Any = None,
             vocab_size: int | None = None, data: Any = None, init_from: Any = None, text_col: str | None = None,
             seed: int = 0, device: str = "auto", precision: str | None = None, compile: bool | None = None,
             progress: bool = True, report_to: Any = None, logging_dir: Any = None, resume: bool = False,
             overwrite: bool = False, revision: str | None = None, family: str | None = None,
             heldout: Any = None, **options: Any) -> PretrainResult:
    """Pretrain a model by `recipe` (default: bert; roberta, albert, spanbert, electra, structbert, xlnet, gpt, modern, t5,
    bart, ...) for `max_steps` or `time_budget` ("90s", "30m", "1h"; default 3m), saving a Hugging Face checkpoint
    to `out` (default: runs/pretrain-RECIPE) and held-out metrics to OUT/eval_results.json.

    The text: `corpus` (files, or a table in memory) or `texts`, tokenised by `tokenizer` (a folder; default: one
    of `vocab_size` trained on the corpus), or `data`: shards from `prepare`. Neither: the Python standard library's
    own documentation, a small model for a few minutes. `init_from`: continue a checkpoint (a folder or Hub id)
    with its own tokenizer. `family`: the model family instead of the recipe's (e.g. recipe="electra",
    family="deberta-v2"). `heldout`: named held-out corpora scored on the final model, {"de": "de.txt", ...} or
    ["de=de.txt", ...]. `options`: the recipe's overrides (objective, masking, dynamic, input_format,
    dupe_factor, plm_k, mask_prob, schedule, embedding_sharing) and any other field of `bertforge.pretraining.options.PretrainOptions`
    (warmup_ratio, heldout_fraction, eval_batches, log_every, save_every, workers, threads, ...)."""
    from bertforge.device import default_precision
    from bertforge.pretraining.options import PretrainOptions, named_heldout_sets
    from bertforge.pretraining.recipes import DEFAULT, resolve
    from bertforge.pretraining.run import pretrain as run

    check_args(locals(), corpus=maybe(DATA), texts=maybe(DATA), out=maybe(PATH), recipe=maybe(TEXT), size=maybe(TEXT),
               seq_len=maybe(LENGTH), batch_size=COUNT, max_steps=maybe(STEPS), lr=maybe(POSITIVE),
               tokenizer=maybe(MODEL), vocab_size=maybe(COUNT), data=maybe(PATH), init_from=maybe(MODEL),
               text_col=maybe(TEXT), seed=SEED, device=DEVICE, precision=maybe(TEXT), compile=maybe(BOOL),
               progress=BOOL, resume=BOOL, overwrite=BOOL, revision=maybe(TEXT), family=maybe(TEXT))
    if seq_len is not None and seq_len < 8:
        raise ArgumentError.about("seq_len", seq_len, "expected at least 8 (a [CLS], a [SEP] and some text)")
    tracked = trackers(report_to, logging_dir)  # a missing tracker library: one line before any work
    chosen = resolve(recipe or DEFAULT, model_type=family,
                     **{k: options.pop(k) for k in RECIPE_OPTIONS if k in options})
    if isinstance(heldout, dict):
        heldout = [f"{name}={path}" for name, path in heldout.items()]
    files, column = corpus_files(corpus, texts, text_col)
    if files is not None and data is not None:
        raise ArgumentError("corpus, data: give one of them, not both", flag_message="give --corpus or --data, "
                            "not both")
    embedded = files is None and data is None
    if max_steps is None and time_budget is None:
        time_budget = "3m"
    opts = make_config(PretrainOptions, "pretrain", dict(
        recipe=chosen, out=Path(out or f"runs/pretrain-{chosen.name}"), corpus=files, text_col=column,
        data=Path(data) if data is not None else None,
        tokenizer=Path(model_name(tokenizer, revision, "tokenizer=")) if tokenizer is not None else None,
        vocab_size=vocab_size, size=size or ("bert-tiny" if embedded else "bert-mini"),
        seq_len=seq_len or (64 if embedded else 128), batch_size=batch_size, max_steps=max_steps,
        time_budget=time_budget, lr=lr, precision=precision or default_precision(device), seed=seed, resume=resume,
        overwrite=overwrite, init_from=Path(model_name(init_from, revision, "init_from=")) if init_from else None,
        progress=progress, device=device, compile=compile, heldout_sets=named_heldout_sets(heldout or []),
        **tracked), options)
    record = run(opts)
    return PretrainResult(opts.out, dict(record.get("heldout", {})), read_history(opts.out), record)
