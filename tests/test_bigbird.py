"""BigBird as an attention choice of the one encoder: parity with transformers' BigBirdForMaskedLM / BigBirdModel in
eval and training mode (block-sparse at lengths that are and are not a multiple of the block, padding, the
full-attention fallback for short batches, attention_type "original_full", the training plan of random blocks),
both directions; the blocked maths equals dense attention under the same sparse mask; scores grow linearly."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.config import ModelConfig, compose
from bertforge.errors import BertforgeError
from bertforge.model.heads import MaskedLM
from bertforge.model import Encoder
from bertforge.model.sparse import bigbird as block_sparse
from bertforge.model.sparse import layout as sparse
from bertforge.model.sparse.layout import SparseLayout

transformers.logging.set_verbosity_error()

# blocks of 4, 2 random blocks: block-sparse from 37 tokens on ((5 + 2 * 2) * 4 = 36 and shorter: full attention)
HF_SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=256, block_size=4, num_random_blocks=2)


def _randomise(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _batch(length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, length - 13:] = 0  # whole padding blocks and a part-padded one
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.BigBirdForMaskedLM(transformers.BigBirdConfig(**HF_SMALL)).eval()
    _randomise(hf)
    path = tmp_path_factory.mktemp("hf_bigbird")
    hf.save_pretrained(path)
    return path, hf


@pytest.mark.filterwarnings("ignore:input length 70 is not a multiple")  # said, and tested below
@pytest.mark.parametrize("length", [30, 52, 70, 200])  # full attention (short); 13 blocks; padded to 72; 50 blocks
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_masked_lm_matches_transformers(hf_dir, length, impl):
    path, hf = hf_dir
    hf.bert.set_attention_type("block_sparse")  # transformers keeps full attention once a short batch fell back
    ours = MaskedLM.from_pretrained(path)
    for layer in ours.bert.encoder.layer:  # the eager reference maths or SDPA, per layer
        layer.attention.self.attn_implementation = impl
    batch = _batch(length)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = hf(**batch).logits
        logits = ours(**batch)
    assert hf.bert.attention_type == ("original_full" if length <= 36 else "block_sparse")
    assert logits.shape == ref.shape
    torch.testing.assert_close(logits[real], ref[real], atol=1e-5, rtol=0)


def test_bigbird_model_both_ways(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BigBirdModel(transformers.BigBirdConfig(**HF_SMALL)).eval()
    _randomise(hf)
    hf.save_pretrained(tmp_path / "hf")
    ours = Encoder.from_pretrained(tmp_path / "hf")
    batch = _batch(64)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        r, o = hf(**batch), ours(**batch)
    torch.testing.assert_close(o.last_hidden_state[real], r.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=1e-5, rtol=0)
    # bertforge -> transformers: an MLM and the bare encoder, no missing or unexpected keys
    cfg = compose("big_bird", "tiny", vocab_size=99, block_size=4, num_random_blocks=1, max_position_embeddings=128)
    lm = MaskedLM(cfg).eval()
    _randomise(lm)
    lm.save_pretrained(tmp_path / "lm")
    back, info = transformers.BigBirdForMaskedLM.from_pretrained(tmp_path / "lm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert back.config.block_size == 4 and back.config.attention_type == "block_sparse"
    with torch.no_grad():
        torch.testing.assert_close(lm(**batch)[real], back.eval()(**batch).logits[real], atol=1e-5, rtol=0)
    lm.bert.save_pretrained(tmp_path / "bare")
    base, info = transformers.BigBirdModel.from_pretrained(tmp_path / "bare", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(lm.bert(**batch).pooler_output, base.eval()(**batch).pooler_output,
                                   atol=1e-5, rtol=0)


def test_original_full_is_bert_attention(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BigBirdModel(transformers.BigBirdConfig(**HF_SMALL, attention_type="original_full")).eval()
    hf.save_pretrained(tmp_path)
    ours = Encoder.from_pretrained(tmp_path)
    assert ours.config.attention_type == "original_full"
    batch = _batch(64)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).last_hidden_state[real], hf(**batch).last_hidden_state[real],
                                   atol=1e-5, rtol=0)


def _dense_reference(attn, x, keep, blocks):
    """Dense softmax attention of `attn`'s projections under the sparse mask `blocks` [h, n-2, 5+r] describes."""
    B, T, _ = x.shape
    h, d, bs = attn.n_heads, attn.head_dim, attn.block_size
    n = T // bs
    q, k, v = attn.project(x).view(B, T, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    allowed = torch.zeros(h, n, n, dtype=torch.bool)
    allowed[:, [0, n - 1], :] = True
    for i in range(1, n - 1):
        allowed[:, i, [0, i - 1, i, i + 1, n - 1]] = True
        for head in range(h):
            allowed[head, i, blocks[head, i - 1]] = True
    tok = allowed.repeat_interleave(bs, 1).repeat_interleave(bs, 2)[None] & keep[:, None, None, :]
    scores = (q @ k.transpose(-1, -2) / d ** 0.5).masked_fill(~tok, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, h * d) * keep[:, :, None]


@pytest.mark.parametrize("length,block,max_len", [(52, 4, 256), (200, 4, 256), (1024, 32, 1024)])
def test_training_mode_matches_transformers(tmp_path, length, block, max_len):
    """In training, transformers draws the original BigBird plan (numpy seeded with the layer index; 1024, 3072 and
    4096 tokens use the paper's old plan): with dropout off, both give the same logits."""
    torch.manual_seed(0)
    hf = transformers.BigBirdForMaskedLM(transformers.BigBirdConfig(
        **{**HF_SMALL, "block_size": block, "max_position_embeddings": max_len}, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))
    _randomise(hf)
    hf.save_pretrained(tmp_path)
    ours = MaskedLM.from_pretrained(tmp_path).train()
    batch = _batch(length)
    real = batch["attention_mask"].bool()
    ref = hf.train()(**batch).logits
    logits = ours(**batch)
    torch.testing.assert_close(logits[real], ref[real], atol=1e-5, rtol=0)
    logits.sum().backward()  # and it trains
    grads = {name: p.grad for name, p in ours.named_parameters() if "pooler" not in name}  # (the MLM skips it)
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())


def test_training_blocks_are_legal_fixed_per_layer_and_the_maths_is_dense_attention():
    torch.manual_seed(0)
    cfg = compose("big_bird", "tiny", vocab_size=99, block_size=4, num_random_blocks=2, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    attn = block_sparse.BigBirdSelfAttention(cfg, index=1).train()
    n = 14
    plan = attn.random_blocks(n, torch.device("cpu"))
    assert plan.shape == (attn.n_heads, n - 2, 2)
    for head in range(attn.n_heads):
        for i, row in enumerate(plan[head].tolist(), start=1):
            assert len(set(row)) == 2 and all(1 <= b <= n - 2 and abs(b - i) > 1 for b in row)
    assert torch.equal(attn.random_blocks(n, torch.device("cpu")), plan)  # the same at every step
    other = block_sparse.BigBirdSelfAttention(cfg, index=0).train()
    assert not torch.equal(other.random_blocks(n, torch.device("cpu")), plan)  # seeded by the layer
    assert not attn.eval().random_blocks(n, torch.device("cpu")).any()  # eval: block 0, as transformers
    attn.train()
    x = torch.randn(2, n * 4, cfg.hidden_size)
    keep = torch.ones(2, n * 4, dtype=torch.bool)
    keep[1, 37:] = False
    with torch.no_grad():
        out, _ = attn(x, SparseLayout(keep))
        ref = _dense_reference(attn, x, keep, plan)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_scores_grow_linearly_with_length(monkeypatch):
    calls: list[tuple[int, int, int]] = []
    real_attend = block_sparse.attend

    def spy(q, k, v, mask, *args, **kwargs):
        calls.append((q.shape[0] * q.shape[1], q.shape[2], k.shape[2]))
        return real_attend(q, k, v, mask, *args, **kwargs)

    monkeypatch.setattr(block_sparse, "attend", spy)
    cfg = compose("big_bird", "tiny", vocab_size=99, block_size=16, num_random_blocks=2)
    enc = Encoder(cfg).eval()
    totals = {}
    for length in (512, 1024, 2048):
        calls.clear()
        with torch.no_grad():
            enc(torch.randint(5, 99, (1, length)))
        for _, tq, tk in calls:
            assert tk < length or tq <= 2 * 16  # all T keys only for the first and last block
        totals[length] = sum(b * tq * tk for b, tq, tk in calls)
    # exactly affine in T (blocks x a fixed key count + the edge rows x T): no T x T term
    assert totals[2048] - totals[1024] == 2 * (totals[1024] - totals[512])


def test_config_schema_and_refusals():
    cfg = compose("big_bird", "tiny")
    assert (cfg.attention_type, cfg.block_size, cfg.num_random_blocks, cfg.hidden_act) == ("block_sparse", 64, 3,
                                                                                            "gelu_new")
    d = cfg.to_hf_dict(["BigBirdModel"])
    assert d["model_type"] == "big_bird" and d["attention_type"] == "block_sparse" and d["use_bias"] is True
    assert ModelConfig.from_hf_dict(d).block_size == 64
    with pytest.raises(BertforgeError, match="BigBird with use_bias=False is not supported"):
        ModelConfig.from_hf_dict({**d, "use_bias": False})
    with pytest.raises(BertforgeError, match="unknown attention_type 'sparse'"):
        compose("big_bird", "tiny", attention_type="sparse")
    with pytest.raises(BertforgeError, match="attention_type is a BigBird setting"):
        compose("bert", "tiny", attention_type="block_sparse")
    with pytest.raises(BertforgeError, match="global_attention_mask is a Longformer input"):
        Encoder(cfg)(torch.ones(1, 8, dtype=torch.long), global_attention_mask=torch.ones(1, 8, dtype=torch.long))


def test_a_length_off_the_block_grid_is_padded_and_said():
    cfg = compose("big_bird", "tiny", vocab_size=99, block_size=4, num_random_blocks=1)
    enc = Encoder(cfg).eval()
    ids = torch.randint(5, 99, (2, 41))
    sparse._SAID.clear()  # said once per process and remainder
    with pytest.warns(UserWarning, match="input length 41 is not a multiple of BigBird's block_size 4: padded to 44"):
        out = enc(ids)
    assert out.last_hidden_state.shape == (2, 41, cfg.hidden_size)
