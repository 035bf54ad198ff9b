"""Serving models over HTTP: `create_app` (the ASGI application: routes for embeddings, classification,
fill-mask and re-ranking, with dynamic batching, limits and metrics; see docs/serving.md) and `serve` (that
application run by uvicorn until interrupted). Needs the `serve` extra (fastapi, uvicorn).

    app = bertforge.create_app({"minilm": "sentence-transformers/all-MiniLM-L6-v2"})   # for any ASGI server
    bertforge.serve(["runs/sst2", "minilm=sentence-transformers/all-MiniLM-L6-v2"], port=8080)
"""
from __future__ import annotations

import os
import sys
from typing import Any

from bertforge.config.arguments import (COUNT, DEVICE, NONNEG, PORT, POSITIVE, TEXT, Kind, check_args,
                                        maybe)
from bertforge.errors import ArgumentError, BertforgeError

# what `create_app` / `serve` serve: a folder or Hub id, a list of [NAME=]FOLDER, or a dict of name -> folder
MODELS = Kind(lambda v: (isinstance(v, (str, os.PathLike)) and bool(str(v).strip()))
              or (isinstance(v, (list, tuple, dict)) and bool(v)), "a model folder or Hub id, a list of "
              "[NAME=]FOLDER, or a dict of name -> folder")
KEY = Kind(lambda v: isinstance(v, str), "a string")


def _check_serving(values: dict) -> None:
    """`create_app`'s and `serve`'s shared arguments, before anything is loaded."""
    check_args(values, models=maybe(MODELS), precision=TEXT, device=DEVICE, max_batch_tokens=COUNT,
               max_wait_ms=NONNEG, max_queue=COUNT, max_inputs=COUNT, max_body_bytes=COUNT, api_key=maybe(KEY),
               batches_in_flight=COUNT, read_timeout=POSITIVE, max_connections=COUNT, revision=maybe(TEXT),
               max_request_chars=COUNT, decoding=TEXT, num_beams=COUNT)
    if values["models"] is None and values["index"] is None:
        raise ArgumentError("models=None: give the models to serve (or an index with a reader or a generator)")


def model_specs(models: Any, revision: str | None = None) -> list[str]:
    """The models to serve as `NAME=FOLDER` / `FOLDER` specs: from one folder or Hub id, a list of `[NAME=]FOLDER`
    or `[NAME=]ID`, or a dict of name -> folder or id. A Hub id becomes its snapshot folder, served under the id
    (`ID=FOLDER`)."""
    from bertforge.io.hub import resolve_model_option

    if isinstance(models, (str, os.PathLike)):
        models = [models]
    items = [(str(k), v) for k, v in models.items()] if isinstance(models, dict) else [
        tuple(str(m).rpartition("=")[::2]) for m in models]
    specs = []
    for name, model in items:
        flag = f"models {name}=" if name else "models="
        path = resolve_model_option(model, revision, flag)
        if name:
            specs.append(f"{name}={path}")
        else:
            specs.append(str(path) if str(path) == str(model) else f"{str(model).removeprefix('hf://')}={path}")
    return specs


def create_app(models: Any, *, precision: str = "fp32", device: str = "auto", max_batch_tokens: int = 16384,
               max_wait_ms: float = 2.0, max_queue: int = 256, max_inputs: int = 128, max_body_bytes: int = 8 << 20,
               api_key: str | None = None, batches_in_flight: int = 2, read_timeout: float = 30.0,
               max_connections: int = 512, revision: str | None = None, max_request_chars: int = 1_000_000,
               index: Any = None, reader: Any = None, retriever: Any = None, generator: Any = None,
               decoding: str = "thorough", num_beams: int = 4):
    """The FastAPI application serving `models` (the first is the default): a folder or Hub id, a list of
    `[NAME=]FOLDER` / `[NAME=]ID`, or a dict of name -> folder or id; each loaded now on `device` (embeddings in
    `precision`: fp32, bf16, fp16 on a GPU, int8 on the CPU). `api_key`: every route but /health then needs
    `Authorization: Bearer KEY`. The limits are `bertforge serve`'s flags of the same names. `index` and `reader`
    (with `retriever`, as `bertforge.ask` takes them): /answer answers questions as `ask` does (`models` may then
    be None). `generator` instead of `reader`: /answer answers by generation (a RAG or fid folder, decoded with
    `decoding` and `num_beams` as `ask` takes them)."""
    _check_serving(locals())
    return _app(models, precision, device, revision, api_key, max_batch_tokens, max_wait_ms, max_queue, max_inputs,
                max_body_bytes, batches_in_flight, read_timeout, max_connections, max_request_chars,
                answer=(index, reader, retriever, generator, decoding, num_beams))[0]


def _answerer(answer: tuple, device: str, revision: str | None) -> Any:
    """The `Asker` /answer calls (None without an index and a reader; one of them alone is refused)."""
    index, reader, retriever, *generation = answer + (None,) * (6 - len(answer))
    generator, decoding, num_beams = generation
    if generator is not None:
        if index is None or reader is not None:
            raise ArgumentError("generator: goes with index and without reader: /answer retrieves from the index and "
                                "generates the answer", flag_message="--generator goes with --index and without "
                                "--reader: /answer retrieves from the index and generates the answer")
        from bertforge.api.generative_qa import GenerativeAsker

        return GenerativeAsker(index, generator, retriever, device=device, revision=revision,
                               decoding=decoding or "thorough", num_beams=num_beams or 4)
    if index is None and reader is None:
        return None
    if index is None or reader is None:
        raise ArgumentError("index, reader: give both: /answer retrieves from the one and reads with the other",
                            flag_message="--index and --reader go together: /answer retrieves from the one and "
                            "reads with the other")
    from bertforge.api.reading import Asker

    return Asker(index, reader, retriever, device=device, revision=revision)


def _app(models: Any, precision: str, device: str, revision: str | None, api_key: str | None, *limits: Any,
         answer: tuple = (None, None, None)):
    """(the application, the models it serves by name), every option checked before a model is loaded."""
    try:
        from bertforge.server import ServeOptions, create_app as make, load_models
    except ImportError as err:  # fastapi (or uvicorn) missing: one line naming the extra
        raise BertforgeError(f"serving needs {err.name or 'fastapi'}, which is not installed: "
                             "pip install 'bertforge[serve]'") from None
    options = ServeOptions(*limits[:5], api_key, *limits[5:])
    for name in ("max_batch_tokens", "batches_in_flight", "max_queue", "max_inputs", "max_body_bytes",
                 "max_connections", "max_request_chars", "max_connections_per_client"):
        if getattr(options, name) < 1:
            raise BertforgeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    for name in ("read_timeout_s", "header_timeout_s", "write_timeout_s", "graceful_timeout_s"):
        if not getattr(options, name) > 0:
            raise BertforgeError(f"--{name.removesuffix('_s').replace('_', '-')} must be more than 0 seconds, got "
                                 f"{getattr(options, name)}")
    if options.max_wait_ms < 0:
        raise BertforgeError(f"--max-wait-ms must be 0 or more, got {options.max_wait_ms}")
    check_api_key(api_key, "api_key")
    answerer = _answerer(answer, device, revision)
    loaded = load_models(model_specs(models, revision), precision, device) if models or answerer is None else {}
    return make(loaded, options, answerer), loaded


def check_api_key(api_key: str | None, where: str) -> None:
    """An empty key would silently turn authentication off: refused in one line naming `where` it came from."""
    if api_key is not None and not api_key.strip():
        said = "--api-key" if where == "api_key" else where  # the command line names its flag
        raise ArgumentError(f"{where} is empty or blank: give a key, or leave {where} out to serve without "
                            "authentication", flag_message=f"{said} is empty or blank: give a key, or leave {said} "
                            "out to serve without authentication")


def serve(models: Any, *, host: str = "127.0.0.1", port: int = 8080, threads: int | None = None,
          log_level: str = "info", precision: str = "fp32", device: str = "auto", max_batch_tokens: int = 16384,
          max_wait_ms: float = 2.0, max_queue: int = 256, max_inputs: int = 128, max_body_bytes: int = 8 << 20,
          api_key: str | None = None, batches_in_flight: int = 2, read_timeout: float = 30.0,
          max_connections: int = 512, revision: str | None = None, max_request_chars: int = 1_000_000,
          header_timeout: float = 10.0, write_timeout: float = 30.0, max_connections_per_client: int = 256,
          graceful_timeout: float = 10.0, index: Any = None, reader: Any = None, retriever: Any = None,
          generator: Any = None, decoding: str = "thorough", num_beams: int = 4) -> None:
    """Serve `models` (as `create_app` takes them, with its options) on `host`:`port` until interrupted (SIGINT /
    SIGTERM: requests in flight are answered first, and the process is gone within `graceful_timeout` seconds),
    saying on stderr what each model serves. `api_key` (default: $BERTFORGE_API_KEY; unset or empty: no
    authentication). `threads`: torch's intra-op threads. The connection limits and deadlines are `bertforge
    serve`'s flags of the same names (docs/serving.md, "Limits")."""
    _check_serving(locals())
    check_args(locals(), host=TEXT, port=PORT, threads=maybe(COUNT), log_level=TEXT, header_timeout=POSITIVE,
               write_timeout=POSITIVE, max_connections_per_client=COUNT, graceful_timeout=POSITIVE)
    where = "api_key"
    if api_key is None:  # an unset or empty variable: no authentication
        api_key, where = os.environ.get("BERTFORGE_API_KEY") or None, "$BERTFORGE_API_KEY"
    check_api_key(api_key, where)
    import torch

    from bertforge.server import shutdown
    from bertforge.server.limits import bounded_protocol

    if threads:
        torch.set_num_threads(threads)
    app, loaded = _app(models, precision, device, revision, api_key, max_batch_tokens, max_wait_ms, max_queue,
                       max_inputs, max_body_bytes, batches_in_flight, read_timeout, max_connections,
                       max_request_chars, header_timeout, write_timeout, max_connections_per_client,
                       graceful_timeout, answer=(index, reader, retriever, generator, decoding, num_beams))
    for m in loaded.values():
        print(f"bertforge serve: {m.name} ({m.path}): {', '.join(m.tasks)}", file=sys.stderr)
    if index is not None:
        print(f"bertforge serve: /answer: index {index}, reader {reader}", file=sys.stderr)
    print(f"bertforge serve: authentication {'on (Bearer key)' if api_key else 'off (no --api-key)'}",
          file=sys.stderr)
    # uvicorn handles SIGTERM/SIGINT: it stops accepting, lets in-flight requests finish, then the app's
    # lifespan drains the batcher's queue, all within graceful_timeout (server.shutdown). Its protocol gets the
    # connection slots and the header and write deadlines (server.limits).
    protocol = bounded_protocol(min(header_timeout, read_timeout), max_connections, max_connections_per_client,
                                write_timeout, api_key)
    shutdown.run(app, graceful_timeout, host=host, port=port, log_level=log_level, access_log=log_level == "debug",
                 http=protocol)
