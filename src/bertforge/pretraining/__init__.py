"""Pretraining: the objectives and recipes, the pretraining run, held-out evaluation and its report (`bertforge pretrain`,
`bertforge.pretrain`)."""
