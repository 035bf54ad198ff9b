"""The HTTP app: routes, limits, JSON errors, auth, timing headers and metrics around the batcher and the models.

Every error is JSON `{"error": message, "type": kind, "field": name-or-null}` with its status: 401 (missing or
wrong bearer token), 404 (unknown model or route, or a model that does not serve the route), 408 (headers or body
slower than the read timeout), 413 (too many inputs, an input over the model's length without `truncate`, a body
over the byte limit), 422 (malformed JSON, wrong types, an input the model refuses, `dimensions` a model cannot
give), 429 (the queue is full: retry later), 503 (starting or stopping, or too many open connections).
A request whose client goes away before its answer is cancelled, and its queued work dropped (`Around`).
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertforge.analysis.fill_mask import MASK_SPELLINGS
from bertforge.errors import BertforgeError
from bertforge.server import schemas as S
from bertforge.server.batcher import Batcher, Job, QueueFull
from bertforge.server.metrics import Metrics
from bertforge.server.registry import (CLASSIFY, EMBED, FILL_MASK, RERANK, SIMILARITY, TOKENIZE, Operation,
                                      ServedModel, normalize_rows)
from bertforge.server.texts import Prepared, Preparer, prepare, tokens_json

ROUTES = ("/embed", "/v1/embeddings", "/v1/models", "/classify", "/fill-mask", "/rerank", "/similarity", "/tokenize",
          "/health", "/info", "/metrics", "/answer")


@dataclass
class ServeOptions:
    max_batch_tokens: int = 16384  # rows x longest input per inference batch
    max_wait_ms: float = 2.0       # how long a batch waits for more requests once the first is taken
    max_queue: int = 256           # requests waiting; one more is answered 429
    max_inputs: int = 128          # inputs per request; more is 413
    max_body_bytes: int = 8 << 20  # request body size; more is 413
    api_key: str | None = None     # bearer token every route but /health needs
    batches_in_flight: int = 2     # handed to the inference thread at once: one computing, one filling
    read_timeout_s: float = 30.0   # a request's headers, then its body, must arrive within this (else 408)
    max_connections: int = 512     # open connections; one more gets 503 at once (server.limits)
    max_request_chars: int = 1_000_000  # characters of text in one request; more is 413 (server.texts)
    header_timeout_s: float = 10.0      # a request's headers must arrive within this, and read_timeout_s (408)
    write_timeout_s: float = 30.0       # a client that takes none of its response for this long is dropped
    max_connections_per_client: int = 256  # open connections from one address (server.limits)
    graceful_timeout_s: float = 10.0    # SIGTERM: the process is gone within this (server.shutdown)


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None, kind: str = "invalid_request"):
        super().__init__(message)
        self.status, self.message, self.field, self.kind = status, message, field, kind


def _error(status: int, message: str, field: str | None = None, kind: str = "invalid_request",
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "type": kind, "field": field}, status_code=status, headers=headers)


def _field_name(loc: tuple) -> str:
    """pydantic's error location as a field path: ("body", "inputs", "list[str]", 1) -> "inputs[1]"."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not any(c in part for c in "[]-") and part not in ("str", "int", "bool", "list"):  # union branch tags
            out += f".{part}" if out else part
    return out or "body"


class Around:
    """Around every HTTP request: the bearer token (401), the body limit (413: a Content-Length over it at once, a
    chunked body as soon as the bytes read pass it), the body's deadline (408: the whole body within
    `read_timeout_s` of the headers), JSON as the body's type, the in-flight gauge, the X-Total-Time-Ms header and
    the request metrics."""

    def __init__(self, app: Any, opts: ServeOptions, metrics: Metrics) -> None:
        self.app, self.opts, self.metrics = app, opts, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        path, headers = scope["path"], dict(scope["headers"])
        route = path if path in ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
        status = 500  # what the client gets if the app fails before it answers
        opts = self.opts
        size = headers.get(b"content-length", b"").decode("latin-1")
        given = headers.get(b"authorization", b"")
        refusal: Response | None = None
        if opts.api_key and path != "/health" and not hmac.compare_digest(given, f"Bearer {opts.api_key}".encode()):
            refusal = _error(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "Authorization",
                             "unauthorized", {"WWW-Authenticate": "Bearer", "Connection": "close"})  # no slot kept
        elif size.isdigit() and int(size) > opts.max_body_bytes:
            refusal = _error(413, f"request body of {size} bytes is over the limit of {opts.max_body_bytes}",
                             "body", "too_large", {"Connection": "close"})  # close: the body is never read
        if refusal is not None:
            status = refusal.status_code
            refusal.headers["X-Total-Time-Ms"] = f"{(time.perf_counter() - start) * 1000:.2f}"
            await refusal(scope, receive, send)
        else:
            if scope["method"] == "POST" and b"json" not in headers.get(b"content-type", b""):
                # every body is JSON: accept `curl -d '{...}'` (which says x-www-form-urlencoded) as such
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"] \
                    + [(b"content-type", b"application/json")]

            received, refused, started, body_done = 0, False, False, False
            task, watcher, gone = asyncio.current_task(), None, False

            async def watch() -> None:
                # the body is in: the next message is the client's disconnect (or our own answer being complete).
                # Gone before its answer: the request is cancelled, so its queued work is dropped (server.batcher)
                nonlocal gone
                if (await receive())["type"] == "http.disconnect" and not started and task is not None:
                    gone = True
                    task.cancel()

            async def refuse(code: int, message: str, kind: str) -> dict:
                # the client gets the error at once and the connection is closed (the rest of the body is never
                # read); the app sees a disconnect
                nonlocal refused, status
                refused, status = True, code
                if not started:
                    await _error(code, message, "body", kind, {"Connection": "close", "X-Total-Time-Ms":
                                                               f"{(time.perf_counter() - start) * 1000:.2f}"}
                                 )(scope, receive, send)
                return {"type": "http.disconnect"}

            async def limited_receive() -> dict:
                # A body without Content-Length (chunked) is counted as it streams in: past the limit 413, so at
                # most one chunk over the limit is ever held; a body still incomplete read_timeout_s after the
                # headers: 408 (a client trickling bytes holds no connection for long)
                nonlocal received, body_done, watcher
                if refused:
                    return {"type": "http.disconnect"}
                if body_done:  # e.g. waiting for the client to disconnect: no deadline
                    return await receive()
                left = start + opts.read_timeout_s - time.perf_counter()
                try:
                    message = await asyncio.wait_for(receive(), max(left, 0.0))
                except asyncio.TimeoutError:
                    return await refuse(408, f"the request body took over {opts.read_timeout_s:g} s", "timeout")
                if message["type"] == "http.request":
                    body_done = not message.get("more_body", False)
                    received += len(message.get("body", b""))
                    if received > opts.max_body_bytes:
                        return await refuse(413, f"request body over the limit of {opts.max_body_bytes} bytes",
                                            "too_large")
                    if body_done:
                        watcher = asyncio.get_running_loop().create_task(watch())
                return message

            async def timed_send(message: dict) -> None:
                nonlocal status, started
                if refused:  # the 413 went out: whatever the app answers to the disconnect is dropped
                    return
                if message["type"] == "http.response.start":
                    started = True
                    status = message["status"]
                    elapsed_ms = f"{(time.perf_counter() - start) * 1000:.2f}".encode()
                    message["headers"] = [*message.get("headers", ()), (b"x-total-time-ms", elapsed_ms)]
                await send(message)

            counted = path != "/metrics"
            self.metrics.in_flight += counted  # one event loop: no lock needed
            try:
                await self.app(scope, limited_receive, timed_send)
            except asyncio.CancelledError:
                if not gone:
                    raise
                task.uncancel()
                status = 499  # nginx's "client closed request", for the metrics
            finally:
                if watcher is not None:
                    watcher.cancel()
                self.metrics.in_flight -= counted
        self.metrics.request(route, status, time.perf_counter() - start)


def create_app(models: dict[str, ServedModel], options: ServeOptions | None = None,
               answerer: Any = None) -> FastAPI:
    """The FastAPI app serving `models` (the first is the default); the batcher runs while the app lives.
    `answerer`: an index and a reader (`api.reading.Asker`: `answerer(questions, k)` -> results with `to_dict()`)
    that /answer calls, in the inference thread as every model's work."""
    opts = options or ServeOptions()
    answer_op = None
    if answerer is not None:
        def answer_run(items: list[tuple[str, int]]) -> list[dict[str, Any]]:
            k = items[0][1]  # one request per call (not batchable): one k (None: the answerer's own)
            return [r.to_dict() for r in answerer([q for q, _ in items], k)]

        answer_op = Operation("answer", answer_run, batchable=False)
    metrics = Metrics()
    batcher = Batcher(opts.max_batch_tokens, opts.max_wait_ms, opts.max_queue, on_batch=metrics.batch,
                      max_in_flight=opts.batches_in_flight)
    state = {"ready": False}
    preparer = Preparer(list(models.values()))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        state["ready"] = True
        try:
            yield
        finally:  # uvicorn has let in-flight requests finish; drain whatever is still queued
            state["ready"] = False
            preparer.shutdown()
            await batcher.stop()

    app = FastAPI(title="bertforge serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    # ---- errors ----------------------------------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, err: ApiError) -> JSONResponse:
        if err.status == 429:
            metrics.rejected.inc()
        return _error(err.status, err.message, err.field, err.kind,
                      headers={"Retry-After": "1"} if err.status == 429 else None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors() or [{"loc": ("body",), "msg": "invalid request"}]
        if errors[0].get("type") == "json_invalid":
            return _error(422, f"malformed JSON: {errors[0].get('msg')}", "body", "invalid_json")
        first = max(errors, key=lambda e: len(e.get("loc", ())))  # a union's deepest branch: inputs[1], not inputs
        field = _field_name(first.get("loc", ()))
        return _error(422, f"{field}: {first.get('msg')}", field, "invalid_field")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers 400 "error parsing the body" to JSON that json.loads refuses other than by
        # JSONDecodeError: nesting past the recursion limit, bytes that are not UTF-8
        cause = err.__cause__
        if err.status_code == 400 and isinstance(cause, (RecursionError, ValueError)):
            why = "nested too deeply" if isinstance(cause, RecursionError) else \
                f"not UTF-8 ({cause})" if isinstance(cause, UnicodeDecodeError) else str(cause).splitlines()[0]
            return _error(422, f"malformed JSON: {why}", "body", "invalid_json")
        return _error(err.status_code, str(err.detail), None, "not_found" if err.status_code == 404 else "http")

    # ---- auth, body limit, timing, metrics: a plain ASGI middleware (Starlette's BaseHTTPMiddleware, which
    # @app.middleware("http") builds, runs every request through an extra task and memory streams) ---------------
    app.add_middleware(Around, opts=opts, metrics=metrics)

    # ---- helpers ---------------------------------------------------------------------------------------------------
    def pick(name: str | None, task: str) -> ServedModel:
        if name is None:
            found = next((m for m in models.values() if task in m.tasks), None)
            if found is None:
                raise ApiError(404, f"no model here serves /{task} (models: {', '.join(models)})", "model",
                               "model_not_found")
            return found
        model = models.get(name)
        if model is None:
            raise ApiError(404, f"unknown model {name!r} (models: {', '.join(models)})", "model", "model_not_found")
        if task not in model.tasks:
            raise ApiError(404, f"model {name!r} does not serve /{task} (it serves: {', '.join(model.tasks)})",
                           "model", "model_not_found")
        return model

    def as_list(value: str | list, field: str) -> list:
        items = [value] if isinstance(value, str) else list(value)
        if not items:
            raise ApiError(422, f"{field}: give at least one input", field, "invalid_field")
        if len(items) > opts.max_inputs:
            raise ApiError(413, f"{field}: {len(items)} inputs, over the limit of {opts.max_inputs} per request",
                           field, "too_many_inputs")
        return items

    def check_lengths(model: ServedModel, lengths: list[int], truncate: bool, field: str,
                      partial: list[bool] | None = None) -> None:
        if truncate:
            return
        for i, n in enumerate(lengths):
            if n > model.max_length:
                count = f"over {n - 1}" if partial and partial[i] else str(n)  # partial: only its start was read
                raise ApiError(413, f"{field}[{i}]: {count} tokens, over the model's limit of {model.max_length} "
                                    "(send \"truncate\": true to cut it)", f"{field}[{i}]", "input_too_long")

    async def prepared(model: ServedModel, texts: list[str], pairs: list[str | None] | None, truncate: bool,
                       field: str, chars: int | None = None) -> Prepared:
        """The texts cut for `truncate`, counted, and checked against the character and length limits; tokenized
        off the event loop unless small (server.texts)."""
        if chars is None:
            chars = sum(map(len, texts)) + sum(len(p) for p in pairs or () if p is not None)
        if chars > opts.max_request_chars:
            raise ApiError(413, f"{field}: {chars} characters of text, over the limit of {opts.max_request_chars} "
                                "per request", field, "too_large")
        done = await preparer.run(model, chars, prepare, model.max_length, texts, pairs, truncate)
        check_lengths(model, done.lengths, truncate, field, done.partial)
        return done

    async def run(model: ServedModel | None, task: str, inputs: list, lengths: list[int]) -> Job:
        try:
            job = await batcher.submit(model.ops[task] if model is not None else answer_op, inputs, lengths)
        except QueueFull as err:
            raise ApiError(429, f"{err}: retry later", None, "overloaded") from None
        except BertforgeError as err:
            raise ApiError(422, str(err), None, "invalid_input") from None
        metrics.job(task, job.queue_s, job.compute_s, len(inputs), sum(lengths))
        return job

    def respond(content: Any, job: Job | None = None) -> JSONResponse:
        headers = {}
        if job is not None:
            headers = {"X-Queue-Time-Ms": f"{job.queue_s * 1000:.2f}",
                       "X-Compute-Time-Ms": f"{job.compute_s * 1000:.2f}", "X-Batch-Size": str(job.batch_rows)}
        return JSONResponse(content, headers=headers)

    async def vectors(body: Any, texts: list[str], field: str, task: str = EMBED) -> tuple[ServedModel, np.ndarray,
                                                                                            list[int], Job]:
        model = pick(body.model, task)
        done = await prepared(model, texts, None, body.truncate, field)
        lengths = done.lengths
        job = await run(model, EMBED, done.texts, lengths)
        normalize = getattr(body, "normalize", None)
        return model, normalize_rows(job.results, model.normalizes if normalize is None else normalize), lengths, job

    # ---- routes ----------------------------------------------------------------------------------------------------
    @app.post("/embed")
    async def embed(body: S.EmbedRequest) -> JSONResponse:
        _, vecs, _, job = await vectors(body, as_list(body.inputs, "inputs"), "inputs")
        return respond(vecs.tolist(), job)

    @app.post("/v1/embeddings")
    async def openai_embeddings(body: S.OpenAIEmbeddingRequest) -> JSONResponse:
        if body.encoding_format not in ("float", "base64"):
            raise ApiError(422, "encoding_format: expected 'float' or 'base64'", "encoding_format", "invalid_field")
        # OpenAI shortens only models trained for it (Matryoshka) and refuses `dimensions` for the others; no
        # model bertforge serves declares that training, so only the model's own size is accepted
        served = pick(body.model, EMBED)
        if body.dimensions is not None and body.dimensions != served.dim:
            raise ApiError(422, f"dimensions: {served.name} gives {served.dim}-dimensional embeddings and was not "
                                f"trained to be shortened (Matryoshka); leave dimensions out or give {served.dim}",
                           "dimensions", "invalid_field")
        model, vecs, lengths, job = await vectors(body, as_list(body.input, "input"), "input")
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                 if body.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vecs)]
        return respond({"object": "list", "data": data, "model": model.name,
                        "usage": {"prompt_tokens": sum(lengths), "total_tokens": sum(lengths)}}, job)

    @app.post("/similarity")
    async def similarity(body: S.SimilarityRequest) -> JSONResponse:
        sentences = as_list(body.sentences, "sentences")
        _, vecs, _, job = await vectors(body, [body.source_sentence, *sentences], "sentences", SIMILARITY)
        unit = normalize_rows(list(vecs), True)  # cosine, as sentence-transformers' similarity
        return respond((unit[1:] @ unit[0]).tolist(), job)

    @app.post("/classify")
    async def classify(body: S.ClassifyRequest) -> JSONResponse:
        model = pick(body.model, CLASSIFY)
        items = [(x, None) if isinstance(x, str) else (x[0], x[1]) for x in as_list(body.inputs, "inputs")]
        done = await prepared(model, [t for t, _ in items], [p for _, p in items], body.truncate, "inputs")
        job = await run(model, CLASSIFY, list(zip(done.texts, done.pairs)), done.lengths)
        return respond(job.results, job)

    @app.post("/rerank")
    async def rerank(body: S.RerankRequest) -> JSONResponse:
        model = pick(body.model, RERANK)
        texts = as_list(body.texts, "texts")
        done = await prepared(model, [body.query] * len(texts), texts, body.truncate, "texts",
                              len(body.query) + sum(map(len, texts)))
        job = await run(model, RERANK, list(zip(done.texts, done.pairs)), done.lengths)
        ranked = sorted(range(len(texts)), key=lambda i: -job.results[i])
        return respond([{"index": i, "score": job.results[i], **({"text": texts[i]} if body.return_text else {})}
                        for i in ranked], job)

    @app.post("/fill-mask")
    async def fill_mask(body: S.FillMaskRequest) -> JSONResponse:
        model = pick(body.model, FILL_MASK)
        texts = as_list(body.inputs, "inputs")
        spellings = (*MASK_SPELLINGS, model.tokenizer.mask_token)
        for i, t in enumerate(texts):
            if not any(s and s in t for s in spellings):
                raise ApiError(422, f"inputs[{i}]: no mask token (write {model.tokenizer.mask_token} where a word is "
                                    "missing)", f"inputs[{i}]", "invalid_field")
        done = await prepared(model, texts, None, body.truncate, "inputs")
        job = await run(model, FILL_MASK, [(t, body.top_k) for t in done.texts], done.lengths)
        return respond(job.results, job)

    @app.post("/tokenize")
    async def tokenize(body: S.TokenizeRequest) -> Response:
        model = pick(body.model, TOKENIZE)
        texts = as_list(body.inputs, "inputs")
        chars = sum(map(len, texts))
        if chars > opts.max_request_chars:
            raise ApiError(413, f"inputs: {chars} characters of text, over the limit of {opts.max_request_chars} "
                                "per request", "inputs", "too_large")

        def tokens(tokenizer: Any) -> Response:  # off the loop for a long text, the response's JSON too
            return Response(tokens_json(tokenizer, texts, body.add_special_tokens), media_type="application/json")

        return await preparer.run(model, chars, tokens)

    @app.post("/answer")
    async def answer(body: S.AnswerRequest) -> JSONResponse:
        if answerer is None:
            raise ApiError(404, "no index and reader here: start serve with --index DIR --reader DIR (or "
                                "--generator DIR) to answer questions", None, "not_found")
        questions = as_list(body.question, "question")
        for i, q in enumerate(questions):
            if not q.strip():
                raise ApiError(422, f"question[{i}]: an empty question", f"question[{i}]", "invalid_field")
        # the batch budget counts what a question costs the reader: k rows of up to its length
        k = body.k if body.k is not None else getattr(answerer, "k_default", 20)
        job = await run(None, "answer", [(q, body.k) for q in questions], [k * answerer.max_len] * len(questions))
        return respond(job.results[0] if isinstance(body.question, str) else job.results, job)

    # OpenAI's model list (what `client.models.list()` / `retrieve()` read)
    def model_card(model: ServedModel) -> dict[str, Any]:
        return {"id": model.name, "object": "model", "created": model.created, "owned_by": "bertforge"}

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return respond({"object": "list", "data": [model_card(m) for m in models.values()]})

    @app.get("/v1/models/{model_id:path}")  # :path: a name may hold a slash ("org/name")
    async def get_model(model_id: str) -> JSONResponse:
        if model_id not in models:
            raise ApiError(404, f"unknown model {model_id!r} (models: {', '.join(models)})", "model",
                           "model_not_found")
        return respond(model_card(models[model_id]))

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = state["ready"]
        return JSONResponse({"status": "ok" if ready else "unavailable", "live": True, "ready": ready},
                            status_code=200 if ready else 503)

    @app.get("/info")
    async def info() -> JSONResponse:
        limits = {k: v for k, v in asdict(opts).items() if k != "api_key"}
        return respond({"models": [m.info() for m in models.values()], "default_model": next(iter(models), None),
                        "limits": limits, "auth": bool(opts.api_key)})

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(batcher.depth), media_type="text/plain; version=0.0.4")

    app.state.batcher, app.state.metrics = batcher, metrics
    return app
