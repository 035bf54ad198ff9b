"""Moved to `bertforge.device` (the one place for device and precision); these names stay importable from here
for code written against the old module."""

from bertforge.device import (INFERENCE_PRECISIONS, autocast, check_precision, compile_module, cpu_info,  # noqa: F401
                              default_precision, is_compiled, pin, uncompile, weight_dtype)
