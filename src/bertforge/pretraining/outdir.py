"""The output directory of a pretraining run, claimed before anything in it is read or written.

`claim_out` (rank 0 of a distributed job; the others learn the outcome) takes `bertforge.io.rundir.claim_output_dir`:
one run per folder (a second is refused while the first holds it; a killed run's lock dies with it), no silent
replacement of an earlier run (`--resume` or `--overwrite`), stale temporary files removed, and in
OUT/run_options.json the options the checkpoints depend on plus fingerprints of the data they were made from. A
`--resume` that changes one of them is refused, naming the option; `RESUMABLE` lists what may change.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.pretraining.options import PretrainOptions
from bertforge.pretraining.prepare import corpus_fingerprint
from bertforge.io.rundir import RunDir, claim_output_dir
from bertforge.training.distributed import broadcast_object

# How long and how it is watched, not what is learned: a resume may change these.
RESUMABLE = ("max_steps", "time_budget", "threads", "log_every", "save_every", "workers", "progress", "device",
             "compile")


def _path(p: Path | str | None) -> str | None:
    return None if p is None else os.path.abspath(p)  # the same run from another working directory is the same


def run_options(opts: PretrainOptions) -> dict[str, Any]:
    """What the run's checkpoints depend on (and, for the record, the RESUMABLE options), by option name."""
    r = opts.recipe
    return {
        # keyed with its dashes so that it sorts (and is checked) first: a changed --recipe changes the
        # recipe fields below as well, and the recipe is what the user changed
        "--recipe": r.name,
        "objective": r.objective, "masking": r.masking, "dynamic": r.dynamic, "input_format": r.input_format,
        "dupe_factor": r.dupe_factor, "mask_prob": r.mask_prob, "schedule": r.schedule,
        "size": opts.size, "seq_len": opts.seq_len, "batch_size": opts.batch_size, "lr": opts.lr,
        "precision": opts.precision, "seed": opts.seed, "vocab_size": opts.vocab_size,
        "corpus": None if opts.corpus is None else [_path(p) for p in opts.corpus], "data": _path(opts.data),
        "text_col": opts.text_col,
        "tokenizer": _path(opts.tokenizer), "init_from": _path(opts.init_from),
        "heldout_fraction": opts.heldout_fraction, "eval_batches": opts.eval_batches,
        **{name: getattr(opts, name) for name in RESUMABLE},
        **({"knowledge": _path(opts.knowledge), "retriever": _path(opts.retriever),
            "refresh_every": opts.refresh_every, "realm_k": opts.realm_k, "projection_dim": opts.projection_dim,
            "ner_model": _path(opts.ner_model)} if r.objective == "realm" else {}),
    }


def files_fingerprint(path: Path) -> list[list]:
    """[name, size, mtime_ns] of a file, or of every file directly in a directory (sorted; not dot files: locks
    and temporaries are not data)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    else:
        files = [path]
    return [[p.name, (st := p.stat()).st_size, st.st_mtime_ns] for p in files if p.exists()]


def data_fingerprint(opts: PretrainOptions, corpus_paths: list[str]) -> dict[str, Any]:
    """Identities of the inputs read from outside OUT: the corpus files, given shards, tokenizer, checkpoint."""
    fp: dict[str, Any] = {}
    if corpus_paths:
        fp["corpus"] = corpus_fingerprint(corpus_paths, opts.text_col)
    for name in ("data", "tokenizer", "init_from"):
        if getattr(opts, name) is not None:
            fp[name] = files_fingerprint(getattr(opts, name))
    return fp


def claim_out(opts: PretrainOptions, corpus_paths: list[str], is_main: bool) -> RunDir | None:
    """Claim OUT on rank 0 (None on the other ranks). A refusal raises the same one line on every rank, so no
    rank waits at a barrier for a rank 0 that has given up."""
    run, failure = None, None
    if is_main:
        try:
            run = claim_output_dir(opts.out, resume=opts.resume, overwrite=opts.overwrite,
                                   options=run_options(opts), fingerprint=data_fingerprint(opts, corpus_paths),
                                   may_change=RESUMABLE, what="--out")
        except Exception as err:  # noqa: BLE001 -- re-raised below, after the other ranks have been told
            failure = err
    message = broadcast_object(None if failure is None else str(failure))
    if failure is not None:
        raise failure
    if message is not None:
        raise BertforgeError(message)
    return run


def run_in_claimed_out(opts: PretrainOptions, corpus_paths: list[str], is_main: bool, work):
    """`work()` with OUT claimed first (`claim_out`: before anything in OUT is read or written) and released after:
    as failed when `work` raises (partial work stays for --resume; an empty new folder goes)."""
    run_dir = claim_out(opts, corpus_paths, is_main)
    try:
        result = work()
    except BaseException:
        if run_dir is not None:
            run_dir.release(failed=True)
        raise
    if run_dir is not None:
        run_dir.release()
    return result
