"""Pretraining example builders: how token streams become [CLS] A [SEP] (B [SEP]) sequences.

A builder first makes an `ExamplePlan` over a `ShardedCorpus`: per example a few ranges of global token offsets
(plus a sentence label), ~40 bytes per example instead of the token ids. `materialize(corpus, plan, i)` then
reads the ids from the memory-mapped shards, so a map-style dataset can index any example cheaply.

Objectives (``BUILDERS``):

* ``segment_pair``  BERT: segments of whole sentences up to a target length (short_seq_prob of the time a random
  shorter one), 50% the actual next segment, 50% a random segment of another document (the unused sentences are
  put back), pairs truncated at random from the front or back of the longer side; label 0 = IsNext, 1 = random.
  This follows Google's create_pretraining_data.py, except that a one-sentence chunk takes the next sentence
  along instead of forcing a random B (which skews Google's labels away from 50/50).
* ``sentence_pair`` single sentences as A and B, NSP labels as above.
* ``full_sentences`` RoBERTa: contiguous tokens packed to exactly seq_len, crossing documents with a separator
  at each join (only the last sequence may be shorter); no label.
* ``doc_sentences`` the same within one document (the last sequence of each document may be shorter).
* ``sop`` ALBERT: two consecutive segments of one document, swapped half the time; label 0 = in order, 1 = swapped.
* ``sentence_structure`` StructBERT's sentence-structural task: a third each B follows A (label 0), B precedes A
  (1: the two consecutive segments swapped) or B comes from another document (2).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bertforge.errors import BertforgeError


@dataclass
class ExamplePlan:
    """Examples as token ranges. Example i owns ranges ptr[i]:ptr[i+1]; each range is [start, end) in global token
    offsets, belongs to segment 0 (A) or 1 (B), and may be preceded by a separator (a document join)."""

    ptr: np.ndarray         # int64 [N + 1]
    start: np.ndarray       # int64 [R]
    end: np.ndarray         # int64 [R]
    segment: np.ndarray     # int8 [R]
    sep_before: np.ndarray  # bool [R]
    label: np.ndarray       # int8 [N]; -1 when the objective has no sentence label

    def __len__(self) -> int:
        return len(self.label)

    def lengths(self) -> np.ndarray:
        """Sequence length of every example (with [CLS] and [SEP]s), without reading any tokens."""
        per_range = (self.end - self.start) + self.sep_before
        idx = np.repeat(np.arange(len(self)), np.diff(self.ptr))
        n = np.bincount(idx, weights=per_range, minlength=len(self)).astype(np.int64)
        has_b = np.bincount(idx, weights=self.segment, minlength=len(self)) > 0
        return n + 2 + has_b

    def ranges(self, i: int) -> list[tuple[int, int, int, bool]]:
        """Example i's ranges as (start, end, segment, sep_before)."""
        a, b = self.ptr[i], self.ptr[i + 1]
        return [(int(s), int(e), int(g), bool(p)) for s, e, g, p in
                zip(self.start[a:b], self.end[a:b], self.segment[a:b], self.sep_before[a:b])]

    @staticmethod
    def concat(plans: list["ExamplePlan"]) -> "ExamplePlan":
        ptrs, shift = [np.zeros(1, np.int64)], 0
        for p in plans:
            ptrs.append(p.ptr[1:] + shift)
            shift += int(p.ptr[-1])
        cat = (lambda name: np.concatenate([getattr(p, name) for p in plans]))
        return ExamplePlan(np.concatenate(ptrs), cat("start"), cat("end"), cat("segment"), cat("sep_before"), cat("label"))


class _PlanLists:
    """Accumulates a plan in Python lists (one append per range), then freezes it into arrays."""

    def __init__(self) -> None:
        self.ptr, self.start, self.end, self.segment, self.sep, self.label = [0], [], [], [], [], []

    def add(self, ranges: list[tuple[int, int, int, bool]], label: int = -1) -> None:
        for s, e, g, p in ranges:
            self.start.append(s)
            self.end.append(e)
            self.segment.append(g)
            self.sep.append(p)
        self.ptr.append(len(self.start))
        self.label.append(label)

    def freeze(self) -> ExamplePlan:
        return ExamplePlan(np.asarray(self.ptr, np.int64), np.asarray(self.start, np.int64),
                           np.asarray(self.end, np.int64), np.asarray(self.segment, np.int8),
                           np.asarray(self.sep, bool), np.asarray(self.label, np.int8))


def _truncate_pair(a0: int, a1: int, b0: int, b1: int, max_tokens: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """Google's truncate_seq_pair on ranges: drop one token at a time from the longer side, front or back at random."""
    excess = (a1 - a0) + (b1 - b0) - max_tokens
    if excess <= 0:
        return a0, a1, b0, b1
    for front in (rng.random(excess) < 0.5).tolist():
        if a1 - a0 > b1 - b0:
            a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
        else:
            b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
    return a0, a1, b0, b1


def _other_doc(rng: np.random.Generator, n_docs: int, d: int) -> int:
    """A uniformly random document other than d."""
    r = int(rng.integers(0, n_docs - 1))
    return r + (r >= d)


class ExampleBuilder:
    """Base class: subclasses implement `plan`; `materialize` turns a planned example into arrays."""

    name = ""
    has_label = False

    def __init__(self, seq_len: int = 128):
        if seq_len < 8:
            raise BertforgeError(f"seq_len must be >= 8, got {seq_len}")
        self.seq_len = int(seq_len)

    def plan(self, corpus, rng: np.random.Generator) -> ExamplePlan:
        raise NotImplementedError

    def materialize(self, corpus, plan: ExamplePlan, i: int, words: bool = True) -> dict[str, np.ndarray]:
        """[CLS] A [SEP] (B [SEP]) with a separator at each document join inside a segment.
        Returns input_ids, token_type_ids, word_start (+ sentence_label) as numpy arrays; `words=False` leaves
        word_start out (token masking never reads it: half the shard reads of an example)."""
        cls, sep = corpus.cls_id, corpus.sep_id
        ids, ws = [np.array([cls])], [np.ones(1, np.uint8)]
        n_per_type = [1, 0]
        prev_seg = 0
        for s, e, g, p in plan.ranges(i):
            if g != prev_seg:  # A ends
                ids.append(np.array([sep]))
                ws.append(np.ones(1, np.uint8))
                n_per_type[prev_seg] += 1
                prev_seg = g
            if p:
                ids.append(np.array([sep]))
                ws.append(np.ones(1, np.uint8))
                n_per_type[g] += 1
            if e > s:
                ids.append(corpus.tokens(s, e))
                if words:
                    w = np.array(corpus.word_starts(s, e), np.uint8)
                    w[0] = 1  # a range that starts mid-word still starts a maskable unit
                    ws.append(w)
                n_per_type[g] += e - s
        ids.append(np.array([sep]))
        ws.append(np.ones(1, np.uint8))
        n_per_type[prev_seg] += 1
        out = {"input_ids": np.concatenate(ids).astype(np.int64),
               "token_type_ids": np.repeat(np.array([0, 1], np.int64), n_per_type)}
        if words:
            out["word_start"] = np.concatenate(ws)
        if self.has_label:
            out["sentence_label"] = np.int64(plan.label[i])
        return out

    def __call__(self, corpus, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Yield every example of the corpus (deterministic given the seed)."""
        plan = self.plan(corpus, plan_rng(seed, 0))
        for i in range(len(plan)):
            yield self.materialize(corpus, plan, i)


def plan_rng(seed: int, dupe: int) -> np.random.Generator:
    """The generator for building copy `dupe` of the examples (its own stream, apart from masking's)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, dupe)))


class _SegmentBuilder(ExampleBuilder):
    """Google's chunking of a document into segments of whole sentences (shared by segment-pair NSP, SOP, SSO)."""

    has_label = True
    # What B is, by label: the actual continuation, segments swapped (B precedes A), or another document's.
    relations: tuple[str, ...] = ("next", "random")

    def draw_label(self, rng: np.random.Generator) -> int:
        """A label, uniform over `relations` (two relations: 1 when u < 0.5, the stream NSP/SOP always used)."""
        u = rng.random()
        return int(u < 0.5) if len(self.relations) == 2 else min(int(u * len(self.relations)), len(self.relations) - 1)

    def __init__(self, seq_len: int = 128, short_seq_prob: float = 0.1):
        super().__init__(seq_len)
        if not 0.0 <= short_seq_prob <= 1.0:
            raise BertforgeError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
        self.short_seq_prob = short_seq_prob

    def plan(self, corpus, rng: np.random.Generator) -> ExamplePlan:
        doc_ptr, starts, ends = corpus.sentence_spans()
        n_docs = len(doc_ptr) - 1
        if "random" in self.relations and n_docs < 2:
            raise BertforgeError(f"{self.name}: needs at least 2 documents for random next segments, got {n_docs}")
        prefix = np.concatenate([[0], np.cumsum(ends - starts)])  # prefix[k] = tokens in sentences [0, k)
        doc_ptr, starts, ends, prefix = doc_ptr.tolist(), starts.tolist(), ends.tolist(), prefix
        max_tokens = self.seq_len - 3
        out = _PlanLists()
        for d in range(n_docs):
            lo, hi = doc_ptr[d], doc_ptr[d + 1]
            # As in Google's code, one target length per document; sometimes short to match fine-tuning inputs.
            target = max_tokens
            if rng.random() < self.short_seq_prob:
                target = int(rng.integers(2, max_tokens + 1))
            chunk_lo, i = lo, lo
            while i < hi:
                if i == hi - 1 or prefix[i + 1] - prefix[chunk_lo] >= target:
                    # The label is drawn first. Google forces "random" for a one-sentence chunk, which skews
                    # labels (42% IsNext on short-sentence text); here such a chunk takes the next sentence
                    # along, or at the end of a document gives no example, so both labels stay at 50%.
                    label = self.draw_label(rng)
                    relation = self.relations[label]
                    if i == chunk_lo and i + 1 < hi:
                        i += 1
                    n_chunk = i - chunk_lo + 1
                    if n_chunk >= 2:
                        a_end = chunk_lo + int(rng.integers(1, n_chunk))
                        a0, a1 = starts[chunk_lo], ends[a_end - 1]
                        if relation == "next":
                            b0, b1 = starts[a_end], ends[i]
                        elif relation == "swapped":
                            a0, a1, b0, b1 = starts[a_end], ends[i], a0, a1
                        else:
                            target_b = target - (a1 - a0)
                            r = _other_doc(rng, n_docs, d)
                            rlo, rhi = doc_ptr[r], doc_ptr[r + 1]
                            j0 = rlo + int(rng.integers(0, rhi - rlo))
                            # Sentences j0..j1 of the random document until target_b tokens are reached.
                            j1 = int(np.searchsorted(prefix, prefix[j0] + target_b, side="left")) - 1
                            j1 = min(max(j1, j0), rhi - 1)
                            b0, b1 = starts[j0], ends[j1]
                            i = a_end - 1  # put the unused sentences back: the next chunk starts at A's end
                        a0, a1, b0, b1 = _truncate_pair(a0, a1, b0, b1, max_tokens, rng)
                        out.add([(a0, a1, 0, False), (b0, b1, 1, False)], label)
                    chunk_lo = i + 1
                i += 1
        return out.freeze()


class SegmentPairNSP(_SegmentBuilder):
    name = "segment_pair"


class SOP(_SegmentBuilder):
    name = "sop"
    relations = ("next", "swapped")


class SentenceStructure(_SegmentBuilder):
    """StructBERT (Wang et al. 2020): 0 = B is A's next segment, 1 = B is A's previous one, 2 = another document's."""

    name = "sentence_structure"
    relations = ("next", "swapped", "random")


class SentencePairNSP(ExampleBuilder):
    """A = one sentence; B = the next sentence (label 0) or a random sentence of another document (label 1)."""

    name = "sentence_pair"
    has_label = True

    def plan(self, corpus, rng: np.random.Generator) -> ExamplePlan:
        doc_ptr, starts, ends = corpus.sentence_spans()
        n_docs = len(doc_ptr) - 1
        if n_docs < 2:
            raise BertforgeError(f"{self.name}: needs at least 2 documents, got {n_docs}")
        doc_ptr, starts, ends = doc_ptr.tolist(), starts.tolist(), ends.tolist()
        out = _PlanLists()
        for d in range(n_docs):
            i, hi = doc_ptr[d], doc_ptr[d + 1]
            while i < hi - 1:  # only sentences that have a successor are used as A, so labels stay balanced
                if rng.random() < 0.5:
                    b, label, step = i + 1, 0, 2
                else:
                    r = _other_doc(rng, n_docs, d)
                    b = doc_ptr[r] + int(rng.integers(0, doc_ptr[r + 1] - doc_ptr[r]))
                    label, step = 1, 1  # the real next sentence is put back
                a0, a1, b0, b1 = _truncate_pair(starts[i], ends[i], starts[b], ends[b], self.seq_len - 3, rng)
                out.add([(a0, a1, 0, False), (b0, b1, 1, False)], label)
                i += step
        return out.freeze()


class FullSentences(ExampleBuilder):
    """Contiguous tokens packed to exactly seq_len, crossing documents with a separator at each join."""

    name = "full_sentences"
    cross_documents = True

    def plan(self, corpus, rng: np.random.Generator) -> ExamplePlan:
        doc_ptr, starts, ends = corpus.sentence_spans()
        doc_start = starts[doc_ptr[:-1]].tolist()
        doc_end = ends[doc_ptr[1:] - 1].tolist()
        capacity = self.seq_len - 2  # [CLS] ... [SEP]
        out = _PlanLists()
        block: list[tuple[int, int, int, bool]] = []
        room = capacity
        for s, e in zip(doc_start, doc_end):
            if not self.cross_documents and block:
                out.add(block)
                block, room = [], capacity
            join = bool(block)  # the separator at a join takes one slot
            while s < e or join:
                take = min(room - join, e - s)
                block.append((s, s + take, 0, join))
                room -= take + join
                s, join = s + take, False
                if room == 0:
                    out.add(block)
                    block, room = [], capacity
        if block:
            out.add(block)
        return out.freeze()


class DocSentences(FullSentences):
    """Like FullSentences, but a sequence never crosses a document (the last of each document may be shorter)."""

    name = "doc_sentences"
    cross_documents = False


BUILDERS: dict[str, type[ExampleBuilder]] = {
    b.name: b for b in (SegmentPairNSP, SentencePairNSP, FullSentences, DocSentences, SOP, SentenceStructure)
}


def make_builder(name: str, seq_len: int = 128, **kwargs) -> ExampleBuilder:
    """Builder by name: segment_pair, sentence_pair, full_sentences, doc_sentences, sop, sentence_structure."""
    if name not in BUILDERS:
        raise BertforgeError(f"unknown example builder {name!r} (expected one of {', '.join(BUILDERS)})")
    cls = BUILDERS[name]
    if kwargs and not issubclass(cls, _SegmentBuilder):
        raise BertforgeError(f"builder {name!r} takes no options {sorted(kwargs)}")
    return cls(seq_len=seq_len, **kwargs)
