"""Reading the user's files: one place for opening, decoding and file:line error messages.

Two policies, because two kinds of input exist:
  * strict (task data, JSON configs, embedding pairs): a problem is the user's to fix, so it raises a
    BertforgeError naming ``file:line`` (`text_lines`, `jsonl_rows`, `tsv_rows`, `csv_rows`, `read_json`);
  * lenient (pretraining corpora, gigabytes of scraped text): a bad line must not cost the whole corpus, so it
    is repaired and reported once as a ``file:line`` warning (`LineReader` with ``strict=False``).
Only the standard library is imported here: every layer of bertforge may use it.
"""
from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import logging
import lzma
import re
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from bertforge.errors import BertforgeError

log = logging.getLogger("bertforge.data")

MAX_WARNINGS_PER_FILE = 5
# What a damaged file raises mid-read: a truncated gzip (EOFError), a bad CRC or header (BadGzipFile, an OSError),
# corrupt deflate or xz data (zlib.error, lzma.LZMAError), a failing disk (OSError); bz2 raises OSError.
READ_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)
# Compressed files are read as the format under the compression suffix (data.csv.gz is CSV); .zst needs zstandard.
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
# The csv module refuses a field over 128 KiB by default; a long document in one cell is data, not damage. The
# bound stays finite so that a file with one unmatched quote is refused rather than read whole into one field.
CSV_FIELD_LIMIT = 256 << 20


def warn(message: str) -> None:
    """Report a data problem once, on one line, through both logging and warnings."""
    log.warning(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def where(path: str | Path, line: int) -> str:
    return f"{Path(path).name}:{line}"


def require_file(path: str | Path, what: str = "") -> Path:
    """`path` as a Path, or a one-line error when it is not a readable file."""
    p = Path(path)
    if not p.is_file():
        kind = "a folder, not a file" if p.is_dir() else "no such file"
        raise BertforgeError(f"{what + ': ' if what else ''}{p}: {kind}")
    return p


def compression(path: str | Path) -> str:
    """The compression suffix `path` ends in (".gz", ".bz2", ".xz", ".zst"), or ""."""
    name = Path(path).name.lower()
    return next((c for c in COMPRESSIONS if name.endswith(c)), "")


def uncompressed_name(path: str | Path) -> str:
    """The file's name without its compression suffix (data.csv.gz: data.csv), lower case: what its format is."""
    name = Path(path).name.lower()
    return name[:len(name) - len(compression(name))]


def open_binary(path: Path) -> BinaryIO:
    """A binary stream of `path`, decompressed by its suffix (.gz, .bz2, .xz; .zst when zstandard is installed)."""
    kind = compression(path)
    if kind == ".gz":
        return gzip.open(path, "rb")
    if kind == ".bz2":
        return bz2.open(path, "rb")
    if kind == ".xz":
        return lzma.open(path, "rb")
    if kind == ".zst":
        zstandard = zstd_module(path)
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def zstd_module(path: str | Path) -> Any:
    """zstandard, or one line saying that reading `path` (a .zst file) needs it: checked for a whole corpus before
    any of it is read."""
    try:
        import zstandard
    except ImportError:
        raise BertforgeError(f"{path}: reading a .zst file needs zstandard (pip install zstandard), or decompress it "
                             "first (zstd -d)") from None
    return zstandard


def open_text(path: Path) -> io.TextIOWrapper:
    """A text stream of `path` (decompressed as `open_binary`) for the csv module: UTF-8 after an optional
    byte-order mark, undecodable bytes kept as lone surrogates ("surrogateescape") so that the reader blames the
    line that holds them (`bad_utf8`) rather than the line where the decoder's chunk began."""
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors="surrogateescape", newline="")


def bad_utf8(fields: list[str], line: int, path: Path) -> None:
    """Raise naming the line of the first undecodable byte in a record's `fields` (starting at `line`)."""
    text = "\x00".join(fields)
    found = _ESCAPED.search(text)
    if found is not None:
        at, byte = found.start(), ord(found.group()) - 0xDC00
        raise BertforgeError(f"{where(path, line + text.count(chr(10), 0, at))}: invalid UTF-8 (byte 0x{byte:02x})")


_ESCAPED = re.compile("[\udc80-\udcff]")  # an undecodable byte, as "surrogateescape" keeps it


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (json.loads keeps the last silently)."""

    def __init__(self, key: str):
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads' object_pairs_hook: an object, or DuplicateKey when a key appears twice."""
    obj: dict = {}
    for key, item in pairs:
        if key in obj:
            raise DuplicateKey(key)
        obj[key] = item
    return obj


def read_json(path: str | Path, expect: type = dict, pairs_hook: Any = None) -> Any:
    """A JSON file's content (compressed too), which must be an `expect` (dict by default); an object naming a key
    twice is refused (`pairs_hook`: json.loads' object_pairs_hook instead of that check)."""
    p = require_file(path)
    try:
        with open_binary(p) as fh:
            raw = fh.read()
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs_hook or unique_pairs)
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise BertforgeError(f"{p}:{line}: invalid UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise BertforgeError(f"{p}:{err.lineno}: invalid JSON ({err.msg})") from None
    except DuplicateKey as err:
        raise BertforgeError(f"{p}: {err}; keep one") from None
    except READ_ERRORS as err:
        raise BertforgeError(f"{p}: cannot read ({getattr(err, 'strerror', None) or err})") from None
    if not isinstance(data, expect):
        raise BertforgeError(f"{p}: expected a JSON {expect.__name__}, found {type(data).__name__}")
    return data



def safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from a .safetensors file's header alone (8-byte little-endian length, then JSON):
    the shapes a config can be checked against before anything is allocated."""
    p = require_file(path)
    try:
        with open(p, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= 100 << 20:  # safetensors' own ceiling on the header is 100 MB
                raise ValueError(f"header length {size}")
            header = json.loads(f.read(size).decode("utf-8"))
        return {name: tuple(int(n) for n in info["shape"]) for name, info in header.items()
                if name != "__metadata__"}
    except OSError as err:
        raise BertforgeError(f"{p}: cannot read ({err.strerror})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as err:  # JSON and UTF-8 errors are ValueErrors
        raise BertforgeError(f"{p}: not a readable safetensors file (header: {err})") from None

# ---------------------------------------------------------------------------------------------- line reader

def _cut_point(chunk: bytes) -> int:
    """Where to split a chunk of an over-long line: after the last whitespace in its tail, else on a UTF-8
    character boundary, so that neither a word nor a multi-byte character is split across chunks."""
    tail_start = len(chunk) - max(1, len(chunk) // 16)
    ws = max(chunk.rfind(b" ", tail_start), chunk.rfind(b"\t", tail_start))
    if ws > 0:
        return ws + 1
    cut = len(chunk)
    while cut > len(chunk) - 3 and cut > 1 and (chunk[cut - 1] & 0xC0) == 0x80:  # back over continuation bytes
        cut -= 1
    if chunk[cut - 1] >= 0xC0:  # ... and over the lead byte of the (possibly split) last character
        cut -= 1
    return cut if cut > 0 else len(chunk)


class LineReader:
    """Yield (line_number, text) from a binary stream, without line endings.

    strict=True: invalid UTF-8 raises a BertforgeError naming file:line. strict=False: it is replaced (U+FFFD)
    and reported as a warning (the first few per file). A line longer than `max_bytes` comes as several pieces with
    the same line number (chunk_long_lines) or is skipped with a warning (records that must parse whole).
    A file that cannot be read to its end (a truncated or corrupt .gz, a disk error) raises a BertforgeError
    when strict; otherwise the lines read so far stand, one warning says how much was read, and iteration ends.
    """

    def __init__(self, path: Path, fh: BinaryIO, max_bytes: int = 1 << 20, chunk_long_lines: bool = True,
                 strict: bool = False):
        self.path, self.fh, self.max_bytes, self.chunk_long_lines = path, fh, max_bytes, chunk_long_lines
        self.strict = strict
        self.bad_lines = 0
        self.bytes_read = 0     # uncompressed bytes handed out so far

    def _decode(self, raw: bytes, lineno: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if self.strict:
                raise BertforgeError(f"{where(self.path, lineno)}: invalid UTF-8 "
                                     f"({err.reason} at byte {err.start})") from None
            self.bad_lines += 1
            if self.bad_lines <= MAX_WARNINGS_PER_FILE:
                warn(f"{self.path}:{lineno}: invalid UTF-8 (byte 0x{raw[err.start]:02x}) replaced with U+FFFD")
            elif self.bad_lines == MAX_WARNINGS_PER_FILE + 1:
                warn(f"{self.path}:{lineno}: more invalid UTF-8; further warnings for this file suppressed")
            return raw.decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[tuple[int, str]]:
        lineno, carry, continuing = 0, b"", False
        while True:
            try:
                raw = carry + self.fh.readline(max(1, self.max_bytes - len(carry)))
            except READ_ERRORS as err:
                self._stopped(err, lineno + (not continuing))
                return
            self.bytes_read += len(raw) - len(carry)
            carry = b""
            if not raw:
                return
            if not continuing:
                lineno += 1
            if raw.endswith(b"\n") or len(raw) < self.max_bytes:
                continuing = False
                yield lineno, self._decode(raw, lineno).rstrip("\r\n")
                continue
            # A piece of an over-long line.
            if not self.chunk_long_lines:
                warn(f"{self.path}:{lineno}: record longer than {self.max_bytes} bytes skipped")
                while raw and not raw.endswith(b"\n"):
                    try:
                        raw = self.fh.readline(self.max_bytes)
                    except READ_ERRORS as err:
                        self._stopped(err, lineno)
                        return
                    self.bytes_read += len(raw)
                continue
            if not continuing:
                warn(f"{self.path}:{lineno}: line longer than {self.max_bytes} bytes; read in chunks")
            continuing = True
            cut = _cut_point(raw)
            raw, carry = raw[:cut], raw[cut:]
            yield lineno, self._decode(raw, lineno)

    def _stopped(self, err: BaseException, lineno: int) -> None:
        """A read failed at `lineno`: raise (strict) or warn once with how much of the file was read."""
        why = str(err) or type(err).__name__
        if self.strict:
            raise BertforgeError(f"{where(self.path, lineno)}: cannot read further ({why})") from None
        at = ""
        raw = getattr(self.fh, "fileobj", None)  # a GzipFile's compressed stream: how far into it we got
        if raw is not None:
            try:
                at = f" at compressed byte {raw.tell():,} of {self.path.stat().st_size:,}"
            except (OSError, ValueError):
                pass
        warn(f"{self.path}:{lineno}: file damaged or cut short{at} ({why}); kept the {lineno - 1:,} lines "
             f"({self.bytes_read:,} bytes) read before it, the rest of the file is lost")


# ---------------------------------------------------------------------------------------------- strict readers

def text_lines(path: str | Path, skip_blank: bool = True) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file (.gz too); invalid UTF-8 raises naming file:line."""
    p = require_file(path)
    with open_binary(p) as fh:
        for no, line in LineReader(p, fh, max_bytes=1 << 30, strict=True):
            if no == 1:
                line = line.lstrip("\ufeff")  # byte-order mark
            if line.strip() or not skip_blank:
                yield no, line


def jsonl_rows(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file; bad UTF-8, bad JSON or a non-object line
    raises a BertforgeError naming file:line."""
    p = Path(path)
    for n, line in text_lines(p):
        try:
            obj = json.loads(line, object_pairs_hook=unique_pairs)
        except json.JSONDecodeError as e:
            raise BertforgeError(f"{where(p, n)}: invalid JSON ({e.msg})") from None
        except DuplicateKey as e:
            raise BertforgeError(f"{where(p, n)}: {e}") from None
        if not isinstance(obj, dict):
            raise BertforgeError(f"{where(p, n)}: expected a JSON object, found {type(obj).__name__}")
        yield n, obj


def tsv_rows(path: str | Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a GLUE-style tsv. Quotes are ordinary characters (QUOTE_NONE): an unmatched `"`
    inside a sentence would otherwise swallow the following lines. Blank lines are skipped."""
    p = require_file(path)
    # utf-8-sig: the MRPC files start with a byte-order mark that would otherwise glue onto the first header
    with open_text(p) as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            for row in reader:
                bad_utf8(row, reader.line_num, p)
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                yield reader.line_num, row
        except csv.Error as err:
            raise BertforgeError(f"{where(p, reader.line_num + 1)}: malformed TSV ({err})") from None
        except READ_ERRORS as err:
            raise BertforgeError(f"{where(p, reader.line_num + 1)}: cannot read further ({err})") from None


def csv_rows(path: str | Path, delimiter: str = ",") -> Iterator[tuple[int, list[str]]]:
    """(line number where the record starts, fields) of an ordinary (quoted) CSV file; blank records skipped."""
    p = require_file(path)
    with open_text(p) as f:
        reader = csv.reader(f, delimiter=delimiter)
        start = 1
        try:
            for row in reader:
                bad_utf8(row, start, p)
                if row and any(c.strip() for c in row):
                    yield start, row
                start = reader.line_num + 1
        except READ_ERRORS as err:
            raise BertforgeError(f"{where(p, start)}: cannot read further ({err})") from None
        except csv.Error as err:
            raise BertforgeError(f"{where(p, start)}: malformed CSV ({err})") from None
