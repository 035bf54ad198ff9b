"""A tiny DeBERTa-v3 through the verbs: `finetune`, `evaluate`, `predict`, `embed`, `export` (the unfused ONNX
graph: its relative-position bias is outside onnxruntime's fused attention pattern) and `serve`, each checked
against transformers or against the in-process API on the same folder."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.config import compose
from bertforge.model.heads import MaskedLM
from bertforge.tokenization import Tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from test_finetune_cli import FILLER, NEG, POS, write_sst  # noqa: E402

LONG = "the film was very good and the plot was fine " * 18  # hundreds of tokens: past every bucket of the model


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A DeBERTa-v3-layout tokenizer, a tiny random DeBERTa MLM (16 buckets, so 200 tokens reach the log ones),
    SST-2-shaped data and the classifier `finetune` makes of them."""
    root = tmp_path_factory.mktemp("deberta")
    rng = random.Random(0)
    texts = [" ".join(rng.choices(POS + NEG + FILLER, k=10)) for _ in range(400)]
    tok = Tokenizer.train(texts, kind="deberta-v2", vocab_size=80)
    cfg = compose("deberta-v2", "tiny", vocab_size=tok.vocab_size, position_buckets=16, max_relative_positions=64)
    torch.manual_seed(0)
    MaskedLM(cfg).save_pretrained(root / "mlm", tokenizer=tok)
    assert main(["finetune", "--task", "sst2", "--data", str(write_sst(root / "sst", 64, 32)), "--model",
                 str(root / "mlm"),
                 "--out", str(root / "clf"), "--epochs", "2", "--lr", "1e-3", "--batch-size", "16", "--precision",
                 "fp32", "--no-progress"]) == 0
    (root / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                           for t in ("the movie was good", "awful plot", LONG)))
    return root


def test_finetuned_deberta_is_transformers_and_evaluates_and_predicts(work, tmp_path, capsys):
    from bertforge.tasks.models import load_task_model
    from bertforge.tasks.predict import predict

    ref, info = transformers.DebertaV2ForSequenceClassification.from_pretrained(work / "clf",
                                                                                output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours, _, _ = load_task_model(work / "clf")
    enc = Tokenizer.from_pretrained(work / "clf")(["the movie was good", LONG], max_length=256)
    with torch.no_grad():
        torch.testing.assert_close(ours(**enc)["logits"], ref.eval()(**enc).logits, atol=1e-5, rtol=0)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(work / "clf"), "--task", "sst2", "--data", str(work / "sst"),
                 "--no-progress"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1.0
    assert main(["predict", "--model", str(work / "clf"), "--input", str(work / "in.jsonl"), "--out",
                 str(tmp_path / "p.jsonl"), "--no-progress"]) == 0
    got = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    want = predict(work / "clf", work / "in.jsonl", progress=False)
    assert [g["label"] for g in got] == [w["label"] for w in want]
    assert np.allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-6)


def test_embed_is_the_mean_of_transformers_hidden_states(work, tmp_path):
    lines = ["the movie was good", "awful plot", LONG]
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
    assert main(["embed", "--model", str(work / "mlm"), "--input", str(tmp_path / "t.txt"), "--out",
                 str(tmp_path / "v.npy"), "--no-progress"]) == 0
    ref = transformers.DebertaV2Model.from_pretrained(work / "mlm").eval()
    enc = Tokenizer.from_pretrained(work / "mlm")(lines, max_length=512)
    with torch.no_grad():
        hidden = ref(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    want = ((hidden * m).sum(1) / m.sum(1)).numpy()
    assert np.abs(np.load(tmp_path / "v.npy") - want).max() < 1e-5


def test_export_writes_the_unfused_graph_that_matches_pytorch(work, tmp_path):
    pytest.importorskip("onnxruntime")
    from bertforge.tasks.models import load_task_model

    assert main(["export", "--model", str(work / "clf"), "--format", "onnx", "--out", str(tmp_path / "x")]) == 0
    record = json.loads((tmp_path / "x" / "export.json").read_text())
    assert record["fused_nodes"] == {} and record["inputs"] == ["input_ids", "attention_mask"]  # no token types
    assert "adds relative-position scores" in record["unfused"]  # and says why the graph is unfused
    graph, _, _ = load_task_model(tmp_path / "x")
    ours, _, _ = load_task_model(work / "clf")
    enc = Tokenizer.from_pretrained(work / "clf")(["awful plot", LONG, "the plot"], max_length=256)
    assert enc["input_ids"].shape[1] > 150  # another length than the traced sample: the graph is not fixed to it
    with torch.no_grad():
        torch.testing.assert_close(graph(**enc)["logits"], ours(**enc)["logits"], atol=1e-4, rtol=0)


BERTFORGE = shutil.which("bertforge", path=str(Path(sys.executable).parent)) or shutil.which("bertforge")


def test_serve_classifies_and_fills_masks_as_the_api_does(work):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from bertforge.analysis.fill_mask import fill_mask
    from bertforge.tasks.predict import predict

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([BERTFORGE, "serve", "--port", str(port), "--model", f"clf={work / 'clf'}", "--model",
                             f"mlm={work / 'mlm'}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "BERTFORGE_API_KEY": ""})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None and time.time() < deadline, "server did not start"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        texts = ["the movie was good", "awful plot", LONG]
        got = httpx.post(url + "/classify", json={"inputs": texts, "model": "clf", "truncate": True},
                         timeout=60).json()
        assert isinstance(got, list), got
        want = predict(work / "clf", work / "in.jsonl", progress=False)
        assert [g["label"] for g in got] == [w["label"] for w in want]
        assert np.allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-6)
        text = "the movie was [MASK]"
        filled = httpx.post(url + "/fill-mask", json={"inputs": [text], "model": "mlm", "top_k": 3}, timeout=60).json()
        assert isinstance(filled, list), filled
        offline = fill_mask(MaskedLM.from_pretrained(work / "mlm"), Tokenizer.from_pretrained(work / "mlm"), text, 3)
        assert [c["token_id"] for c in filled[0][0]] == [c.token_id for c in offline[0]]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
