"""`bertforge quantize` (dynamic int8) and `bertforge export` (ONNX, checked in onnxruntime)."""
from __future__ import annotations

import argparse
import json
import sys

from bertforge.commands.bounds import OPSET
from bertforge.commands.needs import of_extra
from bertforge.commands.options import add_overwrite_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="dynamic int8 quantisation of an encoder / sentence encoder / task model",
                       description="Write a copy of --model whose encoder runs torch's dynamic int8 quantisation "
                                   "when `embed`, `predict` or `evaluate` load it. See docs/distillation.md.")
    p.add_argument("--model", required=True, metavar="DIR")
    p.add_argument("--out", required=True, metavar="DIR")
    add_overwrite_arg(p)
    p.set_defaults(func=quantize_command, needs=())

    p = sub.add_parser("export", help="export an encoder / sentence encoder / task model to ONNX",
                       description="Trace the model to ONNX, run it in onnxruntime and keep it only if it matches "
                                   "PyTorch to 1e-4 (fp32); --int8 adds onnxruntime's dynamic int8 graph.")
    p.add_argument("--model", required=True, metavar="DIR")
    p.add_argument("--format", default="onnx", choices=("onnx",))
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--int8", action="store_true", help="also write model.int8.onnx (dynamic int8)")
    p.add_argument("--opset", type=OPSET, default=17)
    add_overwrite_arg(p)
    p.set_defaults(func=export_command, needs=of_extra("export", "export"))


def quantize_command(args: argparse.Namespace) -> int:
    from bertforge.api import quantize

    print(json.dumps(quantize(args.model, args.out, overwrite=args.overwrite).to_dict(), indent=2))
    print(f"-> {args.out}", file=sys.stderr)
    return 0


def export_command(args: argparse.Namespace) -> int:
    from bertforge.api import export

    result = export(args.model, args.out, format=args.format, int8=args.int8, opset=args.opset,
                    overwrite=args.overwrite)
    print(json.dumps(result.to_dict(), indent=2))
    print(f"-> {args.out}", file=sys.stderr)
    return 0
