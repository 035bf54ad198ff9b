"""The one place for device and precision: `--device` resolution, the precision names, the default precision per
device (bf16 where native, TF32 for fp32 matmuls on CUDA), autocast, `--compile` with its one-line fallback,
pinned non-blocking transfers, a model too big for the GPU as one line, and the `--device` / `--precision` flags
that every verb declares through `add_device_args`.

Imports only torch and `bertforge.errors` (layer 0): the model, the trainer, the tasks and the commands all use it.
torch is imported inside the functions that use it: the command line's parser declares its flags here, and
`bertforge --help` (or a mistyped flag) should answer at once, not after the seconds torch takes to import.
Every function also runs on the CPU; the tests exercise the same code with device "cpu".
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError

if TYPE_CHECKING:
    import torch
    from torch import nn

# The one set of precision names. Training runs the first two (autocast), inference the first three on a device
# that has them (fp16 is a GPU format), int8 is dynamic quantisation on the CPU.
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
TRAINING_PRECISIONS = PRECISIONS[:2]
INFERENCE_PRECISIONS = PRECISIONS[:3]
DEVICE_TYPES = ("cpu", "cuda", "mps")


# ---- devices ---------------------------------------------------------------------------------------------------------
def resolve_device(name: str, local_rank: int = 0, flag: str = "--device") -> torch.device:
    """"auto" -> this rank's GPU when CUDA is available, else CPU; "cuda" -> cuda:LOCAL_RANK; "mps" -> Apple's GPU.
    A device that is not there (cuda without a GPU, cuda:3 on a one-GPU machine, a misspelt name) is one line
    naming `flag`."""
    import torch

    name = str(name).strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BertforgeError(f"{flag} {name}: not a device (use auto, cpu, cuda, cuda:N or mps)") from None
    if device.type not in DEVICE_TYPES:
        raise BertforgeError(f"{flag} {name}: unsupported device type (use auto, cpu, cuda, cuda:N or mps)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise BertforgeError(f"{flag} {name}: CUDA is not available ({why}); use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BertforgeError(f"{flag} {name}: only {torch.cuda.device_count()} GPU(s) visible")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertforgeError(f"{flag} {name}: MPS is not available on this machine; use --device cpu or auto")
    return device


def cpu_info() -> str:
    """/proc/cpuinfo's text ("" where there is none): the CPU's model name and instruction-set flags."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return ""


def default_precision(device: str | torch.device | None = None) -> str:
    """bf16 autocast where the hardware does bf16 matmuls natively (AVX512-BF16 / AMX CPUs, recent GPUs), else
    fp32: on those CPUs bf16 trains ~1.6x faster at unchanged fine-tuning scores (docs/benchmarks.md), elsewhere it
    is emulated and many times slower. `device` None or "auto" means the GPU when there is one."""
    import torch

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


def configure_matmul(device: torch.device) -> str:
    """On CUDA, fp32 matmuls run as TF32 (torch's "high" precision: ~8x the fp32 rate on Ampere and later, the
    10-bit mantissa of every mixed-precision recipe). Returns what the run header says about it ("" elsewhere)."""
    if device.type != "cuda":
        return ""
    import torch

    torch.set_float32_matmul_precision("high")
    return "fp32 matmuls: TF32 (torch.set_float32_matmul_precision('high'))"


def check_precision(precision: str, device: torch.device, flag: str = "--precision",
                    allowed: tuple[str, ...] = PRECISIONS) -> None:
    """One line, before any work, for a precision this device cannot run (fp16 is a GPU format, int8 a CPU one)."""
    if precision not in allowed:
        raise BertforgeError(f"{flag} {precision!r}: expected one of {', '.join(allowed)}")
    if precision == "fp16" and device.type == "cpu":
        raise BertforgeError(f"{flag} fp16 needs a GPU (--device cuda); on the CPU use bf16 or fp32")
    if precision == "int8" and device.type != "cpu":
        raise BertforgeError(f"{flag} int8 (dynamic quantisation) runs on the CPU only; on a GPU use bf16 or fp16")


def _half_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit float type of bf16 / fp16 (None for fp32 and int8)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def weight_dtype(precision: str) -> torch.dtype:
    """The dtype weights are stored in for `precision` (fp32 for fp32 and int8)."""
    import torch

    return _half_dtype(precision) or torch.float32


def autocast(device: torch.device, precision: str):
    """Autocast to bf16 / fp16 on `device` (a no-op context for fp32 and int8)."""
    import torch

    dtype = _half_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def placement(module: nn.Module) -> set[tuple[torch.dtype, torch.device]]:
    """The (dtype, device) pairs of `module`'s floating-point parameters and buffers: one pair for a model that is
    all in one place (what `.to()` promises and an inference copy must keep)."""
    return {(t.dtype, t.device) for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()}


def like(tensor: torch.Tensor) -> dict[str, Any]:
    """Factory kwargs (device, dtype) of `tensor`: a module built from existing weights is built where they are."""
    return {"device": tensor.device, "dtype": tensor.dtype}


# ---- moving data -----------------------------------------------------------------------------------------------------
def pin(batch: Any) -> Any:
    """`batch` with every CPU tensor in page-locked memory (so `.to(cuda, non_blocking=True)` overlaps compute)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, dict):
        return {k: pin(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin(v) for v in batch)
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in a (nested) batch on `device`, without blocking the host (from pinned memory the copy
    overlaps the GPU's work; from pageable memory torch copies synchronously, as `.to` always did)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def model_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def oom_error(module: nn.Module, device: torch.device, what: str) -> BertforgeError:
    """The one line for a CUDA out-of-memory error: what ran out, the model's own size and the GPU's."""
    import torch

    need = model_bytes(module)
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    rest = "its optimizer state and activations" if "train" in what else "activations"
    return BertforgeError(f"{what}: out of GPU memory on {device} (the model alone needs {_gib(need)}, {rest} more; "
                          f"the GPU has {_gib(total)}): use a smaller --batch-size, bf16, or a bigger GPU")


@contextlib.contextmanager
def out_of_memory(module: nn.Module, device: torch.device, what: str) -> Iterator[None]:
    """A CUDA out-of-memory error inside becomes `oom_error`'s one line."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise oom_error(module, device, what) from None


def move_model(module: nn.Module, device: torch.device, what: str = "loading the model") -> nn.Module:
    """`module.to(device)`, a model too big for the GPU being one line (see `out_of_memory`). A model that is not
    a torch module (an ONNX graph) runs where its runtime puts it: returned as it is."""
    from torch import nn

    if not isinstance(module, nn.Module):
        return module
    with out_of_memory(module, device, what):
        return module.to(device)


# ---- compile ---------------------------------------------------------------------------------------------------------
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


def compile_by_default(device: torch.device, asked: bool | None) -> bool:
    """`--compile` unless said otherwise: on for training on a GPU (the step is launch-bound without it), off on
    the CPU (compile time would eat short CPU runs and CPU speed is measured eager)."""
    return device.type == "cuda" if asked is None else bool(asked)


def loader_workers(device: torch.device, asked: int | None) -> int:
    """Processes making training batches unless said otherwise: on a GPU up to 4 (the host must keep up with the
    chip; the model's step leaves the cores free), on the CPU none (the step uses every core; one thread prefetches)."""
    if asked is not None:
        return int(asked)
    return min(4, max(1, (os.cpu_count() or 2) - 1)) if device.type == "cuda" else 0


# ---- the flags -------------------------------------------------------------------------------------------------------
def add_device_args(parser: argparse.ArgumentParser, precisions: tuple[str, ...] | None = INFERENCE_PRECISIONS,
                    precision_default: str | None = "fp32", precision_help: str = "",
                    compile: str | None = None, device: bool = True) -> None:
    """Declare --device (unless `device` is False), --precision (choices `precisions`; None: no such flag) and,
    given its help text, --compile: the same names, metavars and wording on every verb that has them."""
    if device:
        parser.add_argument("--device", default="auto", metavar="DEV",
                            help="auto (a GPU when there is one) | cpu | cuda | cuda:N | mps (default: auto)")
    if precisions is not None:
        default = f"default: {precision_default}" if precision_default else \
            "default: bf16 where the CPU/GPU does it natively, else fp32"
        parser.add_argument("--precision", default=precision_default, choices=precisions,
                            help=f"{precision_help}{'; ' if precision_help else ''}{default}")
    if compile is not None:
        parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help=compile)
