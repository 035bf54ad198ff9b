"""Question files of the open-domain QA benchmarks, read into one shape: `Question(qid, question, answers, match)`.

Layouts (`FORMATS`; found from the file, or named):
- "nq-open": JSON Lines `{"question": ..., "answer": [...]}`, as ORQA and DPR release NQ-open (and DrQA's "Format A"
  .txt files: the same objects, one a line);
- "webquestions": the original JSON list `[{"utterance": ..., "targetValue": "(list (description X) (description
  \"Y Z\"))", ...}]` (the answers are the descriptions), or JSON Lines `{"question": ..., "answers": [...]}`;
- "curatedtrec": tab-separated `question<TAB>pattern` lines (DrQA's release; the answer is a regular expression),
  or, named, JSON Lines `{"question", "answer": [patterns]}` (DrQA's Format A files);
- "dpr-csv": DPR's `question<TAB>["a", "b"]` lines (a list literal; nq-test.csv, trec-test.csv, ...);
- "squad": a SQuAD v1.1 JSON file (every question with its gold answers).
Answers of "curatedtrec" are matched as patterns ("regex"), every other layout's as strings; `match` overrides it
(DPR scores its trec-test.csv with regex). A question with no answers is kept: the scorer reports it. An id field
("id", "qid", "question_id") is kept; otherwise a question is named FILE:LINE (or FILE row N).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io.read import jsonl_rows, require_file, text_lines, tsv_rows, where
from bertforge.io.tables import file_format, json_document
from bertforge.retrieval.metrics import MATCHES, REGEX, STRING

FORMATS = ("nq-open", "webquestions", "curatedtrec", "dpr-csv", "squad")
ID_FIELDS = ("id", "qid", "question_id")
EXPECTED = ("NQ-open JSON Lines {question, answer: [...]}, WebQuestions (a JSON list with utterance / targetValue, "
            "or JSON Lines {question, answers: [...]}), CuratedTREC (question<TAB>pattern lines), DPR's csv "
            "(question<TAB>[\"a\", \"b\"] lines) or a SQuAD v1.1 JSON file")


@dataclass(frozen=True)
class Question:
    qid: str
    question: str
    answers: tuple[str, ...]
    match: str = STRING


@dataclass
class QuestionFile:
    """The questions of one file, its layout and how its answers are matched."""

    questions: list[Question]
    format: str
    match: str
    source: str = ""

    def __len__(self) -> int:
        return len(self.questions)


def read_questions(source: Any, format: str | None = None, match: str | None = None) -> QuestionFile:
    """The questions of file `source`: its layout found from the file unless `format` names one of `FORMATS`;
    answers matched by `match` ("string" or "regex"; default: "regex" for curatedtrec, else "string")."""
    if format is not None and format not in FORMATS:
        raise BertforgeError(f"question_format must be one of {', '.join(FORMATS)}, not {format!r}")
    if match is not None and match not in MATCHES:
        raise BertforgeError(f"match must be one of {', '.join(MATCHES)}, not {match!r}")
    p = require_file(source, "questions")
    found, rows = _layout(p, format)
    if format is not None and found != format and not (format == "curatedtrec" and found == "nq-open"):
        raise BertforgeError(f"{p}: not a {format} file: it looks like {found}")
    fmt = format or found
    how = match or (REGEX if fmt == "curatedtrec" else STRING)
    questions = [Question(qid, q, tuple(a), how) for qid, q, a in rows]
    if not questions:
        raise BertforgeError(f"{p}: no questions")
    return QuestionFile(questions, fmt, how, str(p))


def _unknown(p: Path, what: str) -> BertforgeError:
    return BertforgeError(f"{p}: not a question file ({what}); expected {EXPECTED}")


def _layout(p: Path, format: str | None) -> tuple[str, list[tuple[str, str, list[str]]]]:
    """(the layout found, its rows as (qid, question, answers))."""
    if format == "squad" or file_format(p) == "json":
        doc = json_document(p)
        if doc is not None:
            return _json_document(p, doc)
    first = next(text_lines(p), None)
    if first is None:
        raise _unknown(p, "it is empty")
    if first[1].lstrip().startswith("{"):
        return _json_lines(p)
    return _tab_lines(p)


def _json_document(p: Path, doc: Any) -> tuple[str, list]:
    from bertforge.tasks.squad import _nested_squad, read_squad

    if _nested_squad(doc):
        return "squad", [(ex.qid, ex.question, list(dict.fromkeys(a.text for a in ex.answers)))
                         for ex in read_squad(p)]
    if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "utterance" in doc[0]:
        return "webquestions", [_webquestions(f"{p.name} row {i}", obj) for i, obj in enumerate(doc)]
    if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "question" in doc[0]:
        return _records(p, ((f"{p.name} row {i}", obj) for i, obj in enumerate(doc)))
    raise _unknown(p, "a JSON document of another layout")


def _json_lines(p: Path) -> tuple[str, list]:
    return _records(p, ((where(p, n), obj) for n, obj in jsonl_rows(p)))


def _records(p: Path, objects: Iterator[tuple[str, Any]]) -> tuple[str, list]:
    """Objects with "question" and "answer" (NQ-open) or "answers" (WebQuestions' JSON Lines), or WebQuestions'
    own "utterance" / "targetValue"; the first object decides, every other must have the same fields."""
    rows, layout = [], None
    for at, obj in objects:
        if not isinstance(obj, dict):
            raise BertforgeError(f"{at}: expected a JSON object, found {type(obj).__name__}")
        if layout is None:
            layout = ("webquestions-original" if "utterance" in obj else "nq-open" if "answer" in obj
                      else "webquestions" if "answers" in obj else None)
            if layout is None or ("question" not in obj and layout != "webquestions-original"):
                raise _unknown(p, f"its first object has the fields {', '.join(map(str, obj)) or 'none'}")
        if layout == "webquestions-original":
            rows.append(_webquestions(at, obj))
            continue
        key = "answer" if layout == "nq-open" else "answers"
        if key not in obj or "question" not in obj:
            raise BertforgeError(f"{at}: missing field {'question' if 'question' not in obj else key!r} (the "
                                 f"{layout} layout: question and {key})")
        rows.append((_qid(obj, at), _question(obj["question"], at), _answer_list(obj[key], at, key)))
    if layout is None:
        raise _unknown(p, "no objects")
    return ("webquestions" if layout == "webquestions-original" else layout), rows


def _qid(obj: dict, at: str) -> str:
    found = next((obj[f] for f in ID_FIELDS if obj.get(f) not in (None, "")), None)
    return at if found is None else str(found)


def _question(text: Any, at: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise BertforgeError(f"{at}: empty question")
    return text.strip()


def _answer_list(answers: Any, at: str, field: str) -> list[str]:
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not all(isinstance(a, (str, int, float)) for a in answers):
        raise BertforgeError(f"{at}: {field!r} must be a list of strings")
    return [str(a) for a in answers]


# a (description X) or (description "X Y") item of WebQuestions' targetValue; a quoted value may hold parentheses
_DESCRIPTION = re.compile(r'\(description\s+(?:"((?:[^"\\]|\\.)*)"|([^()"]*?))\s*\)')


def webquestions_answers(target: str) -> list[str]:
    """The answers in a WebQuestions targetValue: `(list (description "Jazmyn Bieber") (description Canada))`."""
    return [(quoted if quoted is not None else bare).replace('\\"', '"').strip()
            for quoted, bare in ((m.group(1), m.group(2)) for m in _DESCRIPTION.finditer(target))]


def _webquestions(at: str, obj: Any) -> tuple[str, str, list[str]]:
    if not isinstance(obj, dict) or "utterance" not in obj or not isinstance(obj.get("targetValue"), str):
        raise BertforgeError(f"{at}: expected an object with 'utterance' and a 'targetValue' string (WebQuestions)")
    answers = webquestions_answers(obj["targetValue"])
    if obj["targetValue"].strip() and not answers:
        raise BertforgeError(f"{at}: targetValue {obj['targetValue'][:60]!r} holds no (description ...) answer")
    return _qid(obj, at), _question(obj["utterance"], at), answers


def _tab_lines(p: Path) -> tuple[str, list]:
    """question<TAB>answers lines: a list literal in the first line's second column makes the file DPR's csv (every
    line must then hold one), anything else CuratedTREC's patterns ("[0-9]+ miles" is a pattern). Quotes are
    ordinary characters (answers and patterns hold them)."""
    rows, layout = [], None
    for n, fields in tsv_rows(p):
        at = where(p, n)
        if len(fields) < 2:
            if layout is None:
                raise _unknown(p, f"line {n} has no tab")
            raise BertforgeError(f"{at}: expected question<TAB>answers, found {len(fields)} column")
        question, answer = fields[0], fields[1].strip()
        if layout is None:
            layout = "dpr-csv" if _list_literal(answer) is not None else "curatedtrec"
        if layout == "dpr-csv":
            answers = _list_literal(answer)
            if answers is None:
                raise BertforgeError(f"{at}: the answer column {answer[:60]!r} is not a list of strings, unlike "
                                     "the first line's (DPR's csv)")
        else:
            answers = [answer]
        rows.append((at, _question(question, at), answers))
    if layout is None:
        raise _unknown(p, "no lines")
    return layout, rows


def _list_literal(text: str) -> list[str] | None:
    """A list of strings written as JSON or Python (DPR writes `['a', "b's"]`), else None; a literal only, never
    code."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        answers = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    ok = isinstance(answers, list) and all(isinstance(a, (str, int, float)) for a in answers)
    return [str(a) for a in answers] if ok else None
