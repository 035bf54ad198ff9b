"""Generation against transformers' `generate` on the same weights (greedy, repetition penalty, seeded sampling,
beam search, left-padded batches), streaming, and the bad input of `bertforge generate`."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

from bertforge.cli import main
from bertforge.config import compose
from bertforge.errors import BertforgeError
from bertforge.generation import GenerationConfig, TextStream, generate, generate_ids, load, stream, warp
from bertforge.model import DecoderLM
from bertforge.tokenization import Tokenizer

transformers.logging.set_verbosity_error()
V = 97


def _hf(path, eos: int):
    torch.manual_seed(0)
    # initializer_range 0.2: random weights whose greedy output varies (at 0.02 it repeats one token)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=1,
                                  eos_token_id=eos, pad_token_id=eos, initializer_range=0.2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    return transformers.GPT2LMHeadModel.from_pretrained(path).eval(), DecoderLM.from_pretrained(path)


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(5, V, (1, 7), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def models(tmp_path_factory, prompt):
    """The same random weights twice: eos is a token greedy decoding reaches after a few steps, so that finishing
    early (and beams finishing at different lengths) is exercised."""
    ref, _ = _hf(tmp_path_factory.mktemp("probe"), eos=0)
    free = ref.generate(prompt, max_new_tokens=12, do_sample=False)[0, 7:].tolist()
    eos = next(t for t in free[2:] if t not in free[:2])
    return _hf(tmp_path_factory.mktemp("gpt2"), eos)


def test_greedy_is_token_identical_to_transformers(models, prompt):
    ref, ours = models
    for penalty in (1.0, 1.3):
        theirs = ref.generate(prompt, max_new_tokens=30, do_sample=False, repetition_penalty=penalty)
        mine = generate_ids(ours, prompt, max_new_tokens=30, greedy=True, repetition_penalty=penalty)
        assert mine.tolist() == theirs.tolist()
    assert mine[0, -1] == ours.config.eos_token_id or mine.shape[1] == 37


def test_sampling_is_reproducible_and_equal_to_transformers_with_the_same_seed(models, prompt):
    ref, ours = models
    opts = dict(temperature=0.7, top_k=20, top_p=0.8)
    for seed in (0, 1):
        torch.manual_seed(seed)
        theirs = ref.generate(prompt, max_new_tokens=25, do_sample=True, **opts)
        mine = generate_ids(ours, prompt, max_new_tokens=25, seed=seed, **opts)
        assert mine.tolist() == theirs.tolist()
        assert generate_ids(ours, prompt, max_new_tokens=25, seed=seed, **opts).tolist() == mine.tolist()
    assert generate_ids(ours, prompt, max_new_tokens=25, seed=5).tolist() != \
        generate_ids(ours, prompt, max_new_tokens=25, seed=6).tolist()


@pytest.mark.parametrize("beams,length_penalty", [(3, 1.0), (4, 0.5), (2, 2.0)])
def test_beam_search_equals_transformers(models, prompt, beams, length_penalty):
    ref, ours = models
    theirs = ref.generate(prompt, max_new_tokens=20, num_beams=beams, length_penalty=length_penalty, do_sample=False)
    mine = generate_ids(ours, prompt, max_new_tokens=20, num_beams=beams, length_penalty=length_penalty)
    assert mine.tolist() == theirs.tolist()


def test_left_padded_batch_equals_transformers_and_each_row_alone(models):
    ref, ours = models
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(5, V, (1, 9), generator=g), torch.randint(5, V, (1, 4), generator=g)
    eos = ours.config.eos_token_id
    batch = torch.cat([a, torch.cat([torch.full((1, 5), eos), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    for kw, hf_kw in ((dict(greedy=True), {}), (dict(num_beams=3), dict(num_beams=3))):
        theirs = ref.generate(batch, attention_mask=mask, max_new_tokens=15, do_sample=False, **hf_kw)
        mine = generate_ids(ours, batch, mask, max_new_tokens=15, **kw)
        assert mine.tolist() == theirs.tolist()
    alone = generate_ids(ours, b, max_new_tokens=15, greedy=True)[0].tolist()
    batched = generate_ids(ours, batch, mask, max_new_tokens=15, greedy=True)[1, 5:].tolist()
    assert batched[:len(alone)] == alone


def test_warp_keeps_the_nucleus_and_the_top_k():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(warp(scores, top_p=0.75)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(warp(scores, top_p=0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(warp(scores, top_p=0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(warp(scores, top_p=0.01)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(warp(scores, top_k=3)).tolist() == [[True, True, True, False]]
    torch.testing.assert_close(warp(scores, temperature=2.0), scores / 2)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    texts = ["Once upon a time there was a cat who sat on a mat.", "Café, naïve, 日本語 and 🙂 emoji."] * 40
    tok = Tokenizer.train(texts, kind="gpt2", vocab_size=300)
    cfg = compose("gpt2", "tiny", num_hidden_layers=1, vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                  bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, max_position_embeddings=32)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("textgpt")
    DecoderLM(cfg).save_pretrained(path, tokenizer=tok)
    return path


def test_stream_pieces_add_up_to_the_generated_text(text_model):
    lm, tok = load(text_model)
    for opts in (dict(greedy=True), dict(seed=3, top_p=0.95), dict(num_beams=2)):
        pieces = list(stream(lm, tok, "Once upon", max_new_tokens=12, **opts))
        assert "".join(pieces) == generate(lm, tok, "Once upon", max_new_tokens=12, **opts)
    # a multi-byte character split over two tokens is held back until it is complete
    ts = TextStream(tok)
    emoji = tok.encode_ids(["🙂"])[0]
    raw = [b for t in emoji for b in tok.convert_ids_to_tokens([t])]
    assert len(emoji) >= 1 and raw
    pieces = [ts.push([t]) for t in emoji]
    assert "".join(pieces) + ts.flush() == "🙂" and "\ufffd" not in "".join(pieces)


def test_long_prompt_is_cut_from_the_left_and_said(text_model):
    lm, tok = load(text_model)
    long = "the cat sat on a mat " * 30
    with pytest.warns(UserWarning, match=r"kept its last 22 tokens"):
        out = generate(lm, tok, long, max_new_tokens=10, greedy=True)
    assert isinstance(out, str)
    with pytest.raises(BertforgeError, match="--max-new-tokens 32 leaves no room for a prompt"):
        generate(lm, tok, "hi", max_new_tokens=32)


@pytest.mark.parametrize("flags,message", [
    (["--top-p", "1.5"], "--top-p must be in (0, 1] (got 1.5)"),
    (["--top-p", "0"], "--top-p must be in (0, 1] (got 0.0)"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--greedy", "--top-k", "5"], "--top-k shape sampling; greedy search does not sample"),
    (["--num-beams", "0"], "--num-beams must be at least 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
])
def test_bad_flags_are_one_line(text_model, flags, message, capsys):
    assert main(["generate", "--model", str(text_model), "--prompt", "hi", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertforge generate: error: {err[0].split('error: ', 1)[1]}"] and message in err[0]


def test_generate_cli_streams_and_refuses_an_encoder(text_model, tmp_path, capsys):
    assert main(["generate", "--model", str(text_model), "--prompt", "Once upon", "--max-new-tokens", "8",
                 "--seed", "1", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    lm, tok = load(text_model)
    assert out == "Once upon" + generate(lm, tok, "Once upon", max_new_tokens=8, seed=1) + "\n"
    from bertforge.model import Encoder
    Encoder(compose("bert", "tiny", vocab_size=50, num_hidden_layers=1)).save_pretrained(tmp_path / "bert")
    assert main(["generate", "--model", str(tmp_path / "bert"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a bert encoder checkpoint (BertModel) cannot generate text" in err


def test_generate_cli_bf16_weights_and_device_lines(text_model, capsys):
    import copy

    lm, tok = load(text_model)
    ids = torch.tensor([lm.prompt_ids(tok, "Once upon")])
    half = copy.deepcopy(lm).to(torch.bfloat16)
    with torch.inference_mode():
        full_logits, half_logits = lm.lm_logits(ids, last_only=True), half.lm_logits(ids, last_only=True)
    assert float(torch.nn.functional.cosine_similarity(half_logits.float(), full_logits, dim=-1).min()) > 0.97
    assert main(["generate", "--model", str(text_model), "--prompt", "Once upon", "--max-new-tokens", "6",
                 "--greedy", "--precision", "bf16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Once upon") and out.endswith("\n")
    assert main(["generate", "--model", str(text_model), "--prompt", "hi", "--precision", "fp16",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "fp16 needs a GPU" in err


def test_generate_cli_default_precision_is_the_hardwares(text_model, capsys, monkeypatch):
    from bertforge import device as accel

    for flags, want in (("avx512f avx512_bf16", "bf16"), ("avx2 fma", "fp32")):
        monkeypatch.setattr(accel, "cpu_info", lambda flags=flags: f"flags : {flags}")
        assert main(["generate", "--model", str(text_model), "--prompt", "hi", "--max-new-tokens", "3", "--greedy",
                     "--device", "cpu"]) == 0
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"(greedy, {want}, ")


def test_config_defaults_per_mode():
    assert GenerationConfig().resolved() == GenerationConfig(temperature=1.0, top_k=0, top_p=0.9)
    assert GenerationConfig(greedy=True).resolved().top_p is None
    assert GenerationConfig(num_beams=3).resolved().mode == "beam"


def test_generate_cli_greedy_equals_transformers_generate_on_a_transformers_checkpoint(tmp_path):
    """The installed console script, fp32, on a GPT-2 saved by transformers with a GPT-2 style tokenizer: the
    prompt's tokens alone (no <|endoftext|> before them), as `GPT2LMHeadModel.generate`; --prepend-bos puts it
    back; an empty prompt starts from it."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")
    assert exe, "the bertforge console script is not installed"
    texts = ["It was the best of times, it was the worst of times.", "Call me Ishmael. Some years ago."] * 40
    tok = Tokenizer.train(texts, kind="gpt2", vocab_size=300)
    tok.save_pretrained(tmp_path)
    eot = tok.cls_token_id
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=eot, eos_token_id=eot, initializer_range=0.2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)

    def theirs(ids: list[int]) -> str:
        out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=20, do_sample=False, pad_token_id=eot)[0, len(ids):].tolist()
        return hf_tok.decode(out[:out.index(eot)] if eot in out else out)

    def ours(prompt: str, *flags: str) -> str:
        proc = subprocess.run([exe, "generate", "--model", str(tmp_path), "--prompt", prompt, "--greedy",
                               "--precision", "fp32", "--device", "cpu", "--max-new-tokens", "20", *flags],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(prompt) and proc.stdout.endswith("\n")
        return proc.stdout[len(prompt):-1]

    prompt = "It was the best of times"
    ids = hf_tok(prompt)["input_ids"]
    assert eot not in ids
    plain, with_bos = theirs(ids), theirs([eot, *ids])
    assert plain != with_bos  # the two prompts continue differently: the test tells them apart
    assert ours(prompt) == plain
    assert ours(prompt, "--prepend-bos") == with_bos
    assert ours("") == theirs([eot])
