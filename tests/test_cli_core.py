"""The installed `bertforge` console script: info, fill-mask and clear one-line errors on bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.errors import BertforgeError
from bertforge.model.heads import MaskedLM
from bertforge.tokenization import Tokenizer

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")


def run(*args: str) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([BERTFORGE, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny masked LM with its own WordPiece tokenizer, trained here on a few lines."""
    root = tmp_path_factory.mktemp("tiny")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(f"the cat sat on the mat number {i} and the dog ran to the park" for i in range(200)))
    tok = Tokenizer.train(corpus.read_text().splitlines(), kind="wordpiece", vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    model = MaskedLM(ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    out = root / "model"
    model.save_pretrained(out, tokenizer=tok)
    return out


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_help_lists_verbs():
    proc = run("--help")
    assert proc.returncode == 0
    for verb in ("tokenizer", "info", "fill-mask", "embed"):
        assert verb in proc.stdout
    for verb in ("info", "fill-mask", "embed", "tokenizer"):
        assert run(verb, "--help").returncode == 0


def test_info_describes_checkpoint(tiny_dir):
    proc = run("info", str(tiny_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    expected = sum(p.numel() for p in MaskedLM.from_pretrained(tiny_dir).state_dict().values()) - 120 * 32 * 1
    assert d["parameters"] == expected  # the tied decoder is stored once
    assert d["layers"] == 2 and d["tokenizer"]["kind"] == "wordpiece" and d["architectures"] == ["BertForMaskedLM"]


def test_fill_mask_matches_library(tiny_dir):
    proc = run("fill-mask", "--model", str(tiny_dir), "--top-k", "3", "--json", "the cat sat on the [MASK]")
    assert proc.returncode == 0, proc.stderr
    cands = json.loads(proc.stdout)[0]
    assert len(cands) == 3 and cands[0]["probability"] >= cands[1]["probability"] >= cands[2]["probability"]
    from bertforge.analysis.fill_mask import fill_mask
    lib = fill_mask(MaskedLM.from_pretrained(tiny_dir), Tokenizer.from_pretrained(tiny_dir), "the cat sat on the [MASK]")
    assert cands[0]["token_id"] == lib[0][0].token_id


def test_fill_mask_prints_text_not_byte_level_symbols(tmp_path):
    """A byte-level BPE vocabulary spells " the" as "Ġthe": `fill-mask` shows the decoded text."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the cat sat on the mat and the dog ran to the park {i}" for i in range(200)))
    tok = Tokenizer.train(corpus.read_text().splitlines(), kind="bpe", vocab_size=300, min_frequency=1)
    torch.manual_seed(0)
    model = MaskedLM(ModelConfig(model_type="roberta", vocab_size=tok.vocab_size, hidden_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 max_position_embeddings=66, pad_token_id=tok.pad_token_id, type_vocab_size=1))
    model.save_pretrained(tmp_path / "rob", tokenizer=tok)
    every = str(tok.vocab_size)  # all candidates: the Ġ-spelled ones are surely among them
    proc = run("fill-mask", "--model", str(tmp_path / "rob"), "--top-k", every, "--json", "the cat <mask> on the mat")
    assert proc.returncode == 0, proc.stderr
    cands = json.loads(proc.stdout)[0]
    assert len(cands) == tok.vocab_size
    by_id = {c["token_id"]: c["token"] for c in cands}
    assert by_id[tok.token_to_id("Ġcat")] == "cat" and by_id[tok.token_to_id("Ġthe")] == "the"
    # only the bare space symbol, which decodes to nothing visible, keeps its vocabulary spelling
    assert {c["token"] for c in cands if "Ġ" in c["token"]} <= {"Ġ"}
    table = run("fill-mask", "--model", str(tmp_path / "rob"), "--top-k", every, "the cat <mask> on the mat")
    assert table.returncode == 0 and "Ġthe" not in table.stdout and "\n  cat " in table.stdout


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_truncated_safetensors(tiny_dir, tmp_path):
    bad = _copy(tiny_dir, tmp_path / "bad")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    _one_line_error(run("fill-mask", "--model", str(bad), "a [MASK]"), "model.safetensors")
    _one_line_error(run("info", str(bad)), "model.safetensors")


def test_unknown_model_type(tiny_dir, tmp_path):
    bad = _copy(tiny_dir, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "gpt7"
    (bad / "config.json").write_text(json.dumps(cfg))
    _one_line_error(run("info", str(bad)), "config.json", "gpt7")


def test_wrong_shaped_tensor(tiny_dir, tmp_path):
    bad = _copy(tiny_dir, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (bad / "config.json").write_text(json.dumps(cfg))
    _one_line_error(run("fill-mask", "--model", str(bad), "a [MASK]"), "intermediate.dense.weight", "(48, 32)")


def test_missing_tokenizer_and_missing_dir(tiny_dir, tmp_path):
    bad = _copy(tiny_dir, tmp_path / "bad")
    for name in ("tokenizer.json", "vocab.txt"):
        (bad / name).unlink(missing_ok=True)
    _one_line_error(run("fill-mask", "--model", str(bad), "a [MASK]"), "tokenizer")
    _one_line_error(run("info", str(tmp_path / "nowhere")), "nowhere")


def test_missing_mlm_head(tmp_path):
    from bertforge.model import Encoder
    enc = Encoder(ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32))
    enc.save_pretrained(tmp_path)
    with pytest.raises(BertforgeError, match="cls.predictions"):
        MaskedLM.from_pretrained(tmp_path)


def test_config_errors_are_one_line(tiny_dir, tmp_path):
    bad = _copy(tiny_dir, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["hidden_act"] = "quick_gelu"
    (bad / "config.json").write_text(json.dumps(cfg))
    _one_line_error(run("fill-mask", "--model", str(bad), "a [MASK]"), "quick_gelu")
    _one_line_error(run("fill-mask", "--model", str(tiny_dir), "--top-k", "0", "a [MASK]"), "--top-k")
    with pytest.raises(BertforgeError, match="embedding_size"):
        ModelConfig(model_type="bert", hidden_size=32, embedding_size=16, num_attention_heads=2)
