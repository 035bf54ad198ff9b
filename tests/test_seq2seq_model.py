"""The encoder-decoder (T5 and BART as one `Seq2SeqLM`) against transformers' T5ForConditionalGeneration and
BartForConditionalGeneration on the same weights, both ways; its config against T5Config / BartConfig; the
decoder's KV cache against full recomputation."""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers
from safetensors.torch import load_file

from bertforge.config.seq2seq import Seq2SeqConfig, compose_seq2seq, seq2seq_preset
from bertforge.errors import BertforgeError
from bertforge.model import Seq2SeqLM
from bertforge.model.cache import KVCache, Seq2SeqCache
from bertforge.model.seq2seq.layers import relative_position_bucket

transformers.logging.set_verbosity_error()
V = 71
HF_CLASS = {"t5": transformers.T5ForConditionalGeneration, "t5-gated": transformers.T5ForConditionalGeneration,
            "bart": transformers.BartForConditionalGeneration}


def hf_model(kind: str):
    """Small random transformers models; unequal encoder / decoder depths, d_kv != d_model / heads for T5,
    initialisations wide enough that the logits differ visibly between tokens."""
    torch.manual_seed(0)
    if kind.startswith("t5"):
        cfg = transformers.T5Config(vocab_size=V, d_model=32, d_kv=6, d_ff=40, num_layers=2, num_decoder_layers=3,
                                    num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=12,
                                    feed_forward_proj="gated-gelu" if kind == "t5-gated" else "relu",
                                    tie_word_embeddings=kind != "t5-gated", decoder_start_token_id=0,
                                    initializer_factor=1.0)
    else:
        cfg = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=3,
                                      encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=40,
                                      decoder_ffn_dim=24, max_position_embeddings=40, init_std=0.3,
                                      scale_embedding=True)
    model = HF_CLASS[kind](cfg).eval()
    if kind == "bart":  # transformers starts it at zero; a random one checks that it is read and added
        model.final_logits_bias.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module", params=["t5", "t5-gated", "bart"])
def pair(request, tmp_path_factory):
    """(kind, transformers' model, its directory, bertforge's model read from it)."""
    path = tmp_path_factory.mktemp(request.param)
    hf_model(request.param).save_pretrained(path)
    return request.param, HF_CLASS[request.param].from_pretrained(path).eval(), path, Seq2SeqLM.from_pretrained(path)


def batch(pad: int):
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, V, (3, 11), generator=g), torch.randint(3, V, (3, 7), generator=g)
    mask = torch.ones_like(src)
    mask[1, 7:], mask[2, 4:] = 0, 0  # right padding, as the tokenizers of both families pad
    src = src.masked_fill(mask == 0, pad)
    return src, mask, tgt


def test_logits_and_loss_equal_transformers_with_padding(pair):
    kind, ref, _, ours = pair
    src, mask, tgt = batch(ours.config.pad_token_id)
    labels = tgt.clone()
    labels[0, 5:] = -100
    with torch.no_grad():
        r = ref(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
        o = ours(src, mask, tgt)
        torch.testing.assert_close(o["logits"], r.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(o["encoder_hidden_states"], r.encoder_last_hidden_state, atol=1e-5, rtol=0)
        assert (r.logits[0, 0] - r.logits[0, 0].mean()).abs().max() > 0.5  # logits that can tell tokens apart
        # labels: decoder inputs made by shifting right, -100 ignored: the same loss and logits as transformers
        rl, ol = ref(input_ids=src, attention_mask=mask, labels=labels), ours(src, mask, labels=labels)
    torch.testing.assert_close(ol["loss"], rl.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(ol["logits"], rl.logits, atol=1e-5, rtol=0)
    assert ours.shift_right(labels)[0].tolist() == [ours.config.decoder_start_token_id, *tgt[0, :5].tolist(),
                                                    ours.config.pad_token_id]


def test_padding_changes_nothing_for_the_real_tokens(pair):
    _, _, _, ours = pair
    src, mask, tgt = batch(ours.config.pad_token_id)
    with torch.no_grad():
        padded = ours(src, mask, tgt)["logits"][1]
        alone = ours(src[1:2, :7], None, tgt[1:2])["logits"][0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


def test_eager_and_sdpa_agree(pair):
    _, _, path, ours = pair
    eager = Seq2SeqLM.from_pretrained(path, attn_implementation="eager")
    src, mask, tgt = batch(ours.config.pad_token_id)
    dec_mask = torch.ones_like(tgt)
    dec_mask[2, 5:] = 0
    with torch.no_grad():
        a, b = ours(src, mask, tgt, dec_mask)["logits"], eager(src, mask, tgt, dec_mask)["logits"]
    real = dec_mask.bool()
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)  # two kernels: float rounding


def test_saved_checkpoint_loads_in_transformers_and_back(pair, tmp_path):
    kind, ref, path, ours = pair
    ours.save_pretrained(tmp_path)
    # the same tensor names (tied ones stored once, as transformers stores them) and values
    theirs, mine = load_file(str(path / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert sorted(mine) == sorted(theirs)
    for k in theirs:
        torch.testing.assert_close(mine[k], theirs[k], atol=0, rtol=0)
    back, info = HF_CLASS[kind].from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [ours.config.family.head_classes["lm"]]
    src, mask, tgt = batch(ours.config.pad_token_id)
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
                                   ours(src, mask, tgt)["logits"], atol=1e-5, rtol=0)
    again = Seq2SeqLM.from_pretrained(tmp_path)
    assert again.config == ours.config


def test_kv_cache_steps_equal_one_full_pass(pair):
    """prefill + step (self-attention cache, cross-attention keys projected once) = the teacher-forced pass."""
    _, _, _, ours = pair
    cfg = ours.config
    cfg_forced = (cfg.forced_bos_token_id, cfg.forced_eos_token_id)
    cfg.forced_bos_token_id = cfg.forced_eos_token_id = None
    try:
        src, mask, tgt = batch(cfg.pad_token_id)
        dec = torch.cat([torch.full((3, 1), cfg.decoder_start_token_id), tgt], 1)
        with torch.no_grad():
            full = ours(src, mask, dec)["logits"]
            logits, cache, start = ours.prefill(src, mask, max_new_tokens=dec.shape[1])
            steps = [logits]
            for t in range(1, dec.shape[1]):
                logits, cache = ours.step(dec[:, t], cache)
                steps.append(logits)
        assert start.tolist() == dec[:, :1].tolist() and cache.length == dec.shape[1]
        torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=0)
    finally:
        cfg.forced_bos_token_id, cfg.forced_eos_token_id = cfg_forced


def test_cache_reorder_moves_cross_attention_rows_too():
    self_kv = KVCache(1, 2, 1, 2, 4)
    cross = [(torch.arange(2.0).view(2, 1, 1, 1).expand(2, 1, 3, 2), torch.zeros(2, 1, 3, 2))]
    cache = Seq2SeqCache(self_kv, cross, torch.tensor([[True], [False]]).view(2, 1, 1, 1), 5)
    cache.reorder(torch.tensor([1, 1, 0]))
    assert cache.cross[0][0][:, 0, 0, 0].tolist() == [1, 1, 0]
    assert cache.cross_mask.view(-1).tolist() == [False, False, True] and cache.self_attn.batch_size == 3
    kept = cache.cross[0][0]
    cache.reorder(torch.tensor([1, 0, 2]))  # rows 0 and 1 hold the same source: nothing to move
    assert cache.cross[0][0] is kept and cache.sources.tolist() == [1, 1, 0]
    cache.reorder(torch.tensor([2, 2, 2]))
    assert cache.cross[0][0][:, 0, 0, 0].tolist() == [0, 0, 0] and cache.sources.tolist() == [0, 0, 0]


def test_relative_position_buckets_equal_transformers():
    rel = torch.arange(-200, 200)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 12)):
            ref = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
                rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance)
            assert relative_position_bucket(rel, bidirectional, buckets, distance).tolist() == ref.tolist()


# ---- config ------------------------------------------------------------------------------------------------------
def test_config_reads_and_writes_transformers_schemas(pair):
    kind, ref, path, ours = pair
    cfg = ours.config
    hf = ref.config
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, cfg.vocab_size) == \
        (hf.d_model, hf.num_layers if kind != "bart" else hf.encoder_layers,
         hf.num_decoder_layers if kind != "bart" else hf.decoder_layers, V)
    if kind.startswith("t5"):
        assert cfg.gated_ffn == (kind == "t5-gated") and cfg.scale_decoder_outputs == (kind == "t5")
        assert cfg.activation == ("gelu_new" if kind == "t5-gated" else "relu") and cfg.head_dim_for(4) == 6
    else:
        assert (cfg.decoder_attention_heads, cfg.scale_embedding, cfg.decoder_start_token_id) == (2, True, 2)
    assert Seq2SeqConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    # transformers' own config class reads what bertforge writes, to the same values
    theirs = type(hf)(**{k: v for k, v in cfg.to_hf_dict().items() if k != "model_type"})
    for name in ("d_model", "vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
        assert getattr(theirs, name) == getattr(hf, name)


def test_compose_and_presets():
    t5 = compose_seq2seq("t5", "tiny", vocab_size=100)
    assert (t5.d_model, t5.encoder_layers, t5.decoder_layers, t5.encoder_attention_heads, t5.encoder_ffn_dim) == \
        (128, 2, 2, 2, 512)
    assert (t5.pad_token_id, t5.eos_token_id, t5.decoder_start_token_id, t5.family.rms_norm) == (0, 1, 0, True)
    bart = seq2seq_preset("bart-base")
    assert (bart.d_model, bart.encoder_layers, bart.encoder_ffn_dim, bart.max_position_embeddings) == \
        (768, 6, 3072, 1024)
    assert (bart.bos_token_id, bart.pad_token_id, bart.eos_token_id, bart.decoder_start_token_id) == (0, 1, 2, 2)
    small = seq2seq_preset("t5-small")
    assert (small.encoder_layers, small.d_model, small.encoder_attention_heads, small.d_kv) == (6, 512, 8, 64)
    assert seq2seq_preset("t5-v1_1-base").gated_ffn and seq2seq_preset("bart-mini").d_model == 256
    # bart-base: 139.4M parameters, as facebook/bart-base (embeddings tied, positions 1026 x 768 per stack)
    with torch.device("meta"):  # shapes only: no memory, no initialisation work
        assert round(Seq2SeqLM(seq2seq_preset("bart-base", vocab_size=50265)).num_parameters() / 1e6, 1) == 139.4


@pytest.mark.parametrize("change,message", [
    (dict(model_type="t5", some_new_switch=1), "unknown t5 config field 'some_new_switch'"),
    (dict(model_type="bart", encoder_layerdrop=0.1), "bart with encoder_layerdrop=0.1 is not supported"),
    (dict(model_type="bart", normalize_before=True), "bart with normalize_before=True is not supported"),
    (dict(model_type="t5", is_encoder_decoder=False), "t5 with is_encoder_decoder=False is not supported"),
    (dict(model_type="t5", feed_forward_proj="gated-gelu-x"), "feed_forward_proj 'gated-gelu-x'"),
    (dict(model_type="t5", eos_token_id=[1, 2]), "eos_token_id must be a whole number (got [1, 2])"),
    (dict(model_type="t5", d_model=None), "missing field 'd_model'"),
    (dict(model_type="mt5"), "model_type 'mt5' is not an encoder-decoder bertforge reads"),
])
def test_bad_configs_are_one_line(change, message):
    family = change["model_type"]
    base = compose_seq2seq(family, "tiny").to_hf_dict() if family in ("t5", "bart") else {}
    d = {k: v for k, v in {**base, **change}.items() if v is not None}  # None: the field left out
    with pytest.raises(BertforgeError) as err:
        Seq2SeqConfig.from_hf_dict(d, source="x/config.json")
    assert message in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("x/config.json")


def test_bad_shapes_are_refused():
    with pytest.raises(BertforgeError, match="one encoder_attention_heads and decoder_attention_heads"):
        compose_seq2seq("t5", "tiny", decoder_attention_heads=4)
    with pytest.raises(BertforgeError, match="gated_ffn"):
        compose_seq2seq("bart", "tiny", gated_ffn=True)
    with pytest.raises(BertforgeError, match="unknown encoder-decoder preset 'bert-base'"):
        seq2seq_preset("bert-base")
    with pytest.raises(BertforgeError, match="needs decoder_input_ids or labels"):
        Seq2SeqLM(compose_seq2seq("bart", "tiny", vocab_size=50))(torch.ones(1, 3, dtype=torch.long))


def test_missing_tensor_and_wrong_shape_are_one_line(tmp_path):
    cfg = compose_seq2seq("t5", "tiny", vocab_size=50, encoder_layers=1, decoder_layers=1)
    Seq2SeqLM(cfg).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    from safetensors.torch import save_file
    save_file({k: v for k, v in state.items() if k != "encoder.final_layer_norm.weight"},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(BertforgeError, match="tensor 'encoder.final_layer_norm.weight' is missing"):
        Seq2SeqLM.from_pretrained(tmp_path)
    save_file({**state, "shared.weight": torch.zeros(49, 128)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(BertforgeError, match=r"tensor 'shared.weight' has shape \(49, 128\)"):
        Seq2SeqLM.from_pretrained(tmp_path)


def test_training_step_reduces_the_loss():
    torch.manual_seed(0)
    for family in ("t5", "bart"):
        model = Seq2SeqLM(compose_seq2seq(family, "tiny", vocab_size=40, encoder_layers=1, decoder_layers=1,
                                          dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)).train()
        src, labels = torch.randint(3, 40, (4, 6)), torch.randint(3, 40, (4, 5))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(15):
            loss = model(src, labels=labels)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], (family, losses)
        assert model.lm_head.weight is model.shared.weight


def test_a_separate_output_matrix_is_read_and_kept(tmp_path):
    """T5 v1.1's files hold their own lm_head.weight (tie_word_embeddings false): transformers 5 then keeps the
    output untied, and so does bertforge, in both directions."""
    hf_model("t5-gated").save_pretrained(tmp_path / "hf")
    from safetensors.torch import save_file
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    state["lm_head.weight"] = torch.randn_like(state["shared.weight"])
    save_file(state, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    ref = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    ours = Seq2SeqLM.from_pretrained(tmp_path / "hf")
    assert ref.lm_head.weight is not ref.shared.weight and not ours.tied
    src, mask, tgt = batch(0)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, mask, tgt)["logits"],
                                   ref(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
                                   atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    assert torch.equal(load_file(str(tmp_path / "ours" / "model.safetensors"))["lm_head.weight"],
                       state["lm_head.weight"])
    _, info = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
