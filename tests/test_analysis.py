"""bertforge.analysis: head statistics on a hand-built attention tensor, JS distances, a probe that beats the
majority class, attention maps against transformers, and the console script's analyze verbs."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.analysis.attention import attention_html, attention_maps, load_encoder
from bertforge.analysis.head_statistics import js_distances, sentence_sums
from bertforge.analysis.probe import fit_probes, layer_features
from bertforge.model.checkpoint import save_pretrained
from bertforge.config import preset
from bertforge.errors import BertforgeError
from bertforge.model import Encoder
from bertforge.tasks.models import init_from_pretrained, save_task_model
from bertforge.tokenization import Tokenizer

BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")


def test_head_statistics_of_a_hand_built_tensor():
    # one layer, two heads, 4 tokens: [CLS] a , [SEP]
    a = np.zeros((1, 2, 4, 4))
    a[0, 0] = [[1, 0, 0, 0], [0.5, 0, 0.5, 0], [0, 1, 0, 0], [0, 0, 0, 1]]          # head 0
    a[0, 1] = np.full((4, 4), 0.25)                                                 # head 1: uniform
    sep = np.array([False, False, False, True])
    punct = np.array([False, False, True, False])
    s = sentence_sums(a, sep, punct)
    # head 0, per row: cls 1,.5,0,0; sep 0,0,0,1; punct 0,.5,0,0; self 1,0,0,1; prev -,.5,1,0; next 0,.5,0,-
    assert s["cls"][0, 0] == pytest.approx(1.5) and s["sep"][0, 0] == pytest.approx(1.0)
    assert s["punct"][0, 0] == pytest.approx(0.5) and s["self"][0, 0] == pytest.approx(2.0)
    assert s["prev"][0, 0] == pytest.approx(1.5) and s["next"][0, 0] == pytest.approx(0.5)
    assert s["entropy"][0, 0] == pytest.approx(np.log(2))            # only row 1 is spread (0.5 / 0.5)
    assert s["entropy"][0, 1] == pytest.approx(4 * np.log(4))        # uniform rows
    assert s["cls"][0, 1] == s["sep"][0, 1] == s["self"][0, 1] == pytest.approx(1.0)
    assert s["prev"][0, 1] == s["next"][0, 1] == pytest.approx(0.75)
    js = js_distances(a[0])
    assert js[0, 0] == js[1, 1] == 0 and js[0, 1] == pytest.approx(js[1, 0])
    # row 0: JS(one-hot, uniform) = 0.5*log(1/((1+.25)/2)) + 0.5*(.25*log(.25/.625) + 3*.25*log(.25/.125))
    one_hot_vs_uniform = 0.5 * np.log(1 / 0.625) + 0.5 * (0.25 * np.log(0.25 / 0.625) + 0.75 * np.log(2))
    half_vs_uniform = 0.5 * 2 * 0.5 * np.log(0.5 / 0.375) + 0.5 * (2 * 0.25 * np.log(0.25 / 0.375) + 2 * 0.25 * np.log(2))
    assert js[0, 1] == pytest.approx(3 * one_hot_vs_uniform + half_vs_uniform)


def test_probes_read_a_separable_layer_and_not_a_noise_layer():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    readable = rng.normal(size=(300, 8)).astype(np.float32)
    readable[:, 0] += 5 * y  # the label is linearly readable from one direction
    noise = rng.normal(size=(300, 8)).astype(np.float32)
    labels = [str(v) for v in y]
    x = np.stack([readable, noise])  # two "layers"
    acc = fit_probes(x[:, :200], labels[:200], x[:, 200:], labels[200:])
    majority = max(np.mean(y[200:] == k) for k in range(3))
    assert acc[0] > 0.95 and majority < 0.5
    assert acc[1] < 0.6


def test_probes_match_scikit_learns_logistic_regression():
    """The same objective as LogisticRegression(C=1) on a noisy 5-class problem: the same accuracy within 2 points,
    per layer (three layers of different difficulty)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(1)
    n, h, classes = 3000, 16, 5
    y = rng.integers(0, classes, n)
    centres = rng.normal(size=(3, classes, h))
    x = np.stack([centres[k][y] * scale + rng.normal(size=(n, h)) * 10
                  for k, scale in enumerate((1.0, 3.0, 6.0))]).astype(np.float32)
    labels = [str(v) for v in y]
    ours = fit_probes(x[:, :2000], labels[:2000], x[:, 2000:], labels[2000:])
    for k in range(3):
        ref = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x[k, :2000], labels[:2000])
        assert ours[k] == pytest.approx(ref.score(x[k, 2000:], labels[2000:]), abs=0.02)
    assert ours[0] < ours[1] < ours[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    words = "the cat dog sat ran on a mat , . good bad film".split()
    (d / "c.txt").write_text("\n".join(" ".join(random.Random(i).choices(words, k=8)) for i in range(200)))
    tok = Tokenizer.train((d / "c.txt").read_text().splitlines(), vocab_size=80, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2, max_position_embeddings=16)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    model, _ = init_from_pretrained(d / "model", "classify", 2)
    save_task_model(model, d / "sst", ["0", "1"], {"name": "sst2", "max_seq_len": 16}, tokenizer=tok)
    return d


def test_attention_maps_match_transformers_and_truncate(tiny):
    transformers = pytest.importorskip("transformers")
    encoder, tok = load_encoder(tiny / "model")
    maps = attention_maps(encoder, tok, "the cat sat on a mat .")
    hf = transformers.BertModel.from_pretrained(tiny / "model", attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(**tok("the cat sat on a mat ."), output_attentions=True).attentions
    np.testing.assert_allclose(maps.attn, torch.stack(ref, 1)[0].numpy(), atol=1e-5)
    assert maps.tokens[0] == "[CLS]" and not maps.truncated
    long = attention_maps(encoder, tok, " ".join(["cat"] * 40))
    assert long.truncated and len(long.tokens) == 16
    page = attention_html(long, layers=[1])
    assert "<script src" not in page and "http" not in page and '"layers": [1]' in page
    with pytest.raises(BertforgeError, match="--layers 5 out of range"):
        attention_html(long, layers=[5])


def test_layer_features_take_each_words_first_subtoken(tiny):
    encoder, tok = load_encoder(tiny / "model")
    items = [(["the", "catdog", ","], ["DT", "NN", ","]), (["good", "film"], ["JJ", "NN"])]
    feats, labels = layer_features(encoder, tok, items, sentence_level=False, progress=False)
    assert feats.shape == (3, 5, 128) and labels == ["DT", "NN", ",", "JJ", "NN"]
    enc = tok("the catdog ,")
    with torch.no_grad():
        hidden = encoder(**enc, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(feats[2, 1], hidden[2][0, 2].numpy(), atol=1e-6)  # "catdog" starts at token 2


def run(*args: object) -> subprocess.CompletedProcess:
    assert BERTFORGE, "the bertforge console script is not installed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([BERTFORGE, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_console_script_analyze_verbs_write_their_files(tiny, tmp_path):
    sents = tmp_path / "s.txt"
    sents.write_text("the cat sat on a mat .\na good film , a bad dog .\nthe dog ran .\n")
    conll = tmp_path / "pos.txt"
    rng = random.Random(0)
    tags = {"the": "DT", "a": "DT", "cat": "NN", "dog": "NN", "mat": "NN", "film": "NN", "sat": "VBD",
            "ran": "VBD", "on": "IN", ",": ",", ".": ".", "good": "JJ", "bad": "JJ"}
    conll.write_text("\n\n".join("\n".join(f"{w} {tags[w]} O O" for w in rng.choices(list(tags), k=6))
                                 for _ in range(30)) + "\n")
    sst = tmp_path / "dev.tsv"
    sst.write_text("sentence\tlabel\n" + "".join(f"a {w} film\t{int(w == 'good')}\n" for w in ["good", "bad"] * 6))
    checks = [
        (("attention", "--model", tiny / "model", "--text", "the cat sat", "--out", tmp_path / "a.html"), "a.html"),
        (("heads", "--model", tiny / "model", "--input", sents, "--out", tmp_path / "h"), "h/heads.json"),
        (("probe", "--model", tiny / "model", "--task", "pos", "--data", conll, "--out", tmp_path / "p"),
         "p/probe.json"),
        (("importance", "--model", tiny / "sst", "--task", "sst2", "--data", sst, "--out", tmp_path / "i"),
         "i/importance.png"),
        (("explain", "--model", tiny / "sst", "--text", "a good film", "--out", tmp_path / "e.html"), "e.html"),
    ]
    for args, made in checks:
        proc = run("analyze", *args)
        assert proc.returncode == 0, (args[0], proc.stderr)
        assert (tmp_path / made).is_file(), made
    heads = json.loads((tmp_path / "h" / "heads.json").read_text())
    assert len(heads["heads"]) == 4 and heads["tokens"] > 0
    probe = json.loads((tmp_path / "p" / "probe.json").read_text())
    assert len(probe["accuracy"]) == len(probe["control"]) == 3
    assert max(probe["accuracy"]) > probe["majority"]


def test_bad_input_is_one_line_and_long_text_is_truncated(tiny, tmp_path, capsys):
    from bertforge.cli import main

    sents = tmp_path / "s.txt"
    sents.write_text("words\nwithout\ntags\n")  # one column: no POS column
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"\0")
    for args, needle in [
        (("probe", "--model", tiny / "model", "--task", "pos", "--data", sents, "--out", tmp_path / "x"), "s.txt:1"),
        (("attention", "--model", onnx, "--text", "x", "--out", tmp_path / "o.png"), "ONNX"),
        (("attention", "--model", tiny / "model", "--text", "x", "--out", tmp_path / "o.pdf"), "--out"),
    ]:
        assert main(["analyze", *map(str, args)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "x").exists()
    assert main(["analyze", "attention", "--model", str(tiny / "model"), "--text", "cat " * 40,
                 "--out", str(tmp_path / "l.png")]) == 0
    assert "truncated" in capsys.readouterr().err and (tmp_path / "l.png").stat().st_size > 1000
