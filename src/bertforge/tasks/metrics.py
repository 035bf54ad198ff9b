"""Evaluation metrics with their official definitions.

GLUE: accuracy, binary F1 (positive class 1), Matthews correlation (CoLA), Pearson / Spearman (STS-B), all
through scikit-learn / scipy. NER: entity-level precision / recall / F1 through seqeval in its default
(conlleval-compatible) mode, where an ``I-X`` without a preceding ``B-X`` still starts an entity. SQuAD:
exact match and token F1 after the official ``normalize_answer``, max over gold answers, for v1.1 and v2.0
(HasAns / NoAns breakdown and the best no-answer threshold, as ``evaluate-v2.0.py`` computes them).

All scores are returned as plain floats; GLUE / NER scores lie in [0, 1] (correlations in [-1, 1]), SQuAD
scores in percent (0-100) like the official scripts. sklearn / scipy / seqeval are imported inside the
functions that use them so importing this module stays cheap.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np

from bertforge.errors import BertforgeError

# ----------------------------------------------------------------------------------------------- GLUE


def _arrays(predictions: Sequence, labels: Sequence) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.shape != y.shape:
        raise BertforgeError(f"predictions and labels differ in shape: {p.shape} vs {y.shape}")
    if p.size == 0:
        raise BertforgeError("cannot compute a metric over zero examples")
    return p, y


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    p, y = _arrays(predictions, labels)
    return float((p == y).mean())


def binary_f1(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """F1 of the positive class 1 (MRPC, QQP convention); 0 when there are no true or predicted positives."""
    from sklearn.metrics import f1_score

    p, y = _arrays(predictions, labels)
    return float(f1_score(y, p, pos_label=1, average="binary", zero_division=0))


def matthews_corr(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation coefficient (CoLA); 0 when a prediction or label column is constant."""
    from sklearn.metrics import matthews_corrcoef

    p, y = _arrays(predictions, labels)
    return float(matthews_corrcoef(y, p))


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Pearson's r; 0 when a prediction or label column is constant (as `matthews_corr`: scipy's NaN there would
    poison a best-epoch choice and a mean over seeds)."""
    from scipy.stats import pearsonr

    p, y = _arrays(predictions, labels)
    if _constant(p, y):
        return 0.0
    return float(pearsonr(p.astype(np.float64), y.astype(np.float64))[0])


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Spearman's rho; 0 when a prediction or label column is constant (see `pearson`)."""
    from scipy.stats import spearmanr

    p, y = _arrays(predictions, labels)
    if _constant(p, y):
        return 0.0
    return float(spearmanr(p.astype(np.float64), y.astype(np.float64))[0])


def _constant(*columns: np.ndarray) -> bool:
    return any(c.size == 0 or bool((c == c.flat[0]).all()) for c in columns)


METRICS = {
    "accuracy": accuracy,
    "f1": binary_f1,
    "mcc": matthews_corr,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_metrics(task_name: str, predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """Every metric of a task in ``readers.TASKS``. ``predictions`` / ``labels``: label ids (indices into the
    task's label list) for classification, floats for regression (STS-B)."""
    from bertforge.tasks.readers import get_task

    spec = get_task(task_name)
    return {name: METRICS[name](predictions, labels) for name in spec.metrics}


# ----------------------------------------------------------------------------------------------- NER


def ner_metrics(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision / recall / F1 (seqeval default mode = conlleval) and token accuracy.

    ``true_tags`` / ``pred_tags``: one tag list per sentence, same lengths."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    if len(true_tags) != len(pred_tags):
        raise BertforgeError(f"{len(pred_tags)} predicted sentences for {len(true_tags)} gold sentences")
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise BertforgeError(f"sentence {i}: {len(p)} predicted tags for {len(t)} words")
    y, p = [list(t) for t in true_tags], [list(t) for t in pred_tags]
    return {
        "precision": float(precision_score(y, p, zero_division=0)),
        "recall": float(recall_score(y, p, zero_division=0)),
        "f1": float(f1_score(y, p, zero_division=0)),
        "accuracy": float(accuracy_score(y, p)),
    }


# ----------------------------------------------------------------------------------------------- SQuAD

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """The official SQuAD normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the,
    collapse whitespace (in that order)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, empty_is_answer: bool = True) -> float:
    """Bag-of-tokens F1 between normalised answers.

    ``empty_is_answer`` (v2.0 rule): when either side normalises to no tokens, the score is 1 if both do and
    0 otherwise, so an empty prediction matches a no-answer question. v1.1 (``False``) scores no overlap as 0
    even when both are empty."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if empty_is_answer and (not pred or not ref):
        return float(pred == ref)
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_v1_metrics(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Official SQuAD v1.1 score: ``{"exact_match", "f1"}`` in percent, each the max over a question's gold
    answers, averaged over all questions in ``references`` (a missing prediction counts 0)."""
    if not references:
        raise BertforgeError("no reference questions to score")
    em = f1 = 0.0
    for qid, golds in references.items():
        if not golds:
            raise BertforgeError(f"question {qid}: no gold answers (a v2.0 file? use squad_v2_metrics)")
        if qid not in predictions:
            continue
        pred = predictions[qid]
        em += max(exact_match(pred, g) for g in golds)
        f1 += max(token_f1(pred, g, empty_is_answer=False) for g in golds)
    n = len(references)
    return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


def _v2_raw_scores(
    predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]
) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
    exact, f1, has_ans = {}, {}, {}
    for qid, golds in references.items():
        # as the official script: answerable iff the gold list is non-empty (bool(qa["answers"])); gold texts that
        # normalise to nothing are dropped for scoring only
        has_ans[qid] = bool(golds)
        golds = [g for g in golds if normalize_answer(g)] or [""]
        if qid not in predictions:
            raise BertforgeError(f"missing prediction for question {qid}")
        pred = predictions[qid]
        exact[qid] = max(exact_match(pred, g) for g in golds)
        f1[qid] = max(token_f1(pred, g) for g in golds)
    return exact, f1, has_ans


def find_best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """The official v2.0 ``find_best_thresh``: walk questions by increasing no-answer score, answering each
    one in turn (starting from "all abstain"), and return (best score in percent, the na-score at which it
    was reached). A question is abstained on when its na-score exceeds the threshold. Like the official
    script, the threshold stays 0.0 when abstaining everywhere is best."""
    cur = best = float(sum(not v for v in has_ans.values()))
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            cur += scores[qid]
        elif predictions[qid]:
            cur -= 1  # answering a no-answer question loses the point abstaining had
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), float(best_thresh)


def squad_v2_metrics(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """Official SQuAD v2.0 score. ``references``: gold answer texts per question, empty for no-answer
    questions; a no-answer prediction is "". ``na_probs``: a no-answer score per question (e.g. the null
    score difference from ``squad.postprocess``); questions whose score exceeds ``na_prob_thresh`` count as
    abstained, and ``best_exact`` / ``best_f1`` with their thresholds are added. For a meaningful threshold
    search pass the best *non-null* predictions. Returns exact, f1, total, HasAns_*, NoAns_*, best_*."""
    if not references:
        raise BertforgeError("no reference questions to score")
    exact_raw, f1_raw, has_ans = _v2_raw_scores(predictions, references)
    probs = na_probs if na_probs is not None else {q: 0.0 for q in references}
    missing = [q for q in references if q not in probs]
    if missing:
        raise BertforgeError(f"no no-answer score for {len(missing)} question(s), e.g. {missing[0]}")

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        return {q: float(not has_ans[q]) if probs[q] > na_prob_thresh else s for q, s in raw.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    out: dict[str, float] = {}

    def add(prefix: str, qids: list[str]) -> None:
        if qids:
            out[f"{prefix}exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
            out[f"{prefix}f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            out[f"{prefix}total"] = len(qids)

    add("", list(references))
    add("HasAns_", [q for q in references if has_ans[q]])
    add("NoAns_", [q for q in references if not has_ans[q]])
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_threshold(predictions, exact_raw, probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_threshold(predictions, f1_raw, probs, has_ans)
    return out
