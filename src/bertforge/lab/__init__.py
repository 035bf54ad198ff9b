"""The ablation lab: the seeds' ablation tables (BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT) answered the way the
papers answered them, by downstream scores at equal compute, over several seeds, with a verdict per claim.

* ``tables``: which arms each paper compared, its claims and its numbers; the fixed downstream suite.
* ``run``: pretrain every arm for one budget, fine-tune each on the suite, resumably (`bertforge ablate --table`).
* ``flops``: estimated training FLOPs per token, for equal-compute arms.
* ``report``: mean and spread per task, verdicts (reproduced / not reproduced / inconclusive), Markdown, figure.
"""
