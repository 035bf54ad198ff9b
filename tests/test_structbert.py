"""StructBERT: trigram shuffling of unmasked tokens (word structure), next / previous / random segment pairs
(sentence structure), the joint objective (its loss by hand, it learns, it saves as a BertForMaskedLM that
transformers loads), recipes and ablation arms."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertforge.data import Masker, WordShuffle, make_builder
from bertforge.errors import BertforgeError
from bertforge.pretraining.ablation import ARMS
from bertforge.pretraining.objectives import StructBERTObjective, build_objective
from bertforge.pretraining.recipes import RECIPES, resolve

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CLS, SEP, MASK = 1, 2, 3


def test_word_shuffle_permutes_disjoint_trigrams_of_unmasked_tokens():
    masker = Masker(100, MASK, special_ids=[0, CLS, SEP])
    shuffle = WordShuffle(masker, trigram_rate=0.05)
    ids = np.array([CLS] + list(range(10, 70)) + [SEP] + list(range(20, 80)) + [SEP])  # 120 ordinary tokens
    for seed in range(20):
        out = shuffle(ids, rng=np.random.default_rng(seed))
        plain = masker(ids, rng=np.random.default_rng(seed))  # the same generator draws the same MLM masks first
        assert np.array_equal(out["mlm_labels"], plain["mlm_labels"])
        shuffled = np.flatnonzero(out["wso_labels"] != -100)
        assert len(shuffled) == 3 * 6  # round(0.05 * 120) trigrams
        assert not (set(shuffled) & set(np.flatnonzero(plain["mlm_labels"] != -100)))  # only unmasked tokens
        assert not (set(shuffled) & {0, 61, 122})  # never a special token
        assert np.array_equal(out["wso_labels"][shuffled], ids[shuffled])  # labels: the original tokens
        starts = shuffled.reshape(-1, 3)
        assert np.all(np.diff(starts, axis=1) == 1)  # contiguous trigrams, disjoint
        for tri in starts:  # the same three tokens, in a different order (all tokens here are distinct)
            assert sorted(out["input_ids"][tri]) == sorted(ids[tri]) and not np.array_equal(out["input_ids"][tri],
                                                                                         ids[tri])
        untouched = np.setdiff1d(np.arange(len(ids)), np.concatenate([shuffled,
                                                                      np.flatnonzero(plain["mlm_labels"] != -100)]))
        assert np.array_equal(out["input_ids"][untouched], ids[untouched])
    with pytest.raises(BertforgeError, match="trigram_rate"):
        WordShuffle(masker, trigram_rate=0.5)


class Docs:
    """A corpus stub with what the segment builders read: sentences as token ranges, grouped into documents."""

    def __init__(self, n_docs: int = 200, sents: int = 6, length: int = 5):
        self.doc_ptr = np.arange(0, n_docs * sents + 1, sents)
        self.starts = np.arange(n_docs * sents) * length
        self.ends = self.starts + length
        self.length = length

    def sentence_spans(self):
        return self.doc_ptr, self.starts, self.ends

    def doc_of(self, token: int) -> int:
        return int(np.searchsorted(self.doc_ptr, token // self.length, side="right") - 1)


def test_sentence_structure_pairs_are_next_previous_or_random_in_thirds():
    docs = Docs()
    plan = make_builder("sentence_structure", seq_len=32).plan(docs, np.random.default_rng(0))
    counts = np.bincount(plan.label, minlength=3)
    assert len(plan) > 250 and np.all(np.abs(counts / len(plan) - 1 / 3) < 0.08), counts
    for i in range(len(plan)):
        (a0, a1, sa, _), (b0, b1, sb, _) = plan.ranges(i)
        assert (sa, sb) == (0, 1)
        label = int(plan.label[i])
        if label == 0:    # B follows A in the same document
            assert docs.doc_of(a0) == docs.doc_of(b0) and a1 <= b0
        elif label == 1:  # B precedes A in the same document
            assert docs.doc_of(a0) == docs.doc_of(b0) and b1 <= a0
        else:             # B from another document
            assert docs.doc_of(a0) != docs.doc_of(b0)


def tiny_cfg():
    from bertforge.config import ModelConfig
    return ModelConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)


def structured_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows count up from a random start (masked and shuffled tokens are predictable); the sentence label is
    learnable from the first token."""
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 16
    start = torch.randint(5, 60 - T - 1, (B, 1), generator=g)
    ids = start + torch.arange(T)
    masked = torch.zeros(B, T, dtype=torch.bool)
    masked[:, 3] = masked[:, 11] = True
    shuffled = torch.zeros(B, T, dtype=torch.bool)
    shuffled[:, 6:9] = True
    corrupted = ids.masked_fill(masked, MASK)
    corrupted[:, 6:9] = ids[:, [8, 6, 7]]
    return dict(input_ids=corrupted, mlm_labels=torch.where(masked, ids, -100),
                wso_labels=torch.where(shuffled, ids, -100), attention_mask=torch.ones_like(ids),
                token_type_ids=(torch.arange(T) >= T // 2).long().expand(B, T).clone(),
                sentence_label=start.squeeze(1) % 3)


def test_structbert_loss_is_mlm_plus_word_plus_sentence_and_falls():
    torch.manual_seed(0)
    model = build_objective("structbert", tiny_cfg())
    assert isinstance(model, StructBERTObjective) and model.bert.pooler is not None
    b = structured_batch()
    model.eval()
    out = model(**b)
    hidden = model.bert(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    full = model.cls.predictions(hidden.last_hidden_state).reshape(-1, 60)
    mlm = F.cross_entropy(full, b["mlm_labels"].reshape(-1), ignore_index=-100)
    wso = F.cross_entropy(full, b["wso_labels"].reshape(-1), ignore_index=-100)
    sso = F.cross_entropy(model.sentence_structure(hidden.pooler_output), b["sentence_label"])
    torch.testing.assert_close(out["loss"], mlm + wso + sso, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["wso_loss"], wso, rtol=1e-5, atol=1e-5)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        out = model(**b)
        out["loss"].backward()
        opt.step()
        opt.zero_grad()
        first = first if first is not None else float(out["loss"].detach())
    assert float(out["loss"].detach()) < 0.6 * first
    assert {"mlm_acc", "wso_acc", "sso_acc"} <= set(out)
    only_word, only_sentence = build_objective("mlm+wso", tiny_cfg()), build_objective("mlm+sso", tiny_cfg())
    assert only_word.sentence_structure is None and only_word.bert.pooler is None
    assert "wso_acc" not in only_sentence(**b) and "sso_acc" not in only_word(**b)


def test_structbert_saves_as_bert_for_masked_lm_and_reloads_its_heads(tmp_path):
    from transformers import BertForMaskedLM

    from bertforge.model.checkpoint import load_pretrained
    torch.manual_seed(0)
    model = build_objective("structbert", tiny_cfg()).eval()
    model.save_pretrained(tmp_path)
    hf, info = BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    b = structured_batch()
    with torch.no_grad():
        ours = model.cls.predictions(model.encode(b["input_ids"], b["attention_mask"], b["token_type_ids"])
                                     .last_hidden_state)
        ref = hf.eval()(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        token_type_ids=b["token_type_ids"]).logits
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    back = build_objective("structbert", tiny_cfg())
    assert load_pretrained(back, tmp_path) == []  # the 3-way head and the pooler come back too
    assert torch.equal(back.sentence_structure.weight, model.sentence_structure.weight)


def test_recipes_and_arms():
    s, x = RECIPES["structbert"], RECIPES["xlnet"]
    assert (s.objective, s.input_format, s.sentence_task, s.model_type) == ("structbert", "segment-pair", "sso", "bert")
    assert (x.objective, x.model_type, x.plm_k, x.dynamic, x.tokenizer_kind) == ("plm", "xlnet", 6, True, "unigram")
    assert resolve("xlnet", plm_k=4).plm_k == 4
    for bad, msg in ((dict(input_format="full-sentences"), "needs sentence pairs"),
                     (dict(input_format="sentence-pair"), "needs --input-format segment-pair")):
        with pytest.raises(BertforgeError, match=msg):
            resolve("structbert", **bad)
    with pytest.raises(BertforgeError, match="use --recipe xlnet"):
        resolve("bert", objective="plm")
    with pytest.raises(BertforgeError, match="use --recipe xlnet"):
        resolve("xlnet", objective="mlm")
    with pytest.raises(BertforgeError, match="does not apply to --objective plm"):
        resolve("xlnet", masking="span")
    with pytest.raises(BertforgeError, match="--plm-k must be at least 1"):
        resolve("xlnet", plm_k=0)
    for name in ("sso", "wso", "structbert", "xlnet"):
        arm = ARMS[name]
        resolve(arm["recipe"], **arm["over"])  # every arm is a valid recipe
    assert resolve(ARMS["wso"]["recipe"], **ARMS["wso"]["over"]).objective == "mlm+wso"
