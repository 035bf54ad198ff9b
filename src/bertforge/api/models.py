"""What a single checkpoint does on its own: `info` (what it is), `fill_mask` (a masked LM's candidates),
`generate` (a decoder's or encoder-decoder's text), `longify` (a Longformer made from a BERT / RoBERTa).

    bertforge.fill_mask("runs/pretrain-bert", "Paris is the [MASK] of France.")[0][0]   # Candidate(token="capital", ...)
    bertforge.generate("runs/pretrain-gpt", "Once upon a time", max_new_tokens=40, seed=0)
    for piece in bertforge.generate("runs/pretrain-gpt", "Call me", stream=True):
        print(piece, end="", flush=True)
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertforge.api.inputs import device_for, model_name
from bertforge.config.arguments import (BOOL, COUNT, COUNT0, DEVICE, FINITE, LENGTH, MODEL, OPEN_FRACTION, PATH,
                                        POSITIVE, SEED, TEXT, TEXTS, check_args, maybe)
from bertforge.errors import ArgumentError, BertforgeError


def info(model: Any, *, revision: str | None = None) -> dict[str, Any]:
    """What a checkpoint is, read from config.json, the safetensors header and the tokenizer files (no weights are
    loaded): path, model_type, architectures, layers, hidden_size, heads, intermediate_size, embedding_size,
    share_layers, max_positions, blocks (the layer layout in words), vocab_size, parameters, tokenizer, labels."""
    from safetensors import safe_open

    from bertforge.families import DECODER, ENCODER
    from bertforge.model.checkpoint import read_state_dict
    from bertforge.model.folder import ModelFolder

    check_args(locals(), model=MODEL, revision=maybe(TEXT))
    folder = ModelFolder.open(model_name(model, revision, ""), "")
    path, raw = folder.path, folder.config
    cfg = folder.config_for(ENCODER, DECODER, verb="an encoder or decoder")
    st = path / "model.safetensors"
    if st.is_file():  # count parameters from the header: no need to load the weights
        try:
            with safe_open(str(st), "pt") as f:
                n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        except Exception as err:  # noqa: BLE001 - a damaged file is the user's to know about
            raise BertforgeError(f"{st}: not a readable safetensors file ({err})") from None
    else:
        n_params = sum(t.numel() for t in read_state_dict(path)[0].values())
    try:
        tok = folder.tokenizer()
        tokenizer = {"kind": tok.kind, "vocab_size": tok.vocab_size, "lowercase": tok.do_lower_case}
    except BertforgeError as err:
        tokenizer = {"error": str(err)}
    return {
        "path": str(path), "model_type": cfg.model_type, "architectures": raw.get("architectures"),
        "layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "heads": cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size, "embedding_size": cfg.embedding_size,
        "share_layers": cfg.share_layers,
        "max_positions": None if cfg.family.relative_positions else cfg.max_position_embeddings,  # XLNet: no limit
        "blocks": _blocks(cfg),
        "vocab_size": cfg.vocab_size, "parameters": n_params, "tokenizer": tokenizer,
        "labels": raw.get("id2label") if raw.get("bertforge_task") or raw.get("problem_type") else None,
    }


def _blocks(cfg) -> str:
    """The layer layout in words (what a config's switches make of the blocks)."""
    from bertforge.families import DECODER

    if cfg.stack == DECODER:
        return f"pre-norm causal decoder, learned positions, {cfg.hidden_act} MLP"
    if cfg.family.streams == 2:
        return f"post-norm, relative positions (Transformer-XL, two streams), {cfg.hidden_act} MLP"
    return (f"{cfg.norm_position}-norm, {cfg.position_embedding_type} positions, "
            f"{'GeGLU' if cfg.gated_mlp else cfg.hidden_act} MLP"
            + (f", window {cfg.local_attention} with global attention every "
               f"{cfg.global_attn_every_n_layers} layers" if cfg.local_attention else "")
            + _sparse(cfg))


def _sparse(cfg) -> str:
    """Longformer's / BigBird's attention in words ("" for full attention)."""
    from bertforge.families.family import BLOCK_SPARSE, SLIDING_WINDOW

    if cfg.family.sparse_attention == SLIDING_WINDOW:
        windows = sorted(set(cfg.attention_window))
        return f", Longformer attention (window {'/'.join(map(str, windows))} + global tokens)"
    if cfg.family.sparse_attention == BLOCK_SPARSE and cfg.attention_type == "block_sparse":
        return (f", BigBird block-sparse attention (blocks of {cfg.block_size}: 3 window + 2 global + "
                f"{cfg.num_random_blocks} random)")
    return ""


def fill_mask(model: Any, text: str | list[str], *, top_k: int = 5, device: str | None = None,
              revision: str | None = None):
    """The `top_k` candidates for each mask in `text` (written [MASK] or <mask>), best first: per mask a list of
    `Candidate`s (token, token_id, probability); for a list of texts, one such list per text. `model`: a
    checkpoint with an MLM head (a folder or Hub id), or a loaded (MaskedLM, Tokenizer) pair."""
    from bertforge.analysis.fill_mask import fill_mask as run

    check_args(locals(), model=MODEL, text=TEXTS, top_k=COUNT, device=maybe(DEVICE), revision=maybe(TEXT))
    run_on = device_for(device) if device is not None or not isinstance(model, tuple) else None
    lm, tokenizer = _loaded_pair(model, run_on, revision, _masked_lm)
    if isinstance(text, str):
        return run(lm, tokenizer, text, top_k)
    return [run(lm, tokenizer, t, top_k) for t in text]


def _masked_lm(folder):
    from bertforge.model.heads import MaskedLM

    return MaskedLM.from_pretrained(folder), None  # first: a checkpoint that cannot fill masks is the error to report


def _loaded_pair(model: Any, run_on: Any, revision: str | None, load, precision: str | None = None):
    """(model, tokenizer) on the device `run_on` (None: where it is): a loaded pair as it is, or `load(folder)` of a
    folder or Hub id; its weights in `precision`'s type when one is given."""
    from bertforge.device import move_model, weight_dtype
    from bertforge.model.folder import ModelFolder

    if isinstance(model, tuple):
        lm, tokenizer = model
    else:
        folder = ModelFolder.open(model_name(model, revision))
        lm, tokenizer = load(folder)
        tokenizer = tokenizer if tokenizer is not None else folder.tokenizer()
    if precision is not None:
        lm = lm.to(dtype=weight_dtype(precision))
    if run_on is not None:
        lm = move_model(lm, run_on, "--model" if isinstance(model, tuple) else f"--model {model}")
    return lm, tokenizer


class TextStream:
    """The pieces of one generated text, each as soon as it is generated (iterate once); `config` is the resolved
    `GenerationConfig` (its `mode`: sample, greedy or beam), `precision` the weights' type, `continues_prompt`
    whether the text continues the prompt (a decoder) rather than answering it (an encoder-decoder)."""

    def __init__(self, pieces: Iterator[str], config: Any, precision: str, continues_prompt: bool):
        self._pieces, self.config, self.precision, self.continues_prompt = pieces, config, precision, continues_prompt

    def __iter__(self) -> Iterator[str]:
        return self._pieces


def generate(model: Any, prompt: str | list[str], *, max_new_tokens: int = 50, greedy: bool = False,
             num_beams: int = 1, temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float = 1.0, length_penalty: float = 1.0,
             seed: int | None = None, prepend_bos: bool = False, stream: bool = False, device: str | None = None,
             precision: str | None = None, revision: str | None = None):
    """Text from a decoder (GPT-2 layout: the continuation of `prompt`) or an encoder-decoder (T5, BART: the output
    for the source text `prompt`): a string, a list of strings for a list of prompts, or with `stream` a
    `TextStream` of pieces as they are generated (one prompt).

    Sampling with nucleus top-p 0.9 unless `greedy` or `num_beams` > 1; `seed` makes sampling repeatable (a list
    of prompts is one batch drawing from one generator, so a row's sample is not that prompt's sample alone).
    `model`: a folder or Hub id, or a loaded (model, tokenizer) pair (`bertforge.generation.load`). `precision`:
    the weights' type while decoding (default: bf16 where the device computes it natively, else fp32; fp32 is
    token-identical to transformers)."""
    from bertforge.device import INFERENCE_PRECISIONS, check_precision, default_precision
    from bertforge.generation import GenerationConfig, generate as run, load, stream as pieces
    from bertforge.generation.text import reads_source

    check_args(locals(), model=MODEL, prompt=TEXTS, max_new_tokens=COUNT, greedy=BOOL, num_beams=COUNT,
               temperature=maybe(POSITIVE), top_k=maybe(COUNT0), top_p=maybe(OPEN_FRACTION),
               repetition_penalty=POSITIVE, length_penalty=FINITE, seed=maybe(SEED), prepend_bos=BOOL, stream=BOOL,
               device=maybe(DEVICE), precision=maybe(TEXT), revision=maybe(TEXT))
    if stream and not isinstance(prompt, str):
        raise ArgumentError("prompt: stream=True generates for one prompt: give a string")
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature, top_k=top_k,
                           top_p=top_p, repetition_penalty=repetition_penalty, num_beams=num_beams,
                           length_penalty=length_penalty, seed=seed, prepend_bos=prepend_bos).resolved()
    loaded = isinstance(model, tuple)  # a loaded pair stays where it is, in its own type, unless told otherwise
    run_on = device_for(device) if device is not None or not loaded else None  # before the model is read
    if precision is None and not loaded:
        precision = default_precision(run_on)
    if precision is not None:
        where = run_on if run_on is not None else next(model[0].parameters()).device
        check_precision(precision, where, allowed=INFERENCE_PRECISIONS)
    lm, tokenizer = _loaded_pair(model, run_on, revision, load, precision)
    if not stream:
        return run(lm, tokenizer, prompt, cfg)
    dtype = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    shown = precision or dtype.get(str(next(lm.parameters()).dtype), "fp32")
    return TextStream(pieces(lm, tokenizer, prompt, cfg), cfg, shown, not reads_source(lm))


def longify(model: Any, out: Any, *, max_length: int, attention_window: int = 512, overwrite: bool = False,
            revision: str | None = None) -> dict[str, Any]:
    """Write a Longformer for inputs of up to `max_length` tokens made from a BERT or RoBERTa checkpoint to `out`
    (positions copied over to `max_length` rows; a sliding window of `attention_window` and global Q/K/V made
    from each layer's own); continue it with `pretrain(init_from=out, seq_len=max_length)`. Returns what was made
    (out, architecture, source, positions, attention_window, max_length)."""
    from bertforge.io.rundir import claim_output_dir
    from bertforge.model.folder import ModelFolder
    from bertforge.pretraining.longify import longify as run

    check_args(locals(), model=MODEL, out=PATH, max_length=LENGTH, attention_window=COUNT, overwrite=BOOL,
               revision=maybe(TEXT))
    name = model_name(model, revision)
    folder = ModelFolder.open(name)
    if Path(out).resolve() == folder.path.resolve():
        raise ArgumentError.about("out", out, "the model's own folder; write the long model elsewhere")
    options = {"model": str(name), "max_length": max_length, "attention_window": attention_window}
    with claim_output_dir(out, resume=False, overwrite=overwrite, options=options, resume_flag=None):
        return run(folder, max_length, out, attention_window)
