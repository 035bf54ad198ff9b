"""`model.relative_position` on its own: the log buckets, the rows a length reaches, and one attention layer against
transformers' `DisentangledSelfAttention` on the same random weights (fp32, <= 1e-5), over the switches a DeBERTa
config can set (buckets or none, c2p / p2c / both, shared or own position projections), on SDPA and eager."""
from __future__ import annotations

import math

import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.families import FAMILIES
from bertforge.model.relative_position import (DisentangledSelfAttention, RelativePositionEmbeddings, half_width,
                                               log_bucket, relative_index)

transformers = pytest.importorskip("transformers")
from transformers.models.deberta_v2 import modeling_deberta_v2 as hf  # noqa: E402


def config(**over) -> ModelConfig:
    shape = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ModelConfig(**{**FAMILIES["deberta-v2"].settings(), **shape, **over})


@pytest.mark.parametrize("buckets,max_position", [(256, 512), (8, 32), (6, 100), (16, 20)])
def test_log_buckets_are_transformers(buckets, max_position):
    d = torch.arange(-3 * max_position, 3 * max_position)
    torch.testing.assert_close(log_bucket(d, buckets, max_position),
                               hf.make_log_bucket_position(d, buckets, max_position).long(), rtol=0, atol=0)
    # within +-buckets/2 a distance is its own bucket; beyond, the bucket grows with it, and up to max_position it
    # stays below `buckets` (so it has a row in the 2 x buckets table)
    mid = buckets // 2
    assert torch.equal(log_bucket(d, buckets, max_position)[(d.abs() <= mid)], d[d.abs() <= mid])
    far = log_bucket(d[d >= 0], buckets, max_position)
    assert bool((far[1:] >= far[:-1]).all()) and int(far[:max_position].max()) < buckets


@pytest.mark.parametrize("length", [1, 5, 9, 40, 120])
@pytest.mark.parametrize("buckets,max_position,half", [(8, 32, 8), (16, 20, 16), (-1, 12, 12)])
def test_only_the_rows_a_length_reaches_are_used(length, buckets, max_position, half):
    """The index into the sliced table picks what the full table's index picks, and the slice is no wider than
    the 2T - 1 distances (nor than the table)."""
    index, first, stop = relative_index(length, torch.device("cpu"), buckets, max_position, half)
    pos = torch.arange(length)
    d = pos[:, None] - pos[None, :]
    full = torch.clamp((hf.make_log_bucket_position(d, buckets, max_position) if buckets > 0 else d) + half,
                       0, 2 * half - 1)
    assert torch.equal(index + first, full.long())
    assert 0 <= first and stop <= 2 * half and stop - first <= 2 * length - 1 + 2
    assert int(index.min()) >= 0 and int(index.max()) < stop - first


SWITCHES = [
    dict(),                                                                  # DeBERTa-v3: shared, both terms
    dict(share_relative_projections=False),                                  # v2: pos_key_proj / pos_query_proj
    dict(share_relative_projections=False, relative_attention_terms=("c2p",)),
    dict(relative_attention_terms=("p2c",)),
    dict(relative_attention_terms=()),
    dict(position_buckets=-1, max_relative_positions=6),                     # no buckets, distances clamped
    dict(norm_relative_embeddings=False, position_buckets=8, max_relative_positions=16),
]


def _pair(cfg: ModelConfig, seed: int = 0):
    """Our layer and table, and transformers' DisentangledSelfAttention with the same weights."""
    hf_cfg = transformers.DebertaV2Config(**cfg.to_hf_dict())
    torch.manual_seed(seed)
    ref = hf.DisentangledSelfAttention(hf_cfg).eval()
    encoder = hf.DebertaV2Encoder(hf_cfg).eval()
    with torch.no_grad():
        for p in (*ref.parameters(), *encoder.parameters()):
            p.normal_(0, 0.3)
    ours = DisentangledSelfAttention(cfg).eval()
    table = RelativePositionEmbeddings(cfg).eval()
    names = {"query": "query_proj", "key": "key_proj", "value": "value_proj"}
    with torch.no_grad():
        for name, param in ours.named_parameters():
            module, leaf = name.split(".")
            param.copy_(getattr(getattr(ref, names.get(module, module)), leaf))
        table.embeddings.weight.copy_(encoder.rel_embeddings.weight)
        if table.LayerNorm is not None:
            table.LayerNorm.load_state_dict(encoder.LayerNorm.state_dict())
    return ours, table, ref, encoder


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "v3")
@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager"])
def test_one_layer_matches_transformers(switches, eager):
    cfg = config(**switches)
    ours, table, ref, encoder = _pair(cfg)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 23, cfg.hidden_size, generator=g)
    keep = torch.ones(3, 23, dtype=torch.long)
    keep[1, 15:] = 0
    keep[2, 3:] = 0
    with torch.no_grad():
        ctx, probs = ours(x, keep[:, None, None, :].bool(), eager=eager, relative=table(x))
        ref_ctx, ref_probs = ref(x, encoder.get_attention_mask(keep), output_attentions=True,
                                 relative_pos=encoder.get_rel_pos(x), rel_embeddings=encoder.get_rel_embedding())
    real = keep.bool()
    torch.testing.assert_close(ctx[real], ref_ctx[real], atol=1e-5, rtol=0)
    if eager:  # the probabilities of every real query
        rows = real[:, None, :, None].expand_as(probs)
        torch.testing.assert_close(probs[rows], ref_probs[rows], atol=1e-5, rtol=0)


def test_scale_is_one_over_sqrt_3d_with_both_terms():
    assert DisentangledSelfAttention(config()).scale == pytest.approx(1 / math.sqrt(3 * 8))
    assert DisentangledSelfAttention(config(relative_attention_terms=("c2p",))).scale == \
        pytest.approx(1 / math.sqrt(2 * 8))
    assert half_width(config()) == 256 and half_width(config(position_buckets=-1, max_relative_positions=20)) == 20


def test_gradients_reach_the_table_and_every_projection():
    cfg = config(share_relative_projections=False, position_buckets=8, max_relative_positions=16)
    ours, table, _, _ = _pair(cfg)
    x = torch.randn(2, 11, cfg.hidden_size, requires_grad=True)
    ctx, _ = ours.train()(x, None, relative=table.train()(x))
    ctx.square().sum().backward()
    for name, p in [*ours.named_parameters(), *table.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_a_bad_bucket_setting_is_one_line():
    from bertforge.errors import BertforgeError
    with pytest.raises(BertforgeError, match="position_buckets 64 needs max_relative_positions above 33"):
        config(position_buckets=64, max_relative_positions=20)
    with pytest.raises(BertforgeError, match="unknown relative attention terms"):
        config(relative_attention_terms=("c2c",))
