"""Dense retrievers: `train_retriever` (DPR's question and passage towers, in-batch and hard negatives) and
`export_dpr` (a retriever's towers in transformers' DPR layout). Pretraining one on raw text is
`pretrain(corpus, recipe="ict")` (the Inverse Cloze Task).

    result = bertforge.train_retriever("bert-base-uncased", "nq-train.json", out="runs/dpr", hard_negatives=1)
    q = bertforge.embed(result.out / "question", ["who wrote hamlet?"])      # question vectors
    p = bertforge.embed(result.out / "passage", ["Hamlet. Hamlet is a tragedy by William Shakespeare ..."])
    scores = q @ p.T                                                          # dot products, as trained
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.inputs import device_for, model_name, trackers
from bertforge.api.results import TrainResult
from bertforge.config.arguments import (BOOL, COUNT, COUNT0, DATA, DEVICE, EPOCHS, FRACTION, MODEL, PATH, POSITIVE,
                                        SEED, STEPS, TEXT, check_args, maybe)
from bertforge.errors import ArgumentError


def train_retriever(model: Any, train: Any, *, out: Any, passages: Any = None, separate_encoders: bool = False,
                    hard_negatives: int = 1, pooling: str | None = None, epochs: float = 1.0,
                    max_steps: int | None = None, batch_size: int = 16, lr: float = 2e-5, warmup_ratio: float = 0.1,
                    seed: int = 0, data_split: str | None = None, data_config: str | None = None,
                    device: str = "auto", precision: str = "fp32", compile: bool | None = None,
                    progress: bool = True, report_to: Any = None, logging_dir: Any = None, resume: bool = False,
                    overwrite: bool = False, save_every: int | None = None,
                    revision: str | None = None) -> TrainResult:
    """Train a dense retriever (Karpukhin et al. 2020) and save it to `out` as a retriever folder: question/ and
    passage/ (sentence-transformers folders), transformers/question_encoder and transformers/ctx_encoder
    (transformers' DPR layout, for BERT towers read at [CLS]) and retriever.json (docs/retrieval.md).

    `model`: an encoder folder or Hub id (BERT, a sentence-transformers folder, a DPR checkpoint) or a retriever
    folder (`pretrain(recipe="ict")`'s, or an earlier run's); one tower for questions and passages, or two
    (`separate_encoders`, each starting from `model`). `train`: rows {question, positive, negatives?, answers?}
    (a positive or negative may be a passage id of `passages`), DPR's json, or SQuAD v1.1. `hard_negatives`: per
    question and batch (the row's own negatives first, then BM25's best passages that are neither the positive nor
    hold an answer, searched in `passages` or else the training passages; 0: in-batch negatives only).
    `pooling`: cls (DPR's, the default) or mean."""
    from bertforge.io.rundir import claim_output_dir
    from bertforge.io.tables import single_source, source_name
    from bertforge.retrieval.dpr import mine_hard_negatives, read_training
    from bertforge.retrieval.passages import read_passages, with_title
    from bertforge.retrieval.towers import HF_DIR, is_retriever, load_towers
    from bertforge.retrieval.train import fit

    check_args(locals(), model=MODEL, train=DATA, out=PATH, passages=maybe(DATA), separate_encoders=BOOL,
               hard_negatives=COUNT0, pooling=maybe(TEXT), epochs=EPOCHS, max_steps=maybe(STEPS), batch_size=COUNT,
               lr=POSITIVE, warmup_ratio=FRACTION, seed=SEED, data_split=maybe(TEXT), data_config=maybe(TEXT),
               device=DEVICE, precision=TEXT, compile=maybe(BOOL), progress=BOOL, resume=BOOL, overwrite=BOOL,
               save_every=maybe(COUNT), revision=maybe(TEXT))
    tracked = trackers(report_to, logging_dir)
    device_for(device, precision, ("fp32", "bf16"))
    name = str(model) if is_retriever(model) else model_name(model, revision, "model=")
    options = {"model": name, "train": source_name(train),
               "passages": None if passages is None else source_name(passages),
               "separate_encoders": separate_encoders, "hard_negatives": hard_negatives, "pooling": pooling,
               "batch_size": batch_size, "lr": lr, "seed": seed, "precision": precision,
               "epochs": epochs, "max_steps": max_steps}
    with claim_output_dir(out, resume=resume, overwrite=overwrite, options=options,
                          may_change=("epochs", "max_steps"), what="--out"):
        corpus = read_passages(passages) if passages is not None else None
        examples = read_training(single_source(train, data_split or "train", data_config), corpus,
                                 config=data_config)
        search_in = None if corpus is None else [with_title(t, x) for t, x in zip(corpus.titles, corpus.texts)]
        mine_hard_negatives(examples, hard_negatives, search_in)
        towers = load_towers(name, separate=separate_encoders, pooling=pooling, revision=revision)
        history, trainer = fit(towers, examples, out, hard_negatives=hard_negatives, epochs=epochs,
                               max_steps=max_steps, batch_size=batch_size, lr=lr, warmup_ratio=warmup_ratio,
                               seed=seed, progress=progress, device=device, precision=precision, compile=compile,
                               resume=resume, save_every=save_every, **tracked)
    train_lines = [h for h in history if "loss" in h and h.get("split") != "eval"]
    out = Path(out)
    record = {"out": str(out), "examples": len(examples), "shared": towers.shared,
              "pooling": towers.question.pooling.modes[0] if towers.question.pooling else None,
              "hard_negatives": hard_negatives,
              "with_hard_negatives": sum(1 for ex in examples if ex.negatives[:hard_negatives]),
              "steps": trainer.step, "segments": trainer.segments,
              "transformers": str(out / HF_DIR) if (out / HF_DIR).is_dir() else None}
    if train_lines:
        record.update(first_loss=train_lines[0]["loss"], last_loss=train_lines[-1]["loss"])
    return TrainResult(out, {}, history, record)


def export_dpr(model: Any, out: Any, *, overwrite: bool = False) -> dict[str, Path]:
    """A retriever folder's towers as transformers' DPRQuestionEncoder (OUT/question_encoder) and DPRContextEncoder
    (OUT/ctx_encoder) folders, which `from_pretrained` loads unchanged and which give the towers' vectors as
    `pooler_output`. Returns {"question_encoder": path, "ctx_encoder": path}."""
    from bertforge.io.rundir import claim_output_dir
    from bertforge.retrieval.towers import export_dpr as export, is_retriever

    check_args(locals(), model=PATH, out=PATH, overwrite=BOOL)
    if not is_retriever(model):
        raise ArgumentError.about("model", model, "not a retriever folder (no retriever.json; `bertforge retriever "
                                  "train` and `pretrain --recipe ict` write one)")
    with claim_output_dir(out, resume=False, overwrite=overwrite, what="--out", resume_flag=None):
        return export(model, out)
