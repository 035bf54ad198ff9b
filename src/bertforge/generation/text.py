"""Text in, text out: prompts encoded for the model (left-truncated to fit, left-padded to a batch), token ids
decoded incrementally for streaming, and the `generate` / `stream` API over any model of the generation protocol.

    lm, tok = load("runs/gpt")                       # bertforge.model.DecoderLM + bertforge.Tokenizer
    print(generate(lm, tok, "It was a dark and stormy night", max_new_tokens=40, seed=0))
    for piece in stream(lm, tok, "Call me Ishmael.", top_p=0.9):
        print(piece, end="", flush=True)
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from bertforge.errors import BertforgeError
from bertforge.families import FAMILIES, DECODER, ENCODER_DECODER
from bertforge.model.folder import ModelFolder
from bertforge.generation.config import GenerationConfig
from bertforge.generation.search import TokenSteps, beam_search, generate_ids
from bertforge.model import DecoderLM, Seq2SeqLM
from bertforge.tokenization import Tokenizer


def load(path: "str | Path | ModelFolder") -> tuple[DecoderLM | Seq2SeqLM, Tokenizer]:
    """The model and tokenizer of a checkpoint directory (or an opened model folder): a decoder (GPT-2 layout) or
    an encoder-decoder (T5, BART), bertforge's or transformers'."""
    folder = ModelFolder.open(path)
    if folder.holds == "encoder-decoder":
        return Seq2SeqLM.from_pretrained(folder), folder.tokenizer()
    if folder.holds != "decoder":
        cfg = folder.model_config
        if cfg is None:
            what = f"a {folder.kind} model"
        else:
            arch = ", ".join(folder.config.get("architectures") or []) or cfg.family.base_architecture
            what = f"a {cfg.model_type} encoder checkpoint ({arch})"
        generators = {stack: ", ".join(n for n, f in FAMILIES.items() if f.stack == stack)
                      for stack in (DECODER, ENCODER_DECODER)}
        raise BertforgeError(f"{folder.path}: {what} cannot generate text; give a decoder (GPT-2 layout, model_type "
                             f"{generators[DECODER]}, e.g. from `bertforge pretrain --recipe gpt`) or an "
                             f"encoder-decoder ({generators[ENCODER_DECODER]})")
    return DecoderLM.from_pretrained(folder), folder.tokenizer()


def reads_source(model) -> bool:
    """True for an encoder-decoder, whose prompt is a source for its encoder (`prompt_padding == "right"`);
    False for a decoder, which continues its prompt."""
    return getattr(model, "prompt_padding", "left") == "right"


def encode_prompts(model, tokenizer, prompts: Sequence[str], max_new_tokens: int,
                   prepend_bos: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input_ids, attention_mask or None) for the prompts: each as `model.prompt_ids` makes it (a decoder's
    non-empty prompt with <bos> first only when `prepend_bos`), cut to
    `model.max_prompt_tokens` (with a warning saying so) and padded to one width. A decoder continues its prompt:
    it keeps the prompt's last tokens and pads on the left, so every row ends at its last token. An
    encoder-decoder (`model.prompt_padding == "right"`) reads its prompt as a source: it keeps the first tokens
    (and the eos that ends a source) and pads on the right, as it was trained."""
    source = reads_source(model)
    room = model.max_prompt_tokens(max_new_tokens)
    if room < 1:
        raise BertforgeError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt: the model's context "
                             f"is {model.config.max_position_embeddings} tokens")
    rows = []
    for i, text in enumerate(prompts):
        # an encoder-decoder's source has its own start and end tokens
        ids = model.prompt_ids(tokenizer, text) if source else model.prompt_ids(tokenizer, text, prepend_bos)
        if len(ids) > room:
            which = "the prompt" if len(prompts) == 1 else f"prompt {i + 1}"
            if source:
                warnings.warn(f"{which} has {len(ids)} tokens; the encoder reads {room}: kept its first "
                              f"{room - 1} tokens and the end of text", stacklevel=2)
                ids = ids[:room - 1] + ids[-1:]
            else:
                warnings.warn(f"{which} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} the model's "
                              f"context of {model.config.max_position_embeddings} leaves room for {room}: kept its "
                              f"last {room} tokens", stacklevel=2)
                ids = ids[-room:]
        rows.append(ids)
    if any(not ids for ids in rows):
        raise BertforgeError("an empty prompt for a model without a bos token: give some text to continue")
    width = max(len(ids) for ids in rows)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    fill = [[pad] * (width - len(ids)) for ids in rows]
    device = next(model.parameters()).device  # the model's, so a GPU model gets GPU inputs
    input_ids = torch.tensor([ids + f if source else f + ids for ids, f in zip(rows, fill)], dtype=torch.long,
                             device=device)
    if all(len(ids) == width for ids in rows):
        return input_ids, None
    mask = torch.tensor([[1] * len(ids) + [0] * len(f) if source else [0] * len(f) + [1] * len(ids)
                         for ids, f in zip(rows, fill)], dtype=torch.long, device=device)
    return input_ids, mask


def _prefix_length(model, input_ids: torch.Tensor) -> int:
    """How many leading ids of a generated sequence are not new: a decoder's prompt, or an encoder-decoder's
    decoder start token (its prompt went to the encoder)."""
    return 1 if reads_source(model) else input_ids.shape[1]


class TextStream:
    """Incremental detokenisation: `push(ids)` returns the text they add. A step can end inside a multi-byte
    character (byte-level BPE), which decodes as U+FFFD: that text is held back until the character completes."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.text):
            return ""
        new, self.text = text[len(self.text):], text
        return new

    def flush(self) -> str:
        """Whatever is left (an incomplete character at the very end stays U+FFFD)."""
        text = self.tokenizer.decode(self.ids)
        new = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        return new


def _config(config: GenerationConfig | None, options: dict) -> GenerationConfig:
    return (config or GenerationConfig()).replace(**options).resolved()


def _continuations(model, tokenizer, ids: torch.Tensor, prefix_len: int) -> list[str]:
    eos = model.config.eos_token_id
    out = []
    for row in ids[:, prefix_len:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos)]
        out.append(tokenizer.decode(row))
    return out


def generate(model, tokenizer, prompt: str | Sequence[str], config: GenerationConfig | None = None,
             **options) -> str | list[str]:
    """The continuation of `prompt` (a list of them for a list), without the prompt and the eos. `options`
    override `config` fields: max_new_tokens, greedy, temperature, top_k, top_p, repetition_penalty, num_beams,
    length_penalty, seed, prepend_bos."""
    cfg = _config(config, options)
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    input_ids, mask = encode_prompts(model, tokenizer, prompts, cfg.max_new_tokens, cfg.prepend_bos)
    ids = generate_ids(model, input_ids, mask, cfg)
    texts = _continuations(model, tokenizer, ids, _prefix_length(model, input_ids))
    return texts[0] if isinstance(prompt, str) else texts


def stream(model, tokenizer, prompt: str, config: GenerationConfig | None = None, **options) -> Iterator[str]:
    """The continuation of `prompt` as text pieces, each as soon as its tokens are generated (beam search knows
    its answer only at the end: one piece)."""
    cfg = _config(config, options)
    input_ids, mask = encode_prompts(model, tokenizer, [prompt], cfg.max_new_tokens, cfg.prepend_bos)
    if cfg.mode == "beam":
        yield _continuations(model, tokenizer, beam_search(model, input_ids, mask, cfg),
                             _prefix_length(model, input_ids))[0]
        return
    text = TextStream(tokenizer)
    eos = model.config.eos_token_id if cfg.stop_at_eos else None
    for token in TokenSteps(model, input_ids, mask, cfg):
        if eos is not None and int(token[0]) == eos:
            break
        piece = text.push(token.tolist())
        if piece:
            yield piece
    rest = text.flush()
    if rest:
        yield rest
