"""`bertforge serve`: a batched HTTP inference service (FastAPI + uvicorn, the optional `serve` extra).

    models = load_models(["minilm=path/to/model"])        # registry: what each folder can do
    app = create_app(models, ServeOptions(max_queue=64))  # routes, limits, errors, metrics; batcher in lifespan

Requests from many clients are batched dynamically (`bertforge.server.batcher`) and run through the same functions
the offline commands call, so the answers match `bertforge embed` / `predict` / `fill-mask`.
Its names need fastapi and are imported on first use: importing the package loads neither torch nor fastapi
(`bertforge.api.serve` names the extra when it is missing).
"""
_MODULES = {"ServeOptions": "app", "create_app": "app", "ServedModel": "registry", "load_models": "registry"}
__all__ = ["ServeOptions", "ServedModel", "create_app", "load_models"]


def __getattr__(name: str):
    if name in _MODULES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
