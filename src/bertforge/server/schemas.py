"""Request bodies (pydantic): wrong types are 422 errors naming the field. Strict strings: 5 is not "5"."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StrictBool, StrictInt, StrictStr


def _text(value: str) -> str:
    # JSON may escape a lone UTF-16 surrogate ("\ud800"): Python holds it, but it is no text, and the tokenizer
    # (and every UTF-8 writer, the error response included) fails on it
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"a lone surrogate ({value[err.start]!r}) at character {err.start} is not text") from None
    return value


Text = Annotated[StrictStr, AfterValidator(_text)]
Texts = Text | list[Text]


class _Request(BaseModel):
    model: Text | None = None  # a --model NAME; None: the first model that serves the route


class EmbedRequest(_Request):
    inputs: Texts
    normalize: StrictBool | None = None  # None: the model's own choice (a final Normalize module)
    truncate: StrictBool = False


class OpenAIEmbeddingRequest(_Request):
    input: Texts
    encoding_format: Text = "float"
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None  # only the model's own size (see server.app)
    truncate: StrictBool = False


class ClassifyRequest(_Request):
    # a text, a list of texts, or a list of [text, text_pair] pairs
    inputs: Text | list[Text | Annotated[list[Text], Field(min_length=2, max_length=2)]]
    truncate: StrictBool = False


class FillMaskRequest(_Request):
    inputs: Texts
    top_k: Annotated[StrictInt, Field(ge=1, le=100)] = 5
    truncate: StrictBool = False


class RerankRequest(_Request):
    query: Text
    texts: list[Text]
    truncate: StrictBool = False
    return_text: StrictBool = False


class SimilarityRequest(_Request):
    source_sentence: Text
    sentences: list[Text]
    truncate: StrictBool = False


class TokenizeRequest(_Request):
    inputs: Texts
    add_special_tokens: StrictBool = True


class AnswerRequest(BaseModel):
    question: Texts  # one question, or a list of them
    k: Annotated[StrictInt, Field(ge=1, le=1000)] | None = None  # passages per question (None: 20, or a generator's own)
