"""The ablation lab: the ablation tables of the BERT, RoBERTa, ALBERT, ELECTRA and SpanBERT papers answered the way the
papers answered them, by downstream scores at equal compute, over several seeds, with a verdict per claim.

* ``tables``: which arms each paper compared, its claims and its numbers; the fixed downstream suite.
* ``run``: pretrain every arm for one budget, fine-tune each on the suite, resumably (`bertforge ablate --table`).
* ``flops``: estimated training FLOPs per token, for equal-compute arms.
* ``report``: mean and spread per task, verdicts (reproduced / not reproduced / inconclusive), Markdown, figure.
"""
