"""Request bodies (pydantic): wrong types are 422 errors naming the field. Strict strings: 5 is not "5"."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

Texts = StrictStr | list[StrictStr]


class _Request(BaseModel):
    model: StrictStr | None = None  # a --model NAME; None: the first model that serves the route


class EmbedRequest(_Request):
    inputs: Texts
    normalize: StrictBool | None = None  # None: the model's own choice (a final Normalize module)
    truncate: StrictBool = False


class OpenAIEmbeddingRequest(_Request):
    input: Texts
    encoding_format: StrictStr = "float"
    truncate: StrictBool = False


class ClassifyRequest(_Request):
    # a text, a list of texts, or a list of [text, text_pair] pairs
    inputs: StrictStr | list[StrictStr | Annotated[list[StrictStr], Field(min_length=2, max_length=2)]]
    truncate: StrictBool = False


class FillMaskRequest(_Request):
    inputs: Texts
    top_k: Annotated[StrictInt, Field(ge=1, le=100)] = 5
    truncate: StrictBool = False


class RerankRequest(_Request):
    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool = False
    return_text: StrictBool = False


class SimilarityRequest(_Request):
    source_sentence: StrictStr
    sentences: list[StrictStr]
    truncate: StrictBool = False


class TokenizeRequest(_Request):
    inputs: Texts
    add_special_tokens: StrictBool = True
