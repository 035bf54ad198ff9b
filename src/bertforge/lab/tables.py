"""The ablation tables of the BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT and DeBERTa-v3 papers: which arms each paper
compared, the claims it drew, and its own numbers.

An arm is a pretraining configuration from `bertforge.pretraining.ablation.ARMS` (one registry for `ablate --arms`
and for the tables); a table names the arms a paper's table compared, with the paper's labels, plus the control
(`CONTROL`: no pretraining at all). A claim compares two
arms on some downstream tasks ("a" expected better than "b", or, with `tolerance`, the two within that many points).
Paper numbers are the papers' development-set scores at BERT-base scale, shown beside ours for direction only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bertforge.errors import BertforgeError

# The fixed downstream suite: task -> (folder under the data root, training examples used, dev examples used).
# Slices keep a table affordable on a CPU; dev sets are the GLUE/CoNLL development files (test labels are private).
SUITE: dict[str, tuple[str, int | None, int | None]] = {
    "sst2": ("glue/SST-2", 2000, None),
    "mrpc": ("glue/MRPC", 2000, None),
    "rte": ("glue/RTE", None, None),
    "stsb": ("glue/STS-B", 2000, None),
    "conll": ("conll2003", 2000, 1000),
    "squad": ("squad", 1500, 500),  # one dev file, split by article (no train file is shipped)
}
DEFAULT_TASKS = ("sst2", "mrpc", "rte", "stsb", "conll")
# The control every table carries (not in the papers): the same encoder, randomly initialised and fine-tuned with
# the same recipe. Without it a table cannot tell a pretraining effect from what fine-tuning alone reaches.
CONTROL = "untrained"
CONTROL_LABEL = "no pretraining (control)"
CONTROL_DESCRIBE = "the bert encoder at random initialisation, fine-tuned like every arm"
PAIR_TASKS = ("mrpc", "rte", "stsb")
RETRIEVAL = "retrieval"  # a table whose arms and scores are retrieval-augmented against closed-book (lab.realm_table)
# its scores: held-out salient-span MLM accuracy, cloze EM (the answer masked after the question), generators' EM
RETRIEVAL_TASKS = ("heldout_mlm", "cloze_em", "open_qa_em")
RETRIEVAL_ARMS = {"realm": "REALM: salient-span MLM reading retrieved documents",
                  "realm-closed": "the same reader, masks and steps, reading the null document only (closed book)",
                  "rag": "RAG-Token: a generator reading the top k passages of a dense index",
                  "rag-closed": "the same generator, pairs and steps, reading the question alone (closed book)"}  # sentence-pair inputs: where a sentence-level objective could help


@dataclass(frozen=True)
class Claim:
    text: str
    a: str                          # the arm the paper found better (or: one side of a "costs little" claim)
    b: str
    tasks: tuple[str, ...] | None = None  # None: every task of the suite
    tolerance: float | None = None  # "a within `tolerance` points of b" instead of "a > b"
    paper: str = ""                 # what the paper reported, in a few words


@dataclass(frozen=True)
class Table:
    name: str
    source: str                     # the paper and table
    arms: dict[str, str]            # arm -> the paper's label for it
    claims: tuple[Claim, ...]
    paper: dict[str, dict[str, float]] = field(default_factory=dict)  # arm -> {paper's task: score}
    tasks: tuple[str, ...] = DEFAULT_TASKS
    cross_relation: bool = False    # also score every sentence head on NSP and on SOP (ALBERT's Table 5)
    flops_matched: dict[str, str] = field(default_factory=dict)  # arm -> the arm whose training FLOPs it gets
    kind: str = "pretrain"          # "pretrain": arms pretrained then fine-tuned on SUITE; RETRIEVAL: lab.realm_table


def transfers(arm: str) -> Claim:
    """The sanity claim every table starts with: its baseline arm beats no pretraining at all. Until it holds, the
    budget is too small for the table's real claims to mean anything."""
    return Claim("pretraining transfers at all (control, not in the paper)", arm, CONTROL,
                 paper="taken for granted")


TABLES: dict[str, Table] = {
    "bert": Table(
        "bert", "Devlin et al. 2019, Table 5 (BERT-base, dev)",
        {"nsp": "MLM + NSP (BERT)", "no-nsp": "No NSP", "ltr": "LTR & No NSP", CONTROL: CONTROL_LABEL},
        (transfers("nsp"),
         Claim("NSP helps sentence-pair tasks", "nsp", "no-nsp", PAIR_TASKS,
               paper="QNLI 88.4 vs 84.9, MNLI 84.4 vs 83.9"),
         Claim("a left-to-right LM is much worse than MLM", "no-nsp", "ltr",
               paper="MRPC 86.5 vs 77.5, SQuAD 87.9 vs 77.8")),
        paper={"nsp": {"MNLI": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7, "SQuAD": 88.5},
               "no-nsp": {"MNLI": 83.9, "QNLI": 84.9, "MRPC": 86.5, "SST-2": 92.6, "SQuAD": 87.9},
               "ltr": {"MNLI": 82.1, "QNLI": 84.3, "MRPC": 77.5, "SST-2": 92.1, "SQuAD": 77.8}}),
    "roberta": Table(
        "roberta", "Liu et al. 2019, Tables 1 and 2 (BERT-base, dev)",
        {"nsp": "static, SEGMENT-PAIR + NSP", "nsp-dynamic": "dynamic, SEGMENT-PAIR + NSP",
         "sentence-pair": "SENTENCE-PAIR + NSP", "dynamic": "FULL-SENTENCES", "doc-sentences": "DOC-SENTENCES",
         "modern": "the modern recipe (extra arm, not in the paper)", CONTROL: CONTROL_LABEL},
        (transfers("nsp-dynamic"),
         Claim("dynamic masking >= static", "nsp-dynamic", "nsp", paper="SQuAD 2.0 78.7 vs 78.3, SST-2 92.9 vs 92.5"),
         Claim("single sentences hurt: SEGMENT-PAIR > SENTENCE-PAIR", "nsp-dynamic", "sentence-pair",
               paper="MNLI 84.0 vs 82.9"),
         Claim("FULL-SENTENCES without NSP >= SEGMENT-PAIR with NSP", "dynamic", "nsp-dynamic",
               paper="MNLI 84.7 vs 84.0"),
         Claim("DOC-SENTENCES >= FULL-SENTENCES", "doc-sentences", "dynamic", paper="SQuAD 2.0 79.7 vs 79.1")),
        paper={"nsp": {"SQuAD 2.0": 78.3, "MNLI": 84.3, "SST-2": 92.5},
               "nsp-dynamic": {"SQuAD 2.0": 78.7, "MNLI": 84.0, "SST-2": 92.9},
               "sentence-pair": {"SQuAD 2.0": 76.2, "MNLI": 82.9, "SST-2": 92.1},
               "dynamic": {"SQuAD 2.0": 79.1, "MNLI": 84.7, "SST-2": 92.5},
               "doc-sentences": {"SQuAD 2.0": 79.7, "MNLI": 84.7, "SST-2": 92.7}}),
    "albert": Table(
        "albert", "Lan et al. 2020, Tables 4 and 5 (ALBERT-base, dev)",
        {"no-nsp": "none", "nsp": "NSP", "sop": "SOP", "albert": "ALBERT, all layers shared (E=128, SOP)",
         "albert-unshared": "ALBERT, not shared", CONTROL: CONTROL_LABEL},
        (transfers("sop"),
         Claim("SOP >= NSP downstream", "sop", "nsp", paper="average 80.1 vs 79.2"),
         Claim("sharing costs little (within 2.5 points)", "albert", "albert-unshared", tolerance=2.5,
               paper="average 80.1 vs 82.3 at E=128 (12M vs 89M parameters)")),
        paper={"no-nsp": {"SST-2": 89.9, "MNLI": 81.5, "NSP acc": 52.4, "SOP acc": 53.3},
               "nsp": {"SST-2": 91.1, "MNLI": 81.6, "NSP acc": 90.5, "SOP acc": 52.0},
               "sop": {"SST-2": 90.3, "MNLI": 82.0, "NSP acc": 78.9, "SOP acc": 86.5}},
        cross_relation=True),
    "electra": Table(
        "electra", "Clark et al. 2020, Table 1 (ELECTRA-Small vs BERT-Small, GLUE dev)",
        {"dynamic": "MLM (BERT)", "electra": "replaced-token detection, equal wall clock",
         "electra-flops": "replaced-token detection, equal FLOPs", CONTROL: CONTROL_LABEL},
        (transfers("dynamic"),
         Claim("RTD beats MLM at equal wall clock", "electra", "dynamic", paper="GLUE 79.9 vs 75.1"),
         Claim("RTD beats MLM at equal FLOPs", "electra-flops", "dynamic", paper="GLUE 79.9 vs 75.1 (1.4e18 FLOPs)")),
        paper={"dynamic": {"GLUE": 75.1}, "electra": {"GLUE": 79.9}},
        flops_matched={"electra-flops": "dynamic"}),
    "spanbert": Table(
        "spanbert", "Joshi et al. 2020, Tables 5 and 6 (masking schemes; span-boundary objective)",
        {"dynamic": "random subword tokens", "whole-word": "whole words", "span": "geometric spans",
         "span+sbo": "geometric spans + SBO", CONTROL: CONTROL_LABEL},
        (transfers("dynamic"),
         Claim("spans beat random tokens", "span", "dynamic", paper="SQuAD 2.0 85.4 vs 83.8"),
         Claim("whole words >= random tokens", "whole-word", "dynamic", paper="SQuAD 2.0 84.3 vs 83.8"),
         Claim("the span-boundary objective helps", "span+sbo", "span", paper="small gains on QA and coreference")),
        paper={"dynamic": {"SQuAD 2.0": 83.8}, "whole-word": {"SQuAD 2.0": 84.3}, "span": {"SQuAD 2.0": 85.4}},
        tasks=DEFAULT_TASKS + ("squad",)),
    # Equal compute: the three arms cost the same per step, and the two sharing arms get the steps that the
    # no-sharing arm's FLOPs pay for, whatever the machine's load did to its wall clock.
    "deberta-v3": Table(
        "deberta-v3", "He et al. 2023, Table 2 (embedding sharing in replaced-token detection; MNLI, SQuAD 2.0 dev)",
        {"rtd-no-sharing": "NES (no embedding sharing)", "rtd-shared": "ES (embedding sharing)",
         "rtd-gdes": "GDES (gradient-disentangled embedding sharing)", CONTROL: CONTROL_LABEL},
        (transfers("rtd-shared"),
         Claim("gradient-disentangled sharing beats plain sharing", "rtd-gdes", "rtd-shared",
               paper="GDES above ES on MNLI and SQuAD 2.0"),
         Claim("gradient-disentangled sharing beats no sharing", "rtd-gdes", "rtd-no-sharing",
               paper="GDES above NES on MNLI and SQuAD 2.0")),
        flops_matched={"rtd-shared": "rtd-no-sharing", "rtd-gdes": "rtd-no-sharing"}),
    # Retrieval against closed book at equal steps and examples: REALM against the same encoder pretrained with the
    # same salient-span masking without retrieval; RAG against the same generator fine-tuned without passages.
    "realm": Table(
        "realm", "Guu et al. 2020, Table 1 (REALM) and Lewis et al. 2020, Table 1 (RAG): retrieval vs closed book",
        {"realm": "REALM", "realm-closed": "closed book (same encoder, no retrieval)",
         "rag": "RAG-Token", "rag-closed": "closed book (same generator, no passages)"},
        (Claim("REALM predicts held-out salient spans better than closed-book MLM", "realm", "realm-closed",
               ("heldout_mlm",), paper="not reported (REALM's pretraining is judged by open QA)"),
         Claim("REALM answers open questions better than closed-book MLM (cloze EM)", "realm", "realm-closed",
               ("cloze_em",), paper="NQ EM 39.2 (REALM, Wikipedia) / 40.4 (CC-News) vs 34.5 (T5-11B closed book)"),
         Claim("RAG answers open questions better than the closed-book generator (EM)", "rag", "rag-closed",
               ("open_qa_em",), paper="NQ EM 44.1 (RAG-Token) / 44.5 (RAG-Seq) vs 26.5 (BART-large closed book)")),
        paper={"realm": {"NQ EM": 40.4}, "rag": {"NQ EM": 44.1},
               "T5-11B closed book": {"NQ EM": 34.5}, "BART-large closed book": {"NQ EM": 26.5}},
        tasks=RETRIEVAL_TASKS, kind=RETRIEVAL),
}


def tables_named(names: list[str]) -> list[Table]:
    """The tables for --table (several allowed; "all" is every table), unknown names refused in one line."""
    if "all" in names:
        return list(TABLES.values())
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise BertforgeError(f"--table: unknown {', '.join(unknown)} (choose from {', '.join(TABLES)}, all)")
    return [TABLES[n] for n in dict.fromkeys(names)]


def tasks_of(table: Table, override: list[str] | None) -> list[str]:
    """The downstream tasks a table is scored on: its suite, or --tasks (a retrieval table has its own scores)."""
    return list(override) if override and table.kind != RETRIEVAL else list(table.tasks)


def listing() -> str:
    """What `bertforge ablate --list` prints: every table with its arms and claims."""
    from bertforge.pretraining.ablation import ARMS
    lines = []
    for t in TABLES.values():
        lines.append(f"{t.name}: {t.source}; tasks {', '.join(t.tasks)}")
        for arm, label in t.arms.items():
            describe = (CONTROL_DESCRIBE if arm == CONTROL else RETRIEVAL_ARMS[arm] if t.kind == RETRIEVAL
                        else ARMS[arm]["describe"])
            lines.append(f"  {arm:<16} {label}  [{describe}]")
        for c in t.claims:
            lines.append(f"  claim: {c.text} ({c.a} vs {c.b})")
    lines.append("arms on their own (--arms, held-out MLM accuracy only): " + ", ".join(ARMS))
    return "\n".join(lines)
