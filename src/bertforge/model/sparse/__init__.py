"""Sparse long attention in linear memory: what the layers share (`layout.py`: padding to blocks, global tokens,
the layout passed down the layers), Longformer's sliding window + global tokens (`longformer.py`) and BigBird's
block-sparse attention (`bigbird.py`, with its training plan of random blocks in `bigbird_plan.py`)."""
