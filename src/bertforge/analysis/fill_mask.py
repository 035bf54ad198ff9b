"""Fill-mask: the masked LM's top-k candidates for each mask token in a text."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bertforge.errors import BertforgeError
from bertforge.model.heads import MaskedLM
from bertforge.tokenization import Tokenizer

MASK_SPELLINGS = ("[MASK]", "<mask>")


@dataclass
class Candidate:
    token: str        # the token as text (decoded: byte-level BPE's "Ġthe" reads "the")
    token_id: int
    probability: float

    def to_dict(self) -> dict:
        return {"token": self.token, "token_id": self.token_id, "probability": self.probability}


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """What one token reads as: its decoded text, stripped; the vocabulary symbol when that is empty (a special
    token, a lone word-boundary marker)."""
    text = tokenizer.decode([token_id], skip_special_tokens=False).strip()
    return text or tokenizer.convert_ids_to_tokens([token_id])[0]


def fill_mask(model: MaskedLM, tokenizer: Tokenizer, text: str, top_k: int = 5) -> list[list[Candidate]]:
    """For each mask in `text` (written [MASK] or <mask>, whatever the tokenizer calls it), the top-k tokens
    (as decoded text, with their ids and probabilities)."""
    if top_k < 1:
        raise BertforgeError(f"--top-k must be at least 1, got {top_k}")
    for spelling in MASK_SPELLINGS:  # let users write either spelling whatever the vocabulary
        text = text.replace(spelling, tokenizer.mask_token)
    batch = tokenizer([text], max_length=model.config.max_position_embeddings - model.config.position_offset)
    positions = batch["input_ids"] == tokenizer.mask_token_id
    if not positions.any():
        raise BertforgeError(f"no mask token in the text (write {tokenizer.mask_token} where a word is missing)")
    model.eval()
    device = next(model.parameters()).device  # the model's: a GPU model gets GPU inputs
    with torch.inference_mode():
        logits = model(*(batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids")),
                       positions=positions.to(device))
    probs = logits.float().softmax(-1).cpu()
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[Candidate(token_text(tokenizer, i), i, p)
             for i, p in zip(ids.tolist(), ps.tolist())] for ids, ps in zip(top.indices, top.values)]
