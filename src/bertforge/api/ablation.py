"""`ablate`: pretraining arms compared at equal compute, either a paper's ablation table re-run with a verdict per
claim (the lab: pretrain every arm, fine-tune each on a downstream suite, over seeds), or a chosen set of arms
compared by held-out MLM accuracy.

    bertforge.ablate(table=["bert"], downstream="data", budget="2m", seeds=2)["tables"]["bert"]["claims"]
    bertforge.ablate(["corpus.txt"], arms=["nsp", "sop"], budget="1m", out="runs/abl")["rows"]

`api.choices.ablation_listing()` lists the tables and arms (`bertforge ablate --list`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.api.inputs import device_for, trackers
from bertforge.config.arguments import (BOOL, COUNT, DATA, DEVICE, EPOCHS, LENGTH, PATH, SEED, STEPS, TEXT, TEXTS,
                                        check_args, maybe)
from bertforge.errors import BertforgeError

ARMS_OUT = Path("runs") / "ablation"           # out's default when comparing arms
TABLES_OUT = Path("runs") / "ablation-tables"  # ... and when re-running tables


def ablate(corpus: Any = None, *, out: Any = None, table: Any = None, arms: Any = None, size: str = "bert-mini",
           seq_len: int = 128, batch_size: int = 32, budget: str = "2m", vocab_size: int | None = None,
           steps: int | None = None, seeds: int = 2, downstream: Any = None, tasks: Any = None,
           finetune_epochs: float = 3.0, train_limit: int | None = None, threads: int | None = None,
           precision: str | None = None, device: str = "auto", seed: int = 0, report_to: Any = None,
           overwrite: bool = False, retriever: Any = None) -> dict[str, Any]:
    """Pretrain arms for the same `budget` (wall clock per arm, e.g. "2m") and compare them.

    With `table` (a name or a list: bert, roberta, albert, electra, spanbert, deberta-v3, realm, all): re-run those
    papers' ablation tables: every arm of a table pretrained (`steps` per arm instead of the budget, if given), fine-tuned on
    the table's suite (or `tasks`) read from `downstream` (a folder with glue/SST-2, glue/MRPC, glue/RTE,
    glue/STS-B, conll2003, squad) for `finetune_epochs` on `train_limit` examples, over `seeds` seeds; written to
    `out` (default: runs/ablation-tables) as TABLE.md / .json / .png, continued when called again (unless
    `overwrite`); `retriever`: the sentence encoder that indexes the realm table's knowledge corpus for its
    RAG arms (default: each seed's REALM retriever). Returns {"out": the folder, "tables": {name: its report, with
    "claims" and their verdicts}}.

    Without: each of `arms` (default: all) pretrained on `corpus` (files; None: the Python standard library's
    documentation) and compared by held-out MLM accuracy in `out` (default: runs/ablation; ablation.md, .json,
    .png), each arm's run reported to the `report_to` trackers. Returns {"out": the folder, "rows": a row per arm}.
    """
    check_args(locals(), corpus=maybe(DATA), out=maybe(PATH), table=maybe(TEXTS), arms=maybe(TEXTS), size=TEXT,
               seq_len=LENGTH, batch_size=COUNT, budget=TEXT, vocab_size=maybe(COUNT), steps=maybe(STEPS),
               seeds=COUNT, downstream=maybe(PATH), tasks=maybe(TEXTS), finetune_epochs=EPOCHS,
               train_limit=maybe(COUNT), threads=maybe(COUNT), precision=maybe(TEXT), device=DEVICE, seed=SEED,
               overwrite=BOOL, retriever=maybe(PATH))
    tables, chosen_arms = _names(table), _names(arms)
    corpus = [str(corpus)] if isinstance(corpus, (str, Path)) else [str(c) for c in corpus] if corpus else None
    tracked = trackers(report_to)["report_to"]
    if tables:
        if tracked:
            raise BertforgeError("report_to: with arms (or no table) only; a table run reports in TABLE.md")
        if chosen_arms:
            raise BertforgeError("arms and table: a table fixes its arms; give one of them")
        if downstream is None:
            raise BertforgeError("downstream: give the folder of the tables' downstream data (glue/SST-2, glue/MRPC, "
                                 "glue/RTE, glue/STS-B, conll2003, squad)")
    device_for(device, precision)  # a device that is not there: one line before the arms' tokenizer and data
    if tables:
        from bertforge.lab.run import LabOptions, run_lab

        where = Path(out) if out is not None else TABLES_OUT
        reports = run_lab(LabOptions(
            tables=tables, out=where, data_root=Path(downstream), corpus=corpus, budget=budget, steps=steps,
            seeds=seeds, size=size, seq_len=seq_len, batch_size=batch_size, vocab_size=vocab_size,
            precision=precision, device=device, threads=threads, tasks=_names(tasks),
            finetune_epochs=finetune_epochs, train_limit=train_limit, overwrite=overwrite,
            retriever=None if retriever is None else str(retriever)))
        return {"out": where, "tables": reports}
    from bertforge.pretraining.ablation import run_ablation

    where = Path(out) if out is not None else ARMS_OUT
    result = run_ablation(corpus=corpus, out=where, arms=chosen_arms, size=size, seq_len=seq_len,
                          batch_size=batch_size, budget=budget, vocab_size=vocab_size, precision=precision, seed=seed,
                          report_to=tracked, device=device)
    return {"out": where, **result}


def _names(given: Any) -> list[str] | None:
    """One name or several as a list (None: none given)."""
    return [given] if isinstance(given, str) else [str(n) for n in given] if given else None
