"""A family's tokenizer layout (`Family.tokenizer`; the plain kinds' are in the family files that define them:
BERT's WordPiece, RoBERTa's byte-level BPE, ALBERT's Unigram)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenizerLayout:
    """A tokenizer kind: the `tokenizers` model it trains, its special tokens and how it frames a text. The plain
    kinds (wordpiece, bpe, unigram) are `bertforge.tokenization`'s; a family whose tokenizer is a layout of its own
    (GPT-2's, T5's) declares it as `Family.tokenizer`, and the kind is then named after the family."""

    model: str                          # the tokenizers model and trainer: "wordpiece" | "bpe" | "unigram"
    specials: dict[str, str | None]     # role (pad, unk, cls, sep, mask) -> token; trained ones get ids in this order
    frame: str                          # how texts are framed: "cls-sep" ([CLS] A [SEP] B [SEP], types 0 / 1),
    #                                     "double-sep" (<s> A </s></s> B </s>), "eos" (A </s> B </s>), "none"
    hf_class: str                       # tokenizer_config.json's tokenizer_class
    special_map: tuple[tuple[str, str], ...]  # special_tokens_map.json: (entry, role), in the file's order
    config: dict[str, Any] = field(default_factory=dict)  # the rest of tokenizer_config.json
    marker: str | None = None           # a token only this layout's files hold (how a loaded file is recognised)
    normalise: bool = True              # False: the text reaches the model untouched (T5)
    cased: bool = False                 # never lower-cased
    sentinels: int = 0                  # span-corruption sentinels <extra_id_K> added after the pieces (T5)
    keeps_spaces: bool = False          # shards keep the spaces between sentences (a causal LM writes them: GPT-2)
    mask_lstrip: bool = False           # <mask> takes the space before it (RoBERTa)
    # the roles whose tokens take the ids after the pieces (the mask token last: DeBERTa's, XLM-R's); the other
    # special tokens come first, in `specials` order
    after_pieces: tuple[str, ...] = ()
    # whitespace runs and line breaks become one space, then NFC, no trailing space, "▁" before every word and no
    # other split (DeBERTa-v2's SentencePiece normaliser; else ALBERT's, or none with normalise=False)
    collapses_whitespace: bool = False
    keep_accents: bool = False          # tokenizer_config.json says keep_accents (= not lower-cased), as ALBERT's

    def special_order(self) -> tuple[list[str], list[str]]:
        """The special tokens in id order: (those before the pieces, those after them, `after_pieces`')."""
        last = [self.specials[role] for role in self.after_pieces]
        first = [t for t in dict.fromkeys(self.specials.values()) if t is not None and t not in last]
        return first, last


ROLES = ("pad", "unk", "cls", "sep", "mask")
# special_tokens_map.json: every role's token, and (not BERT's) bos / eos as cls / sep
ROLE_ENTRIES = tuple((f"{role}_token", role) for role in ROLES)
BOS_EOS = (("bos_token", "cls"), ("eos_token", "sep"))
