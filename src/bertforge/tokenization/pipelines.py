"""The tokenizer pipelines of the reference models (normaliser, pre-tokenizer, post-processor, decoder) and their
special tokens, per kind; `bertforge.tokenization.Tokenizer` trains, loads and saves with them.

A kind is a `TokenizerLayout` (`bertforge.families.family`), each declared in a family's file: the plain kinds are
"wordpiece" (BERT), "bpe" (RoBERTa's byte-level BPE; BART's is the same) and "unigram" (ALBERT); a family whose
tokenizer is a layout of its own declares it, and the kind is named after the family: GPT-2's byte-level BPE with its
one special token, T5's Unigram with its sentinels, DeBERTa-v2's and XLM-RoBERTa's Unigram with the mask token after
the pieces (`families/gpt2.py`, `families/t5.py`, `families/deberta_v2.py`, `families/xlm_roberta.py` say what each holds).
A saved family layout is recognised on load by its tokenizer_config.json class (`family_kind`).
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from bertforge.families import FAMILIES, TokenizerLayout
from bertforge.families.record.tokenizer import ROLES

_MODEL_KIND = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}
# The plain kinds, each defined by the family file of the paper that introduced it (`Family.plain_tokenizers`:
# BERT's WordPiece, RoBERTa's byte-level BPE, ALBERT's Unigram), in this order; special tokens in id order (they get
# ids 0..4 when training).
PLAIN_KINDS = ("wordpiece", "bpe", "unigram")
_DEFINED = {kind: layout for fam in FAMILIES.values() for kind, layout in fam.plain_tokenizers.items()}
PLAIN_LAYOUTS: dict[str, TokenizerLayout] = {kind: _DEFINED[kind] for kind in PLAIN_KINDS}
# Every kind: the plain ones, then the families' own (named after the family).
LAYOUTS: dict[str, TokenizerLayout] = {
    **PLAIN_LAYOUTS, **{name: fam.tokenizer for name, fam in FAMILIES.items() if fam.tokenizer is not None}}
TOKENIZER_KINDS = tuple(LAYOUTS)
SPECIAL_TOKENS: dict[str, dict[str, str | None]] = {kind: layout.specials for kind, layout in LAYOUTS.items()}
HF_TOKENIZER_CLASS = {kind: layout.hf_class for kind, layout in LAYOUTS.items()}
N_SENTINELS = max(layout.sentinels for layout in LAYOUTS.values())  # the most sentinels a kind has (T5's 100)


def sentinel(k: int) -> str:
    """T5's k-th sentinel token, <extra_id_k>."""
    return f"<extra_id_{k}>"


def family_kind(tokenizer_class: Any, model_kind: str | None) -> str | None:
    """The family layout a tokenizer_config.json's class names ("XLMRobertaTokenizer[Fast]") for a tokenizer of
    `model_kind` (wordpiece, bpe, unigram), or None."""
    if not isinstance(tokenizer_class, str):
        return None
    wanted = tokenizer_class.removesuffix("Fast")
    return next((kind for kind, layout in LAYOUTS.items() if kind not in PLAIN_LAYOUTS
                 and layout.model == model_kind and layout.hf_class.removesuffix("Fast") == wanted), None)



# ----------------------------------------------------------------------------------------------- pipelines

def _wordpiece_pipeline(backend: Backend, lowercase: bool, strip_accents: bool | None = None,
                   chinese: bool = True) -> None:
    # strip_accents=None: accents are stripped exactly when lower-casing, as in the original BERT.
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese,
                                                    strip_accents=strip_accents, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")


def _byte_level_pipeline(backend: Backend) -> None:
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()


def _sentencepiece_pipeline(backend: Backend, lowercase: bool) -> None:
    # The normaliser and pre-tokenizer transformers' AlbertTokenizerFast rebuilds on load (keep_accents=not lowercase).
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")


def _collapsed_whitespace_pipeline(backend: Backend, lowercase: bool) -> None:
    # transformers' DebertaV2Tokenizer (it rebuilds this one on load): whitespace runs and line breaks to one space,
    # NFC, no trailing space; "▁" before every word, no other split
    steps = [normalizers.Lowercase()] if lowercase else []
    steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
              normalizers.Strip(left=False, right=True)]
    backend.normalizer = normalizers.Sequence(steps)
    metaspace = dict(replacement="▁", prepend_scheme="always")
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(**metaspace)])
    backend.decoder = decoders.Metaspace(**metaspace)


def _set_post_processor(backend: Backend, layout: TokenizerLayout, specials: dict[str, str]) -> None:
    cls, sep = specials["cls"], specials["sep"]
    cls_id, sep_id = backend.token_to_id(cls), backend.token_to_id(sep)
    if layout.frame == "double-sep":  # <s> A </s></s> B </s>, all type ids 0
        backend.post_processor = processors.RobertaProcessing((sep, sep_id), (cls, cls_id),
                                                              trim_offsets=True, add_prefix_space=False)
    elif layout.frame == "none":  # nothing added around a text (GPT-2)
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    elif layout.frame == "eos":  # A </s> (B </s>), all type ids 0 (T5)
        backend.post_processor = processors.TemplateProcessing(
            single=f"$A:0 {sep}:0", pair=f"$A:0 {sep}:0 $B:0 {sep}:0", special_tokens=[(sep, sep_id)])
    else:  # [CLS] A [SEP] (B [SEP]), type ids 0 then 1
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, cls_id), (sep, sep_id)])


def _unnormalised_metaspace_pipeline(backend: Backend) -> None:
    # transformers' T5Tokenizer pipeline (it rebuilds this one on load)
    backend.normalizer = None
    metaspace = dict(replacement="▁", prepend_scheme="always", split=True)
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(**metaspace)])
    backend.decoder = decoders.Metaspace(**metaspace)


def _sentinel_tokens(n: int) -> list[AddedToken]:
    """T5's sentinels in id order: <extra_id_{n-1}> first, <extra_id_0> last."""
    return [AddedToken(sentinel(k), special=True, normalized=False) for k in reversed(range(n))]


def _special_added_tokens(layout: TokenizerLayout) -> list[AddedToken]:
    """The special tokens in id order: those before the pieces, then `after_pieces`' (DeBERTa's [MASK] last)."""
    first, last = layout.special_order()  # GPT-2's one token (every role's) once
    # RoBERTa's <mask> swallows the space before it, so "a <mask> b" masks the word " b"-style tokens correctly.
    return [AddedToken(tok, special=True, normalized=False, lstrip=layout.mask_lstrip and tok == layout.specials["mask"])
            for tok in [*first, *last]]


def _json_lowercases(node: Any) -> bool:
    """Whether a serialised normaliser lower-cases (BertNormalizer(lowercase=True) or a Lowercase step)."""
    if isinstance(node, dict):
        if node.get("type") == "Lowercase" or (node.get("type") == "BertNormalizer" and node.get("lowercase")):
            return True
        return any(_json_lowercases(v) for v in node.values())
    if isinstance(node, list):
        return any(_json_lowercases(v) for v in node)
    return False


def _token_str(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json / special_tokens_map.json (string or AddedToken dict)."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None
