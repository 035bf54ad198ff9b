"""The encoder-decoder (T5 and BART as one model): `Seq2SeqLM` and transformers' tensor names (`model.py`), and
its layers (`layers.py`: norms, relative position bias, attention, feed-forward, one layer of either stack)."""
from bertforge.model.seq2seq.model import Seq2SeqLM, hf_key

__all__ = ["Seq2SeqLM", "hf_key"]
