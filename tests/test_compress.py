"""Compression: `quantize` (int8 close to fp32; `predict`, `evaluate` and `embed` load it) and `export` (ONNX in
onnxruntime matches PyTorch to 1e-4 for an encoder, a sentence encoder and a task model); bad input is one line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.distill.compress import SAMPLE, quantize
from bertforge.embed import SentenceEncoder
from bertforge.model import Encoder
from bertforge.tasks.config import FinetuneConfig
from bertforge.tasks.finetune import evaluate_model
from bertforge.tasks.models import load_task_model
from bertforge.tasks.predict import predict
from bertforge.tokenization import Tokenizer
from test_distill import tiny  # noqa: F401 (fixture)
from test_finetune_cli import one_line_error, run

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def sentence_encoder(tiny) -> Path:  # noqa: F811
    out = tiny["dir"] / "st"
    st = SentenceEncoder.from_encoder(Encoder.from_pretrained(tiny["base"]), Tokenizer.from_pretrained(tiny["base"]),
                                      normalize=True)
    st.save_pretrained(out)
    return out


def test_quantized_task_model_is_close_to_fp32_and_predict_evaluate_load_it(tiny, tmp_path):  # noqa: F811
    out = tmp_path / "q"
    record = quantize(tiny["teacher"], out)
    assert record["kind"] == "classify" and record["mean_cosine"] > 0.99
    model, _, _ = load_task_model(out)
    linear_types = {type(m).__name__ for m in model.bert.modules() if "Linear" in type(m).__name__}
    assert any("quantized" in type(m).__module__ for m in model.bert.modules()), linear_types
    fp32, _, _ = load_task_model(tiny["teacher"])
    (tmp_path / "in.txt").write_text("good movie\nawful film\nthe plot was dull\n", encoding="utf-8")
    p32 = predict(tiny["teacher"], tmp_path / "in.txt", progress=False)
    p8 = predict(out, tmp_path / "in.txt", progress=False)
    assert [p["score"] for p in p8] == pytest.approx([p["score"] for p in p32], abs=0.02)
    cfg = FinetuneConfig(task="sst2", model=out, out=out, data=tiny["data"], progress=False)
    assert evaluate_model(out, cfg)["accuracy"] == pytest.approx(evaluate_model(tiny["teacher"], cfg)["accuracy"],
                                                                 abs=0.07)


def test_quantized_sentence_encoder_embeds_close_to_fp32(sentence_encoder, tmp_path):
    out = tmp_path / "q"
    proc = run("quantize", "--model", sentence_encoder, "--out", out)
    assert proc.returncode == 0, proc.stderr
    a = SentenceEncoder.from_pretrained(sentence_encoder).encode(SAMPLE, progress=False)
    b = SentenceEncoder.from_pretrained(out).encode(SAMPLE, progress=False)
    assert not np.allclose(a, b, atol=1e-6)  # really quantised
    assert (a * b).sum(1).min() > 0.99  # unit vectors: cosine
    (tmp_path / "t.txt").write_text("\n".join(SAMPLE) + "\n", encoding="utf-8")
    proc = run("embed", "--model", out, "--input", tmp_path / "t.txt", "--out", tmp_path / "v.npy", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "v.npy").shape == a.shape


@pytest.mark.parametrize("which", ["encoder", "sentence-encoder", "classify"])
def test_onnx_export_matches_pytorch(tiny, sentence_encoder, tmp_path, which):  # noqa: F811
    src = {"encoder": tiny["base"], "sentence-encoder": sentence_encoder, "classify": tiny["teacher"]}[which]
    out = tmp_path / "onnx"
    proc = run("export", "--model", src, "--format", "onnx", "--out", out, "--int8")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "export.json").read_text())
    assert record["kind"] == which and record["fp32_max_abs_diff"] <= 1e-4
    # an independent check on other inputs (another batch size and length than the traced ones)
    tok = Tokenizer.from_pretrained(out)
    batch = tok(["good", "the movie was very good and the actor was great"], return_tensors="pt")
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in batch.items()})[0]
    with torch.no_grad():
        if which == "encoder":
            want = Encoder.from_pretrained(src)(**batch).last_hidden_state
        elif which == "sentence-encoder":
            want = SentenceEncoder.from_pretrained(src)(dict(batch))["sentence_embedding"]
        else:
            want = load_task_model(src)[0](**batch)["logits"]
    assert np.abs(got - want.numpy()).max() <= 1e-4
    q = ort.InferenceSession(str(out / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    qgot = q.run(None, {k: v.numpy() for k, v in batch.items()})[0]
    assert not np.allclose(qgot, got, atol=1e-6) and np.abs(qgot - got).max() < 0.5 * np.abs(got).max() + 0.1


def test_bad_inputs_are_one_line(tiny, tmp_path):  # noqa: F811
    from bertforge.distill.task import TaskDistillConfig, distill_task

    bilstm = tmp_path / "bilstm"
    distill_task(TaskDistillConfig(teacher=tiny["teacher"], task="sst2", data=tiny["data"], out=bilstm,
                                   student="bilstm", max_steps=1, bilstm_hidden=8, batch_size=64))
    for verb, extra in (("export", ["--format", "onnx"]), ("quantize", [])):
        proc = run(verb, "--model", bilstm, "--out", tmp_path / "o", *extra)
        one_line_error(proc, "bilstm", "cannot be")
        assert not (tmp_path / "o").exists()
    proc = run("export", "--model", tmp_path, "--out", tmp_path / "o")
    one_line_error(proc, "no config.json")
