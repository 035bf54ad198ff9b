"""The encoder-decoder (T5 and BART as one model): `Seq2SeqLM` (`model.py`; its tensor names are the checkpoint
engine's, `model.checkpoint`), and its layers (`layers.py`: norms, relative position bias, attention, feed-forward,
one layer of either stack)."""
from bertforge.model.seq2seq.model import Seq2SeqLM

__all__ = ["Seq2SeqLM"]
