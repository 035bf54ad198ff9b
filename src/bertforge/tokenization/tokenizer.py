"""Tokenizers for the BERT family: WordPiece (BERT), byte-level BPE (RoBERTa, GPT-2, BART), Unigram (ALBERT, T5).

All the work is done by the `tokenizers` library; this module only
  * builds the pipelines the reference models use (normaliser, pre-tokenizer, model, post-processor, decoder),
  * trains them from texts, deterministically (`tokenization/train.py`; corpora are read by the caller, e.g.
    with bertforge.data.corpus.iter_texts),
  * loads them from a tokenizer.json or a BERT vocab.txt and saves them in the Hugging Face layout,
  * wraps batch encoding in the small API the rest of bertforge uses (see docs/architecture.md).

The pipelines are the ones transformers' BertTokenizerFast / RobertaTokenizerFast / AlbertTokenizerFast /
GPT2TokenizerFast / T5Tokenizer build, so a saved directory loads in `transformers.AutoTokenizer` and encodes
identically. A kind is a layout (`tokenization/pipelines.py`): the plain ones, and the families' own, named after
the family: GPT-2's byte-level BPE with one special token, <|endoftext|> (document separator, bos and eos), nothing
added around a text and no mask token (`mask_token` is None); T5's Unigram with 100 sentinels, whose cls and sep
are both </s>; DeBERTa-v2's and XLM-RoBERTa's Unigram with the mask token after the pieces, saved under the family's
tokenizer class (DebertaV2Tokenizer, XLMRobertaTokenizer), which also tells them apart on load.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE, Unigram, WordPiece

from bertforge.config.hf import read_config_json
from bertforge.errors import BertforgeError
from bertforge.io.hub import HUB_PREFIX, looks_like_hub_id, resolve_model_path
from bertforge.io.read import read_json
from bertforge.io.write import atomic_write_text
from bertforge.tokenization.pipelines import (LAYOUTS, N_SENTINELS, ROLES, SPECIAL_TOKENS, TOKENIZER_KINDS,
                                              _collapsed_whitespace_pipeline, _sentencepiece_pipeline,
                                              _wordpiece_pipeline, _json_lowercases, _MODEL_KIND,
                                              _byte_level_pipeline, _sentinel_tokens,
                                              _set_post_processor, _special_added_tokens, _token_str,
                                              _unnormalised_metaspace_pipeline, family_kind, sentinel)
from bertforge.tokenization.train import canonical_unigram, checked_texts, train_wordpiece

# A text longer than this is cut before a truncating encode (`Tokenizer.__call__`): a model reads 65536 tokens at
# most, and no token is shorter than a character, so a million characters lose nothing a model would read.
MAX_TEXT_CHARS = 1_000_000

# ----------------------------------------------------------------------------------------------- Tokenizer

class Tokenizer:
    """A `tokenizers.Tokenizer` plus its kind and special tokens, with bertforge's batch-encoding API."""

    def __init__(self, backend: Backend, kind: str | None = None, specials: dict[str, str] | None = None,
                 do_lower_case: bool | None = None, model_max_length: int = 512):
        model_type = type(backend.model).__name__
        vocab = backend.get_vocab(with_added_tokens=True)
        kind = kind or _MODEL_KIND.get(model_type)
        for name, layout in LAYOUTS.items():
            # a family's own layout of this model, told apart by a token of its own and no [CLS] / <s> of the plain
            # kind (GPT-2's <|endoftext|>, T5's sentinels)
            if (layout.marker is not None and kind == layout.model and layout.marker in vocab
                    and SPECIAL_TOKENS[kind]["cls"] not in vocab):
                kind = name
                break
        if kind not in TOKENIZER_KINDS:
            raise BertforgeError(f"unsupported tokenizer model {model_type!r} (expected WordPiece, BPE or Unigram)")
        self.kind = kind
        self.backend = backend
        # Padding / truncation are set per call, never stored in the backend (nor in a saved tokenizer.json).
        backend.no_padding()
        backend.no_truncation()
        self._lock = threading.Lock()  # guards the per-call padding/truncation state of the shared backend
        chosen = dict(SPECIAL_TOKENS[kind])
        for role, tok in (specials or {}).items():
            if tok is not None and role in chosen:
                chosen[role] = tok
        for role in ROLES:  # fall back to the other families' names (e.g. a BPE file with [CLS])
            if chosen[role] is None and SPECIAL_TOKENS[kind][role] is None:
                continue  # a role this kind does not have (GPT-2's mask)
            if chosen[role] not in vocab:
                alt = next((SPECIAL_TOKENS[k][role] for k in TOKENIZER_KINDS
                            if SPECIAL_TOKENS[k][role] is not None and SPECIAL_TOKENS[k][role] in vocab), None)
                if alt is None:
                    raise BertforgeError(f"tokenizer has no {role} token (looked for {chosen[role]!r})")
                chosen[role] = alt
        self.specials = chosen
        if do_lower_case is None:  # no config saying so: read it off the serialised normaliser
            do_lower_case = _json_lowercases(json.loads(backend.to_str()).get("normalizer"))
        self.do_lower_case = bool(do_lower_case)
        self.model_max_length = int(model_max_length)

    def __getstate__(self) -> dict:
        """What travels to worker processes (corpus preparation, DataLoader): the tokenizer.json string."""
        return {"json": self.backend.to_str(), "kind": self.kind, "specials": self.specials,
                "do_lower_case": self.do_lower_case, "model_max_length": self.model_max_length}

    def __setstate__(self, state: dict) -> None:
        self.backend = Backend.from_str(state["json"])
        self.kind, self.specials = state["kind"], dict(state["specials"])
        self.do_lower_case, self.model_max_length = state["do_lower_case"], state["model_max_length"]
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ train / load / save

    @classmethod
    def train(cls, texts: Iterable[str], kind: str = "wordpiece", vocab_size: int = 30522,
              lowercase: bool = True, min_frequency: int = 2, show_progress: bool = False,
              model_max_length: int = 512, workers: int = 1) -> "Tokenizer":
        """Train a tokenizer on texts (documents as strings: read corpus files with
        `bertforge.data.corpus.iter_texts`). The same texts and options always give the same tokenizer.

        `lowercase` applies to WordPiece and Unigram; byte-level BPE and T5 are always cased, as RoBERTa and T5
        are. T5's `vocab_size` counts its 100 sentinels.
        `min_frequency` applies to WordPiece and BPE (the Unigram trainer has none). `workers` > 1 counts the
        words of a large WordPiece corpus in that many processes (see `tokenization.train.word_counts`).
        """
        if kind not in TOKENIZER_KINDS:
            raise BertforgeError(f"unknown tokenizer kind {kind!r} (choose from {', '.join(TOKENIZER_KINDS)})")
        if isinstance(texts, (str, bytes, os.PathLike)):
            raise TypeError("Tokenizer.train takes an iterable of texts, not a single string or path")
        layout = LAYOUTS[kind]
        specials = _special_added_tokens(layout)
        if vocab_size <= len(specials) + layout.sentinels:
            raise BertforgeError(f"vocab_size {vocab_size} is too small (the {len(specials)} special tokens alone)")
        # the trainer gives the first special tokens ids 0, 1, ...; the rest follow the pieces (DeBERTa's [MASK])
        n_first = len(specials) - len(layout.after_pieces)
        first, last = specials[:n_first], specials[n_first:]
        vocab_size -= len(last)
        seen = [0]
        texts = checked_texts(texts, seen)
        lowercase = lowercase and not layout.cased
        unk = layout.specials["unk"]
        if layout.model == "wordpiece":
            backend = Backend(WordPiece(unk_token=unk, max_input_chars_per_word=100))
            _wordpiece_pipeline(backend, lowercase)
            # limit_alphabet=1000: as tokenizers' BertWordPieceTokenizer; rare characters become [UNK].
            train_wordpiece(backend, texts, vocab_size, min_frequency, first, limit_alphabet=1000,
                            show_progress=show_progress, workers=workers)
        elif layout.model == "bpe":  # the tokenizers trainer is deterministic here (see tokenization/train.py)
            backend = Backend(BPE())
            _byte_level_pipeline(backend)
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                          special_tokens=first, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                          show_progress=show_progress)
            backend.train_from_iterator(texts, trainer=trainer)
        else:
            backend = Backend(Unigram())
            if layout.collapses_whitespace:
                _collapsed_whitespace_pipeline(backend, lowercase)
            elif layout.normalise:
                _sentencepiece_pipeline(backend, lowercase)
            else:
                _unnormalised_metaspace_pipeline(backend)
            trainer = trainers.UnigramTrainer(vocab_size=vocab_size - layout.sentinels, special_tokens=first,
                                              unk_token=unk, show_progress=show_progress)
            backend.train_from_iterator(texts, trainer=trainer)
            # the last special tokens become the last pieces, as transformers' converters write them
            backend = canonical_unigram(backend, len(first), append=[t.content for t in last])
            if layout.sentinels:  # after the pieces, as in T5's vocabulary
                backend.add_special_tokens(_sentinel_tokens(layout.sentinels))
        if last:
            backend.add_special_tokens(last)
        if not seen[0]:
            raise BertforgeError("no text to train the tokenizer on")
        _set_post_processor(backend, layout, layout.specials)
        return cls(backend, kind, layout.specials, do_lower_case=lowercase, model_max_length=model_max_length)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, vocab_size: int | None = None,
                        revision: str | None = None) -> "Tokenizer":
        """Load from a directory (tokenizer.json, else vocab.txt + tokenizer_config.json), a tokenizer.json file, or
        a Hugging Face Hub model id (at `revision`; from the cache when offline).

        In a model folder the tokenizer's ids must fit the model's embedding (`vocab_size`, else config.json's):
        another model's tokenizer copied in would otherwise fail later, as an IndexError inside the embedding."""
        if revision is not None or (isinstance(path, str) and (path.startswith(HUB_PREFIX) or (
                not os.path.lexists(path) and looks_like_hub_id(path)))):
            path = resolve_model_path(path, revision, flag="")
        path = Path(path)
        tok = cls._from_files(path)
        config = path / "config.json" if path.is_dir() else path.parent / "config.json"
        vocab = vocab_size
        if vocab is None and config.is_file():
            vocab = read_config_json(config).get("vocab_size")
        if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
            top = max(tok.backend.get_vocab(with_added_tokens=True).values(), default=-1)
            if top >= vocab:
                _check_model_config(config)  # a config.json that does not describe its weights is to blame first
                raise BertforgeError(f"{path}: the tokenizer has ids up to {top} but config.json's vocab_size is "
                                     f"{vocab}: the tokenizer belongs to another model")
        return tok

    @classmethod
    def _from_files(cls, path: Path) -> "Tokenizer":
        if path.is_file():
            directory, tok_json = path.parent, path
        elif path.is_dir():
            directory, tok_json = path, path / "tokenizer.json"
        else:
            raise BertforgeError(f"tokenizer path {path} does not exist")
        config: dict = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins where both say
            if (directory / name).is_file():
                config.update(read_json(directory / name))
        specials = {role: _token_str(config.get(f"{role}_token")) for role in ROLES}
        max_len = config.get("model_max_length", 512)
        if not isinstance(max_len, int) or max_len > 1_000_000:  # transformers writes 1e30 for "unbounded"
            max_len = 512
        lower = config.get("do_lower_case")

        if tok_json.is_file():
            try:
                backend = Backend.from_file(str(tok_json))
            except Exception as err:  # the Rust side raises plain Exception on malformed files
                raise BertforgeError(f"{tok_json}: not a valid tokenizer.json ({err})") from None
            # a family's own layout, told by the class its tokenizer_config.json names (DeBERTa's, XLM-R's)
            kind = family_kind(config.get("tokenizer_class"), _MODEL_KIND.get(type(backend.model).__name__))
            try:
                return cls(backend, kind, specials, do_lower_case=lower, model_max_length=max_len)
            except BertforgeError as err:
                raise BertforgeError(f"{tok_json}: {err}") from None
        vocab_txt = directory / "vocab.txt"
        if path.is_dir() and vocab_txt.is_file():
            return cls._from_vocab_txt(vocab_txt, config, specials, max_len)
        raise BertforgeError(f"{path}: no tokenizer found (looked for tokenizer.json, then vocab.txt)")

    @classmethod
    def _from_vocab_txt(cls, vocab_txt: Path, config: dict, specials: dict, max_len: int) -> "Tokenizer":
        """The pipeline transformers' BertTokenizerFast builds from a vocab.txt."""
        with open(vocab_txt, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
        vocab: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            vocab[tok] = i  # a duplicated line keeps its last id, as in transformers' load_vocab
        if not vocab:
            raise BertforgeError(f"{vocab_txt}: empty vocabulary")
        specials = {role: specials.get(role) or SPECIAL_TOKENS["wordpiece"][role] for role in ROLES}
        for role, tok in specials.items():
            if tok not in vocab:
                raise BertforgeError(f"{vocab_txt}: {role} token {tok!r} is not in the vocabulary")
        lower = config.get("do_lower_case", True)
        backend = Backend(WordPiece(vocab, unk_token=specials["unk"], max_input_chars_per_word=100))
        _wordpiece_pipeline(backend, lowercase=bool(lower), strip_accents=config.get("strip_accents"),
                       chinese=config.get("tokenize_chinese_chars", True))
        backend.add_special_tokens([AddedToken(specials[r], special=True, normalized=False) for r in ROLES])
        _set_post_processor(backend, LAYOUTS["wordpiece"], specials)
        return cls(backend, "wordpiece", specials, do_lower_case=bool(lower), model_max_length=max_len)

    def save_pretrained(self, directory: str | os.PathLike) -> list[Path]:
        """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json (+ vocab.txt for WordPiece)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        s = self.specials
        added = {t.content: t for t in self.backend.get_added_tokens_decoder().values()}

        def token_entry(tok: str) -> str | dict:
            t = added.get(tok)
            if t is None or not (t.lstrip or t.rstrip):
                return tok
            return {"content": tok, "lstrip": t.lstrip, "rstrip": t.rstrip, "normalized": t.normalized,
                    "single_word": t.single_word, "special": True}

        layout = self.layout
        special_map: dict[str, Any] = {entry: token_entry(s[role]) for entry, role in layout.special_map
                                       if s[role] is not None}
        if layout.sentinels:
            special_map["additional_special_tokens"] = [sentinel(k) for k in range(layout.sentinels)]
        config: dict[str, Any] = {"tokenizer_class": layout.hf_class, "do_lower_case": self.do_lower_case,
                                  "model_max_length": self.model_max_length, **special_map}
        if layout.keep_accents:
            config["keep_accents"] = not self.do_lower_case
        config.update(layout.config)
        written = []
        files = {"tokenizer.json": self.backend.to_str(pretty=True),
                 "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                 "special_tokens_map.json": json.dumps(special_map, indent=2, ensure_ascii=False) + "\n"}
        if layout.model == "wordpiece":
            files["vocab.txt"] = "".join(tok + "\n" for tok in self._id_ordered_vocab())
        for name, text in files.items():
            atomic_write_text(directory / name, text)
            written.append(directory / name)
        return written

    def _id_ordered_vocab(self) -> list[str]:
        vocab = self.backend.get_vocab(with_added_tokens=True)
        ordered = [None] * len(vocab)
        for tok, i in vocab.items():
            if i >= len(ordered):
                raise BertforgeError(f"vocabulary ids are not contiguous (id {i} >= size {len(ordered)})")
            ordered[i] = tok
        return ordered

    # ------------------------------------------------------------------ properties

    @property
    def layout(self):
        """What this kind is: its special tokens, how it frames a text, its files (`families.TokenizerLayout`)."""
        return LAYOUTS[self.kind]

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    pad_token = property(lambda self: self.specials["pad"])
    unk_token = property(lambda self: self.specials["unk"])
    cls_token = property(lambda self: self.specials["cls"])
    sep_token = property(lambda self: self.specials["sep"])
    mask_token = property(lambda self: self.specials["mask"])
    pad_token_id = property(lambda self: self.backend.token_to_id(self.specials["pad"]))
    unk_token_id = property(lambda self: self.backend.token_to_id(self.specials["unk"]))
    cls_token_id = property(lambda self: self.backend.token_to_id(self.specials["cls"]))
    sep_token_id = property(lambda self: self.backend.token_to_id(self.specials["sep"]))
    mask_token_id = property(lambda self: None if self.specials["mask"] is None
                             else self.backend.token_to_id(self.specials["mask"]))

    @property
    def sentinel_ids(self) -> list[int]:
        """T5's sentinels <extra_id_0>, <extra_id_1>, ... (the ids span corruption uses); [] for other kinds."""
        ids = [self.backend.token_to_id(sentinel(k)) for k in range(N_SENTINELS)]
        return [i for i in ids if i is not None] if ids[0] is not None else []

    @property
    def special_ids(self) -> set[int]:
        ids = {self.backend.token_to_id(t) for t in self.specials.values() if t is not None}
        ids |= {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        return ids

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, lowercase={self.do_lower_case})"

    # ------------------------------------------------------------------ encoding

    def __call__(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None, max_length: int = 512,
                 padding: str | bool = "longest", truncation: bool = True, return_tensors: str | None = "pt",
                 return_offsets: bool = False, return_word_ids: bool = False,
                 return_special_tokens_mask: bool = False) -> dict:
        """Encode a batch (with special tokens). Returns input_ids, token_type_ids, attention_mask and optionally
        offset_mapping (character offsets into each original text, (0, 0) for specials), word_ids (-1 for
        specials/padding) and special_tokens_mask; lists of lists, or tensors with return_tensors="pt"."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if truncation:
            texts = [_bounded(t) for t in texts]
        if pairs is not None:
            pairs = [pairs] if isinstance(pairs, str) else list(pairs)
            if truncation:
                pairs = [_bounded(t) for t in pairs]
            if len(pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(pairs)} pairs")
            inputs: list = list(zip(texts, pairs))
        else:
            inputs = texts
        if padding not in ("longest", "max_length", False, True, None):
            raise ValueError(f"padding must be 'longest', 'max_length' or False, not {padding!r}")
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors must be 'pt' or None, not {return_tensors!r}")
        if truncation and max_length < self.backend.num_special_tokens_to_add(pairs is not None):
            # tokenizers would silently leave such a batch untruncated
            raise BertforgeError(f"max_length={max_length} leaves no room for the special tokens")
        with self._lock:  # padding/truncation are backend state: set, encode, reset
            try:
                if truncation:
                    self.backend.enable_truncation(max_length, strategy="longest_first")
                if padding:
                    self.backend.enable_padding(pad_id=self.pad_token_id, pad_token=self.pad_token,
                                                length=max_length if padding == "max_length" else None)
                encodings = self.backend.encode_batch(inputs, add_special_tokens=True)
            except Exception as err:  # e.g. max_length too small for the special tokens
                if isinstance(err, (TypeError, ValueError)):
                    raise
                raise BertforgeError(f"cannot encode batch with max_length={max_length}: {err}") from None
            finally:
                self.backend.no_truncation()
                self.backend.no_padding()
        out: dict[str, Any] = {"input_ids": [e.ids for e in encodings],
                               "token_type_ids": [e.type_ids for e in encodings],
                               "attention_mask": [e.attention_mask for e in encodings]}
        if return_offsets:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if return_word_ids:
            out["word_ids"] = [[-1 if w is None else w for w in e.word_ids] for e in encodings]
        if return_special_tokens_mask:
            out["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_tensors == "pt":
            import torch

            if len({len(ids) for ids in out["input_ids"]}) > 1:
                raise ValueError("sequences have different lengths: use padding or return_tensors=None")
            out = {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
        return out

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids without special tokens, batched in Rust (no offsets are computed: the corpus-preparation path)."""
        with self._lock:
            encodings = self.backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def encode_words(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """(ids, word_ids) without special tokens, for whole-word masking."""
        with self._lock:
            encs = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, [-1 if w is None else w for w in e.word_ids]) for e in encs]

    def build_inputs(self, ids_a: list[int], ids_b: list[int] | None = None) -> tuple[list[int], list[int]]:
        """Add the special tokens around id lists, as the post-processor does: (input_ids, token_type_ids)."""
        frame = self.layout.frame
        if frame == "none":  # as GPT-2's post-processor: nothing added
            ids = [*ids_a, *(ids_b or [])]
            return ids, [0] * len(ids)
        cls, sep = self.cls_token_id, self.sep_token_id
        if frame == "eos":  # as T5's post-processor: A </s> (B </s>)
            ids = [*ids_a, sep, *([*ids_b, sep] if ids_b is not None else [])]
            return ids, [0] * len(ids)
        ids = [cls, *ids_a, sep]
        if ids_b is None:
            return ids, [0] * len(ids)
        if frame == "double-sep":  # <s> A </s></s> B </s>, RoBERTa has no segment embeddings
            ids += [sep, *ids_b, sep]
            return ids, [0] * len(ids)
        second = [*ids_b, sep]
        return ids + second, [0] * len(ids) + [1] * len(second)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(_as_list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.backend.id_to_token(i) for i in _as_list(ids)]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)


def _bounded(text: Any) -> Any:
    """`text` cut to MAX_TEXT_CHARS before a truncating encode: no sequence a model reads (65536 tokens at most)
    needs more, and a 50 MB field would otherwise be tokenized whole (its offsets stay those of the original)."""
    return text[:MAX_TEXT_CHARS] if isinstance(text, str) and len(text) > MAX_TEXT_CHARS else text


def _as_list(ids: Any) -> list[int]:
    """Accept lists, numpy arrays and tensors of ids."""
    return ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]


def _check_model_config(config: Path) -> None:
    """Read a model folder's config.json as its model would be (the field table, the weights' shapes): a
    vocab_size the weights do not have is the config's fault, not the tokenizer's."""
    from bertforge.config.hf import check_against_weights, config_from_dict
    from bertforge.families import FAMILIES

    if not config.is_file():
        return
    d = read_config_json(config)
    if d.get("model_type") in FAMILIES:
        check_against_weights(config_from_dict(d, str(config)), config.parent / "model.safetensors", str(config))
