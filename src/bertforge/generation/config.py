"""What a generation call is asked to do (`GenerationConfig`), checked before any model runs.

Three modes: sampling (the default: temperature, top-k, nucleus top-p), greedy, and beam search (num_beams > 1,
deterministic). The sampling knobs default to None, meaning "the mode's default": a knob given explicitly to a mode
that does not use it is refused rather than silently ignored.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bertforge.errors import BertforgeError

DEFAULT_TOP_P = 0.9  # nucleus sampling (Holtzman et al. 2020): pure sampling (p = 1) wanders off into incoherence


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 50
    greedy: bool = False
    temperature: float | None = None   # sampling: divide the logits by T (default 1.0)
    top_k: int | None = None           # sampling: keep the k most likely tokens (default 0: all)
    top_p: float | None = None         # sampling: keep the smallest set whose probability reaches p (default 0.9)
    repetition_penalty: float = 1.0    # CTRL's (Keskar et al. 2019): a seen token's logit / R (x R if negative)
    num_beams: int = 1
    length_penalty: float = 1.0        # beam search: a finished beam scores sum(log p) / (new tokens ** this)
    seed: int | None = None            # sampling: the same seed gives the same text
    stop_at_eos: bool = True           # a row ends at the model's eos token
    prepend_bos: bool = False          # a decoder's non-empty prompt starts with <bos> (off: as transformers)

    @property
    def mode(self) -> str:
        return "beam" if self.num_beams > 1 else "greedy" if self.greedy else "sample"

    @property
    def sampling(self) -> bool:
        return self.mode == "sample"

    def replace(self, **changes) -> "GenerationConfig":
        return dataclasses.replace(self, **changes)

    def resolved(self) -> "GenerationConfig":
        """Checked, with the mode's defaults filled in. One line naming the flag for each bad value."""
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise BertforgeError(f"--max-new-tokens must be at least 1 (got {self.max_new_tokens})")
        if self.temperature is not None and not self.temperature > 0:
            raise BertforgeError(f"--temperature must be > 0 (got {self.temperature}); for the most likely token "
                                 "at every step use --greedy")
        if self.top_k is not None and self.top_k < 0:
            raise BertforgeError(f"--top-k must be >= 0 (0 keeps every token; got {self.top_k})")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise BertforgeError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if not self.repetition_penalty > 0:
            raise BertforgeError(f"--repetition-penalty must be > 0 (1 = none; got {self.repetition_penalty})")
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise BertforgeError(f"--num-beams must be at least 1 (got {self.num_beams})")
        given = [flag for flag, value in (("--temperature", self.temperature), ("--top-k", self.top_k),
                                           ("--top-p", self.top_p)) if value is not None]
        if self.num_beams > 1 and self.greedy:
            raise BertforgeError("--greedy and --num-beams > 1 are two different searches: give one")
        if given and not self.sampling:
            raise BertforgeError(f"{', '.join(given)} shape sampling; {self.mode} search does not sample: drop "
                                 f"{'them' if len(given) > 1 else 'it'} or the {'--greedy' if self.greedy else '--num-beams'}")
        if self.sampling:
            return self.replace(temperature=1.0 if self.temperature is None else float(self.temperature),
                                top_k=self.top_k or 0,
                                top_p=DEFAULT_TOP_P if self.top_p is None else float(self.top_p))
        return self
