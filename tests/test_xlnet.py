"""XLNet: transformers' XLNetLMHeadModel layout both ways with equal logits (two streams, relative positions,
segments, padding, mems, clamp_len); the permutation masks by hand; the query stream never reads the token it
predicts; factorisation orders with partial prediction; the permutation LM learns; fill-mask refuses XLNet."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.model.heads import XLNetLM
from bertforge.model import Encoder, XLNetEncoder, permutation_mask, target_mapping_of
from bertforge.model.xlnet import rel_shift

os.environ.setdefault("HF_HUB_OFFLINE", "1")
V, T, B = 99, 10, 3


def hf_model(**kw):
    from transformers import XLNetConfig, XLNetLMHeadModel
    torch.manual_seed(0)
    cfg = XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0,
                      pad_token_id=0, **{"mem_len": None, **kw})
    return XLNetLMHeadModel(cfg).eval()


def tiny(**kw) -> ModelConfig:
    base = dict(model_type="xlnet", vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
                use_pooler=False)
    return ModelConfig(**{**base, **kw})


def inputs(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, T), generator=g)
    out: dict[str, torch.Tensor] = {"input_ids": ids}
    if kind in ("segments", "two-stream"):
        out["token_type_ids"] = (torch.arange(T) >= 6).long().expand(B, T).clone()
        mask = torch.ones(B, T)
        mask[1, 7:] = 0
        out["attention_mask"] = mask
    if kind in ("two-stream", "perm-only"):
        out["perm_mask"] = (torch.rand(B, T, T, generator=g) > 0.6).float()
    if kind == "two-stream":
        tm = torch.zeros(B, 3, T)
        tm[:, 0, 2], tm[:, 1, 5], tm[:, 2, 8] = 1, 1, 1
        out["target_mapping"] = tm
    return out


def test_rel_shift_is_the_distance_gather():
    q, k = 5, 8  # klen = mlen + qlen with 3 memory positions
    x = torch.randn(2, 3, q, k + q)
    i, j = torch.arange(q)[:, None], torch.arange(k)[None, :]
    torch.testing.assert_close(rel_shift(x, k), x[..., i, q - i + j], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["plain", "segments", "two-stream", "perm-only"])
def test_transformers_checkpoint_loads_in_bertforge_with_equal_logits(tmp_path, kind):
    ref = hf_model()
    ref.save_pretrained(tmp_path)
    ours = XLNetLM.from_pretrained(tmp_path)
    batch = inputs(kind)
    with torch.no_grad():
        want = ref(**batch, use_mems=False).logits
        got = ours(**batch)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_bertforge_checkpoint_loads_in_transformers_unchanged(tmp_path):
    from transformers import XLNetLMHeadModel, XLNetModel
    torch.manual_seed(1)
    ours = XLNetLM(tiny()).eval()
    ours.save_pretrained(tmp_path / "lm")
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert config["model_type"] == "xlnet" and config["architectures"] == ["XLNetLMHeadModel"]
    assert "max_position_embeddings" not in config and config["d_model"] == 32
    ref, info = XLNetLMHeadModel.from_pretrained(tmp_path / "lm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    batch = inputs("two-stream", seed=3)
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch), ref.eval()(**batch, use_mems=False).logits, rtol=0, atol=1e-5)
    # the bare encoder saves as XLNetModel does (no prefix) and loads back
    ours.bert.save_pretrained(tmp_path / "bare")
    bare, info = XLNetModel.from_pretrained(tmp_path / "bare", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    back = XLNetEncoder.from_pretrained(tmp_path / "bare")
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs("segments")).last_hidden_state,
                                   bare.eval()(**inputs("segments"), use_mems=False).last_hidden_state,
                                   rtol=0, atol=1e-5)
    assert ModelConfig.from_file(tmp_path / "lm") == ours.config.replace(extra={})


def test_mems_and_clamp_len_match_transformers(tmp_path):
    ref = hf_model(clamp_len=4, mem_len=6)
    ref.save_pretrained(tmp_path)
    ours = XLNetLM.from_pretrained(tmp_path)
    assert (ours.config.clamp_len, ours.config.mem_len) == (4, 6)
    first, second = inputs("plain", seed=1)["input_ids"], inputs("two-stream", seed=2)
    with torch.no_grad():
        ref_mems = ref.transformer(first, use_mems=True).mems
        our_mems = ours.bert(first, use_mems=True).mems
        for a, b in zip(ref_mems, our_mems):  # transformers keeps mems time-major [M, B, H]
            torch.testing.assert_close(b, a.transpose(0, 1), rtol=0, atol=1e-5)
        want = ref(**second, mems=ref_mems, use_mems=True).logits
        got = ours(**second, mems=list(our_mems))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert (got - ours(**second)).abs().max() > 1e-4  # the memory is really attended to


def test_eager_attention_equals_sdpa():
    torch.manual_seed(0)
    sdpa = XLNetEncoder(tiny()).eval()
    eager = XLNetEncoder(tiny(), attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    batch = inputs("two-stream")
    with torch.no_grad():
        torch.testing.assert_close(eager(**batch).last_hidden_state, sdpa(**batch).last_hidden_state,
                                   rtol=0, atol=1e-5)


def test_permutation_mask_by_hand():
    # positions 0..4; targets are 3 (first in the order) and 1 (second); 0, 2, 4 are context
    rank = torch.tensor([[-1, 1, -1, 0, -1]])
    blocked = permutation_mask(rank)[0].int()
    want = torch.tensor([  # row i: 1 where i may not see j
        [0, 1, 0, 1, 0],   # context sees context, no target
        [0, 1, 0, 0, 0],   # the 2nd target sees the context and the 1st target, not itself
        [0, 1, 0, 1, 0],
        [0, 1, 0, 1, 0],   # the 1st target sees only the context
        [0, 1, 0, 1, 0]])
    assert torch.equal(blocked, want)
    mapping, valid = target_mapping_of(torch.tensor([[False, True, False, True, False], [True] + [False] * 4]))
    assert mapping.shape == (2, 2, 5) and valid.tolist() == [[True, True], [True, False]]
    assert mapping[0].argmax(-1).tolist() == [1, 3] and mapping[1, 0, 0] == 1 and mapping[1, 1].sum() == 0


def test_query_stream_never_reads_the_token_it_predicts():
    """Two layers deep: a target's prediction ignores its own token and later targets' tokens, but not an earlier
    target's (the factorisation order), nor the context's."""
    torch.manual_seed(0)
    model = XLNetLM(tiny()).eval()
    ids = torch.randint(1, V, (1, T))
    rank = torch.full((1, T), -1)
    rank[0, 2], rank[0, 6] = 0, 1  # predict 2 first, then 6

    def predict(x):
        mapping, _ = target_mapping_of(rank.ge(0))
        with torch.no_grad():
            return model(x, perm_mask=permutation_mask(rank), target_mapping=mapping)[0]  # [2 targets, V]

    base = predict(ids)
    for pos, changes in ((2, [False, True]), (6, [False, False]), (4, [True, True])):
        other = ids.clone()
        other[0, pos] = (ids[0, pos] % (V - 1)) + 1
        moved = (predict(other) - base).abs().amax(-1) > 1e-6
        assert moved.tolist() == changes, (pos, moved)


def test_plm_objective_learns_and_predict_masked_ignores_the_masked_tokens():
    from bertforge.pretraining.objectives import build_objective
    torch.manual_seed(0)
    model = build_objective("plm", tiny())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V - T - 1, (8, 1), generator=g) + torch.arange(T)  # count up: predictable
    rank = torch.full_like(ids, -1)
    for row in range(8):
        rank[row, torch.randperm(T, generator=g)[:2]] = torch.arange(2)
    batch = dict(input_ids=ids, mlm_labels=torch.where(rank.ge(0), ids, -100), perm_rank=rank,
                 attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = model(**batch)
        out["loss"].backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(out["loss"].detach()))
    assert losses[-1] < 0.5 * losses[0], losses and 0 <= float(out["plm_acc"]) <= 1
    model.eval()
    positions = rank.ge(0)
    logits = model.predict_masked(ids, None, None, positions)
    assert logits.shape == (int(positions.sum()), V)
    scrambled = torch.where(positions, torch.full_like(ids, 4), ids)
    torch.testing.assert_close(model.predict_masked(scrambled, None, None, positions), logits)


def test_sampler_predicts_the_last_1_over_k_of_a_uniform_order():
    from bertforge.data import PermutationSampler
    cls, sep = 1, 2
    sampler = PermutationSampler(50, special_ids=[0, cls, sep, 3], k=6)
    ids = np.array([cls] + list(range(10, 34)) + [sep])  # 24 ordinary tokens -> 4 targets
    out = sampler(ids, rng=np.random.default_rng(0))
    assert np.array_equal(out["input_ids"], ids)  # no [MASK]: the query stream does not read the token
    targets = np.flatnonzero(out["perm_rank"] >= 0)
    assert len(targets) == 4 and sorted(out["perm_rank"][targets]) == [0, 1, 2, 3]
    assert not set(targets) & {0, len(ids) - 1}  # [CLS] / [SEP] are never predicted
    assert np.array_equal(np.flatnonzero(out["mlm_labels"] != -100), targets)
    assert np.array_equal(out["mlm_labels"][targets], ids[targets])
    again = sampler(ids, rng=np.random.default_rng(0))
    assert np.array_equal(again["perm_rank"], out["perm_rank"])  # reproducible from the generator
    hits = np.zeros(len(ids))
    for s in range(600):
        hits += sampler(ids, rng=np.random.default_rng(s))["perm_rank"] >= 0
    assert hits[0] == hits[-1] == 0 and np.all(np.abs(hits[1:-1] / 600 - 4 / 24) < 0.06)  # uniform over tokens
    assert sampler.budget(3) == 1 and sampler.budget(0) == 0
    with pytest.raises(BertforgeError, match="--plm-k"):
        PermutationSampler(50, [0], k=0)


def test_xlnet_config_round_trip_and_refusals():
    cfg = tiny(clamp_len=8, mem_len=16)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    d = cfg.to_hf_dict()
    with pytest.raises(BertforgeError, match="attn_type='uni' is not supported"):
        ModelConfig.from_hf_dict({**d, "attn_type": "uni"}, source="x/config.json")
    with pytest.raises(BertforgeError, match="bi_data=True"):
        ModelConfig.from_hf_dict({**d, "bi_data": True})
    with pytest.raises(BertforgeError, match="XLNetEncoder"):
        Encoder(cfg)  # fine-tuning / embedding code builds the BERT encoder: one clear line, not missing tensors


def test_fill_mask_refuses_an_xlnet_checkpoint_in_one_line(tmp_path, capsys):
    from bertforge.cli import main
    XLNetLM(tiny()).save_pretrained(tmp_path)
    assert main(["fill-mask", "--model", str(tmp_path), "the cat sat on the [MASK]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path) in err and "XLNet" in err and "not a masked LM" in err
    assert main(["info", str(tmp_path)]) == 0  # info describes it (no tokenizer saved: said, not raised)
    out = capsys.readouterr().out
    assert "xlnet (XLNetLMHeadModel)" in out and "positions relative (no limit)" in out
