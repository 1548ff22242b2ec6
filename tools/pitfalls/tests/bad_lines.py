"""Lines a JSONL of run records must survive: each is skipped, named (file:line) and counted, never a crash."""
from pathlib import Path

BAD_LINES = {
    "number": b"42",
    "null": b"null",
    "array": b"[1,2]",
    "empty_object": b"{}",
    "no_run_id": b'{"status": "ok", "key": 1, "policy": "knorm"}',
    "run_id_not_a_string": b'{"run_id": 7, "status": "ok"}',
    "invalid_utf8": b'{"run_id": "x\xff\xfe", "status": "ok"}',
    "empty_line": b"",
    "blank_line": b" \t ",
    "garbage": b"#!%& not json {",
}


def insert_line(path: Path, lineno: int, raw: bytes) -> bytes:
    """Put `raw` as line `lineno` (1-based) of `path`; returns the file's bytes before."""
    before = path.read_bytes()
    lines = before.split(b"\n")
    lines.insert(lineno - 1, raw)
    path.write_bytes(b"\n".join(lines))
    return before


def assert_named_and_counted(err: str, path: Path, lineno: int, n_lines: int) -> None:
    assert f"warning: {path}:{lineno}: " in err, err
    assert f"warning: {path}: skipped 1 unreadable line(s) of {n_lines}" in err, err
