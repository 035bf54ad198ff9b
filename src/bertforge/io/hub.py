"""Model names as users type them: a local folder, or a model id on the Hugging Face Hub.

`resolve_model_path(name, revision)` turns what a user gave (`--model`, `--teacher`, `--init-from`, a model to
serve, a `from_pretrained` argument) into a local path before anything in it is read:

  * a path that exists is itself (a revision is then refused: it names a version of a Hub model);
  * otherwise a Hub id (`owner/name`, or a legacy `name`) is a snapshot folder from `huggingface_hub`, at `revision`
    (a branch, tag or commit; default: main). Online it downloads what bertforge reads (config, safetensors
    weights, tokenizer and sentence-transformers files; never pickled weights), with the token from `HF_TOKEN`
    for private or gated models; offline (`HF_HUB_OFFLINE=1`, or the Hub out of reach) it takes the snapshot
    from the local cache (`HF_HOME`, `HF_HUB_CACHE`), as transformers does;
  * anything else, or an id missing from the cache while offline, is one line naming the flag.

huggingface_hub is installed with `tokenizers`; it is imported only when a name is no local path.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from bertforge.errors import BertforgeError

# The files a model folder may need (config, safetensors weights, tokenizers, sentence-transformers modules); a
# repository's pickled, TensorFlow, Flax and ONNX weights are not downloaded.
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model")
# owner/name or a legacy name without owner; letters, digits, '-', '_', '.' (the Hub's own rule), no path parts
_HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}")


def looks_like_model_id(name: str) -> bool:
    """Whether `name` (not an existing path) could be a Hub model id rather than a mistyped path."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name and not name.endswith((".onnx", ".json", ".git"))


def named(flag: str, name: str | Path) -> str:
    """How a message names what the user gave: "--model X" (or "--model NAME=X" for `serve`, "X" for a
    positional argument)."""
    return f"{flag}{name}" if flag.endswith("=") or not flag else f"{flag} {name}"


def resolve_model_path(name: str | Path, revision: str | None = None, flag: str = "--model") -> Path:
    """The local folder (or .onnx file) `name` stands for: itself when it exists, else the Hub snapshot of the id
    at `revision`; one line naming `flag` when it is neither."""
    path = Path(name).expanduser()
    if os.path.lexists(path):
        if revision is not None:
            raise BertforgeError(f"{named(flag, name)}: --revision {revision} names a version of a Hugging Face Hub "
                                 "model, but this is a local path")
        return path
    if isinstance(name, str) and looks_like_model_id(name):
        return hub_snapshot(name, revision, flag)
    raise BertforgeError(f"{named(flag, name)}: model directory not found")


def resolve_model_option(name: str | Path, revision: str | None = None, flag: str = "--model") -> Path:
    """`resolve_model_path` for a verb's model options, where one `revision` (the command's --revision) may be meant
    for another of them: it applies to a Hub id and is ignored for a local path."""
    local = os.path.lexists(Path(name).expanduser())
    return resolve_model_path(name, None if local else revision, flag)


def hub_snapshot(model_id: str, revision: str | None = None, flag: str = "--model") -> Path:
    """The folder of `model_id` at `revision` from huggingface_hub: downloaded, or from the cache when offline."""
    from huggingface_hub import constants, errors, snapshot_download

    where = named(flag, model_id) + (f" (revision {revision})" if revision else "")
    try:
        folder = snapshot_download(model_id, revision=revision, allow_patterns=list(HUB_FILES),
                                   token=os.environ.get("HF_TOKEN") or None)
    except errors.RevisionNotFoundError:
        raise BertforgeError(f"{where}: the Hugging Face Hub has no such revision") from None
    except (errors.GatedRepoError, errors.RepositoryNotFoundError):  # (gated is a kind of not-found: first)
        raise BertforgeError(f"{where}: not a local folder, and not a model on the Hugging Face Hub that this "
                             "token may read (a private or gated model needs HF_TOKEN)") from None
    except errors.LocalEntryNotFoundError:
        why = "offline (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub cannot be reached"
        raise BertforgeError(f"{where}: no such folder, and not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                             f"while {why}") from None
    except errors.HfHubHTTPError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BertforgeError(f"{where}: the Hugging Face Hub refused the download ({reason})") from None
    except OSError as err:  # a cache that cannot be written (read-only HF_HOME, a full disk)
        raise BertforgeError(f"{where}: cannot download into the Hugging Face cache ({err.strerror or err})") from None
    return Path(folder)
