"""Longformer as an attention choice of the one encoder: parity with transformers' LongformerModel /
LongformerForMaskedLM / LongformerForSequenceClassification / LongformerForQuestionAnswering on the same weights
(both directions, padding, global tokens, per-layer windows, lengths that are no multiple of the window, eager and
SDPA), the blocked maths never building T x T scores, and one-line errors for bad global-attention input."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.config import ModelConfig, compose
from bertforge.errors import BertforgeError
from bertforge.model.heads import MaskedLM
from bertforge.model import Encoder, for_inference
from bertforge.model.sparse import longformer as long_attention
from bertforge.model.sparse.layout import global_mask_from_indices, task_global_mask
from bertforge.tasks.models import (MultipleChoice, QuestionAnswering, SequenceClassifier, TokenClassifier,
                                    save_task_model)

transformers.logging.set_verbosity_error()

# windows 8 and 4 (+-4, +-2 tokens) on sequences of 45: the window matters, 45 is no multiple of 8 or 4 / 2.
HF_SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=130, attention_window=[8, 4], type_vocab_size=1, layer_norm_eps=1e-5)


def _randomise(model: torch.nn.Module) -> None:
    """Non-trivial norm weights and biases, so a map that drops or swaps one cannot pass."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _batch(length: int = 45, glob: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0  # padding queries far from every real token
    ids[mask == 0] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if glob:
        gm = torch.zeros_like(ids)
        gm[:, 0] = 1
        gm[0, [5, 17]] = 1   # rows with different numbers of global tokens
        gm[1, 31] = 1        # on padding: ignored, as in transformers
        batch["global_attention_mask"] = gm
    return batch


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.LongformerForMaskedLM(transformers.LongformerConfig(**HF_SMALL)).eval()
    _randomise(hf)
    path = tmp_path_factory.mktemp("hf_longformer")
    hf.save_pretrained(path)
    return path, hf


@pytest.mark.parametrize("glob", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_masked_lm_matches_transformers(hf_dir, glob, impl):
    path, hf = hf_dir
    ours = MaskedLM.from_pretrained(path)
    for layer in ours.bert.encoder.layer:  # the eager reference maths or SDPA, per layer
        layer.attention.self.attn_implementation = impl
    batch = _batch(glob=glob)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
        hidden = ours.bert(**{k: v for k, v in batch.items()}, output_hidden_states=True).hidden_states
        logits = ours(**batch)
    assert len(hidden) == len(ref.hidden_states) == 3
    for a, b in zip(hidden, ref.hidden_states):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[real], ref.logits[real], atol=1e-5, rtol=0)


def test_global_tokens_change_the_output(hf_dir):
    """The test above would pass with global attention ignored if it changed nothing: it does change things."""
    path, _ = hf_dir
    ours = MaskedLM.from_pretrained(path)
    batch = _batch()
    with torch.no_grad():
        with_global = ours(**batch)
        without = ours(batch["input_ids"], batch["attention_mask"])
    assert (with_global - without)[0].abs().max() > 1e-3  # 1e-5 is the parity tolerance


def test_bertforge_saves_what_transformers_loads(tmp_path):
    cfg = compose("longformer", "tiny", vocab_size=99, max_position_embeddings=130, attention_window=[8, 4],
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ours = MaskedLM(cfg).eval()
    _randomise(ours)
    ours.save_pretrained(tmp_path / "mlm")
    hf, info = transformers.LongformerForMaskedLM.from_pretrained(tmp_path / "mlm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert hf.config.attention_window == [8, 4]
    batch = _batch(length=40)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch)[real], hf.eval()(**batch).logits[real], atol=1e-5, rtol=0)
    # the bare encoder saves as LongformerModel (pooler included) and reads back
    enc = ours.bert
    enc.save_pretrained(tmp_path / "bare")
    base, info = transformers.LongformerModel.from_pretrained(tmp_path / "bare", output_loading_info=True)
    assert not info["unexpected_keys"]
    back = Encoder.from_pretrained(tmp_path / "bare")
    with torch.no_grad():
        a, b = back(**batch).last_hidden_state, base.eval()(**batch).last_hidden_state
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)


def test_longformer_model_with_pooler(tmp_path):
    torch.manual_seed(0)
    hf = transformers.LongformerModel(transformers.LongformerConfig(**{**HF_SMALL, "attention_window": 6})).eval()
    _randomise(hf)
    hf.save_pretrained(tmp_path)
    ours = Encoder.from_pretrained(tmp_path)
    assert ours.config.attention_window == [6, 6]
    batch = _batch(length=33)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        r, o = hf(**batch), ours(**batch)
    torch.testing.assert_close(o.last_hidden_state[real], r.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=1e-5, rtol=0)
    assert o.last_hidden_state.shape == r.last_hidden_state.shape  # unpadded
    fast = for_inference(ours)  # the sparse layers stay as they are (no fused Q/K/V), same numbers
    with torch.no_grad():
        torch.testing.assert_close(fast(**batch).last_hidden_state, o.last_hidden_state, atol=1e-6, rtol=0)
        int8 = for_inference(ours, "int8")(**batch).last_hidden_state  # quantised Q/K/V: called one by one
        assert torch.cosine_similarity(int8[real], o.last_hidden_state[real], dim=-1).min() > 0.99


def test_window_wider_than_the_sequence_is_full_attention():
    """With every token inside every window and no padding, Longformer's local attention is BERT's."""
    torch.manual_seed(0)
    cfg = compose("longformer", "tiny", vocab_size=99, attention_window=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    enc = Encoder(cfg).eval()
    dense = Encoder(compose("roberta", "tiny", vocab_size=99, max_position_embeddings=4098, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)).eval()
    dense.load_state_dict({k: v for k, v in enc.state_dict().items() if "_global" not in k})
    ids = torch.randint(3, 99, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(enc(ids).last_hidden_state, dense(ids).last_hidden_state, atol=1e-5, rtol=0)


def test_task_models_round_trip(tmp_path):
    """Fine-tuning heads load in transformers' Longformer task classes, whose default global attention
    ([CLS]; the question for QA; the endings for multiple choice; none for tagging) is the one bertforge sets."""
    cfg = compose("longformer", "tiny", vocab_size=99, max_position_embeddings=130, attention_window=8,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    clf = SequenceClassifier(cfg.replace(use_pooler=False), 3).eval()
    _randomise(clf)
    save_task_model(clf, tmp_path / "clf", ["a", "b", "c"], {"kind": "classify"})
    hf, info = transformers.LongformerForSequenceClassification.from_pretrained(tmp_path / "clf",
                                                                                output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    batch = _batch(length=30, glob=False)
    with torch.no_grad():
        torch.testing.assert_close(clf(**batch)["logits"], hf.eval()(**batch).logits, atol=1e-5, rtol=0)
    qa = QuestionAnswering(cfg.replace(use_pooler=False)).eval()
    _randomise(qa)
    save_task_model(qa, tmp_path / "qa", None, {"kind": "qa"})
    hf_qa = transformers.LongformerForQuestionAnswering.from_pretrained(tmp_path / "qa").eval()
    ids = batch["input_ids"].clone()
    ids[:, 6], ids[:, 7], ids[:, 25] = 2, 2, 2  # <s> question </s></s> context </s>: three separators a row
    ids[1, 25], ids[1, 29] = 5, 2
    with torch.no_grad():
        ours, ref = qa(ids, batch["attention_mask"]), hf_qa(ids, attention_mask=batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours["start_logits"][real], ref.start_logits[real], atol=1e-5, rtol=0)
    assert task_global_mask(ids, "qa", 2)[0, :6].all() and not task_global_mask(ids, "qa", 2)[0, 6:].any()
    # tagging: no global tokens; multiple choice: the tokens after the first separator pair (transformers' rules)
    tag = TokenClassifier(cfg.replace(use_pooler=False), 3).eval()
    save_task_model(tag, tmp_path / "tag", ["a", "b", "c"], {"kind": "tag"})
    hf_tag = transformers.LongformerForTokenClassification.from_pretrained(tmp_path / "tag").eval()
    choice = MultipleChoice(cfg).eval()
    _randomise(choice)
    save_task_model(choice, tmp_path / "choice", None, {"kind": "choice"})
    hf_choice, info = transformers.LongformerForMultipleChoice.from_pretrained(tmp_path / "choice",
                                                                               output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(tag(ids, batch["attention_mask"])["logits"][real],
                                   hf_tag(ids, attention_mask=batch["attention_mask"]).logits[real], atol=1e-5,
                                   rtol=0)
        two = ids[:2].clone()
        two[1, 25:] = two[0, 25:]  # two full rows (no padding), three separators each
        torch.testing.assert_close(choice(two[None])["logits"], hf_choice.eval()(two[None]).logits, atol=1e-5,
                                   rtol=0)


def test_scores_grow_linearly_with_length(monkeypatch):
    """Every attention call scores a block of queries against at most 3 w/2 + G keys (global rows: G x T), so the
    number of scores per layer grows linearly in T; nothing T x T is built."""
    calls: list[tuple[int, int, int]] = []
    real_attend = long_attention.attend

    def spy(q, k, v, mask, *args, **kwargs):
        calls.append((q.shape[0] * q.shape[1], q.shape[2], k.shape[2]))
        return real_attend(q, k, v, mask, *args, **kwargs)

    monkeypatch.setattr(long_attention, "attend", spy)
    cfg = compose("longformer", "tiny", vocab_size=99, attention_window=16, max_position_embeddings=4098)
    enc = Encoder(cfg).eval()
    totals = {}
    for length in (256, 512, 1024):
        calls.clear()
        ids = torch.randint(3, 99, (1, length))
        with torch.no_grad():
            enc(ids, global_attention_mask=global_mask_from_indices(ids, [0, 3]))
        for _, tq, tk in calls:
            assert tk < length or tq <= 2  # a T-long key set only for the 2 global queries
        totals[length] = sum(b * tq * tk for b, tq, tk in calls)
    # exactly affine in T (blocks x a fixed key count + the global rows x T): no T x T term
    assert totals[1024] - totals[512] == 2 * (totals[512] - totals[256])


def test_bad_global_attention_input():
    enc = Encoder(compose("longformer", "tiny", vocab_size=99, attention_window=8)).eval()
    ids = torch.randint(3, 99, (2, 10))
    with pytest.raises(BertforgeError, match="global attention index 12 is out of range for a sequence of 10"):
        global_mask_from_indices(ids, [0, 12])
    with pytest.raises(BertforgeError, match=r"global_attention_mask has shape \(2, 9\)"):
        enc(ids, global_attention_mask=torch.ones(2, 9, dtype=torch.long))
    with pytest.raises(BertforgeError, match="global_attention_mask is a Longformer input"):
        Encoder(compose("bert", "tiny"))(ids, global_attention_mask=torch.ones_like(ids))
    with pytest.raises(BertforgeError, match="sparse attention has no \\[T, T\\] attention maps"):
        enc(ids, output_attentions=True)


def test_config_window_and_schema():
    cfg = compose("longformer", "tiny")
    assert cfg.attention_window == [512, 512] and cfg.max_position_embeddings == 4098 and cfg.pad_token_id == 1
    d = cfg.replace(attention_window=[8, 16]).to_hf_dict(["LongformerModel"])
    assert d["model_type"] == "longformer" and d["attention_window"] == [8, 16]
    assert ModelConfig.from_hf_dict(d).attention_window == [8, 16]
    for bad, msg in ((7, "attention_window 7 must be a positive even"), ([8], "1 entries for 2 layers")):
        with pytest.raises(BertforgeError, match=msg):
            compose("longformer", "tiny", attention_window=bad)
    with pytest.raises(BertforgeError, match="attention_window is a Longformer setting"):
        compose("roberta", "tiny", attention_window=8)


def test_pruning_a_head_equals_masking_it():
    """prune_heads also removes the head's rows of the global projections: the pruned model computes what the
    full one computes with that head masked, global rows included."""
    torch.manual_seed(0)
    enc = Encoder(compose("longformer", "tiny", vocab_size=99, attention_window=8)).eval()
    batch = _batch(length=36)
    head_mask = torch.ones(2, 2)
    head_mask[0, 1] = 0.0
    with torch.no_grad():
        masked = enc(**batch, head_mask=head_mask).last_hidden_state
        enc.prune_heads({0: [1]})
        pruned = enc(**batch).last_hidden_state
    assert enc.encoder.layer[0].attention.self.query_global.out_features == 64
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(pruned[real], masked[real], atol=1e-5, rtol=0)
