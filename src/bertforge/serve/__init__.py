"""`bertforge serve`: a batched HTTP inference service (FastAPI + uvicorn, the optional `serve` extra).

    models = load_models(["minilm=path/to/model"])        # registry: what each folder can do
    app = create_app(models, ServeOptions(max_queue=64))  # routes, limits, errors, metrics; batcher in lifespan

Requests from many clients are batched dynamically (`bertforge.serve.batcher`) and run through the same functions
the offline commands call, so the answers match `bertforge embed` / `predict` / `fill-mask`.
Importing this package needs fastapi; `bertforge.commands.serve` checks for it and names the extra.
"""
from bertforge.serve.app import ServeOptions, create_app
from bertforge.serve.registry import ServedModel, load_models

__all__ = ["ServeOptions", "ServedModel", "create_app", "load_models"]
