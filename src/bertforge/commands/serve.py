"""`bertforge serve --model [NAME=]DIR ...`: the HTTP inference service (see docs/serving.md)."""
from __future__ import annotations

import argparse

from bertforge.device import PRECISIONS, add_device_args
from bertforge.commands.bounds import COUNT, NONNEG, PORT, POSITIVE
from bertforge.commands.needs import of_extra


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="HTTP inference service with dynamic batching (embed, classify, fill-mask, "
                                     "rerank)",
                       description="Serve one or more models over HTTP. Concurrent requests are batched by a "
                                   "token budget and a short wait, then run through the offline API.")
    p.add_argument("--model", action="append", metavar="[NAME=]DIR",
                   help="a model folder, optionally named (repeat for several; the first is the default). "
                        "Unnamed, it serves under its folder's name, or for a folder called model, best, ...: its "
                        "model card's title or its parent folder's name")
    p.add_argument("--index", metavar="DIR", help="with --reader: answer questions on /answer from this index's "
                                                  "top k passages (as `bertforge ask`)")
    p.add_argument("--reader", metavar="DIR", help="with --index: the reader /answer reads the passages with")
    p.add_argument("--generator", metavar="DIR", help="with --index, instead of --reader: /answer generates the "
                                                      "answer (a RAG or fid folder, as `bertforge ask --generator`)")
    p.add_argument("--decoding", choices=("thorough", "fast"), default="thorough",
                   help="--generator, RAG-Sequence: how candidates are rescored (default: thorough)")
    p.add_argument("--num-beams", type=COUNT, default=4, metavar="N",
                   help="--generator: beam search width (default: 4)")
    p.add_argument("--retriever", metavar="R", help="with --index: the question encoder of a dense index (default: "
                                                    "the one it records), or bm25")
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
                   help="open connections at once (default 512). At the cap, the oldest connection still waiting "
                        "for its request's headers is closed (503) to make room; with every slot inside a "
                        "request, the newcomer gets 503")
    p.add_argument("--max-connections-per-client", type=COUNT, default=256, metavar="N",
                   help="open connections from one IP address (default 256; beyond it as --max-connections)")
    p.add_argument("--header-timeout", type=POSITIVE, default=10.0, metavar="S",
                   help="a request's headers must arrive within S seconds (default 10, and at most "
                        "--read-timeout; slower: 408 and the connection closed)")
    p.add_argument("--write-timeout", type=POSITIVE, default=30.0, metavar="S",
                   help="a client that takes none of its response for S seconds is disconnected (default 30)")
    p.add_argument("--max-request-chars", type=COUNT, default=1_000_000, metavar="N",
                   help="characters of text in one request (default 1000000; more: 413)")
    p.add_argument("--graceful-timeout", type=POSITIVE, default=10.0, metavar="S",
                   help="on SIGTERM or Ctrl-C, requests in flight are answered, but the process is gone within S "
                        "seconds whatever its clients do (default 10)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health (default: "
                        "$BERTFORGE_API_KEY; neither given, or that variable empty: no authentication)")
    add_device_args(p, PRECISIONS, "fp32", "embedding precision (fp16: GPU only, int8: CPU only)")
    p.add_argument("--threads", type=COUNT, metavar="N", help="torch intra-op threads for inference")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=serve_command, needs=of_extra("serve", "serve"))


def serve_command(args: argparse.Namespace) -> int:
    from bertforge.api import serve
    from bertforge.errors import BertforgeError

    if not args.model and not (args.index and (args.reader or args.generator)):
        raise BertforgeError("give at least one --model DIR (or --index DIR --reader DIR to serve /answer)")
    serve(args.model or [], index=args.index, reader=args.reader, retriever=args.retriever,
          generator=args.generator, decoding=args.decoding, num_beams=args.num_beams, host=args.host, port=args.port, threads=args.threads, log_level=args.log_level,
          precision=args.precision, device=args.device, max_batch_tokens=args.max_batch_tokens,
          max_wait_ms=args.max_wait_ms, max_queue=args.max_queue, max_inputs=args.max_inputs,
          max_body_bytes=args.max_body_bytes, api_key=args.api_key, batches_in_flight=args.batches_in_flight,
          read_timeout=args.read_timeout, max_connections=args.max_connections,
          max_request_chars=args.max_request_chars, header_timeout=args.header_timeout,
          write_timeout=args.write_timeout, max_connections_per_client=args.max_connections_per_client,
          graceful_timeout=args.graceful_timeout)
    return 0
