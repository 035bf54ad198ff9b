"""What other bertforge verbs do with a family (`Family.verbs`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerbDefaults:
    finetune_lr: float = 3e-5            # `finetune`'s default peak learning rate
    distils_to: str | None = None        # the family of its DistilBERT-style student (`distill general`)
    long_variant: str | None = None      # the long-attention family `longify` turns it into
