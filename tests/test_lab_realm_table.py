"""The lab's `realm` table (`bertforge ablate --table realm`): its arms and claims, its world built from a SQuAD
file, and a whole 1-seed, 2-step run that writes a report with a verdict per claim. A tiny SQuAD-layout file is
written here: articles of paragraphs with names and dates (salient spans) and questions answered by them."""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.lab.report import INCONCLUSIVE, PENDING
from bertforge.lab.run import LabOptions, check_options, run_lab
from bertforge.lab.tables import RETRIEVAL, RETRIEVAL_ARMS, RETRIEVAL_TASKS, TABLES, listing, tables_named

pytest.importorskip("faiss")

PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "John Napier", "Emmy Noether", "Carl Gauss"]
CITIES = ["London", "Paris", "Vienna", "Berlin", "Madrid", "Lisbon"]


def _squad(root: Path) -> Path:
    articles = []
    for a in range(2):
        paragraphs = []
        for p in range(5):
            who, city, year = PEOPLE[(a + p) % 6], CITIES[(2 * a + p) % 6], 1800 + 7 * p + a
            context = (f"{who} moved to {city} in {year}. There {who} wrote a famous treatise. "
                       f"The treatise was printed in {city} by Oxford Press.")
            qas = [{"id": f"q{a}{p}{i}", "question": q, "answers": [{"text": t, "answer_start": context.index(t)}]}
                   for i, (q, t) in enumerate(((f"Where did {who} move?", city), (f"When did {who} move?", str(year))))]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Article_{a}", "paragraphs": paragraphs})
    path = root / "squad" / "dev-v1.1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_realm_table_is_well_formed_and_listed():
    table = tables_named(["realm"])[0]
    assert table.kind == RETRIEVAL and table is TABLES["realm"]
    assert set(table.arms) == set(RETRIEVAL_ARMS) and tuple(table.tasks) == RETRIEVAL_TASKS
    pairs = {(c.a, c.b) for c in table.claims}
    assert pairs == {("realm", "realm-closed"), ("rag", "rag-closed")}  # each against its own closed-book twin
    assert {t for c in table.claims for t in c.tasks} == set(RETRIEVAL_TASKS)
    assert all(c.paper for c in table.claims)
    assert "realm-closed" in listing() and "claim: RAG answers open questions" in listing()


def test_missing_squad_file_is_one_line(tmp_path):
    opts = LabOptions(tables=["realm"], out=tmp_path / "out", data_root=tmp_path, steps=2, seeds=1, size="bert-tiny")
    with pytest.raises(BertforgeError, match="no squad/dev-v1.1.json"):
        check_options(opts)


@pytest.mark.slow
def test_a_one_seed_two_step_realm_table_reports_a_verdict_per_claim(tmp_path):
    root = _squad(tmp_path / "data")
    out = tmp_path / "lab"
    opts = LabOptions(tables=["realm"], out=out, data_root=root, steps=2, seeds=1, size="bert-tiny", seq_len=64,
                      batch_size=4, vocab_size=300, precision="fp32", threads=1, device="cpu",
                      finetune_epochs=0.2)
    rep = run_lab(opts)["realm"]
    records = [json.loads(p.read_text()) for p in (out / "results").glob("*.json")]
    assert not [r["error"] for r in records if "error" in r]
    assert {r["arm"] for r in records} == set(RETRIEVAL_ARMS)
    by_arm = {r["arm"]: r for r in records}
    # equal steps: the closed-book REALM arm trains as many steps as REALM did; the RAG twins see the same pairs
    assert by_arm["realm"]["pretrain"]["steps"] == by_arm["realm-closed"]["pretrain"]["steps"] == 2
    assert by_arm["rag"]["pretrain"]["steps"] == by_arm["rag-closed"]["pretrain"]["steps"]
    assert by_arm["realm"]["pretrain"]["k"] > 0 and by_arm["realm-closed"]["pretrain"]["k"] == 0
    for r in records:
        for task in r["tasks"].values():
            assert 0.0 <= task["score"] <= 1.0
    world = json.loads((out / "world" / "world.json").read_text())
    assert world["passages"] == 10 and world["heldout_paragraphs"] == 2  # paragraph 4 of each article held out
    assert world["n_eval_questions"] == 4 and world["n_train_questions"] == 16
    assert [c["verdict"] for c in rep["claims"]] == [INCONCLUSIVE] * 3  # one seed: no spread, never decided
    assert all(c["verdict"] != PENDING and c["why"] == "one seed: no spread measured" for c in rep["claims"])
    md = (out / "realm.md").read_text()
    assert "| realm-closed | closed book (same encoder, no retrieval) | 1 | 2 |" in md
    assert md.count("**inconclusive**") == 3 and "NQ EM 44.1 (RAG-Token)" in md
    # the same command again continues: nothing left to run, the same report
    again = run_lab(opts)["realm"]
    assert [c["a_mean"] for c in again["claims"]] == [c["a_mean"] for c in rep["claims"]]
