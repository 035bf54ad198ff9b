"""ModernBERT as a family of the one encoder: numerical parity with transformers' ModernBertForMaskedLM on the same
weights (both directions, eager and SDPA, a padded batch longer than the local window), the config.json schema,
the fused Wqkv split/join, and the switches each family may or may not turn."""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.model.checkpoint import hf_state_dict, load_pretrained
from bertforge.config import ModelConfig, compose, preset
from bertforge.errors import BertforgeError
from bertforge.model.heads import MaskedLM
from bertforge.model import Encoder, apply_rotary, for_inference, rotary_cos_sin, sliding_window_mask

transformers.logging.set_verbosity_error()

# 4 layers (global, local, local, global), window 8 (+-4 tokens), sequences of 20: the window matters.
HF_SMALL = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                local_attention=8, global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                cls_token_id=1, sep_token_id=2, max_position_embeddings=64)


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    mask[2, 6:] = 0  # padding queries far outside any real token's window
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _randomise(model: torch.nn.Module) -> None:
    """Non-trivial norm weights and biases, so a map that drops or swaps one cannot pass."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _compare(ours: MaskedLM, ref, batch, atol: float = 1e-5) -> None:
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        r = ref(**batch, output_hidden_states=True)
        hidden = ours.bert(batch["input_ids"], batch["attention_mask"], output_hidden_states=True).hidden_states
        logits = ours(**batch)
    assert len(hidden) == len(r.hidden_states) == 5
    for a, b in zip(hidden, r.hidden_states):  # embeddings, layers 1-3, final-normed layer 4 (as transformers)
        torch.testing.assert_close(a[real], b[real], atol=atol, rtol=0)
    torch.testing.assert_close(logits[real], r.logits[real], atol=atol, rtol=0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_transformers_modernbert_loads_in_bertforge_with_equal_outputs(tmp_path, impl):
    torch.manual_seed(0)
    ref = transformers.ModernBertForMaskedLM._from_config(transformers.ModernBertConfig(**HF_SMALL),
                                                          attn_implementation=impl).eval()
    _randomise(ref)
    ref.save_pretrained(tmp_path)
    cfg = ModelConfig.from_file(tmp_path)
    assert (cfg.model_type, cfg.norm_position, cfg.position_embedding_type, cfg.gated_mlp) == \
        ("modernbert", "pre", "rotary", True)
    assert cfg.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert (cfg.local_attention, cfg.rope_theta, cfg.local_rope_theta) == (8, 160000.0, 10000.0)
    ours = MaskedLM(cfg)
    for layer in ours.bert.encoder.layer:
        layer.attention.self.attn_implementation = impl
    assert load_pretrained(ours, tmp_path) == []
    batch = _batch()
    _compare(ours.eval(), ref, batch)
    if impl == "eager":  # the attention probabilities themselves, window and padding included
        real = batch["attention_mask"].bool()
        with torch.no_grad():
            a = ours.bert(**batch, output_attentions=True).attentions
            b = ref(**batch, output_attentions=True).attentions
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x.transpose(1, 2)[real], y.transpose(1, 2)[real], atol=1e-5, rtol=0)


def test_bertforge_modernbert_loads_in_transformers_with_no_missing_keys(tmp_path):
    torch.manual_seed(0)
    cfg = compose("modernbert", "tiny", vocab_size=99, pad_token_id=0, num_hidden_layers=4, hidden_size=32,
                  num_attention_heads=4, intermediate_size=48, local_attention=8, max_position_embeddings=64)
    ours = MaskedLM(cfg).eval()
    _randomise(ours)
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ModernBertForMaskedLM"]
    ref, info = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    _compare(ours, ref.eval(), _batch())
    # and back: the same file reloads in bertforge with the same numbers
    again = MaskedLM.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(again(**_batch()), ours(**_batch()), atol=0, rtol=0)


def test_bare_encoder_saves_as_modernbertmodel(tmp_path):
    cfg = compose("modernbert", "tiny", vocab_size=99, pad_token_id=0, num_hidden_layers=2, hidden_size=32,
                  num_attention_heads=2, intermediate_size=48, local_attention=8, global_attn_every_n_layers=2)
    enc = Encoder(cfg).eval()
    _randomise(enc)
    enc.save_pretrained(tmp_path)
    ref, info = transformers.ModernBertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(enc(**batch).last_hidden_state[real],
                                   ref.eval()(**batch).last_hidden_state[real], atol=1e-5, rtol=0)


def test_fused_wqkv_is_query_key_value_in_order():
    cfg = compose("modernbert", "tiny", vocab_size=50, pad_token_id=0, num_hidden_layers=1)
    model = MaskedLM(cfg)
    state = hf_state_dict(model, cfg)
    attn = model.bert.encoder.layer[0].attention.self
    wqkv = state["model.layers.0.attn.Wqkv.weight"]
    assert wqkv.shape == (3 * cfg.hidden_size, cfg.hidden_size)
    for part, lin in zip(wqkv.chunk(3), (attn.query, attn.key, attn.value)):
        assert torch.equal(part, lin.weight.detach())
    # no biases anywhere but the decoder's; layer 0 has no attention norm; the decoder is tied (stored once)
    assert not any(k.endswith(".bias") for k in state if k != "decoder.bias")
    assert "model.layers.0.attn_norm.weight" not in state and "decoder.weight" not in state
    assert state["model.layers.0.mlp.Wi.weight"].shape == (2 * cfg.intermediate_size, cfg.hidden_size)


def test_config_round_trips_and_reads_older_transformers_spellings():
    cfg = compose("modernbert", "mini", vocab_size=500, pad_token_id=3)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    # transformers 4.x files: global_rope_theta / local_rope_theta / global_attn_every_n_layers, no layer_types
    old = {k: v for k, v in cfg.to_hf_dict().items() if k not in ("rope_parameters", "layer_types")}
    old.update(global_rope_theta=80000.0, local_rope_theta=5000.0, global_attn_every_n_layers=2)
    back = ModelConfig.from_hf_dict(old)
    assert (back.rope_theta, back.local_rope_theta, back.layer_types) == \
        (80000.0, 5000.0, ["full_attention", "sliding_attention"] * 2)
    # transformers' own defaults read the same as our family table
    hf = transformers.ModernBertConfig().to_dict()
    fam = ModelConfig.from_hf_dict(hf)
    assert (fam.num_hidden_layers, fam.intermediate_size, fam.vocab_size, fam.local_attention,
            fam.global_attn_every_n_layers, fam.rope_theta, fam.layer_norm_eps) == \
        (22, 1152, 50368, 128, 3, 160000.0, 1e-5)
    assert fam.extra["cls_token_id"] == 50281  # special-token ids travel through extra


def test_unsupported_layouts_fail_with_one_line():
    d = compose("modernbert", "tiny", vocab_size=50, pad_token_id=0).to_hf_dict()
    d["layer_types"] = ["sliding_attention", "full_attention"]
    with pytest.raises(BertforgeError, match="layer_types .* is not 'global every N layers'"):
        ModelConfig.from_hf_dict(d, source="x/config.json")
    d = compose("modernbert", "tiny", vocab_size=50, pad_token_id=0).to_hf_dict()
    d["classifier_activation"] = "silu"
    with pytest.raises(BertforgeError, match="x/config.json: classifier_activation"):
        ModelConfig.from_hf_dict(d, source="x/config.json")
    with pytest.raises(BertforgeError, match="a bert model cannot have norm_position='pre'"):
        compose("bert", "tiny", norm_position="pre")
    with pytest.raises(BertforgeError, match="cannot have attention_bias=False"):
        compose("roberta", "tiny", attention_bias=False)
    with pytest.raises(BertforgeError, match="a modernbert model cannot have gated_mlp=False"):
        compose("modernbert", "tiny", gated_mlp=False)


def test_sliding_window_width_and_padding_rows():
    pad = torch.tensor([[True] * 3 + [False] * 7])[:, None, None, :]  # 3 real tokens of 10
    m = sliding_window_mask(pad, 10, 2, torch.device("cpu"))[0, 0]
    assert m[0].tolist() == [True, True, True] + [False] * 7   # |i - j| <= 2, real keys only
    assert m[9].tolist() == [False] * 9 + [True]               # a padding query far away keeps itself only
    assert sliding_window_mask(pad, 3, 2, torch.device("cpu")) is pad  # the window spans everything
    full = sliding_window_mask(None, 10, 2, torch.device("cpu"))[0, 0]
    assert full.sum(1).tolist() == [3, 4, 5, 5, 5, 5, 5, 5, 4, 3]


def test_rotary_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)

    def score(i: int, j: int) -> float:
        cos, sin = rotary_cos_sin(torch.tensor([i, j]), 8, 10000.0)
        qi = apply_rotary(q, cos[:1], sin[:1])
        kj = apply_rotary(k, cos[1:], sin[1:])
        return float((qi * kj).sum())

    assert score(3, 7) == pytest.approx(score(10, 14), abs=1e-5)
    assert score(3, 7) != pytest.approx(score(3, 8), abs=1e-3)


def test_window_and_rotary_base_change_the_output():
    """The parity above would not notice a window or base that does nothing: show that each one acts."""
    cfg = compose("modernbert", "tiny", vocab_size=99, pad_token_id=0, num_hidden_layers=3, hidden_size=32,
                  num_attention_heads=4, intermediate_size=48, local_attention=8)
    base = Encoder(cfg).eval()
    _randomise(base)
    with torch.no_grad():  # sharp attention: at init's small scale every position looks alike
        for layer in base.encoder.layer:
            layer.attention.self.query.weight.mul_(20)
            layer.attention.self.key.weight.mul_(20)
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = base(**batch).last_hidden_state[real]
        for change in (dict(local_attention=None), dict(local_rope_theta=160000.0)):
            other = Encoder(cfg.replace(**change)).eval()
            other.load_state_dict(base.state_dict())
            assert (other(**batch).last_hidden_state[real] - ref).abs().max() > 1e-3, change  # parity: 1e-5


def test_inference_copy_and_head_pruning_without_biases():
    cfg = compose("modernbert", "tiny", vocab_size=99, pad_token_id=0, local_attention=8)
    enc = Encoder(cfg).eval()
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(for_inference(enc)(**batch).last_hidden_state[real],
                                   enc(**batch).last_hidden_state[real], atol=1e-5, rtol=0)
        enc.prune_heads({0: [1]})
        assert enc.config.heads_per_layer == [1, 2] and enc(**batch).last_hidden_state.isfinite().all()


def test_published_presets_have_modernberts_parameter_counts():
    """ModernBERT-base 149M and -large 395M parameters (Warner et al. 2024), counted without allocating them."""
    for name, expected in (("modernbert-base", 149e6), ("modernbert-large", 395e6)):
        with torch.device("meta"):
            n = Encoder(preset(name)).num_parameters()
        assert abs(n - expected) / expected < 0.01, (name, n)
