"""Each decision once per call: on `embed`'s and `distill task`'s paths (the command line and the Python API) a
model name is resolved to a folder once per model, and the device resolved and the precision checked once, before
any data is read. Counted by wrapping the one resolver of each (`io.hub.resolve_model_path`,
`device.resolve_device`, `device.check_precision`) wherever a module holds it."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

import bertforge
from bertforge import cli

WORDS = "good great fine bad awful poor the a film movie plot was is very".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A tiny BERT, a classifier made from it (the teacher), a folder of splits and texts to embed."""
    from bertforge.config import preset
    from bertforge.model.heads import MaskedLM
    from bertforge.tasks.models import init_from_pretrained, save_task_model
    from bertforge.tokenization import Tokenizer

    d = tmp_path_factory.mktemp("once")
    rng = random.Random(0)
    docs = [" ".join(rng.choices(WORDS, k=8)) for _ in range(60)]
    tok = Tokenizer.train(docs, vocab_size=60, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2, max_position_embeddings=64)
    torch.manual_seed(0)
    MaskedLM(cfg).save_pretrained(d / "mlm", tokenizer=tok)
    clf, _ = init_from_pretrained(d / "mlm", "classify", 2)
    save_task_model(clf, d / "clf", ["0", "1"], {"name": "sst2", "max_seq_len": 32}, tokenizer=tok)
    (d / "sst").mkdir()
    for split, n in (("train", 32), ("dev", 16)):
        rows = ["sentence\tlabel"] + [f"{docs[i]}\t{i % 2}" for i in range(n)]
        (d / "sst" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (d / "texts.txt").write_text("\n".join(docs[:5]) + "\n", encoding="utf-8")
    return {"dir": d, "mlm": d / "mlm", "clf": d / "clf", "sst": d / "sst", "texts": d / "texts.txt"}


@pytest.fixture
def counts(monkeypatch) -> dict[str, list]:
    """{name: [calls]} of the model-name resolver and the device / precision checks, every module's reference to
    each wrapped; 'read' records when the data was first read (the number of device checks done by then)."""
    import bertforge.device as device
    import bertforge.io.hub as hub
    import bertforge.io.tables as tables

    seen: dict[str, list] = {"resolve_model_path": [], "resolve_device": [], "check_precision": [], "read": []}

    def counting(name, original, record=None):
        def wrapper(*args, **kwargs):
            seen[name].append(args[:1] if record is None else record())
            return original(*args, **kwargs)
        return wrapper

    originals = {"resolve_model_path": hub.resolve_model_path, "resolve_device": device.resolve_device,
                 "check_precision": device.check_precision}
    wrapped = {name: counting(name, fn) for name, fn in originals.items()}
    for module in [m for n, m in sys.modules.items() if n.startswith("bertforge") and m is not None]:
        for name, fn in originals.items():
            if getattr(module, name, None) is fn:
                monkeypatch.setattr(module, name, wrapped[name])
    devices_so_far = lambda: len(seen["resolve_device"]) + len(seen["check_precision"])  # noqa: E731
    read, reading = tables.open_table, counting("read", tables.open_table, devices_so_far)
    for module in [m for n, m in sys.modules.items() if n.startswith("bertforge") and m is not None]:
        if getattr(module, "open_table", None) is read:
            monkeypatch.setattr(module, "open_table", reading)
    return seen


def _summary(seen: dict[str, list]) -> dict[str, int]:
    return {k: len(v) for k, v in seen.items() if k != "read"}


def test_embed_resolves_the_model_once_and_checks_the_device_once(tiny, counts, capsys, tmp_path):
    bertforge.embed(str(tiny["mlm"]), [" ".join(WORDS[:4])])
    assert _summary(counts) == {"resolve_model_path": 1, "resolve_device": 1, "check_precision": 1}, counts
    for k in counts:
        counts[k].clear()
    assert cli.main(["embed", "--model", str(tiny["mlm"]), "--input", str(tiny["texts"]),
                     "--out", str(tmp_path / "v.npy")]) == 0
    assert _summary(counts) == {"resolve_model_path": 1, "resolve_device": 1, "check_precision": 1}, counts


def test_distill_task_resolves_each_model_once_and_checks_the_device_before_reading(tiny, counts, capsys, tmp_path):
    bertforge.distill(str(tiny["clf"]), str(tiny["sst"]), task="sst2", out=tmp_path / "api", student="layers:1",
                      max_steps=1, batch_size=8, progress=False, precision="fp32")
    assert _summary(counts) == {"resolve_model_path": 1, "resolve_device": 1, "check_precision": 1}, counts
    assert counts["read"] and counts["read"][0] == 2, "the device was checked after the data was read"
    for k in counts:
        counts[k].clear()
    assert cli.main(["distill", "task", "--teacher", str(tiny["clf"]), "--task", "sst2", "--data", str(tiny["sst"]),
                     "--out", str(tmp_path / "cli"), "--student", "layers:1", "--max-steps", "1",
                     "--batch-size", "8", "--precision", "fp32"]) == 0
    assert _summary(counts) == {"resolve_model_path": 1, "resolve_device": 1, "check_precision": 1}, counts
    assert counts["read"] and counts["read"][0] == 2
