"""SQuAD v1.1 / v2.0: reading, sliding-window features, span post-processing and the no-answer threshold.

Pipeline::

    examples = read_squad("dev-v1.1.json")
    train_ex, eval_ex = split_by_article(examples, 24)           # the shared data has no train file
    feats = build_squad_features(eval_ex, tokenizer)             # max_seq_length 384, doc_stride 128, query 64
    batch = feats.tensors()                                      # input_ids, token_type_ids, attention_mask,
                                                                 # start_positions, end_positions
    out = postprocess(eval_ex, feats, start_logits, end_logits, version_2=True, null_threshold=0.0)
    squad_v2_metrics(out.predictions, references(eval_ex), na_probs=out.null_diffs)   # bertforge.tasks.metrics
    tau = best_threshold(eval_ex, out)                           # then apply_threshold(out, tau)

Windows follow the original BERT ``run_squad``: the question is cut to ``max_query_length`` tokens, the
context is tokenised once with character offsets and covered by windows of the remaining length whose starts
are ``doc_stride`` tokens apart; a token's answer scores count only in the window where it has the most
context on both sides. Answer text is always cut from the original context by character offsets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.errors import BertforgeError
from bertforge.io.tables import Table, file_format, json_document, open_table, value


@dataclass
class Answer:
    text: str
    start: int  # character offset in the context

    @property
    def end(self) -> int:
        return self.start + len(self.text)


@dataclass
class SquadExample:
    """One question. ``answers`` is empty for an unanswerable (v2.0) question; ``plausible_answers`` then
    holds the annotators' distractor spans. ``article``: the article's index in its file."""

    qid: str
    question: str
    context: str
    answers: list[Answer] = field(default_factory=list)
    is_impossible: bool = False
    plausible_answers: list[Answer] = field(default_factory=list)
    title: str = ""
    article: int = 0


def read_squad(source: Any) -> list[SquadExample]:
    """Read a SQuAD v1.1 or v2.0 JSON file (``{"version", "data": [{"title", "paragraphs": [{"context",
    "qas": [{"id", "question", "answers", "is_impossible"?, "plausible_answers"?}]}]}]}``), or the Hub's flat
    rows (``id, title, context, question, answers: {"text": [...], "answer_start": [...]}``; no answers: no
    answer) in any source `bertforge.io.tables.open_table` takes.

    Every gold answer must appear in its context at ``answer_start``; otherwise a BertforgeError names the
    file and the question id."""
    data = json_document(source) if isinstance(source, (str, Path)) and file_format(source) == "json" else None
    if not _nested_squad(data):
        return _squad_rows(open_table(source))
    p = Path(source)
    out: list[SquadExample] = []
    for a, article in enumerate(data["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs", []), list):
            raise BertforgeError(f"{p.name}: article {a} is not an object with a 'paragraphs' list")
        title = article.get("title", "")
        for pi, para in enumerate(article.get("paragraphs", [])):
            where_p = f"{p.name}: article {a} ({title}) paragraph {pi}"
            if not isinstance(para, dict) or not isinstance(para.get("qas", []), list):
                raise BertforgeError(f"{where_p}: not an object with 'context' and a 'qas' list")
            context = para.get("context")
            if not isinstance(context, str) or not context.strip():
                raise BertforgeError(f"{where_p}: empty context")
            for qa in para.get("qas", []):
                if not isinstance(qa, dict):
                    raise BertforgeError(f"{where_p}: a question is not a JSON object")
                qid = str(qa.get("id", ""))
                where = f"{p.name}: question {qid or '?'} (article {a}, paragraph {pi})"
                question = qa.get("question")
                if not qid or not isinstance(question, str) or not question.strip():
                    raise BertforgeError(f"{where}: missing id or empty question")
                impossible = bool(qa.get("is_impossible", False))
                answers = [_answer(x, context, where, check=True) for x in qa.get("answers", [])]
                if impossible and answers:
                    raise BertforgeError(f"{where}: is_impossible but has answers")
                if not impossible and not answers:
                    raise BertforgeError(f"{where}: no answers and not marked is_impossible")
                plausible = [_answer(x, context, where, check=False) for x in qa.get("plausible_answers", [])]
                out.append(SquadExample(qid, question.strip(), context, answers, impossible, plausible, title, a))
    if not out:
        raise BertforgeError(f"{p.name}: no questions")
    return out


def _nested_squad(data: Any) -> bool:
    """Whether parsed JSON is SQuAD's own layout: {"data": [articles with "paragraphs"]}."""
    articles = data.get("data") if isinstance(data, dict) else None
    return isinstance(articles, list) and (not articles or isinstance(articles[0], dict) and "paragraphs" in articles[0])


def _squad_rows(table: Table) -> list[SquadExample]:
    """SQuAD as flat rows, one question each (the Hub's layout); articles are told apart by title (else context)."""
    out: list[SquadExample] = []
    articles: dict[str, int] = {}
    for n, row in enumerate(table, 1):
        where = row.where
        question, context = value(row, "question"), value(row, "context")
        if not isinstance(context, str) or not context.strip():
            raise BertforgeError(f"{where}: empty context")
        if not isinstance(question, str) or not question.strip():
            raise BertforgeError(f"{where}: empty question")
        raw = row.get("answers") or []
        if isinstance(raw, dict):  # the Hub's {"text": [...], "answer_start": [...]}
            texts, starts = raw.get("text") or [], raw.get("answer_start") or []
            if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
                raise BertforgeError(f"{where}: 'answers' needs lists 'text' and 'answer_start' of one length")
            raw = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
        if not isinstance(raw, list):
            raise BertforgeError(f"{where}: 'answers' must be a list, or {{'text': [...], 'answer_start': [...]}}")
        answers = [_answer(a if isinstance(a, dict) else {}, context, where, check=True) for a in raw]
        title = str(row.get("title") or "")
        article = articles.setdefault(title or context, len(articles))
        qid = str(row["id"]) if row.get("id") is not None else str(n)
        out.append(SquadExample(qid, question.strip(), context, answers, not answers, [], title, article))
    if not out:
        raise BertforgeError(f"{table.name}: no questions")
    return out


def _answer(obj: dict, context: str, where: str, check: bool) -> Answer:
    try:
        ans = Answer(str(obj["text"]), int(obj["answer_start"]))
    except (KeyError, TypeError, ValueError):
        raise BertforgeError(f"{where}: an answer needs 'text' and an integer 'answer_start'") from None
    if check and (not ans.text.strip() or context[ans.start : ans.end] != ans.text):
        raise BertforgeError(f"{where}: answer {ans.text!r} not found in the context at character {ans.start}")
    return ans


def split_by_article(examples: Sequence[SquadExample], num_train_articles: int) -> tuple[list, list]:
    """Split by article (no article leaks across the split): the first ``num_train_articles`` articles
    in file order for training, the rest for evaluation."""
    articles = list(dict.fromkeys(ex.article for ex in examples))
    if not 0 < num_train_articles < len(articles):
        raise BertforgeError(f"cannot put {num_train_articles} of {len(articles)} articles in the train split")
    train_ids = set(articles[:num_train_articles])
    return [ex for ex in examples if ex.article in train_ids], [ex for ex in examples if ex.article not in train_ids]


def references(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
    """Gold answer texts per question id (empty list for no-answer questions), for the SQuAD metrics."""
    return {ex.qid: [a.text for a in ex.answers] for ex in examples}


# ----------------------------------------------------------------------------------------------- features


@dataclass
class SquadFeatures:
    """One row per window. ``offsets`` [F, L, 2]: the character span in the example's context of each token,
    -1 outside the context (question, specials, padding); ``max_context`` [F, L]: whether this window is the
    token's best-centred one; ``example_index`` [F]: the example each window comes from."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    start_positions: torch.Tensor
    end_positions: torch.Tensor
    example_index: np.ndarray
    offsets: np.ndarray
    max_context: np.ndarray

    def __len__(self) -> int:
        return len(self.example_index)

    def tensors(self, labels: bool = True) -> dict[str, torch.Tensor]:
        """Model inputs (``start_positions`` / ``end_positions`` included when ``labels``)."""
        out = {"input_ids": self.input_ids, "token_type_ids": self.token_type_ids,
               "attention_mask": self.attention_mask}
        if labels:
            out.update(start_positions=self.start_positions, end_positions=self.end_positions)
        return out


def _strip_specials(enc: dict) -> list[tuple[list[int], np.ndarray]]:
    """(ids, offsets [n, 2]) of the real tokens of each encoded text (no specials, no padding)."""
    out = []
    for ids, offs, special, att in zip(enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"],
                                       enc["attention_mask"]):
        keep = [i for i in range(len(ids)) if att[i] and not special[i]]
        out.append(([ids[i] for i in keep], np.asarray([offs[i] for i in keep], dtype=np.int32).reshape(-1, 2)))
    return out


def _encode_plain(tokenizer, texts: list[str]) -> list[tuple[list[int], np.ndarray]]:
    enc = tokenizer(texts, max_length=1_000_000, padding=False, truncation=False, return_tensors=None,
                    return_offsets=True, return_special_tokens_mask=True)
    return _strip_specials(enc)


def _windows(n: int, max_len: int, stride: int) -> list[tuple[int, int]]:
    """(start, end) token windows covering n context tokens, starts ``stride`` apart (original BERT)."""
    spans, start = [], 0
    while True:
        length = min(n - start, max_len)
        spans.append((start, start + length))
        if start + length >= n:
            return spans
        start += min(length, stride)


def _best_windows(spans: list[tuple[int, int]], n: int) -> np.ndarray:
    """For each context token, the window where min(left, right context) + 0.01 * length is highest."""
    best = np.zeros(n, dtype=np.int64)
    best_score = np.full(n, -1.0)
    for w, (s, e) in enumerate(spans):
        pos = np.arange(s, e)
        score = np.minimum(pos - s, e - 1 - pos) + 0.01 * (e - s)
        better = score > best_score[s:e]  # strict: ties keep the earlier window, as the original does
        best[s:e][better] = w
        best_score[s:e][better] = score[better]
    return best


def build_squad_features(
    examples: Sequence[SquadExample],
    tokenizer,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> SquadFeatures:
    """Sliding-window features with start/end token labels.

    The label of a window is the token span of the first gold answer when the whole answer lies inside the
    window, else (and for unanswerable questions) index 0, the [CLS] token."""
    if not examples:
        raise BertforgeError("no SQuAD examples to encode")
    if doc_stride <= 0 or max_query_length <= 0:
        raise BertforgeError(f"doc_stride ({doc_stride}) and max_query_length ({max_query_length}) must be > 0")
    contexts = list(dict.fromkeys(ex.context for ex in examples))
    ctx_tok = dict(zip(contexts, _encode_plain(tokenizer, contexts)))
    q_tok = _encode_plain(tokenizer, [ex.question for ex in examples])
    n_specials = len(tokenizer.build_inputs([], [])[0])
    pad_id = tokenizer.pad_token_id

    ids_rows, type_rows, lengths, starts, ends, ex_index, off_rows, maxctx_rows = [], [], [], [], [], [], [], []
    for i, ex in enumerate(examples):
        q_ids = q_tok[i][0][:max_query_length]
        c_ids, c_offs = ctx_tok[ex.context]
        room = max_seq_length - len(q_ids) - n_specials
        if room <= 0:
            raise BertforgeError(f"max_seq_length {max_seq_length} leaves no room for the context")
        if not c_ids:
            raise BertforgeError(f"question {ex.qid}: the context has no tokens")
        spans = _windows(len(c_ids), room, doc_stride)
        best = _best_windows(spans, len(c_ids))
        tok_start = tok_end = None
        if ex.answers:
            a = ex.answers[0]
            # first token ending after the answer starts, last token starting before it ends (offsets are
            # sorted, so binary search)
            tok_start = int(np.searchsorted(c_offs[:, 1], a.start, side="right"))
            tok_end = int(np.searchsorted(c_offs[:, 0], a.end, side="left")) - 1
            if tok_start >= len(c_ids) or tok_end < 0:
                tok_start = tok_end = None
        # where the context starts inside the sequence, found with a sentinel so any special layout works
        c0 = tokenizer.build_inputs(q_ids, [-1])[0].index(-1)
        for w, (s, e) in enumerate(spans):
            window = c_ids[s:e]
            ids, types = tokenizer.build_inputs(q_ids, window)
            offs = np.full((max_seq_length, 2), -1, dtype=np.int32)
            offs[c0 : c0 + len(window)] = c_offs[s:e]
            mc = np.zeros(max_seq_length, dtype=bool)
            mc[c0 : c0 + len(window)] = best[s:e] == w
            sp = ep = 0
            if tok_start is not None and tok_end is not None and s <= tok_start <= tok_end < e:
                sp, ep = c0 + tok_start - s, c0 + tok_end - s
            pad = max_seq_length - len(ids)
            lengths.append(len(ids))
            ids_rows.append(np.asarray(ids + [pad_id] * pad, dtype=np.int64))
            type_rows.append(np.asarray(types + [0] * pad, dtype=np.int64))
            starts.append(sp)
            ends.append(ep)
            ex_index.append(i)
            off_rows.append(offs)
            maxctx_rows.append(mc)
    lengths = torch.tensor(lengths)
    return SquadFeatures(
        input_ids=torch.from_numpy(np.stack(ids_rows)),
        token_type_ids=torch.from_numpy(np.stack(type_rows)),
        attention_mask=(torch.arange(max_seq_length)[None, :] < lengths[:, None]).long(),
        start_positions=torch.tensor(starts, dtype=torch.long),
        end_positions=torch.tensor(ends, dtype=torch.long),
        example_index=np.asarray(ex_index, dtype=np.int64),
        offsets=np.stack(off_rows),
        max_context=np.stack(maxctx_rows),
    )


# ----------------------------------------------------------------------------------------------- post-processing


@dataclass
class SquadPredictions:
    """``predictions``: the answer per question ("" = no answer, v2.0 only); ``best_non_null``: the best
    span text ignoring the null option; ``null_diffs``: null score minus best span score (the v2.0
    "na_prob"; +inf when no valid span exists); ``nbest``: the top spans as {"text", "score"} dicts."""

    predictions: dict[str, str]
    best_non_null: dict[str, str]
    null_diffs: dict[str, float]
    nbest: dict[str, list[dict]]


def postprocess(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: torch.Tensor | np.ndarray,
    end_logits: torch.Tensor | np.ndarray,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_threshold: float = 0.0,
) -> SquadPredictions:
    """Best answer span per question across its windows.

    In each window the ``n_best`` highest start and end logits are paired; a pair counts when both tokens
    are context tokens, end >= start, the span has at most ``max_answer_length`` tokens and the start token
    is in its best-centred window. Span score = start logit + end logit; the text is cut from the original
    context by character offsets. v2.0: the null score is start[0] + end[0] ([CLS]), the minimum over the
    question's windows; the question gets "" when null - best span > ``null_threshold``."""
    start = np.asarray(start_logits.float().cpu() if isinstance(start_logits, torch.Tensor) else start_logits)
    end = np.asarray(end_logits.float().cpu() if isinstance(end_logits, torch.Tensor) else end_logits)
    if start.shape != end.shape or start.shape[0] != len(features):
        raise BertforgeError(f"logits {start.shape} / {end.shape} do not match {len(features)} features")
    by_example: dict[int, list[int]] = defaultdict(list)
    for f, i in enumerate(features.example_index):
        by_example[int(i)].append(f)

    out = SquadPredictions({}, {}, {}, {})
    for i, ex in enumerate(examples):
        cands: list[tuple[float, int, int]] = []
        null = np.inf
        for f in by_example.get(i, []):
            null = min(null, float(start[f, 0] + end[f, 0]))
            offs, mc = features.offsets[f], features.max_context[f]
            s_idx = np.argsort(-start[f])[:n_best]
            e_idx = np.argsort(-end[f])[:n_best]
            S, E = s_idx[:, None], e_idx[None, :]
            ok = (offs[S, 0] >= 0) & (offs[E, 0] >= 0) & (E >= S) & (E - S + 1 <= max_answer_length) & mc[S]
            for a, b in zip(*np.nonzero(ok)):
                si, ei = s_idx[a], e_idx[b]
                cands.append((float(start[f, si] + end[f, ei]), int(offs[si, 0]), int(offs[ei, 1])))
        cands.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for score, cs, ce in cands:
            text = ex.context[cs:ce]
            if text not in seen:
                seen.add(text)
                nbest.append({"text": text, "score": score, "start": cs, "end": ce})
            if len(nbest) == n_best:
                break
        best_text, best_score = (nbest[0]["text"], nbest[0]["score"]) if nbest else ("", -np.inf)
        diff = float(null - best_score) if version_2 else float("-inf")
        out.best_non_null[ex.qid] = best_text
        out.null_diffs[ex.qid] = diff
        out.nbest[ex.qid] = nbest
        out.predictions[ex.qid] = "" if version_2 and diff > null_threshold else best_text
    return out


def apply_threshold(preds: SquadPredictions, threshold: float) -> dict[str, str]:
    """Answers with a new null threshold: "" where null - best span > ``threshold``."""
    return {q: "" if preds.null_diffs[q] > threshold else t for q, t in preds.best_non_null.items()}


def best_threshold(examples: Sequence[SquadExample], preds: SquadPredictions, metric: str = "f1") -> float:
    """The null threshold that maximises ``metric`` ("f1" or "exact") on these examples, searched as the
    official v2.0 script's ``find_best_thresh`` does over the best non-null answers and the null diffs."""
    from bertforge.tasks.metrics import squad_v2_metrics

    if metric not in ("f1", "exact"):
        raise BertforgeError(f"metric must be 'f1' or 'exact', not {metric!r}")
    scores = squad_v2_metrics(preds.best_non_null, references(examples), na_probs=preds.null_diffs)
    return float(scores[f"best_{metric}_thresh"])
