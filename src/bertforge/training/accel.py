"""Running on an accelerator: the `--precision` autocast of inference, `--compile` with its one-line fallback, and
pinned host memory for non-blocking copies. Every function here also runs on the CPU (tests exercise the same
code with device "cpu"); `resolve_device` (distributed.py) turns `--device` into a `torch.device`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError

INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device, flag: str = "--precision",
                    allowed: tuple[str, ...] = INFERENCE_PRECISIONS + ("int8",)) -> None:
    """One line, before any work, for a precision this device cannot run (fp16 is a GPU format, int8 a CPU one)."""
    if precision not in allowed:
        raise BertforgeError(f"{flag} {precision!r}: expected one of {', '.join(allowed)}")
    if precision == "fp16" and device.type != "cuda":
        raise BertforgeError(f"{flag} fp16 needs a GPU (--device cuda); on the CPU use bf16 or fp32")
    if precision == "int8" and device.type != "cpu":
        raise BertforgeError(f"{flag} int8 (dynamic quantisation) runs on the CPU only; on a GPU use bf16 or fp16")


def default_precision(device: str | torch.device | None = None) -> str:
    """bf16 autocast where the hardware does bf16 matmuls natively (AVX512-BF16 / AMX CPUs, recent GPUs), else
    fp32: on those CPUs bf16 trains ~1.6x faster at unchanged fine-tuning scores (docs/benchmarks.md), elsewhere it
    is emulated and many times slower. `device` None or "auto" means the GPU when there is one."""
    if device in (None, "auto"):
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):  # a bad --device: resolve_device says so in one line
            kind = "cpu"
    if kind == "cuda":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    flags = cpu_info()
    return "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def cpu_info() -> str:
    """/proc/cpuinfo's text ("" where there is none): the CPU's model name and instruction-set flags."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return ""


def weight_dtype(precision: str) -> torch.dtype:
    """The dtype weights are stored in for `precision` (fp32 for fp32 and int8)."""
    return _DTYPES.get(precision, torch.float32)


def autocast(device: torch.device, precision: str):
    """Autocast to bf16 / fp16 on `device` (a no-op context for fp32 and int8)."""
    dtype = _DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def pin(batch: Any) -> Any:
    """`batch` with every CPU tensor in page-locked memory (so `.to(cuda, non_blocking=True)` overlaps compute)."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, dict):
        return {k: pin(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin(v) for v in batch)
    return batch


def _compiler_error(exc: BaseException) -> bool:
    """Errors raised by the compiler stack (dynamo, inductor, a missing C++ compiler), not by the model or its
    inputs: only these fall back to eager."""
    return type(exc).__module__.startswith(("torch._dynamo", "torch._inductor", "torch._subclasses"))


def compile_module(module: nn.Module, enabled: bool, what: str = "--compile", **options: Any) -> nn.Module:
    """Compile `module.forward` with torch.compile, in place (parameter names and state_dict unchanged).

    torch.compile compiles lazily, at the first call; if the compiler is unavailable or fails then (or at a later
    recompile), one line goes to stderr and the module runs eagerly from then on. `uncompile` undoes it (a
    compiled forward is bound to this module: undo it before the module is deep-copied). Returns `module`.
    """
    if not enabled:
        return module
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        print(f"{what}: torch.compile is not supported with this Python/torch; running eagerly", file=sys.stderr)
        return module
    eager = module.forward
    compiled = torch.compile(eager, **options)

    def forward(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only compiler errors are swallowed, see _compiler_error
            if not _compiler_error(exc):
                raise
            out = eager(*args, **kwargs)  # the inputs' own error (a wrong shape) is raised here, as eager raises it
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            print(f"{what}: torch.compile failed ({type(exc).__name__}: {first}); running eagerly", file=sys.stderr)
            uncompile(module)
            return out

    module.forward = forward  # type: ignore[method-assign]
    return module


def is_compiled(module: nn.Module) -> bool:
    return "forward" in module.__dict__


def uncompile(module: nn.Module) -> nn.Module:
    """Back to the eager forward (a no-op for a module that was never compiled)."""
    module.__dict__.pop("forward", None)
    return module
