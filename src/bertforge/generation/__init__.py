"""Text generation for decoders (and, through the same protocol, encoder-decoders): greedy, sampling with
temperature / top-k / top-p, repetition penalty, beam search, KV cache, streaming. See docs/generative.md.

    from bertforge.generation import generate, load, stream
    lm, tok = load("runs/pretrain-gpt")
    generate(lm, tok, "Once upon a time", max_new_tokens=40, seed=0)
"""
from bertforge.generation.config import DEFAULT_TOP_P, GenerationConfig
from bertforge.generation.logits import repetition_penalty, warp
from bertforge.generation.search import TokenSteps, beam_search, generate_ids
from bertforge.generation.text import TextStream, encode_prompts, generate, load, stream

__all__ = ["DEFAULT_TOP_P", "GenerationConfig", "TextStream", "TokenSteps", "beam_search", "encode_prompts",
           "generate", "generate_ids", "load", "repetition_penalty", "stream", "warp"]
