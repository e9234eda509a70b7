"""Row readers for local data files (.jsonl, .json, .parquet, .csv) and dotted-path field access."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

from tokenpo.errors import ConfigError

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
# Parquet is read in record batches so a large file (DAPO-Math-17k has ~1.8M rows) never sits in memory twice.
_PARQUET_BATCH_ROWS = 8192

MISSING = object()


def get_field(row: Mapping, path: str):
    """row[path], or the value at a dotted path ("reward_model.ground_truth", "prompt.0.content"); MISSING if absent.

    A key that itself contains dots is matched first; integer parts index into lists.
    """
    if path in row:
        return row[path]
    value = row
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def read_rows(path: Path) -> Iterator[dict]:
    """Yield the file's rows as dicts; the suffix picks the format. Unreadable input raises ConfigError."""
    if not path.is_file():
        raise ConfigError(f"data.path {path} does not exist")
    if path.stat().st_size == 0:
        raise ConfigError(f"data.path {path} is empty (0 bytes)")
    if path.suffix == ".jsonl":
        return _utf8_checked(_jsonl_rows(path), path)
    if path.suffix == ".json":
        return _utf8_checked(_json_rows(path), path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    if path.suffix == ".csv":
        return _utf8_checked(_csv_rows(path), path)
    raise ConfigError(f"data.path {path} has an unsupported suffix (supported: {', '.join(SUFFIXES)})")


def _utf8_checked(rows: Iterator[dict], path: Path) -> Iterator[dict]:
    """`rows`, with a decoding error turned into a one-line ConfigError naming the file and the bad byte's offset."""
    try:
        yield from rows
    except UnicodeDecodeError as error:
        # the decoder's offset counts from the start of its read buffer, not of the file: find the byte again
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as whole:
            error = whole
        raise ConfigError(f"data.path {path} is not UTF-8 text: byte {error.start} is 0x{error.object[error.start]:02x} "
                          f"({error.reason}); re-save the file as UTF-8") from error


def _jsonl_rows(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                # without its newline: the column of an error at the line's end is within the line
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as error:
                raise ConfigError(f"data.path {path} line {line_number} is not valid JSON: {error.msg} "
                                  f"(column {error.colno})") from error
            if not isinstance(row, dict):
                raise ConfigError(f"data.path {path} line {line_number} holds {json_kind(row)}, expected an object")
            yield row


def _json_rows(path: Path) -> Iterator[dict]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"data.path {path} is not valid JSON: {error.msg} (line {error.lineno}, column "
                          f"{error.colno})") from error
    if not isinstance(rows, list):
        raise ConfigError(f"data.path {path} holds {json_kind(rows)}, expected a JSON list of objects")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"data.path {path} item {index} holds {json_kind(row)}, expected an object")
    yield from rows


def _parquet_rows(path: Path) -> Iterator[dict]:
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ConfigError(f"reading {path} needs pyarrow (pip install 'tokenpo[data]')") from error
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=_PARQUET_BATCH_ROWS)
        for batch in batches:
            yield from batch.to_pylist()
    except pyarrow.ArrowException as error:
        raise ConfigError(f"data.path {path} is not a readable parquet file: {error}") from error


def _csv_rows(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            # more values than the header has columns: an unquoted comma ("1,000") shifted the columns after it
            if None in row:
                header = reader.fieldnames
                raise ConfigError(f"data.path {path} line {reader.line_num} has {len(header) + len(row[None])} "
                                  f"values for the header's {len(header)} ({', '.join(header)}): quote values "
                                  "that hold commas")
            yield row


def json_kind(value) -> str:
    """What a value read from a data file is, in JSON's words ("a number", "null"), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"
