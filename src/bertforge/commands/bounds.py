"""Bounds of numeric command-line flags, declared once where each flag is declared (`type=COUNT`, ...).

A value outside its bound is refused by argparse before the verb starts, as one line naming the flag:
`bertforge finetune: error: --lr must be a finite number > 0 (got nan)` (bertforge.cli.OneLineParser's
wording). Every numeric flag of every
verb uses one of these (tests/test_reliability_validation.py walks the parsers and checks it), so a new flag
cannot silently accept 0 steps, a negative size or a NaN learning rate. The bounds live in
`bertforge.config.arguments`, where the public Python API checks its arguments against the same objects.
"""
from bertforge.api.choices import (COUNT, COUNT0, EPOCHS, FINITE, FRACTION, INNER_FRACTION, LENGTH,  # noqa: F401
                                   NONNEG, OPEN_FRACTION, OPSET, PORT, POSITIVE, SEED, STEPS, Number, int_range)
