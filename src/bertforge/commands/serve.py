"""`bertforge serve --model [NAME=]DIR ...`: the HTTP inference service (see docs/serving.md)."""
from __future__ import annotations

import argparse
import os
import sys

from bertforge.device import PRECISIONS, add_device_args
from bertforge.commands.bounds import COUNT, NONNEG, PORT, POSITIVE
from bertforge.commands.needs import of_extra
from bertforge.errors import BertforgeError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="HTTP inference service with dynamic batching (embed, classify, fill-mask, "
                                     "rerank)",
                       description="Serve one or more models over HTTP. Concurrent requests are batched by a "
                                   "token budget and a short wait, then run through the offline API.")
    p.add_argument("--model", action="append", required=True, metavar="[NAME=]DIR",
                   help="a model folder, optionally named (repeat for several; the first is the default). "
                        "Unnamed, it serves under its folder's name, or for a folder called model, best, ...: its "
                        "model card's title or its parent folder's name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=PORT, default=8080)
    p.add_argument("--max-batch-tokens", type=COUNT, default=16384, metavar="N",
                   help="rows x longest input per inference batch (default 16384)")
    p.add_argument("--max-wait-ms", type=NONNEG, default=2.0, metavar="MS",
                   help="how long a batch waits for more requests (default 2)")
    p.add_argument("--batches-in-flight", type=COUNT, default=2, metavar="N",
                   help="batches handed to the inference thread at once (default 2: the next batch fills while "
                        "one computes; 1: each batch forms after the previous one is answered)")
    p.add_argument("--max-queue", type=COUNT, default=256, metavar="N",
                   help="requests that may wait; one more is refused with 429 (default 256)")
    p.add_argument("--max-inputs", type=COUNT, default=128, metavar="N", help="inputs per request (default 128)")
    p.add_argument("--max-body-bytes", type=COUNT, default=8 << 20, metavar="N",
                   help="request body size limit, with or without Content-Length (default 8 MiB; more: 413)")
    p.add_argument("--read-timeout", type=POSITIVE, default=30.0, metavar="S",
                   help="a request's headers, then its body, must arrive within S seconds (default 30; slower: "
                        "408 and the connection closed)")
    p.add_argument("--max-connections", type=COUNT, default=512, metavar="N",
                   help="open connections at once (default 512; one more: 503 and closed)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health (default: "
                        "$BERTFORGE_API_KEY; neither given, or that variable empty: no authentication)")
    add_device_args(p, PRECISIONS, "fp32", "embedding precision (fp16: GPU only, int8: CPU only)")
    p.add_argument("--threads", type=COUNT, metavar="N", help="torch intra-op threads for inference")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=serve_command, needs=of_extra("serve", "serve"))


def serve_command(args: argparse.Namespace) -> int:
    for name in ("max_batch_tokens", "batches_in_flight", "max_queue", "max_inputs", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise BertforgeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_wait_ms < 0:
        raise BertforgeError(f"--max-wait-ms must be 0 or more, got {args.max_wait_ms}")
    if not 0 <= args.port <= 65535:
        raise BertforgeError(f"--port must be 0..65535, got {args.port}")
    # an empty key would silently turn authentication off: refuse it; an unset or empty variable means no key
    api_key = (os.environ.get("BERTFORGE_API_KEY") or None) if args.api_key is None else args.api_key
    if api_key is not None and not api_key.strip():
        where = "--api-key" if args.api_key is not None else "$BERTFORGE_API_KEY"
        raise BertforgeError(f"{where} is empty or blank: give a key, or leave {where} out to serve without "
                             "authentication")
    import torch
    import uvicorn

    from bertforge.serve import ServeOptions, create_app, load_models
    from bertforge.serve.limits import bounded_protocol

    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_models(args.model, args.precision, args.device)
    for m in models.values():
        print(f"bertforge serve: {m.name} ({m.path}): {', '.join(m.tasks)}", file=sys.stderr)
    print(f"bertforge serve: authentication {'on (Bearer key)' if api_key else 'off (no --api-key)'}",
          file=sys.stderr)
    opts = ServeOptions(args.max_batch_tokens, args.max_wait_ms, args.max_queue, args.max_inputs, args.max_body_bytes,
                        api_key, args.batches_in_flight, args.read_timeout, args.max_connections)
    app = create_app(models, opts)
    # uvicorn handles SIGTERM/SIGINT: it stops accepting, lets in-flight requests finish, then the app's
    # lifespan drains the batcher's queue. Its protocol gets the connection cap and the header deadline.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.log_level == "debug", timeout_graceful_shutdown=None,  # a line per request: noise
                http=bounded_protocol(opts.read_timeout_s, opts.max_connections))
    return 0
