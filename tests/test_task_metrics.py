"""Metrics against hand-worked examples (expected numbers computed by hand in the comments)."""

import math

import pytest

from bertforge.errors import BertforgeError
from bertforge.tasks.metrics import (
    accuracy,
    binary_f1,
    compute_metrics,
    exact_match,
    find_best_threshold,
    matthews_corr,
    ner_metrics,
    normalize_answer,
    pearson,
    spearman,
    squad_v1_metrics,
    squad_v2_metrics,
    token_f1,
)

# preds vs labels: TP = 2 (idx 0, 4), FP = 1 (idx 1), TN = 1 (idx 2), FN = 1 (idx 3)
PREDS = [1, 1, 0, 0, 1]
LABELS = [1, 0, 0, 1, 1]


def test_classification_metrics_by_hand():
    assert accuracy(PREDS, LABELS) == pytest.approx(3 / 5)
    # P = 2/3, R = 2/3 -> F1 = 2/3
    assert binary_f1(PREDS, LABELS) == pytest.approx(2 / 3)
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 - 1) / sqrt(3*3*2*2) = 1/6
    assert matthews_corr(PREDS, LABELS) == pytest.approx(1 / 6)
    # F1 is of class 1: swapping the classes changes it (P = R = 1/2 for class 0)
    assert binary_f1([1 - p for p in PREDS], [1 - y for y in LABELS]) == pytest.approx(1 / 2)


def test_degenerate_classification():
    assert binary_f1([0, 0], [0, 0]) == 0.0  # no positives at all
    assert matthews_corr([1, 1, 1], [1, 0, 1]) == 0.0  # constant predictions
    with pytest.raises(BertforgeError, match="shape"):
        accuracy([1, 0], [1])
    with pytest.raises(BertforgeError, match="zero examples"):
        accuracy([], [])


def test_correlations_by_hand():
    # x = [1,2,3], y = [2,4,7]: dx = [-1,0,1], dy = [-7/3,-1/3,8/3]; cov*3 = 5, var_x*3 = 2, var_y*3 = 114/9
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    # ranks [1,2,3,4] vs [1,3,2,4]: sum d^2 = 2 -> rho = 1 - 6*2 / (4*(16-1)) = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1.0, 2.0, 3.0], [2.0, 4.0, 7.0]) == pytest.approx(1.0)
    # a regressor that predicts one value for everything (an untrained model can) measures no association: 0,
    # as the MCC of a constant column is, not scipy's NaN (which broke the lab's mean and spread over seeds)
    assert pearson([0.5, 0.5, 0.5], [1.0, 2.0, 3.0]) == 0.0 and spearman([0.5, 0.5, 0.5], [1.0, 2.0, 3.0]) == 0.0


def test_compute_metrics_per_task():
    assert compute_metrics("MRPC", PREDS, LABELS) == pytest.approx({"f1": 2 / 3, "accuracy": 3 / 5})
    assert compute_metrics("cola", PREDS, LABELS) == pytest.approx({"mcc": 1 / 6, "accuracy": 3 / 5})
    assert compute_metrics("sst-2", PREDS, LABELS) == pytest.approx({"accuracy": 3 / 5})
    m = compute_metrics("sts-b", [1, 2, 3, 4], [1, 3, 2, 4])
    assert set(m) == {"pearson", "spearman"} and m["spearman"] == pytest.approx(0.8)
    with pytest.raises(BertforgeError, match="unknown task"):
        compute_metrics("qqq", PREDS, LABELS)


def test_ner_entity_level():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "O"]]
    # 3 gold entities, 2 predicted, both right: P = 1, R = 2/3, F1 = 0.8; tokens 5/6 right
    m = ner_metrics(gold, pred)
    assert m["precision"] == pytest.approx(1.0)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(0.8)
    assert m["accuracy"] == pytest.approx(5 / 6)
    # a partly right span (wrong boundary) counts as wrong at the entity level
    m = ner_metrics([["B-PER", "I-PER"]], [["B-PER", "O"]])
    assert m["f1"] == 0.0


def test_ner_i_without_b_is_an_entity():
    # conlleval: an I-PER after O starts a PER entity, so this is the same entity as B-PER I-PER
    assert ner_metrics([["I-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O"]])["f1"] == pytest.approx(1.0)
    # ...and I-PER alone at index 1 is a different (one-token) entity
    assert ner_metrics([["B-PER", "I-PER", "O"]], [["O", "I-PER", "O"]])["f1"] == 0.0
    with pytest.raises(BertforgeError, match="sentence 0: 1 predicted tags for 2 words"):
        ner_metrics([["O", "O"]], [["O"]])


def test_normalize_answer():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("Theory") == "theory"  # articles only as whole words
    assert normalize_answer("state-of-the-art") == "stateoftheart"  # punctuation goes before articles
    assert normalize_answer("  ") == ""


def test_squad_exact_and_f1():
    assert exact_match("the Denver Broncos.", "Denver Broncos") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    # pred [denver, broncos, team] vs gold [denver, broncos]: P = 2/3, R = 1 -> F1 = 0.8
    assert token_f1("Denver Broncos team", "the Denver Broncos") == pytest.approx(0.8)
    # repeated tokens count with multiplicity: pred [x, x] vs gold [x]: common 1, P = 1/2, R = 1 -> 2/3
    assert token_f1("x x", "x") == pytest.approx(2 / 3)
    assert token_f1("", "Denver") == 0.0
    assert token_f1("", "the") == 1.0  # v2 rule: both normalise to nothing
    assert token_f1("", "the", empty_is_answer=False) == 0.0  # v1 rule


def test_squad_v1_max_over_gold_answers():
    refs = {"q1": ["Denver Broncos", "the Broncos"], "q2": ["1990s", "the 1990s"], "q3": ["Santa Clara"]}
    preds = {"q1": "Broncos", "q2": "", "q3": "Santa Clara, California"}
    # q1: EM 1 via "the Broncos", F1 1; q2: empty -> 0 / 0; q3: EM 0, F1 = 2*(2/3*1)/(2/3+1) = 0.8
    m = squad_v1_metrics(preds, refs)
    assert m["exact_match"] == pytest.approx(100 / 3)
    assert m["f1"] == pytest.approx(100 * 1.8 / 3)
    # a missing prediction scores 0 but still counts
    assert squad_v1_metrics({"q1": "Broncos"}, refs)["exact_match"] == pytest.approx(100 / 3)


V2_REFS = {"q1": ["Paris"], "q2": [], "q3": [], "q4": ["blue sky"]}
V2_PREDS = {"q1": "Paris", "q2": "", "q3": "London", "q4": "sky"}
V2_NA = {"q1": 0.1, "q2": 0.9, "q3": 0.8, "q4": 0.3}


def test_squad_v2_breakdown():
    # raw: q1 1/1, q2 1/1 (empty vs no-answer), q3 0/0, q4 EM 0, F1 = 2*(1*1/2)/(1+1/2) = 2/3
    m = squad_v2_metrics(V2_PREDS, V2_REFS)
    assert m["exact"] == pytest.approx(50.0)
    assert m["f1"] == pytest.approx(100 * (2 + 2 / 3) / 4)
    assert m["HasAns_exact"] == pytest.approx(50.0) and m["HasAns_f1"] == pytest.approx(100 * (5 / 3) / 2)
    assert m["NoAns_exact"] == pytest.approx(50.0) and m["NoAns_f1"] == pytest.approx(50.0)
    assert m["total"] == 4 and m["HasAns_total"] == 2 and m["NoAns_total"] == 2
    assert "best_f1" not in m
    # thresholding at 0.5 abstains on q2 and q3 (both no-answer): both now right -> EM 3/4
    m = squad_v2_metrics(V2_PREDS, V2_REFS, na_probs=V2_NA, na_prob_thresh=0.5)
    assert m["exact"] == pytest.approx(75.0)
    with pytest.raises(BertforgeError, match="missing prediction for question q4"):
        squad_v2_metrics({"q1": "Paris", "q2": "", "q3": ""}, V2_REFS)


def test_squad_v2_best_threshold_by_hand():
    # start: abstain everywhere -> 2 (the two no-answer questions). By increasing na-score:
    # q1 (0.1) +1 -> 3 (best, thresh 0.1); q4 (0.3) +F1 2/3 -> 3.667 (F1 best, thresh 0.3), +EM 0 -> 3;
    # q3 (0.8) answers a no-answer question -1; q2 (0.9) predicts "" -> +0.
    m = squad_v2_metrics(V2_PREDS, V2_REFS, na_probs=V2_NA)
    assert m["best_exact"] == pytest.approx(75.0) and m["best_exact_thresh"] == pytest.approx(0.1)
    assert m["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 4) and m["best_f1_thresh"] == pytest.approx(0.3)
    # when abstaining everywhere is best the official script reports threshold 0.0
    score, thresh = find_best_threshold({"a": "x"}, {"a": 0.0}, {"a": 0.5}, {"a": False})
    assert (score, thresh) == (100.0, 0.0)


def test_squad_v2_has_ans_from_gold_list_and_missing_na_prob():
    # gold "the" normalises to "": still an answerable question (the official script: bool(qa["answers"]))
    refs = {"q1": ["the"], "q2": []}
    m = squad_v2_metrics({"q1": "", "q2": ""}, refs)
    assert m["HasAns_total"] == 1 and m["NoAns_total"] == 1
    with pytest.raises(BertforgeError, match="q2"):
        squad_v2_metrics({"q1": "", "q2": ""}, refs, na_probs={"q1": 0.3})
