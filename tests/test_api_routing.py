"""What the command line used to do itself, now the public API's: `bertforge.ablate` (the arms compared, the
tables' flag checks by parameter name), `predict(..., out=FILE)` writing the JSONL the command prints, and
`Index.add` from two handles of one folder keeping both adds (the folder's lock and generation reload, now in
`retrieval.index`)."""
from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import pytest

import bertforge
from bertforge.cli import main
from bertforge.errors import BertforgeError


@pytest.mark.parametrize("kwargs, message", [
    (dict(table="bert", arms=["nsp"], downstream="d"), "^arms and table: a table fixes its arms; give one of them$"),
    (dict(table=["bert"], report_to="tensorboard", downstream="d"), "^report_to: with arms"),
    (dict(table="bert"), "^downstream: give the folder"),
])
def test_ablate_names_the_parameter_in_one_line(kwargs, message, tmp_path):
    pytest.importorskip("torch.utils.tensorboard") if kwargs.get("report_to") else None
    with pytest.raises(BertforgeError, match=message):
        bertforge.ablate(out=tmp_path / "o", **kwargs)
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_ablate_lists_what_the_command_lists():
    from bertforge.api.choices import ablation_listing

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ablate", "--list"]) == 0
    assert out.getvalue() == ablation_listing() + "\n" and "nsp" in out.getvalue()


def test_ablate_compares_the_arms_and_writes_their_table(tmp_path):
    rng = random.Random(0)
    words = "the cat dog sat ran on a mat park and was very big small red".split()
    docs = [" ".join(" ".join(rng.choices(words, k=7)).capitalize() + "." for _ in range(4)) for _ in range(60)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    result = bertforge.ablate(tmp_path / "corpus.txt", arms=["sop"], out=tmp_path / "abl", size="bert-tiny",
                              seq_len=32, batch_size=8, budget="1s", vocab_size=200)
    assert result["out"] == tmp_path / "abl"
    written = json.loads((tmp_path / "abl" / "ablation.json").read_text(encoding="utf-8"))
    assert [r["arm"] for r in result["rows"]] == ["sop"] and written["rows"] == result["rows"]
    assert all(0 <= r["heldout_mlm_acc"] <= 1 and r["steps"] > 0 for r in result["rows"])
    assert "| sop |" in (tmp_path / "abl" / "ablation.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    import torch

    from bertforge.config import preset
    from bertforge.model.heads import MaskedLM
    from bertforge.tasks.models import init_from_pretrained, save_task_model
    from bertforge.tokenization import Tokenizer

    d = tmp_path_factory.mktemp("clf")
    texts = ["a good film", "a bad film", "the plot was dull", "a great movie"] * 10
    tok = Tokenizer.train(texts, vocab_size=60, min_frequency=1)
    cfg = preset("bert-tiny", vocab_size=tok.vocab_size, num_hidden_layers=1, max_position_embeddings=32)
    torch.manual_seed(0)
    MaskedLM(cfg).save_pretrained(d / "mlm", tokenizer=tok)
    clf, _ = init_from_pretrained(d / "mlm", "classify", 2)
    save_task_model(clf, d / "clf", ["neg", "pos"], {"name": "classify", "max_seq_len": 16}, tokenizer=tok)
    (d / "in.txt").write_text("a good film\nthe plot was dull\na great movie\n", encoding="utf-8")
    return d


def test_predict_writes_the_jsonl_the_command_prints(classifier, tmp_path):
    records = bertforge.predict(classifier / "clf", classifier / "in.txt", out=tmp_path / "api.jsonl")
    lines = (tmp_path / "api.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == records and len(records) == 3
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["predict", "--model", str(classifier / "clf"), "--input", str(classifier / "in.txt"),
                     "--no-progress"]) == 0
    assert out.getvalue().splitlines() == lines
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert main(["predict", "--model", str(classifier / "clf"), "--input", str(classifier / "in.txt"),
                     "--out", str(tmp_path / "cli.jsonl"), "--no-progress"]) == 0
    assert said.getvalue() == f"3 predictions -> {tmp_path / 'cli.jsonl'}\n"
    assert (tmp_path / "cli.jsonl").read_text(encoding="utf-8").splitlines() == lines
    with pytest.raises(BertforgeError, match="is a directory"):  # before the model is loaded
        bertforge.predict(classifier / "clf", classifier / "in.txt", out=tmp_path)


def test_two_handles_of_one_index_folder_keep_both_adds(tmp_path):
    pytest.importorskip("bm25s")
    first = bertforge.Index.build(None, ["the cat sat on the mat", "a dog ran in the park"], tmp_path / "idx",
                                  method="bm25", ids=["p1", "p2"])
    second = bertforge.Index.load(tmp_path / "idx")
    assert first.add(["a red bird sang"], ids=["p3"]) == 1
    assert second.add(["the big ship sailed"], ids=["p4"]) == 1  # read before p3 was added: reloaded, p3 kept
    assert sorted(bertforge.Index.load(tmp_path / "idx").ids) == ["p1", "p2", "p3", "p4"]
    second.save()  # under the folder's lock, as its next generation
    assert bertforge.Index.load(tmp_path / "idx").search("ship", k=1)[0].id == "p4"
