"""Distillation: the losses against hand computations, the teacher cache, task distillation into a layer-dropped
transformer and a BiLSTM (loss falls, `predict` / `evaluate` load the result), general distillation (loads in
transformers), and the one-line errors for a teacher of another task and a student with another vocabulary."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from bertforge.model.checkpoint import save_pretrained
from bertforge.config import preset
from bertforge.model.bilstm import augment
from bertforge.distillation.losses import TeacherCache, cosine_loss, kd_loss, logit_mse
from bertforge.distillation.task import TaskDistillConfig, distill_task, pick_layers
from bertforge.errors import BertforgeError
from bertforge.model.heads import MaskedLM
from bertforge.model import Encoder
from bertforge.tasks.config import FinetuneConfig
from bertforge.tasks.finetune import evaluate_model
from bertforge.tasks.models import init_from_pretrained, load_task_model, save_task_model
from bertforge.tasks.predict import predict
from bertforge.tokenization import Tokenizer
from test_finetune_cli import NAMES, NEG, PLACES, POS, FILLER, one_line_error, run, write_sst


# ---- losses ---------------------------------------------------------------------------------------------------------
def test_kd_loss_is_kl_at_temperature_times_t_squared():
    s, t, T = torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([[0.2, 3.0, -1.0]]), 2.0
    p_t = [math.exp(x / T) for x in t[0].tolist()]
    p_t = [x / sum(p_t) for x in p_t]
    p_s = [math.exp(x / T) for x in s[0].tolist()]
    p_s = [x / sum(p_s) for x in p_s]
    hand = sum(a * math.log(a / b) for a, b in zip(p_t, p_s)) * T * T
    assert kd_loss(s, t, T).item() == pytest.approx(hand, rel=1e-5)
    assert kd_loss(t, t, T).item() == pytest.approx(0.0, abs=1e-6)
    # masked rows (padding when tagging) do not count
    s2, t2 = torch.cat([s, torch.zeros(1, 3)]), torch.cat([t, torch.tensor([[9.0, -9.0, 0.0]])])
    assert kd_loss(s2, t2, T, mask=torch.tensor([True, False])).item() == pytest.approx(hand, rel=1e-5)


def test_cosine_and_mse_losses():
    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    b = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [-1.0, 2.0]]])
    # token 0: cos 1 -> 0; token 1: cos 0 -> 1; token 2 is padding
    assert cosine_loss(a, b, torch.tensor([[1, 1, 0]])).item() == pytest.approx(0.5)
    assert logit_mse(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 0.0])).item() == pytest.approx(5.0)


def test_teacher_cache_runs_the_teacher_once_per_unique_input():
    calls: list[list[int]] = []

    def fn(indices):
        calls.append(list(indices))
        return [torch.tensor([float(i)]) for i in indices]

    cache = TeacherCache(fn)
    assert [x.item() for x in cache.get([0, 1, 1], [0, 1, 1])] == [0.0, 1.0, 1.0]
    for _ in range(3):  # later epochs: all hits
        cache.get([1, 0], [1, 0])
    cache.get([2, 0], [2, 0])
    assert calls == [[0, 1], [2]] and cache.computed == 3


def test_teacher_cache_with_blocks_computes_a_missing_rows_whole_block():
    calls: list[list[int]] = []

    def fn(indices):
        calls.append(list(indices))
        return [torch.tensor([float(i)]) for i in indices]

    cache = TeacherCache(fn, total=6, blocks=[[4, 1], [0, 5], [3, 2]])
    assert [x.item() for x in cache.get([5, 4], [5, 4])] == [5.0, 4.0]
    cache.get([1, 0, 3], [1, 0, 3])
    assert calls == [[4, 1], [0, 5], [3, 2]] and cache.computed == 6


def test_task_distillation_computes_the_teacher_for_the_rows_it_trains_on(tiny, tmp_path):
    """The first epoch's batches are the teacher's blocks: N steps cost the teacher N x batch rows (fixed blocks
    of 128 rows cost up to batch x 128 for each shuffled batch)."""
    record = distill_task(TaskDistillConfig(teacher=tiny["teacher"], task="sst2", data=tiny["data"],
                                            out=tmp_path / "s", student="layers:2", max_steps=3, batch_size=8))
    assert record["train_examples"] == 96 and record["steps"] == 3
    assert record["teacher_rows_computed"] == 3 * 8 and record["teacher_batches"] == 3


def test_pick_layers_takes_every_other_layer():
    assert pick_layers(6, 3) == [0, 2, 4] and pick_layers(12, 6) == [0, 2, 4, 6, 8, 10] and pick_layers(4, 4) == [0, 1, 2, 3]
    with pytest.raises(BertforgeError, match="layers:7"):
        pick_layers(6, 7)


def test_augment_masks_and_samples_ngrams():
    row = {"input_ids": torch.tensor([101, 5, 6, 7, 8, 102]), "attention_mask": torch.ones(6, dtype=torch.long),
           "token_type_ids": torch.zeros(6, dtype=torch.long)}
    out = augment([row], 30, mask_id=103, special_ids={101, 102, 103}, p_mask=0.3, p_ng=0.5, seed=0)
    assert out and all(r["input_ids"][0] == 101 and r["input_ids"][-1] == 102 for r in out)
    assert any((r["input_ids"] == 103).any() for r in out)  # masked pieces
    assert any(len(r["input_ids"]) < 6 for r in out)  # n-grams
    keys = [r["input_ids"].numpy().tobytes() for r in out]
    assert len(set(keys)) == len(keys) and row["input_ids"].numpy().tobytes() not in keys


# ---- task distillation ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A 4-layer tiny BERT, a teacher fine-tuned (briefly) from it on a toy SST-2, and the data."""
    d = tmp_path_factory.mktemp("distill")
    rng = random.Random(0)
    vocab = POS + NEG + FILLER + NAMES + PLACES
    (d / "corpus.txt").write_text("\n".join(" ".join(rng.choices(vocab, k=10)) for _ in range(400)), encoding="utf-8")
    tok = Tokenizer.train((d / "corpus.txt").read_text().splitlines(), vocab_size=120, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=4)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "base", cfg, tokenizer=tok)
    data = write_sst(d / "sst", 96, 32)
    teacher, _ = init_from_pretrained(d / "base", "classify", 2)
    save_task_model(teacher, d / "teacher", ["0", "1"], {"name": "sst2", "max_seq_len": 64}, tokenizer=tok)
    return {"dir": d, "base": d / "base", "teacher": d / "teacher", "data": data, "corpus": d / "corpus.txt"}


def _losses(out: Path, key: str = "loss") -> list[float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in lines if r.get("split") != "eval" and key in r]


@pytest.mark.parametrize("student", ["layers:2", "bilstm"])
def test_task_distillation_loss_falls_and_predict_evaluate_load_it(tiny, tmp_path, student):
    out = tmp_path / "student"
    record = distill_task(TaskDistillConfig(teacher=tiny["teacher"], task="sst2", data=tiny["data"], out=out,
                                            student=student, alpha=1.0, epochs=6, batch_size=16, lr=3e-3,
                                            augment=2 if student == "bilstm" else 0, bilstm_hidden=32))
    losses = _losses(out)
    assert losses[-1] < 0.5 * losses[0], losses
    # the teacher ran once per unique training input, not once per epoch
    assert record["teacher_rows_computed"] == record["train_examples"] + record["augmented_examples"]
    model, task, labels = load_task_model(out)
    assert labels == ["0", "1"] and task["distilled_from"] == str(tiny["teacher"])
    if student == "layers:2":
        assert model.config.num_hidden_layers == 2
    metrics = evaluate_model(out, FinetuneConfig(task="sst2", model=out, out=out, data=tiny["data"], progress=False))
    assert 0.0 <= metrics["accuracy"] <= 1.0
    (tmp_path / "in.txt").write_text("good movie\nawful film\n", encoding="utf-8")
    preds = predict(out, tmp_path / "in.txt", progress=False)
    assert [p["label"] in ("0", "1") for p in preds] == [True, True]


def test_the_teachers_config_json_is_read_once(tiny, tmp_path, monkeypatch):
    """`distill task` opens its teacher folder once (model.folder.ModelFolder): config.json is read one time on
    the way from the command to the loaded weights, however many parts (task record, labels, tokenizer check,
    model config, int8 / ONNX decision) use it."""
    import builtins
    import pathlib

    config = (tiny["teacher"] / "config.json").resolve()
    reads: list[str] = []
    originals = {name: getattr(pathlib.Path, name) for name in ("read_text", "read_bytes")}

    def counting(name):
        def read(self, *args, **kwargs):
            if self.resolve() == config:
                reads.append(name)
            return originals[name](self, *args, **kwargs)
        return read

    for name in originals:
        monkeypatch.setattr(pathlib.Path, name, counting(name))
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, pathlib.Path)) and pathlib.Path(file).resolve() == config:
            reads.append("open")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    distill_task(TaskDistillConfig(teacher=tiny["teacher"], task="sst2", data=tiny["data"], out=tmp_path / "s",
                                   student="layers:2", max_steps=1, batch_size=16, progress=False))
    assert len(reads) == 1, reads


@pytest.mark.parametrize("kind", ["classify", "tag"])
def test_bilstm_rows_give_the_same_outputs_alone_and_padded_in_a_batch(kind):
    from bertforge.model.bilstm import BiLSTMConfig, BiLSTMStudent

    torch.manual_seed(0)
    model = BiLSTMStudent(BiLSTMConfig(vocab_size=50, embedding_dim=16, hidden_size=8, mlp_size=12, num_labels=3,
                                       kind=kind, pad_token_id=0)).eval()
    rows = [[5, 6, 7, 8, 9], [10, 11, 12], [13]]
    ids = torch.tensor([r + [0] * (5 - len(r)) for r in rows])
    batch = model(ids, (ids != 0).long())["logits"]  # padded: the packed path
    for i, r in enumerate(rows):
        alone = model(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))["logits"]  # unpadded: no packing
        want = batch[i, :len(r)] if kind == "tag" else batch[i]
        torch.testing.assert_close(alone[0], want, atol=1e-6, rtol=1e-5)


def test_layer_student_starts_as_the_teachers_layers(tiny):
    from bertforge.distillation.task import layer_student

    teacher, _, _ = load_task_model(tiny["teacher"])
    student = layer_student(teacher, "classify", 2, 2)
    t, s = teacher.state_dict(), student.state_dict()
    assert torch.equal(s["bert.encoder.layer.1.output.dense.weight"], t["bert.encoder.layer.2.output.dense.weight"])
    assert torch.equal(s["classifier.weight"], t["classifier.weight"])


def test_teacher_of_another_task_and_other_vocabulary_are_one_line(tiny, tmp_path):
    proc = run("distill", "task", "--teacher", tiny["teacher"], "--task", "cola", "--data", tiny["data"],
               "--out", tmp_path / "o1", "--student", "layers:2")
    one_line_error(proc, "fine-tuned for sst2", "cola")
    assert not (tmp_path / "o1").exists()
    # a student encoder with another vocabulary
    other = tmp_path / "other"
    (tmp_path / "c.txt").write_text("zebra quantum xylophone " * 50, encoding="utf-8")
    tok = Tokenizer.train((tmp_path / "c.txt").read_text().splitlines(), vocab_size=60, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2)
    save_pretrained(Encoder(cfg), other, cfg, tokenizer=tok)
    proc = run("distill", "task", "--teacher", tiny["teacher"], "--task", "sst2", "--data", tiny["data"],
               "--out", tmp_path / "o2", "--student", other)
    one_line_error(proc, "vocabulary", str(other))
    assert not (tmp_path / "o2").exists()


# ---- general distillation -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlm_teacher(tiny) -> Path:
    tok = Tokenizer.from_pretrained(tiny["base"])
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=4)
    torch.manual_seed(1)
    out = tiny["dir"] / "mlm"
    MaskedLM(cfg).save_pretrained(out, tokenizer=tok)
    return out


def test_general_distillation_loss_falls_and_loads_in_transformers(tiny, mlm_teacher, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "student"
    proc = run("distill", "general", "--teacher", mlm_teacher, "--corpus", tiny["corpus"], "--out", out,
               "--max-steps", "30", "--seq-len", "32", "--batch-size", "16", "--lr", "2e-3", "--random-init",
               "--alpha-mlm", "0")  # a random student: the soft targets alone must teach it
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout[proc.stdout.index("{\n"):])
    assert record["student_layers"] == 2 and record["steps"] == 30
    ce, cos = _losses(out, "ce_loss"), _losses(out, "cos_loss")
    assert ce[-1] < 0.7 * ce[0] and cos[-1] < 0.7 * cos[0], (ce, cos)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert type(hf).__name__ == "DistilBertForMaskedLM" and hf.config.n_layers == 2
    ours = MaskedLM.from_pretrained(out)
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids).logits, ours(ids), atol=1e-4)


def test_general_distillation_bad_inputs_are_one_line(tiny, mlm_teacher, tmp_path):
    other = tmp_path / "other"
    (tmp_path / "c.txt").write_text("zebra quantum xylophone " * 50, encoding="utf-8")
    tok = Tokenizer.train((tmp_path / "c.txt").read_text().splitlines(), vocab_size=60, min_frequency=1)
    MaskedLM(preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2)).save_pretrained(other, tokenizer=tok)
    proc = run("distill", "general", "--teacher", mlm_teacher, "--corpus", tiny["corpus"], "--out", tmp_path / "o",
               "--max-steps", "2", "--student-init", other)
    one_line_error(proc, "vocabulary")
    proc = run("distill", "general", "--teacher", tiny["dir"], "--corpus", tiny["corpus"], "--out", tmp_path / "o",
               "--max-steps", "2")
    one_line_error(proc, "no config.json")
    assert not (tmp_path / "o").exists()


def test_general_distillation_holds_out_a_corpus_of_its_own_and_trains_in_the_default_precision(
        tiny, mlm_teacher, tmp_path):
    from bertforge.distillation.general import GeneralDistillConfig, distill_general, pack_corpus
    from bertforge.device import default_precision

    held = tmp_path / "held.txt"
    held.write_text("\n".join(tiny["corpus"].read_text().splitlines()[:40]), encoding="utf-8")
    tok = Tokenizer.from_pretrained(mlm_teacher)
    kw = dict(teacher=mlm_teacher, corpus=[str(tiny["corpus"])], max_steps=2, seq_len=32, batch_size=8)
    record = distill_general(GeneralDistillConfig(out=tmp_path / "a", heldout_corpus=[str(held)], **kw))
    # every corpus block trains; the held-out blocks are the held-out file's
    assert record["train_blocks"] == len(pack_corpus([str(tiny["corpus"])], tok, 32))
    assert record["heldout_blocks"] == len(pack_corpus([str(held)], tok, 32)) > 1
    assert record["precision"] == default_precision("cpu")
    record = distill_general(GeneralDistillConfig(out=tmp_path / "b", precision="fp32", **kw))
    assert record["precision"] == "fp32"
    assert record["heldout_blocks"] == int(len(pack_corpus([str(tiny["corpus"])], tok, 32)) * 0.05)
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    proc = run("distill", "general", "--teacher", mlm_teacher, "--corpus", tiny["corpus"], "--out", tmp_path / "c",
               "--max-steps", "2", "--heldout-corpus", tmp_path / "empty.txt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr  # a warning for the file, then one error line
    assert "no usable text" in proc.stderr.splitlines()[-1] and "empty.txt" in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "c").exists()
    for field, flag in (("precision", "--precision"), ("teacher_precision", "--teacher-precision")):
        with pytest.raises(BertforgeError, match=f"{flag} 'fp16': expected one of fp32, bf16"):
            distill_general(GeneralDistillConfig(out=tmp_path / "d", **{field: "fp16"}, **kw))
    assert not (tmp_path / "d").exists()


# ---- resume ---------------------------------------------------------------------------------------------------------
class _Crash(Exception):
    pass


def _crash_at(monkeypatch, cls: type, call: int) -> None:
    """Make cls.forward raise on its `call`-th training call: an interrupted run."""
    forward, count = cls.forward, [0]

    def crashing(self, *args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise _Crash
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", crashing)


def test_interrupted_distillation_resumes_to_the_uninterrupted_result(tiny, mlm_teacher, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from bertforge.distillation.general import GeneralDistillConfig, GeneralDistiller, distill_general
    from bertforge.distillation.task import Distiller

    task = dict(teacher=tiny["teacher"], task="sst2", data=tiny["data"], student="layers:2", max_steps=6,
                save_every=2, batch_size=16, lr=1e-3)
    general = dict(teacher=mlm_teacher, corpus=[str(tiny["corpus"])], max_steps=6, save_every=2, seq_len=32,
                   batch_size=8, lr=1e-3)
    for cls, run_fn, config, kw in ((Distiller, distill_task, TaskDistillConfig, task),
                                    (GeneralDistiller, distill_general, GeneralDistillConfig, general)):
        whole = run_fn(config(out=tmp_path / f"{cls.__name__}-whole", **kw))
        broken = tmp_path / f"{cls.__name__}-broken"
        with monkeypatch.context() as m:
            _crash_at(m, cls, 5)  # during step 5: the latest checkpoint is step 4
            with pytest.raises(_Crash):
                run_fn(config(out=broken, **kw))
        resumed = run_fn(config(out=broken, resume=True, **kw))
        assert resumed["steps"] == whole["steps"] == 6
        a = load_file(str(tmp_path / f"{cls.__name__}-whole" / "model.safetensors"))
        b = load_file(str(broken / "model.safetensors"))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(b[k], a[k]), k  # bit for bit
        # and so are the records: the teacher's logits do not depend on which batch asked for them first
        whole_metrics = (tmp_path / f"{cls.__name__}-whole" / "metrics.jsonl").read_text()
        assert (broken / "metrics.jsonl").read_text() == whole_metrics, cls.__name__
        with pytest.raises(BertforgeError, match="nothing to resume"):  # a finished run
            run_fn(config(out=broken, resume=True, **kw))


def test_a_resumed_task_distillation_logs_the_uninterrupted_metrics_bit_for_bit(tiny, tmp_path, monkeypatch):
    """Killed in the second epoch and resumed: the resumed run's teacher cache starts empty, so rows the
    uninterrupted run computed in their first-epoch batches are computed again, in other company. BLAS kernels may
    round differently for another batch shape; here the teacher's logits are made to depend on the batch's padded
    width on purpose (scaled by 1 + 1e-6 per token), as such kernels can. Fixed blocks of rows make the logits, and so
    metrics.jsonl, the same bit for bit."""
    import bertforge.distillation.task as distill_module
    from bertforge.distillation.task import Distiller
    from bertforge.tasks.batching import row_length

    rng = random.Random(3)
    vocab = POS + NEG + FILLER
    data = tmp_path / "sst"
    data.mkdir()
    for name, n in (("train", 64), ("dev", 16)):  # lengths 2..30 words: batches pad to different widths
        rows = [f"{' '.join(rng.choices(vocab, k=rng.randint(2, 30)))}\t{rng.randint(0, 1)}" for _ in range(n)]
        (data / f"{name}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    forward_rows = distill_module.forward_rows

    def shape_dependent(model, rows, *args, **kwargs):
        width = max(row_length(r) for r in rows)
        return [{k: v * (1 + 1e-6 * width) for k, v in out.items()}
                for out in forward_rows(model, rows, *args, **kwargs)]

    monkeypatch.setattr(distill_module, "forward_rows", shape_dependent)
    monkeypatch.setattr(distill_module, "TEACHER_BLOCK", 32)  # two blocks of the 64 rows
    kw = dict(teacher=tiny["teacher"], task="sst2", data=data, student="layers:2", max_steps=12, save_every=2,
              batch_size=8, lr=1e-3)
    distill_task(TaskDistillConfig(out=tmp_path / "whole", **kw))
    with monkeypatch.context() as m:
        _crash_at(m, Distiller, 11)  # step 11 of 12, the second epoch (8 steps each): the latest checkpoint is 10
        with pytest.raises(_Crash):
            distill_task(TaskDistillConfig(out=tmp_path / "broken", **kw))
    distill_task(TaskDistillConfig(out=tmp_path / "broken", resume=True, **kw))
    whole = (tmp_path / "whole" / "metrics.jsonl").read_text()
    assert "soft_loss" in whole and (tmp_path / "broken" / "metrics.jsonl").read_text() == whole
