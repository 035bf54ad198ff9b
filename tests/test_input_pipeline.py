"""Batches made by worker processes (issue 30): the same batches, in the same order, for 0, 1 or 2 workers, and a
resumed run continues exactly; on the real pretraining pipeline (shards, example builder, dynamic masking)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models, normalizers, pre_tokenizers, trainers

from bertforge.data import Masker, PretrainingDataset, ShardedCorpus, prepare_corpus
from bertforge.errors import BertforgeError
from bertforge.tokenization import Tokenizer
from bertforge.training import ResumableLoader
from bertforge.training.loader import WorkerBatches, batch_stream

WORDS = "time people year way day thing man world life hand part child eye woman place work week case".split()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> PretrainingDataset:
    d = tmp_path_factory.mktemp("pipe")
    rng = np.random.default_rng(1)
    docs = [" ".join(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(3, 12)))).capitalize()
                     + "." for _ in range(int(rng.integers(8, 20)))) for _ in range(120)]
    (d / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train([str(d / "c.txt")], trainers.WordPieceTrainer(
        vocab_size=80, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    prepare_corpus(d / "c.txt", Tokenizer(backend), d / "shards", shard_tokens=5_000, progress=False)
    corpus = ShardedCorpus(d / "shards")
    return PretrainingDataset(corpus, "full_sentences", Masker(corpus.vocab_size, corpus.mask_id, corpus.special_ids),
                              seq_len=32, seed=3)


def loader(ds: PretrainingDataset) -> ResumableLoader:
    return ResumableLoader(ds, 8, collate_fn=ds.collator(), seed=5, drop_last=True)


def take(ds, workers: int, n: int, state: dict | None = None) -> tuple[list, dict]:
    ld = loader(ds)
    if state is not None:
        ld.load_state_dict(state)
    stream = batch_stream(ld, 2, False, workers)
    got = [next(stream) for _ in range(n)]
    stream.close()
    return got, ld.state_dict()


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        sa == sb and ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
        for (ba, sa), (bb, sb) in zip(a, b))


def test_any_number_of_workers_gives_the_same_batches_across_epochs(dataset):
    per_epoch = len(loader(dataset))
    n = per_epoch + 3  # into the second epoch: the workers reseed the masks per epoch as the loader does
    inline, _ = take(dataset, 0, n)
    assert inline[per_epoch][1] == {"epoch": 1, "position": 1}
    assert not torch.equal(inline[0][0]["mlm_labels"], inline[per_epoch][0]["mlm_labels"])
    for workers in (1, 2):
        got, _ = take(dataset, workers, n)
        assert same(got, inline), workers


def test_resume_mid_epoch_with_workers_is_exact(dataset):
    full, _ = take(dataset, 0, 9)
    first, state = take(dataset, 2, 4)  # the workers ran ahead; close() rewinds to the batch handed out
    assert state == first[-1][1] == {"epoch": 0, "position": 4}
    rest, _ = take(dataset, 2, 5, state)
    assert same(first + rest, full)


def test_a_worker_error_is_raised_as_it_is(dataset):
    def broken(items):
        raise BertforgeError("corpus.txt:3: bad row")
    with pytest.raises(BertforgeError, match=r"^corpus.txt:3: bad row$"):
        next(WorkerBatches(ResumableLoader(list(range(8)), 2, collate_fn=broken), workers=2))
    with pytest.raises(BertforgeError, match="no batches"):
        WorkerBatches(ResumableLoader(list(range(2)), 4, drop_last=True), workers=1)


class TinyMLM(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab)

    def forward(self, input_ids, mlm_labels, **_):
        logits = self.out(torch.tanh(self.emb(input_ids)))
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), mlm_labels.flatten())}


def test_trainer_with_loader_workers_trains_the_same(dataset, tmp_path):
    import json

    from bertforge.training import TrainConfig, Trainer

    def run(name: str, workers: int) -> list[dict]:
        torch.manual_seed(0)
        cfg = TrainConfig(out_dir=tmp_path / name, lr=1e-2, max_steps=8, log_every=2, progress=False, plot=False,
                          device="cpu", loader_workers=workers)
        Trainer(TinyMLM(dataset.corpus.vocab_size), loader(dataset), cfg).train()
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    inline, workers = run("inline", 0), run("workers", 2)
    assert inline == workers and inline[-1]["loss"] < inline[0]["loss"]


def test_batch_masking_keeps_the_rule_per_row():
    from bertforge.data.masking import IGNORE_INDEX, batch_mask_rng

    masker = Masker(1000, 4, [0, 1, 2, 3], mlm_probability=0.15)
    rng = np.random.default_rng(0)
    lengths = np.array([128, 90, 7, 128] * 64)
    ids = np.zeros((len(lengths), 128), np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = np.r_[2, rng.integers(5, 1000, n - 2), 3]
    out = masker.mask_batch(ids, lengths, batch_mask_rng(0, 0, range(len(lengths))))
    chosen = out["mlm_labels"] != IGNORE_INDEX
    want = np.maximum(1, np.rint((lengths - 2) * 0.15)).astype(int)
    assert (chosen.sum(1) == want).all()  # exactly the budget per row, as the per-example masker
    assert not chosen[:, 0].any() and not chosen[np.arange(len(lengths)), lengths - 1].any()  # specials
    assert not (chosen & (np.arange(128)[None] >= lengths[:, None])).any()  # padding
    assert (out["mlm_labels"][chosen] == ids[chosen]).all() and (out["input_ids"][~chosen] == ids[~chosen]).all()
    became = out["input_ids"][chosen]
    share_mask, share_kept = (became == 4).mean(), (became == ids[chosen]).mean()
    assert abs(share_mask - 0.8) < 0.03 and 0.07 < share_kept < 0.14  # 80% [MASK], ~10% (+ random hits) kept
    again = masker.mask_batch(ids, lengths, batch_mask_rng(0, 0, range(len(lengths))))
    assert (again["input_ids"] == out["input_ids"]).all()
    other = masker.mask_batch(ids, lengths, batch_mask_rng(0, 1, range(len(lengths))))
    assert (other["mlm_labels"] != out["mlm_labels"]).any()  # a new epoch, new masks


def test_prepare_uses_every_core_by_default_with_the_same_bytes(tmp_path):
    """`bertforge prepare` without --workers on a corpus big enough for workers: byte-identical to --workers 1."""
    import subprocess
    import sys

    from bertforge.data import shards

    rng = np.random.default_rng(0)
    books = tmp_path / "books"
    books.mkdir()
    for b in range(3):  # 4.5 MB: past the size where the default starts workers
        (books / f"b{b}.txt").write_text("\n\n".join(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 60))
                                                     for _ in range(5000)) + "\n")
    tok = Tokenizer.train([(books / "b0.txt").read_text()], kind="wordpiece", vocab_size=60)
    tok.save_pretrained(tmp_path / "tok")
    assert sum(f.stat().st_size for f in books.iterdir()) >= shards._PARALLEL_BYTES
    outs = {}
    for name, extra in (("one", ["--workers", "1"]), ("default", [])):
        cmd = [sys.executable, "-m", "bertforge.cli", "prepare", "--corpus", str(books), "--tokenizer",
               str(tmp_path / "tok"), "--out", str(tmp_path / name), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outs[name] = tmp_path / name
    manifest = __import__("json").loads((outs["default"] / "manifest.json").read_text())
    assert manifest["stats"]["workers"] == (__import__("os").cpu_count() or 1)
    files = sorted(p.name for p in outs["one"].iterdir() if p.name.startswith("shard_"))
    assert files and files == sorted(p.name for p in outs["default"].iterdir() if p.name.startswith("shard_"))
    for f in files:
        assert (outs["one"] / f).read_bytes() == (outs["default"] / f).read_bytes(), f


def test_tokenizer_training_with_workers_is_identical(tmp_path):
    from bertforge.tokenization import train as tokenizer_train

    texts = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(40)) for i in range(400)]
    old = tokenizer_train._SERIAL_CHUNKS, tokenizer_train._CHUNK_CHARS
    try:  # chunks of ~5 texts, one counted here: the rest of this small corpus goes to the workers
        tokenizer_train._SERIAL_CHUNKS, tokenizer_train._CHUNK_CHARS = 1, 1000
        one = Tokenizer.train(texts, kind="wordpiece", vocab_size=80, workers=1)
        two = Tokenizer.train(texts, kind="wordpiece", vocab_size=80, workers=2)
    finally:
        tokenizer_train._SERIAL_CHUNKS, tokenizer_train._CHUNK_CHARS = old
    assert one.backend.to_str() == two.backend.to_str()
