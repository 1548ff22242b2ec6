"""The harness's one reader and one writer of JSON-lines files (run records, overhead records, the item file).

Writing (`Writer`): the records of a batch are encoded first and written with `os.write` as complete lines, then
flushed to disk (`fsync`) before the next batch. A process killed in the middle of a write can therefore leave at
most one unfinished line, and only at the end of the file. Opening a file to append first repairs such a tail:
an unfinished line that is not a whole record is cut off (with a warning; its run is simply done again), so the
next record starts on a line of its own instead of being glued onto the torn one. A last line that is a whole
record but lacks its newline (a file written by something else) is kept and given its newline.

Reading (`scan`, `read`): every line must be valid UTF-8 holding one JSON object with the required key (a
non-empty string). Any other line (an empty line, `42`, `null`, `[1, 2]`, `{}`, invalid UTF-8, garbage, a torn
last line) is skipped and counted, and `read` names each one (file:line and why) on stderr; the readable records
around it are all returned.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Iterable

RUN_ID = "run_id"
MAX_NAMED = 20          # bad lines named one by one per file; the rest are only counted
_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class BadLine:
    line: int      # 1-based
    reason: str


@dataclasses.dataclass
class Scan:
    records: list[dict]
    bad: list[BadLine]
    lines: int     # lines looked at (empty ones included)


def _kind(x) -> str:
    if x is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(x), type(x).__name__)


def parse_line(raw: bytes, required: str = RUN_ID, kind: type = str) -> tuple[dict | None, str | None]:
    """(record, None) for a good line (without its newline), else (None, why it is not one). A record is a JSON
    object whose `required` key holds a `kind` (a non-empty one for a string)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not valid UTF-8 (byte {e.start})"
    if not text.strip():
        return None, "empty line"
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg} at column {e.colno})"
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    if not isinstance(rec, dict):
        return None, f"not a JSON object but {_kind(rec)}"
    if required not in rec:
        return None, f"no {required}"
    key = rec[required]
    if not isinstance(key, kind) or isinstance(key, bool) or key == "":
        return None, f"{required} is {_kind(key)}, not a non-empty {kind.__name__}"
    return rec, None


def scan(path: Path, required: str = RUN_ID, kind: type = str) -> Scan:
    """Every record of `path` (none when it does not exist) and every line that is not one."""
    out = Scan([], [], 0)
    if not Path(path).is_file():
        return out
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    torn = not data.endswith(b"\n")     # the last piece is "" when the file ends with a newline
    if not torn:
        lines.pop()
    for n, raw in enumerate(lines, 1):
        rec, why = parse_line(raw, required, kind)
        if rec is not None:
            out.records.append(rec)
        else:
            if torn and n == len(lines):
                why = f"unfinished last line, no newline (an interrupted write?): {why}"
            out.bad.append(BadLine(n, why))
    out.lines = len(lines)
    return out


def warn(path: Path, s: Scan) -> None:
    if not s.bad:
        return
    for b in s.bad[:MAX_NAMED]:
        print(f"warning: {path}:{b.line}: {b.reason}; line skipped", file=sys.stderr)
    more = f" ({len(s.bad) - MAX_NAMED} not named)" if len(s.bad) > MAX_NAMED else ""
    print(f"warning: {path}: skipped {len(s.bad)} unreadable line(s) of {s.lines}{more}; "
          f"{len(s.records)} records read", file=sys.stderr)


def read(path: Path, required: str = RUN_ID) -> list[dict]:
    """The records of `path`, warning on stderr about every line skipped."""
    s = scan(path, required)
    warn(path, s)
    return s.records


def _encode(rec: dict) -> bytes:
    # ensure_ascii=False keeps answers readable; a lone surrogate (which a "\udXXX" escape in a runner report can
    # give) cannot be UTF-8 encoded and is written back as its JSON escape, which reads back to the same string.
    line = json.dumps(rec, ensure_ascii=False).encode("utf-8", "backslashreplace") + b"\n"
    assert line.count(b"\n") == 1
    return line


def repair_tail(path: Path, required: str = RUN_ID) -> int:
    """Make `path` end with a newline before anything is appended: an unfinished last line is cut off (a warning
    names it) unless it is a whole record, which gets its newline. Returns the bytes cut off."""
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return 0
    with open(p, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        start, pos = 0, size          # find the byte after the last newline, reading backwards
        while pos > 0:
            step = min(_CHUNK, pos)
            pos -= step
            f.seek(pos)
            i = f.read(step).rfind(b"\n")
            if i >= 0:
                start = pos + i + 1
                break
        f.seek(start)
        tail = f.read()
        rec, why = parse_line(tail, required)
        if rec is not None:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            return 0
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    lineno = sum(chunk.count(b"\n") for chunk in _chunks(p)) + 1
    print(f"warning: {path}:{lineno}: unfinished last line (an interrupted write; {why}) cut off, "
          f"{len(tail)} bytes; its run is done again", file=sys.stderr)
    return len(tail)


def _chunks(p: Path):
    with open(p, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


class Writer:
    """`with Writer(path) as w: w.write(records)` appends (after `repair_tail`); append=False starts the file anew.
    Every `write` is one batch of complete lines, on disk when it returns."""

    def __init__(self, path: Path, append: bool = True):
        self.path, self.append, self.fd = Path(path), append, -1

    def __enter__(self) -> "Writer":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.append:
            repair_tail(self.path)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self.append else os.O_TRUNC)
        self.fd = os.open(self.path, flags, 0o644)
        return self

    def write(self, records: Iterable[dict]) -> None:
        view = memoryview(b"".join(_encode(r) for r in records))
        while view:
            view = view[os.write(self.fd, view):]
        os.fsync(self.fd)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
        self.fd = -1
