"""Small data: the epochs rule, the frozen-head method, mean pooling for sentence-transformers folders, and the
near-chance warning."""
from __future__ import annotations

import json
import os
import random
import warnings
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertforge.config import preset  # noqa: E402
from bertforge.errors import BertforgeError  # noqa: E402
from bertforge.model import Encoder  # noqa: E402
from bertforge.model.checkpoint import save_pretrained  # noqa: E402
from bertforge.model.heads import mean_pool  # noqa: E402
from bertforge.tasks.config import MIN_STEPS, FinetuneConfig  # noqa: E402
from bertforge.tasks.fewshot import chance_scores, fit_logistic, near_chance  # noqa: E402
from bertforge.tasks.finetune import finetune  # noqa: E402
from bertforge.tasks.models import init_from_pretrained  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

POS, NEG = ["good", "great", "fine", "superb"], ["bad", "awful", "terrible", "dull"]
FILLER = "the movie film plot actor was is very a and of in".split()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_rows(folder: Path, n_train: int, n_dev: int, random_labels: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        rng, lines = random.Random(seed), ["sentence\tlabel"]
        for _ in range(n):
            y = rng.randint(0, 1)
            words = rng.choices(FILLER, k=rng.randint(3, 8)) + [rng.choice(POS if y else NEG)]
            rng.shuffle(words)
            lines.append(f"{' '.join(words)}\t{rng.randint(0, 1) if random_labels else y}")
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random BERT (2 layers, H=64) with a WordPiece tokenizer of the synthetic vocabulary."""
    d = tmp_path_factory.mktemp("base")
    rng = random.Random(0)
    lines = [" ".join(rng.choices(POS + NEG + FILLER, k=10)) for _ in range(300)]
    tok = Tokenizer.train(lines, vocab_size=100, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=2, hidden_size=64,
                 num_attention_heads=2, intermediate_size=128)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    return d / "model"


@pytest.fixture(scope="module")
def st(base, tmp_path_factory) -> Path:
    """`base` as a sentence-transformers folder (modules.json: the Transformer at the top)."""
    import shutil

    d = tmp_path_factory.mktemp("st") / "model"
    shutil.copytree(base, d)
    (d / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                 "type": "sentence_transformers.models.Transformer"}]))
    return d


# ---- the rule ------------------------------------------------------------------------------------------------------
def test_epochs_rule_gives_small_data_at_least_min_steps():
    cfg = FinetuneConfig(task="classify", model="m", out="o")  # batch 32, no epochs given
    assert MIN_STEPS == 200
    assert cfg.plan_epochs(200) == (29.0, 3)      # 7 batches an epoch: 29 epochs = 203 steps, ~10 evaluations
    assert cfg.plan_epochs(64) == (100.0, 10)     # 2 batches an epoch
    assert cfg.plan_epochs(1000) == (7.0, 1)      # 32 batches: 224 steps
    assert cfg.plan_epochs(67349) == (3.0, 1)     # big data: the BERT paper's 3 epochs
    assert FinetuneConfig(task="classify", model="m", out="o", epochs=2).plan_epochs(64) == (2.0, 1)
    assert FinetuneConfig(task="classify", model="m", out="o", batch_size=8).plan_epochs(200) == (8.0, 1)


def test_method_is_checked():
    with pytest.raises(BertforgeError, match="unknown method 'setfits'"):
        FinetuneConfig(task="classify", model="m", out="o", method="setfits")
    with pytest.raises(BertforgeError, match="frozen-head .* not conll"):
        FinetuneConfig(task="conll", model="m", out="o", method="frozen-head")


# ---- pieces against references and hand-worked numbers --------------------------------------------------------------
def test_fit_logistic_matches_scikit_learn():
    lm = pytest.importorskip("sklearn.linear_model")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 5, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] + 0.3 * torch.randn(80, generator=g) > 0).long()
    y[:10] = 2  # three classes
    w, b = fit_logistic(x, y, 3, c=1.0)
    ref = lm.LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(x.numpy(), y.numpy())
    assert torch.allclose(w, torch.tensor(ref.coef_, dtype=torch.float32), atol=2e-4)
    # scikit-learn's intercepts are determined up to a shared constant (softmax); compare the differences
    ib = torch.tensor(ref.intercept_, dtype=torch.float32)
    assert torch.allclose(b - b.mean(), ib - ib.mean(), atol=2e-4)


def test_chance_scores_and_the_near_chance_line():
    chance = chance_scores([0, 0, 0, 1], 2)  # majority 0.75; always-0 macro-F1 = (2*.75/1.75)/2
    assert chance["accuracy"] == 0.75 and chance["macro_f1"] == pytest.approx(0.428571, abs=1e-6)
    assert chance_scores([0, 1, 2], 3)["accuracy"] == pytest.approx(1 / 3)
    assert "within 0.05 of a constant guess (0.750)" in near_chance({"accuracy": 0.79}, chance)
    assert near_chance({"accuracy": 0.81}, chance) is None
    assert "--method frozen-head" in near_chance({"accuracy": 0.5}, chance_scores([0, 1], 2))


def test_a_sentence_transformers_folder_classifies_from_the_mean(base, st):
    """Its pooler was never trained (all-MiniLM-L6-v2's is near zero): the classifier reads the mean embedding."""
    model, _ = init_from_pretrained(st, "classify", 2)
    plain, _ = init_from_pretrained(base, "classify", 2)
    assert model.bert.pooler is None and plain.bert.pooler is not None
    # saved as bertforge's class: transformers' BertForSequenceClassification would read a random pooler
    assert model.architecture == "BertforgeSequenceClassifier" and plain.architecture.endswith("Classification")
    model.eval()
    ids, mask = torch.tensor([[2, 5, 6, 7, 3, 0]]), torch.tensor([[1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        h = model.bert(ids, attention_mask=mask).last_hidden_state
        assert torch.allclose(model(ids, mask)["logits"], model.classifier(mean_pool(h, mask)), atol=1e-6)


# ---- runs ------------------------------------------------------------------------------------------------------------
def test_frozen_head_learns_and_predict_evaluate_read_its_folder(st, tmp_path):
    from bertforge.api import evaluate, predict

    data = write_rows(tmp_path / "sst", 96, 64)
    out = tmp_path / "fh"
    result = finetune(FinetuneConfig(task="classify", model=st, out=out, data=data, method="frozen-head",
                                     progress=False))
    acc = result.runs[0]["best"]["accuracy"]
    assert acc > 0.85 and result.runs[0]["steps"] == 0
    assert not (out / "checkpoints").exists() and (out / "model.safetensors").is_file()
    assert evaluate(out, data, task="classify")["accuracy"] == pytest.approx(acc, abs=1e-9)
    texts = [line.split("\t")[0] for line in (data / "dev.tsv").read_text().splitlines()[1:]]
    gold = [line.split("\t")[1] for line in (data / "dev.tsv").read_text().splitlines()[1:]]
    pred = predict(out, texts)
    assert sum(p["label"] == g for p, g in zip(pred, gold)) / len(gold) == pytest.approx(acc, abs=1e-9)


def test_defaults_train_small_data_for_min_steps_and_learn(st, tmp_path):
    data = write_rows(tmp_path / "sst", 48, 64)  # 48 rows at batch 16: 3 steps an epoch, 67 epochs by the rule
    kw = dict(task="classify", model=st, data=data, lr=1e-3, batch_size=16, progress=False,
              save_checkpoints=False, precision="fp32")
    short = finetune(FinetuneConfig(out=tmp_path / "e3", epochs=3, **kw))
    auto = finetune(FinetuneConfig(out=tmp_path / "auto", **kw))
    assert short.runs[0]["steps"] == 9 and auto.runs[0]["steps"] == 201
    evals = [json.loads(x) for x in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()
             if json.loads(x).get("split") == "eval"]
    assert 9 <= len(evals) <= 11  # about MAX_EVALS evaluations, not one per epoch
    assert auto.runs[0]["best"]["accuracy"] > 0.9 > short.runs[0]["best"]["accuracy"]


def test_a_run_near_chance_says_so(st, tmp_path):
    data = write_rows(tmp_path / "noise", 96, 256, random_labels=True)
    with pytest.warns(UserWarning, match="learned little from this data"):
        finetune(FinetuneConfig(task="classify", model=st, out=tmp_path / "x", data=data, method="frozen-head",
                                progress=False))
    learnable = write_rows(tmp_path / "sst", 96, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        finetune(FinetuneConfig(task="classify", model=st, out=tmp_path / "y", data=learnable,
                                method="frozen-head", progress=False))
