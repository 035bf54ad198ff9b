"""`bertforge ablate`: pretraining design choices compared at equal wall-clock on one corpus.

Every arm shares one WordPiece tokenizer and one set of shards, trains for the same time budget, and is scored on
the same held-out task: token-level MLM (15%, static masks, fixed seed) over full-sentence sequences of held-out
documents, so the numbers are comparable across objectives, masking rates, input formats and families. (ELECTRA's
MLM number is its small generator's; its discriminator is scored by RTD accuracy. XLNet predicts each masked
position from its query stream, seeing every other position and none of the masked ones: the MLM task, without
reading the [MASK], random or kept token there.) Writes ablation.json, ablation.md, ablation.png. `prepare_shared` +
`run_arm` are the pieces, for scripts that run arms one at a time.
"""
from __future__ import annotations

import json
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from bertforge.data import ShardedCorpus
from bertforge.errors import BertforgeError
from bertforge.io.write import atomic_write, atomic_write_text
from bertforge.pretraining.inputs import heldout_batches
from bertforge.pretraining.metrics import mlm_metrics, most_frequent_token
from bertforge.pretraining.recipes import LEFT_TO_RIGHT
from bertforge.pretraining.options import PretrainOptions
from bertforge.device import default_precision
from bertforge.pretraining.prepare import prepare_data, prepare_tokenizer
from bertforge.pretraining.recipes import DEFAULT as DEFAULT_RECIPE
from bertforge.pretraining.recipes import resolve
from bertforge.pretraining.run import pretrain

BASE = DEFAULT_RECIPE  # the recipe (BERT's) that most arms change one knob of
# name -> (recipe, overrides, description). Pairs to read: nsp/sop/sso/no-nsp; static/dynamic; dynamic/electra;
# dynamic (token) / span / span+sbo; dynamic/wso; nsp/structbert; dynamic/xlnet.
ARMS: dict[str, dict[str, Any]] = {
    "nsp": dict(recipe=BASE, over={}, describe="MLM + NSP, segment pairs, static masks (BERT)"),
    "sop": dict(recipe=BASE, over=dict(objective="mlm+sop"), describe="MLM + SOP, segment pairs, static masks"),
    "no-nsp": dict(recipe=BASE, over=dict(objective="mlm"), describe="MLM only, segment pairs, static masks"),
    "static": dict(recipe=BASE, over=dict(objective="mlm", input_format="full-sentences", dynamic=False),
                   describe="MLM, full sentences, static masks (x5)"),
    "dynamic": dict(recipe=BASE, over=dict(objective="mlm", input_format="full-sentences", dynamic=True),
                    describe="MLM, full sentences, dynamic masks (RoBERTa-style, WordPiece)"),
    "span": dict(recipe=BASE, over=dict(objective="mlm", input_format="full-sentences", dynamic=True,
                                          masking="span"), describe="MLM with span masking, dynamic"),
    "span+sbo": dict(recipe="spanbert", over={}, describe="span masking + span-boundary objective (SpanBERT)"),
    "electra": dict(recipe="electra", over={}, describe="replaced-token detection, 1/4-size generator"),
    "electra-flops": dict(recipe="electra", over={},
                          describe="replaced-token detection, trained for the FLOPs of another arm (a table's)"),
    # BERT's Table 5 and RoBERTa's Tables 1-2 (the input formats), SpanBERT's masking units, ALBERT's sharing.
    "ltr": dict(recipe=BASE, over=dict(objective="ltr", input_format="full-sentences"),
                describe="left-to-right LM on the same encoder, left-only attention (BERT's LTR & No NSP)"),
    "nsp-dynamic": dict(recipe=BASE, over=dict(dynamic=True), describe="MLM + NSP, segment pairs, dynamic masks"),
    "sentence-pair": dict(recipe=BASE, over=dict(input_format="sentence-pair", dynamic=True),
                          describe="MLM + NSP, single-sentence pairs, dynamic masks"),
    "doc-sentences": dict(recipe=BASE, over=dict(objective="mlm", input_format="doc-sentences", dynamic=True),
                          describe="MLM, sentences from one document per row, dynamic masks"),
    "whole-word": dict(recipe=BASE, over=dict(objective="mlm", input_format="full-sentences", dynamic=True,
                                                masking="whole_word"), describe="MLM with whole-word masking, dynamic"),
    "albert": dict(recipe="albert", over={}, describe="the ALBERT recipe: MLM + SOP, E=128, all layers shared"),
    "albert-unshared": dict(recipe="albert", over=dict(share_layers="none"),
                            describe="ALBERT with no cross-layer sharing"),
    # StructBERT (Wang et al. 2020): each structural objective alone, then both (its recipe).
    "sso": dict(recipe=BASE, over=dict(objective="mlm+sso"),
                describe="MLM + sentence structure (next / previous / random), segment pairs, static masks"),
    "wso": dict(recipe=BASE, over=dict(objective="mlm+wso", input_format="full-sentences", dynamic=True),
                describe="MLM + word structure (5% of trigrams shuffled), full sentences, dynamic"),
    "structbert": dict(recipe="structbert", over={},
                       describe="MLM + WSO + SSO, segment pairs, static masks (StructBERT)"),
    "xlnet": dict(recipe="xlnet", over={},
                  describe="permutation LM, two-stream relative attention, last 1/6 predicted (XLNet)"),
    "roberta": dict(recipe="roberta", over={}, describe="the RoBERTa recipe: MLM, dynamic masks, full sentences"),
    "modern": dict(recipe="modern", over={},
                   describe="the ModernBERT recipe: modernbert family, MLM 30%, packed rows, WSD schedule"),
    "modern-mask15": dict(recipe="modern", over=dict(mask_prob=0.15), describe="modern with 15% masking"),
    "modern-linear": dict(recipe="modern", over=dict(schedule="linear"),
                          describe="modern with warm-up + linear decay"),
    # DeBERTa-v3 (He et al. 2023): replaced-token detection on a DeBERTa encoder, three ways of sharing embeddings.
    "rtd-no-sharing": dict(recipe="deberta-v3", over=dict(embedding_sharing="none"),
                           describe="DeBERTa RTD, generator and discriminator embeddings apart (NES)"),
    "rtd-shared": dict(recipe="deberta-v3", over=dict(embedding_sharing="shared"),
                       describe="DeBERTa RTD, one embedding module for both (ES, ELECTRA's sharing)"),
    "rtd-gdes": dict(recipe="deberta-v3", over={},
                     describe="DeBERTa RTD, gradient-disentangled sharing: sg(E_G) + E_delta (GDES, DeBERTa-v3)"),
}

# each arm's own task
OWN_TASKS = ("nsp_acc", "sop_acc", "sso_acc", "wso_acc", "sbo_acc", "rtd_acc", "plm_acc", "lm_acc")


@dataclass
class Shared:
    """What every arm shares: the tokenizer and shards, and the common held-out task."""

    out: Path
    corpus: list[str]
    data_dir: Path
    heldout_fraction: float | None
    batches: list[dict]
    most_frequent: int


def prepare_shared(corpus: list[str] | None, out: Path, seq_len: int = 128, batch_size: int = 32,
                   vocab_size: int | None = None) -> Shared:
    """One WordPiece tokenizer and one set of shards for every arm, and the held-out batches they are scored on."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        from bertforge.pretraining.default_corpus import default_corpus
        corpus = [str(default_corpus())]
    base = PretrainOptions(recipe=resolve(BASE), out=out, corpus=corpus, vocab_size=vocab_size or 8192,
                           seq_len=seq_len)
    tok = prepare_tokenizer(base, corpus, is_main=True)
    data_dir = prepare_data(base, corpus, tok, is_main=True)
    held = ShardedCorpus(data_dir, split="heldout", heldout_fraction=base.heldout_fraction)
    common_recipe = resolve(BASE, objective="mlm", input_format="full-sentences")
    batches = heldout_batches(held, common_recipe, seq_len, batch_size, n_batches=20)
    most_frequent = most_frequent_token(held)  # counted over every shard: train + held-out
    return Shared(out, corpus, data_dir, base.heldout_fraction, batches, most_frequent)


def run_arm(name: str, shared: Shared, size: str = "bert-mini", seq_len: int = 128, batch_size: int = 32,
            budget: str | None = "2m", precision: str | None = None, seed: int = 0, max_steps: int | None = None,
            lr: float | None = None, threads: int | None = None, out_name: str | None = None,
            extra_eval: Callable[[nn.Module], dict[str, float]] | None = None,
            report_to: tuple[str, ...] = (), device: str = "auto") -> dict[str, Any]:
    """Train arm `name` for `budget` (or `max_steps`, whichever ends first) into OUT/arms/NAME (or OUT/arms/
    `out_name`) and return its row of the table. `lr` None: the recipe's default for the size. `extra_eval`: more
    metrics of the final model, merged into the common held-out ones (a left-to-right arm has only these: it
    cannot fill a [MASK])."""
    if name not in ARMS:
        raise BertforgeError(f"--arms: unknown {name} (choose from {', '.join(ARMS)})")
    precision = precision or default_precision(device)
    arm = ARMS[name]
    recipe = resolve(arm["recipe"], **arm["over"])
    print(f"\n=== arm {name}: {arm['describe']} ({budget or f'{max_steps} steps'}) ===", flush=True)
    opts = PretrainOptions(recipe=recipe, out=shared.out / "arms" / (out_name or name), data=shared.data_dir,
                           tokenizer=shared.out / "tokenizer", size=size, seq_len=seq_len, batch_size=batch_size,
                           time_budget=budget, max_steps=max_steps, lr=lr, threads=threads,
                           precision=precision, seed=seed, device=device,
                           heldout_fraction=shared.heldout_fraction, progress=False, log_every=25,
                           fill_mask_examples=0, overwrite=True, report_to=report_to,
                           extra_eval=lambda m: {**({} if recipe.objective in LEFT_TO_RIGHT else
                                                    mlm_metrics(m, shared.batches, shared.most_frequent,
                                                                precision=precision)),
                                                 **(extra_eval(m) if extra_eval else {})})
    res = pretrain(opts)
    own, common = res["heldout"], res["common"]
    return {"arm": name, "describe": arm["describe"], "recipe": recipe.name, "family": recipe.model_type,
            "objective": recipe.objective, "masking": recipe.masking, "mask_prob": recipe.mask_prob,
            "masks": "dynamic" if recipe.dynamic else f"static x{recipe.dupe_factor}",
            "input_format": recipe.input_format, "schedule": recipe.schedule, "lr": res["lr"],
            "parameters": res["parameters"], "steps": res["steps"],
            "tokens_seen": res["tokens_seen"],  # counted, not estimated
            "train_seconds": res["seconds"]["train"], "heldout_mlm_acc": common.get("mlm_acc"),
            "heldout_mlm_loss": common.get("mlm_loss"), "baseline_acc": common.get("baseline_acc"),
            "own_heldout_mlm_acc": own.get("mlm_acc"), "common": common,
            **{k: own[k] for k in OWN_TASKS if k in own}}


def run_ablation(corpus: list[str] | None, out: Path, arms: list[str] | None = None, size: str = "bert-mini",
                 seq_len: int = 128, batch_size: int = 32, budget: str = "2m", vocab_size: int | None = None,
                 precision: str | None = None, seed: int = 0, report_to: tuple[str, ...] = (),
                 device: str = "auto") -> dict[str, Any]:
    names = arms or list(ARMS)
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise BertforgeError(f"--arms: unknown {', '.join(unknown)} (choose from {', '.join(ARMS)})")
    precision = precision or default_precision(device)
    shared = prepare_shared(corpus, out, seq_len, batch_size, vocab_size)
    rows = []
    for name in names:
        rows.append(run_arm(name, shared, size, seq_len, batch_size, budget, precision, seed, report_to=report_to,
                            device=device))
        _write(shared.out, rows, dict(size=size, seq_len=seq_len, batch_size=batch_size, budget=budget,
                                      precision=precision, corpus=[str(c) for c in shared.corpus], seed=seed))
    return {"rows": rows}


def table_cell(value: float | None, spec: str) -> str:
    """A table cell: "-" where an arm has no such number (a left-to-right arm fills no [MASK])."""
    return "-" if value is None else format(value, spec)


def _write(out: Path, rows: list[dict], setup: dict) -> None:
    """ablation.json, ablation.md and ablation.png (rewritten after every arm, so a partial run leaves results)."""
    atomic_write_text(out / "ablation.json", json.dumps({"setup": setup, "rows": rows}, indent=2) + "\n")
    lines = [f"Held-out MLM accuracy at equal wall-clock ({setup['budget']} per arm, {setup['size']}, seq "
             f"{setup['seq_len']}, batch {setup['batch_size']}, {setup['precision']}); same held-out task for "
             f"every arm (token masking, full sentences).", "",
             "| arm | family | objective | masking | masks | input | schedule | lr | steps | held-out MLM acc | "
             "MLM loss | baseline | own task |", "|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        own = ", ".join(f"{k.replace('_acc', '').upper()} {r[k]:.3f}" for k in OWN_TASKS if k in r)
        lines.append(f"| {r['arm']} | {r['family']} | {r['objective']} | {r['masking']} {r['mask_prob']:.0%} | "
                     f"{r['masks']} | {r['input_format']} | {r['schedule']} | {r['lr']:g} | {r['steps']} | "
                     f"{table_cell(r['heldout_mlm_acc'], '.3f')} | {table_cell(r['heldout_mlm_loss'], '.2f')} | "
                     f"{table_cell(r['baseline_acc'], '.3f')} | "
                     f"{own or '-'} |")
    atomic_write_text(out / "ablation.md", "\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(1.1 * len(rows) + 2, 3.5))
    ax.bar([r["arm"] for r in rows], [r["heldout_mlm_acc"] or 0.0 for r in rows], color="#4a7ab5")
    ax.axhline(max(r["baseline_acc"] or 0.0 for r in rows), color="grey", ls="--", lw=1,
               label="most-frequent-token baseline")
    ax.set_ylabel("held-out MLM accuracy")
    ax.set_title(f"equal wall-clock ({setup['budget']} per arm, {setup['size']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    atomic_write(out / "ablation.png", lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
