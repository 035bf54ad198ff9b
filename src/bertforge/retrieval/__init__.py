"""Retrieval: find passages in a corpus for a question, then read them.

Sparse retrieval (BM25 on bm25s), dense question / passage encoders (DPR-style towers), fusion of the two, the
corpus-scale index built from embedding shards, readers over the top k, and open-domain QA scored as the papers
score it. The retrieval-augmented models (REALM, RAG) compose these with the encoder, the trainer and the
encoder-decoder that exist.
"""
