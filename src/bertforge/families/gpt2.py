"""GPT-2 (Radford et al. 2019): a pre-LN decoder, learned positions (1024), tied output embedding, gelu_new, a
byte-level BPE of 50257 whose one special token <|endoftext|> is bos, eos and document separator. bertforge's
decoder (`bertforge.model.decoder`) has GPT2LMHeadModel's tensor names; GPT-2's Conv1D layers store their weight
as [in, out] (bertforge's nn.Linear: [out, in]). Its config.json is `GPT2Config`'s."""
from typing import Any

from bertforge.families.family import (DECODER, CheckpointLayout, ConfigSchema, Defaults, Family, Heads,
                                       TokenizerLayout, refuse_unsupported)
from bertforge.families.record.schema import (BERT_CHECKS, EPS, HEADS, LAYERS, MAX_FFN, POSITIONS, RATE, TEXT, WIDTH,
                                              Field, checks)

ENDOFTEXT = "<|endoftext|>"


def write_config(cfg: Any) -> dict[str, Any]:
    """transformers' GPT2Config schema. GPT-2 has one residual dropout (resid_pdrop, also used after the
    embeddings: embd_pdrop) and one attention dropout (attn_pdrop)."""
    return dict(model_type="gpt2", vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings,
                n_embd=cfg.hidden_size, n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                n_inner=cfg.intermediate_size, activation_function=cfg.hidden_act,
                resid_pdrop=cfg.hidden_dropout_prob, embd_pdrop=cfg.hidden_dropout_prob,
                attn_pdrop=cfg.attention_probs_dropout_prob, layer_norm_epsilon=cfg.layer_norm_eps,
                initializer_range=cfg.initializer_range, bos_token_id=cfg.bos_token_id,
                eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, scale_attn_weights=True,
                scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, tie_word_embeddings=True)


def read_config(fam: Family, d: dict[str, Any], source: str, ours: dict[str, Any]) -> dict[str, Any]:
    # Variants of GPT-2's attention that bertforge's decoder does not compute: refused, not silently ignored.
    refuse_unsupported(source, "GPT-2", d, {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                                            "add_cross_attention": False, "tie_word_embeddings": True})
    eos = d.get("eos_token_id", 50256)
    pad = d.get("pad_token_id")
    return dict(model_type="gpt2", vocab_size=d["vocab_size"], hidden_size=d["n_embd"],
                num_hidden_layers=d["n_layer"], num_attention_heads=d["n_head"],
                intermediate_size=d.get("n_inner") or 4 * d["n_embd"],
                hidden_act=d.get("activation_function", "gelu_new"), hidden_dropout_prob=d.get("resid_pdrop", 0.1),
                attention_probs_dropout_prob=d.get("attn_pdrop", 0.1),
                max_position_embeddings=d.get("n_positions", 1024), type_vocab_size=0,
                initializer_range=d.get("initializer_range", 0.02),
                layer_norm_eps=d.get("layer_norm_epsilon", 1e-5),
                pad_token_id=pad if pad is not None else (eos if eos is not None else 0), use_pooler=False,
                bos_token_id=d.get("bos_token_id", 50256), eos_token_id=eos)


# GPT-2's byte-level BPE: one special token, <|endoftext|> (document separator, bos and eos; no mask), nothing
# added around a text, and sentences keep the spaces between them (a causal LM writes the text as it stands).
TOKENIZER = TokenizerLayout(
    model="bpe", specials={"pad": ENDOFTEXT, "unk": ENDOFTEXT, "cls": ENDOFTEXT, "sep": ENDOFTEXT, "mask": None},
    frame="none", hf_class="GPT2TokenizerFast",
    special_map=(("bos_token", "cls"), ("eos_token", "sep"), ("unk_token", "unk"), ("pad_token", "pad")),
    config={"add_prefix_space": False, "errors": "replace"}, marker=ENDOFTEXT, cased=True, keeps_spaces=True)

RECIPES = (
    # Radford et al. 2019: a left-to-right LM on contiguous text packed to the context length, documents separated
    # by <|endoftext|>, byte-level BPE. (masking and dynamic are unused: nothing is masked.)
    dict(name="gpt", objective="clm", masking="token", dynamic=True, input_format="full-sentences",
         tokenizer_kind="gpt2"),
)

FAMILY = Family(
    "gpt2", "GPT2", "transformer",
    stack=DECODER,
    head_classes={"lm": "GPT2LMHeadModel"},
    presets={"gpt2": ("base", dict(bos_token_id=50256, eos_token_id=50256))},  # GPT-2 small (124M)
    recipes=RECIPES,
    tokenizer=TOKENIZER,
    checkpoint=CheckpointLayout(
        transposed_weights=r"\.(c_attn|c_proj|c_fc)\.weight$"),
    schema=ConfigSchema(
        checks=checks((("n_layer",), LAYERS), (("n_head",), HEADS), (("n_embd",), WIDTH),
                       (("n_inner",), Field("int", 1, MAX_FFN)), (("n_positions",), POSITIONS),
                       (("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"), RATE),
                       (("layer_norm_epsilon",), EPS), (("activation_function",), TEXT), base=BERT_CHECKS),
        write_config=write_config,
        read_config=read_config,
        # generation starts after (and stops at) the separator the documents were packed with
        token_ids_from_tokenizer={"bos_token_id": "cls", "eos_token_id": "sep"}),
    defaults=Defaults(
        vocab_size=50257,
        type_vocab_size=0,
        pad_token_id=50256,
        max_position_embeddings=1024,
        layer_norm_eps=1e-5,
        hidden_act="gelu_new",
        use_pooler=False),
    heads=Heads(
        hf_task_heads=()))
