"""The GPU path's bugs caught on a CPU (issue 30).

A model moved to float64 is somewhere other than where torch builds modules by default (fp32, CPU), just as a model
moved to a GPU is: every inference entry point runs on such a model here, and a global forward hook checks that each
module that runs (those built lazily, at load or at inference conversion, included) holds only float64 tensors.
The training step's host synchronisations are counted with patched `Tensor.item` / `.cpu` / `.tolist` /
`__float__` / `__int__` / `__bool__`. The flags are declared once; the bad-input lines are one line each.
"""
from __future__ import annotations

import ast
import contextlib
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bertforge import device as dev
from bertforge.config import ModelConfig, compose
from bertforge.errors import BertforgeError
from bertforge.tokenization import Tokenizer

F64 = torch.float64
SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"
WORDS = "the cat sat on a mat while dog ran to park near tree and bird sang song in morning light".split()
TEXTS = ["the cat sat on the mat", "a dog ran to the park near a tree while the bird sang", "bird", ""]


@contextlib.contextmanager
def all_in(dtype: torch.dtype, device: torch.device = torch.device("cpu")):
    """Every module that runs inside holds its floating-point parameters and buffers in `dtype` on `device`."""
    bad: list[str] = []
    ran: list[str] = []

    def hook(module: nn.Module, args, output) -> None:
        ran.append(type(module).__name__)
        for name, t in itertools.chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False)):
            if t.is_floating_point() and (t.dtype, t.device) != (dtype, device):
                bad.append(f"{type(module).__name__}.{name}: {t.dtype} on {t.device}")

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield ran
    finally:
        handle.remove()
    assert ran, "no module ran: the check saw nothing"
    assert not bad, "left behind: " + "; ".join(sorted(set(bad)))


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    lines = [" ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(10)) for i in range(200)]
    return Tokenizer.train(lines, kind="wordpiece", vocab_size=150, min_frequency=1)


@pytest.fixture(scope="module")
def cfg(tok) -> ModelConfig:
    return ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=40)


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, cfg, tok) -> Path:
    from bertforge.model.heads import MaskedLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("mlm")
    MaskedLM(cfg).save_pretrained(path, tokenizer=tok)
    return path


def eager_compile(monkeypatch) -> None:
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager"))


# ---- the crash of issue 30 and its class --------------------------------------------------------------------------
def test_for_inference_of_a_float64_encoder_is_float64_and_matches(cfg):
    from bertforge.model import Encoder, for_inference

    torch.manual_seed(0)
    enc = Encoder(cfg).eval()
    ids = torch.randint(5, cfg.vocab_size, (3, 9))
    ref = for_inference(enc)(ids).last_hidden_state
    fast = for_inference(enc.to(F64))  # was: a float32 fused qkv beside float64 weights -> "same dtype" error
    assert dev.placement(fast) == {(F64, torch.device("cpu"))}
    with all_in(F64):
        out = fast(ids).last_hidden_state
    assert out.dtype == F64
    torch.testing.assert_close(out.float(), ref, atol=1e-5, rtol=1e-4)
    int8 = for_inference(enc.float(), "int8")  # CPU only; what stays a float tensor stays with its source
    assert dev.placement(int8) == dev.placement(enc)


@pytest.mark.parametrize("compile", [False, True])
def test_sentence_encoder_encode_in_float64(mlm_dir, compile, monkeypatch):
    from bertforge.embedding import SentenceEncoder

    eager_compile(monkeypatch)
    model = SentenceEncoder.from_pretrained(mlm_dir)
    ref = model.encode(TEXTS, progress=False)
    with all_in(F64):
        model.compile_inference = compile  # what `embed --compile` sets
        got = model.to(F64).encode(TEXTS, progress=False)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_cross_encoder_rerank_in_float64(cfg, tok):
    from bertforge.embedding.cross_encoder import CrossEncoder
    from bertforge.retrieval.index import Hit, rerank

    torch.manual_seed(0)
    ce = CrossEncoder(cfg, tok).eval()
    q, p = ["the cat"] * 3, ["a cat sat", "the dog ran to the park", "bird"]
    ref = ce.predict(q, p)
    hits = [Hit(i + 1, 0.0, str(i), t, title="") for i, t in enumerate(p)]
    with all_in(F64):
        got = ce.to(F64).predict(q, p)
        ranked = rerank(hits, "the cat", ce)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert [h.id for h in ranked] == [str(i) for i in np.argsort(-ref, kind="stable")]


def test_predict_and_evaluate_in_float64(cfg, tok, tmp_path):
    from bertforge.tasks.examples import TextExample
    from bertforge.tasks.folders import saved_task
    from bertforge.tasks.kinds import kind_from_saved
    from bertforge.tasks.models import build_model, save_task_model

    torch.manual_seed(1)
    save_task_model(build_model(cfg, "classify", 3), tmp_path, ["neg", "neu", "pos"], {"name": "mood"},
                    tokenizer=tok)
    kind = kind_from_saved(tmp_path, *saved_task(tmp_path))
    examples = [TextExample(t or "x", None, ["neg", "neu", "pos"][i % 3], str(i)) for i, t in enumerate(TEXTS)]
    enc = kind.encode(examples, tok)
    model = kind.load(tmp_path)
    ref, ref_metrics = kind.predict(model, enc), kind.evaluate(model, enc)
    with all_in(F64):
        got, metrics = kind.predict(model.to(F64), enc), kind.evaluate(model, enc)
    assert [r["label"] for r in got] == [r["label"] for r in ref] and metrics == ref_metrics
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a["probs"] if "probs" in a else a["score"], b["probs"] if "probs" in b
                                   else b["score"], atol=1e-5)


def test_fill_mask_and_attention_maps_in_float64(mlm_dir, tok):
    from bertforge.analysis.attention import attention_maps
    from bertforge.analysis.fill_mask import fill_mask
    from bertforge.model.heads import MaskedLM

    mlm = MaskedLM.from_pretrained(mlm_dir)
    text = f"the cat {tok.mask_token} on the mat"
    ref, ref_maps = fill_mask(mlm, tok, text, 3), attention_maps(mlm.bert, tok, "the cat sat")
    with all_in(F64):
        got, maps = fill_mask(mlm.to(F64), tok, text, 3), attention_maps(mlm.bert, tok, "the cat sat")
    assert [[c.token_id for c in row] for row in got] == [[c.token_id for c in row] for row in ref]
    np.testing.assert_allclose([c.probability for c in got[0]], [c.probability for c in ref[0]], atol=1e-6)
    np.testing.assert_allclose(maps.attn, ref_maps.attn, atol=1e-6)


def test_generate_in_float64(tmp_path):
    from bertforge.generation import generate
    from bertforge.model import DecoderLM

    texts = ["Once upon a time there was a cat who sat on a mat."] * 40
    tok = Tokenizer.train(texts, kind="gpt2", vocab_size=300)
    cfg = compose("gpt2", "tiny", num_hidden_layers=1, vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                  bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, max_position_embeddings=32)
    torch.manual_seed(0)
    lm = DecoderLM(cfg).eval()
    ref = generate(lm, tok, "Once upon", max_new_tokens=8, greedy=True)
    with all_in(F64):
        got = generate(lm.to(F64), tok, "Once upon", max_new_tokens=8, greedy=True)
    assert got == ref


def test_distilled_student_is_built_where_its_teacher_is(mlm_dir):
    from bertforge.distillation.init import student_from_teacher
    from bertforge.model.heads import MaskedLM

    teacher = MaskedLM.from_pretrained(mlm_dir).to(F64)
    student = student_from_teacher(teacher)
    assert dev.placement(student) == {(F64, torch.device("cpu"))}
    ids = torch.randint(5, student.config.vocab_size, (2, 7))
    with all_in(F64):
        out = student(ids)
    assert out.dtype == F64


def test_serve_registry_loads_onto_the_device_and_refuses_one_it_lacks(mlm_dir):
    from bertforge.embedding import SentenceEncoder
    from bertforge.server.registry import EMBED, load_models

    models = load_models([str(mlm_dir)], "fp32", "cpu")
    (served,) = models.values()
    got = np.stack(served.ops[EMBED].run(TEXTS))
    np.testing.assert_allclose(got, SentenceEncoder.from_pretrained(mlm_dir).encode(TEXTS, progress=False), atol=1e-6)
    if not torch.cuda.is_available():
        with pytest.raises(BertforgeError, match=r"^--device cuda:0: CUDA is not available"):
            load_models([str(mlm_dir)], "fp32", "cuda")
    with pytest.raises(BertforgeError, match="fp16 needs a GPU"):
        load_models([str(mlm_dir)], "fp16", "cpu")


# ---- no host sync in the training step ------------------------------------------------------------------------------
SYNCS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__")


class TinyMLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        from bertforge.model.heads import MaskedLM
        self.mlm = MaskedLM(cfg)

    def forward(self, input_ids, attention_mask, labels):
        logits = self.mlm(input_ids, attention_mask)
        return {"loss": nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)}


def _batches(cfg: ModelConfig, n: int = 40) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        ids = torch.randint(5, cfg.vocab_size, (12,), generator=g)
        mask = torch.ones(12, dtype=torch.long)
        mask[12 - i % 4:] = 0  # some padding, so the token count is a sum
        labels = torch.where(torch.rand(12, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


def test_training_step_makes_no_host_sync_except_when_logging(cfg, tmp_path, monkeypatch):
    from bertforge.training import ResumableLoader, TrainConfig, Trainer
    from bertforge.training import trainer as trainer_module

    calls: Counter[str] = Counter()
    counting = [False]
    for name in SYNCS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _real=real, **k):
            # Encoder.dense_mask reads a CPU mask (free: the CPU runs in step with the host); a device mask it
            # never reads while training (test_dense_mask_never_reads_a_device_mask_while_training)
            if counting[0] and not (self.device.type == "cpu" and sys._getframe(1).f_code.co_name == "dense_mask"):
                calls[_name] += 1
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    steps: list[tuple[int, int]] = []  # (step, syncs during it)
    real_step = trainer_module.Trainer._train_step

    def watched(self):
        before = sum(calls.values())
        counting[0] = True
        try:
            real_step(self)
        finally:
            counting[0] = False
        steps.append((self.step, sum(calls.values()) - before))
    monkeypatch.setattr(trainer_module.Trainer, "_train_step", watched)
    real_log = trainer_module.Trainer._log

    def logged(self):  # the logging step reads the window: its syncs are counted too, to show the patch works
        counting[0] = True
        try:
            real_log(self)
        finally:
            counting[0] = False
    monkeypatch.setattr(trainer_module.Trainer, "_log", logged)
    torch.manual_seed(0)
    config = TrainConfig(out_dir=tmp_path, lr=1e-3, max_steps=7, log_every=7, grad_accum=2, max_grad_norm=1.0,
                         time_budget_s=3600, progress=False, plot=False, device="cpu", prefetch=0)
    Trainer(TinyMLM(cfg), ResumableLoader(_batches(cfg), batch_size=4, seed=1), config).train()
    assert [s for s, _ in steps] == list(range(1, 8))
    assert [n for _, n in steps] == [0] * 7, (steps, calls)  # seven steps of two micro-batches each: no sync
    assert sum(calls.values()) > 0  # the logging step did read its sums: the counters see real syncs
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert record["step"] == 7 and np.isfinite(record["loss"]) and record["grad_norm"] > 0
    speed = json.loads((tmp_path / "speed.jsonl").read_text().splitlines()[0])
    want = sum(int(r["attention_mask"].sum()) for r in _batches(cfg))  # 7 x 2 x 4 = 56 rows out of 40: 1.4 epochs
    assert speed["tokens_per_s"] > 0 and want > 0


def test_dense_mask_never_reads_a_device_mask_while_training(cfg):
    from bertforge.model import Encoder

    enc = Encoder(cfg)
    meta = torch.ones(2, 6, dtype=torch.long, device="meta")  # reading a meta tensor's value raises
    mask = enc.train().dense_mask(meta, 6, meta.device)
    assert mask is not None and mask.shape == (2, 1, 1, 6) and mask.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):
        enc.eval().dense_mask(meta, 6, meta.device)  # inference reads it (its outputs are read back anyway)
    cpu = torch.ones(2, 6, dtype=torch.long)
    assert enc.train().dense_mask(cpu, 6, cpu.device) is None  # the CPU keeps SDPA's unmasked kernel


# ---- one place for the flags ----------------------------------------------------------------------------------------
def test_device_and_precision_flags_are_declared_only_by_add_device_args():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("--device", "--precision")):
                found.append(str(path.relative_to(SRC)))
    assert sorted(set(found)) == ["device.py"], found


def test_every_verb_with_device_says_the_same(capsys):
    from bertforge import cli

    helps = {}
    for verb in (["embed"], ["predict"], ["evaluate"], ["finetune"], ["pretrain"], ["generate"], ["serve"],
                 ["distill", "task"], ["index", "build"]):
        assert cli.main([*verb, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        helps[" ".join(verb)] = "--device DEV auto (a GPU when there is one) | cpu | cuda | cuda:N | mps" in text
    assert all(helps.values()), helps


def test_precision_names_are_one_tuple():
    from bertforge.commands import embed
    from bertforge.model import encoder

    assert encoder.PRECISIONS is embed.PRECISIONS is dev.PRECISIONS == ("fp32", "bf16", "fp16", "int8")
    assert dev.TRAINING_PRECISIONS == ("fp32", "bf16")


# ---- bad input: one line ------------------------------------------------------------------------------------------
def test_mps_without_mps_is_one_line():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(BertforgeError, match=r"^--device mps: MPS is not available on this machine; use --device cpu"):
        dev.resolve_device("mps")


def test_out_of_gpu_memory_is_one_line_with_the_size(monkeypatch):
    model = nn.Linear(1024, 1024)  # 4 MiB of weights + bias

    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 MiB")
    monkeypatch.setattr(model, "to", oom)
    with pytest.raises(BertforgeError) as err:
        dev.move_model(model, torch.device("cpu"), "--model M")
    line = str(err.value)
    assert "\n" not in line and line.startswith("--model M: out of GPU memory")
    assert f"needs {(1024 * 1024 + 1024) * 4 / 2**30:.2f} GiB" in line


def test_training_oom_is_one_line(tmp_path, monkeypatch, cfg):
    from bertforge.training import ResumableLoader, TrainConfig, Trainer

    class Huge(TinyMLM):
        def forward(self, **batch):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    model = Huge(cfg)
    config = TrainConfig(out_dir=tmp_path, lr=1e-3, max_steps=2, progress=False, plot=False, device="cpu", prefetch=0)
    with pytest.raises(BertforgeError, match=r"^training step 1: out of GPU memory on cpu \(the model alone needs "):
        Trainer(model, ResumableLoader(_batches(cfg), batch_size=4, seed=1), config).train()


def test_tf32_and_compile_defaults_per_device():
    assert dev.configure_matmul(torch.device("cpu")) == ""
    assert dev.compile_by_default(torch.device("cpu"), None) is False
    assert dev.compile_by_default(torch.device("cuda"), None) is True
    assert dev.compile_by_default(torch.device("cuda"), False) is False
    assert dev.compile_by_default(torch.device("cpu"), True) is True
    if torch.cuda.is_available():
        assert "TF32" in dev.configure_matmul(torch.device("cuda"))
        assert torch.get_float32_matmul_precision() == "high"
