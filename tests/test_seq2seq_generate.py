"""Generation from the encoder-decoders against transformers' `generate` on the same weights (greedy, repetition
penalty, beam search, seeded sampling, padded batches, BART's forced eos), and `bertforge generate` on T5 / BART
directories."""
from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.cli import main
from bertforge.config import compose
from bertforge.config.seq2seq import compose_seq2seq
from bertforge.generation import generate, generate_ids, load, stream
from bertforge.model import Encoder, Seq2SeqLM
from bertforge.tokenization import Tokenizer

transformers.logging.set_verbosity_error()
V = 60


def _pair(kind: str, path):
    """A random transformers model with weights wide enough that greedy output varies, and bertforge's copy."""
    torch.manual_seed(0)
    if kind.startswith("t5"):
        cfg = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                    relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                    feed_forward_proj="gated-gelu" if kind == "t5-gated" else "relu",
                                    decoder_start_token_id=0, initializer_factor=3.0)
        ref = transformers.T5ForConditionalGeneration(cfg)
    else:
        cfg = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                      decoder_ffn_dim=48, max_position_embeddings=64, init_std=0.2)
        ref = transformers.BartForConditionalGeneration(cfg)
    ref.save_pretrained(path)
    return type(ref).from_pretrained(path).eval(), Seq2SeqLM.from_pretrained(path)


@pytest.fixture(scope="module", params=["t5", "t5-gated", "bart"])
def models(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def sources():
    """Two sources, the second right-padded (both tokenizers pad on the right)."""
    src = torch.randint(3, V, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(src)
    mask[1, 6:] = 0
    return src, mask


def _hf_opts(ours) -> dict:
    """Both sides do the same thing: the start token said explicitly, BART's forced bos / eos off."""
    return dict(decoder_start_token_id=ours.config.decoder_start_token_id, forced_bos_token_id=None,
                forced_eos_token_id=None)


@pytest.fixture
def unforced(models):
    ref, ours = models
    saved = ours.config.forced_eos_token_id
    ours.config.forced_eos_token_id = None
    yield ref, ours
    ours.config.forced_eos_token_id = saved


@pytest.mark.parametrize("opts,hf", [
    (dict(greedy=True), dict(do_sample=False)),
    (dict(greedy=True, repetition_penalty=1.3), dict(do_sample=False, repetition_penalty=1.3)),
    (dict(num_beams=3), dict(num_beams=3, do_sample=False)),
    (dict(num_beams=4, length_penalty=0.5), dict(num_beams=4, length_penalty=0.5, do_sample=False)),
])
def test_search_is_token_identical_to_transformers(unforced, sources, opts, hf):
    ref, ours = unforced
    src, mask = sources
    src = src.masked_fill(mask == 0, ours.config.pad_token_id)
    theirs = ref.generate(src, attention_mask=mask, max_new_tokens=20, **hf, **_hf_opts(ours))
    mine = generate_ids(ours, src, mask, max_new_tokens=20, **opts)
    assert mine.tolist() == theirs.tolist()
    if opts.get("greedy") and opts.get("repetition_penalty") is None:
        # eos is reached in one row and not the other: finished rows are filled with pad, as transformers does
        alone = generate_ids(ours, src[1:, :6], None, max_new_tokens=20, greedy=True)[0].tolist()
        assert mine[1, :len(alone)].tolist() == alone


def test_bf16_weights_decode_as_accurately_as_transformers_bf16(unforced, sources):
    """`generate --precision bf16` stores the weights in bf16 (the cache, the position bias and the masks follow):
    its first logits are as close to fp32's as transformers' own bf16 model's are (these deliberately wide random
    weights make bf16 rounding visible: cosine 0.96-1.0 for both libraries)."""
    import copy

    ref, ours = unforced
    src, mask = sources
    start = torch.full((2, 1), ours.config.decoder_start_token_id)
    half = copy.deepcopy(ours).to(torch.bfloat16)
    with torch.inference_mode():
        full_logits, _, _ = ours.prefill(src, mask, 5)
        half_logits, cache, _ = half.prefill(src, mask, 5)
        step_logits, _ = half.step(half_logits.argmax(-1), cache)
        theirs = copy.deepcopy(ref).to(torch.bfloat16)(input_ids=src, attention_mask=mask,
                                                       decoder_input_ids=start).logits[:, -1]
    assert half_logits.dtype == torch.bfloat16 and step_logits.shape == half_logits.shape
    cos = lambda a: torch.nn.functional.cosine_similarity(a.float(), full_logits, dim=-1)  # noqa: E731
    assert (cos(half_logits) >= cos(theirs) - 0.01).all(), (cos(half_logits), cos(theirs))
    out = generate_ids(half, src, mask, max_new_tokens=8, greedy=True)
    assert out.dtype == torch.long and out.shape[0] == 2 and int(out.max()) < V


def test_sampling_is_reproducible_and_equal_to_transformers_with_the_same_seed(unforced, sources):
    ref, ours = unforced
    src, mask = sources
    opts = dict(temperature=0.7, top_k=20, top_p=0.8)
    for seed in (0, 1):
        torch.manual_seed(seed)
        theirs = ref.generate(src, attention_mask=mask, max_new_tokens=15, do_sample=True, **opts,
                              **_hf_opts(ours))
        mine = generate_ids(ours, src, mask, max_new_tokens=15, seed=seed, **opts)
        assert mine.tolist() == theirs.tolist()
        assert generate_ids(ours, src, mask, max_new_tokens=15, seed=seed, **opts).tolist() == mine.tolist()


def test_bart_forced_eos_default_equals_transformers(tmp_path, sources):
    """With BART's own generation defaults (forced_eos_token_id=2), both end every unfinished row with eos."""
    ref, ours = _pair("bart", tmp_path)
    assert ours.config.forced_eos_token_id == 2
    src, mask = sources
    for hf, opts in ((dict(do_sample=False), dict(greedy=True)), (dict(num_beams=2), dict(num_beams=2))):
        theirs = ref.generate(src, attention_mask=mask, max_new_tokens=6, **hf)
        mine = generate_ids(ours, src, mask, max_new_tokens=6, **opts)
        assert mine.tolist() == theirs.tolist()
    assert mine[:, -1].tolist() == [2, 2] or 2 in mine[1].tolist()
    ours.config.forced_bos_token_id = 7  # mBART-style: the first generated token is forced
    assert generate_ids(ours, src, mask, max_new_tokens=3, greedy=True)[:, 1].tolist() == [7, 7]


# ---- text and the CLI ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_dirs(tmp_path_factory):
    """Random T5 and BART models saved with a tokenizer (bertforge's own layout)."""
    texts = ["the cat sat on the mat and the dog sat on the log", "a quick brown fox jumps over the lazy dog"] * 30
    out = {}
    for family, kind in (("t5", "unigram"), ("bart", "bpe")):
        tok = Tokenizer.train(texts, kind=kind, vocab_size=120)
        cfg = compose_seq2seq(family, "tiny", vocab_size=tok.vocab_size, encoder_layers=1, decoder_layers=1,
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id,
                              bos_token_id=tok.cls_token_id, max_position_embeddings=40,
                              decoder_start_token_id=tok.pad_token_id if family == "t5" else tok.sep_token_id)
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(family)
        Seq2SeqLM(cfg).save_pretrained(path, tokenizer=tok)
        out[family] = path
    return out


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_generate_text_and_stream_from_a_source(text_dirs, family):
    model, tok = load(text_dirs[family])
    assert isinstance(model, Seq2SeqLM)
    ids = model.prompt_ids(tok, "the cat sat")
    assert ids[-1] == model.config.eos_token_id and (family == "t5") != (ids[0] == model.config.bos_token_id)
    for opts in (dict(greedy=True), dict(seed=3, top_p=0.95), dict(num_beams=2)):
        text = generate(model, tok, "the cat sat", max_new_tokens=8, **opts)
        assert isinstance(text, str)
        assert "".join(stream(model, tok, "the cat sat", max_new_tokens=8, **opts)) == text
    # a batch of sources of different lengths: right-padded, each row as if alone
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both fit: nothing is cut
        both = generate(model, tok, ["the cat sat", "a quick brown fox jumps over"], max_new_tokens=8, greedy=True)
    assert both == [generate(model, tok, t, max_new_tokens=8, greedy=True)
                    for t in ("the cat sat", "a quick brown fox jumps over")]


def test_long_source_keeps_its_first_tokens(text_dirs):
    model, tok = load(text_dirs["bart"])
    with pytest.warns(UserWarning, match=r"the encoder reads 40: kept its first 39 tokens and the end of text"):
        out = generate(model, tok, "the cat sat on the mat " * 20, max_new_tokens=4, greedy=True)
    assert isinstance(out, str)


def test_generate_cli_on_encoder_decoders_and_refuses_an_encoder(text_dirs, tmp_path, capsys):
    for family, path in text_dirs.items():
        assert main(["generate", "--model", str(path), "--prompt", "the dog", "--max-new-tokens", "6",
                     "--seed", "1", "--precision", "fp32"]) == 0
        out = capsys.readouterr().out
        model, tok = load(path)
        assert out == generate(model, tok, "the dog", max_new_tokens=6, seed=1) + "\n"  # the prompt is not echoed
    Encoder(compose("bert", "tiny", vocab_size=50, num_hidden_layers=1)).save_pretrained(tmp_path / "bert")
    assert main(["generate", "--model", str(tmp_path / "bert"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a bert encoder checkpoint (BertModel) cannot generate text" in err
    assert main(["generate", "--model", str(text_dirs["bart"]), "--prompt", "hi", "--max-new-tokens", "50"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-new-tokens 50 exceeds the decoder's 40 positions" in err
