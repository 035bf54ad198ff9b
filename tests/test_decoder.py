"""The decoder (GPT-2 layout) against transformers' GPT2LMHeadModel on the same weights, both ways; the KV cache
against full recomputation; GPT-2's tokenizer kind; the gpt2 family in the one config system."""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers
from safetensors.torch import load_file

from bertforge.config import ModelConfig, compose, preset
from bertforge.errors import BertforgeError
from bertforge.families import DECODER
from bertforge.model import DecoderLM, Encoder, KVCache, attend
from bertforge.tokenization import Tokenizer

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random transformers GPT2LMHeadModel (3 layers, 4 heads, n_inner not 4H), saved as transformers saves it."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=101, n_positions=48, n_embd=32, n_layer=3, n_head=4, n_inner=80,
                                  bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("hf_gpt2")
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 101, (3, 19), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_logits_equal_transformers(hf_dir, ids, impl):
    ref = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation=impl).eval()
    ours = DecoderLM.from_pretrained(hf_dir, attn_implementation=impl)
    # right padding: real tokens keep positions 0.. in both libraries
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), ref(ids).logits, atol=1e-5, rtol=0)
        r, o = ref(ids, attention_mask=mask).logits, ours(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(o[real], r[real], atol=1e-5, rtol=0)


def test_left_padding_equals_transformers_with_its_position_ids(hf_dir, ids):
    """Left-padded rows count positions from their first real token (what transformers' generate passes)."""
    ref = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    ours = DecoderLM.from_pretrained(hf_dir)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        r, o = ref(ids, attention_mask=mask, position_ids=positions).logits, ours(ids, mask)
        alone = ours(ids[:1, 7:])
    torch.testing.assert_close(o[mask.bool()], r[mask.bool()], atol=1e-5, rtol=0)
    torch.testing.assert_close(o[0, 7:], alone[0], atol=1e-5, rtol=0)  # padding changes nothing


def test_saved_checkpoint_loads_in_transformers_and_back(hf_dir, ids, tmp_path):
    ours = DecoderLM.from_pretrained(hf_dir)
    ours.save_pretrained(tmp_path)
    # the same tensors, names and Conv1D layout as transformers' own file; lm_head stored once (tied)
    theirs, mine = load_file(str(hf_dir / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert sorted(theirs) == sorted(mine) and "lm_head.weight" not in mine
    for k in theirs:
        torch.testing.assert_close(mine[k], theirs[k], atol=0, rtol=0)
    back, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["GPT2LMHeadModel"] and saved["n_inner"] == 80
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), back.eval()(ids).logits, atol=1e-5, rtol=0)
    # GPT2Model-style files (no "transformer." prefix, as the original gpt2 checkpoint) load too
    bare = tmp_path / "bare"
    transformers.GPT2LMHeadModel.from_pretrained(hf_dir).transformer.save_pretrained(bare)
    with torch.no_grad():
        torch.testing.assert_close(DecoderLM.from_pretrained(bare)(ids), ours(ids), atol=1e-6, rtol=0)


def test_kv_cache_steps_equal_one_full_pass(hf_dir, ids):
    lm = DecoderLM.from_pretrained(hf_dir)
    with torch.no_grad():
        full = lm(ids)
        cache = lm.new_cache(3, ids.shape[1])
        first = lm(ids[:, :5], cache=cache)          # a prompt of 5
        steps = [lm(ids[:, t:t + 1], cache=cache) for t in range(5, 12)]
        chunk = lm(ids[:, 12:], cache=cache)         # several new tokens at once after a cache: causal mask
    got = torch.cat([first, *steps, chunk], 1)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
    assert cache.length == ids.shape[1]
    with pytest.raises(BertforgeError, match="KV cache holds 19 positions"):
        lm(ids[:, :1], cache=cache)


def test_cache_reorder_keeps_and_repeats_rows():
    cache = KVCache(n_layers=2, batch=3, n_heads=1, head_dim=2, max_length=4)
    k = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 2)
    for layer in cache.layers:
        layer.update(k, k)
    cache.advance(2)
    cache.reorder(torch.tensor([2, 2, 0]))  # in place (same batch size)
    assert cache.keys[1, :, 0, 0, 0].tolist() == [2, 2, 0]
    cache.reorder(torch.tensor([0, 0, 1, 1, 2, 2]))  # expanded (beams)
    assert cache.keys.shape[1] == 6 and cache.values[0, :, 0, 1, 1].tolist() == [2, 2, 2, 2, 0, 0]


def test_causal_attend_matches_an_explicit_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (4, 6, 6))
    tril = torch.ones(4, 6, dtype=torch.bool).tril(2)  # the 4 queries are the last 4 of 6 tokens
    expected, _ = attend(q, k, v, tril, eager=True)
    for eager in (False, True):
        got, _ = attend(q, k, v, None, eager=eager, causal=True)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    # square and unmasked: SDPA's own causal kernel
    sq, _ = attend(k, k, v, None, causal=True)
    ref, _ = attend(k, k, v, torch.ones(6, 6, dtype=torch.bool).tril(), eager=True)
    torch.testing.assert_close(sq, ref, atol=1e-6, rtol=0)


def test_gpt2_is_a_family_of_the_one_config_system(hf_dir):
    cfg = ModelConfig.from_file(hf_dir)
    assert (cfg.model_type, cfg.stack == DECODER, cfg.intermediate_size, cfg.max_position_embeddings,
            cfg.hidden_act, cfg.layer_norm_eps, cfg.bos_token_id, cfg.eos_token_id) == \
        ("gpt2", True, 80, 48, "gelu_new", 1e-5, 1, 2)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    small = preset("gpt2")  # GPT-2 small: 124M
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size, small.max_position_embeddings) == \
        (12, 768, 50257, 1024)
    assert DecoderLM(preset("gpt2", num_hidden_layers=1)).num_parameters() == 124_439_808 - 11 * 7_087_872
    with pytest.raises(BertforgeError, match="scale_attn_by_inverse_layer_idx"):
        ModelConfig.from_hf_dict({**cfg.to_hf_dict(), "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(BertforgeError, match="is a decoder"):
        Encoder(cfg)
    with pytest.raises(BertforgeError, match="is an encoder, not a decoder"):
        DecoderLM(compose("bert", "tiny"))


def test_gpt2_tokenizer_kind_trains_saves_and_loads_in_transformers(tmp_path):
    texts = ["Once upon a time there was a cat.", "The cat sat on the mat, naïvely.", "Ünïcödé and emoji 🙂"] * 30
    tok = Tokenizer.train(texts, kind="gpt2", vocab_size=320)
    assert tok.kind == "gpt2" and tok.mask_token is None and tok.special_ids == {tok.cls_token_id}
    assert tok.cls_token == tok.sep_token == tok.pad_token == "<|endoftext|>"
    tok.save_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    sample = ["The cat sat<|endoftext|> again", " a leading space and 🙂"]
    ours = tok(sample, padding=False, return_tensors=None)["input_ids"]
    assert ours == hf(sample)["input_ids"] == tok.encode_ids(sample)  # nothing added around a text
    assert hf.eos_token == "<|endoftext|>" and hf.bos_token == "<|endoftext|>"
    back = Tokenizer.from_pretrained(tmp_path)
    assert back.kind == "gpt2" and back.decode(ours[1]) == sample[1]
