"""Invocations of an engine: the bundled Llama runner (fairkv-llama) or fairkv inside llama.cpp (fairkv-llamacpp).
Both take the same command line and write the same --json schema (docs/llama-runner.md; fairkv-llamacpp adds its
state fields, docs/llamacpp.md).

`run` is one configuration; `run_sweep` is many configurations of one system prompt in one invocation
(`--config` groups): the engine prefills the prompt once and decodes every answer in one batch, each answer
bit-identical to what `run` gives for that configuration (fairkv-llamacpp: to a run with --batch-invariant, which
the harness passes to its single runs)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .data import REPO_ROOT

# engine name -> (binary, its folder under a build, the environment variable that names it)
ENGINES = {"runner": ("fairkv-llama", "examples/llama", "FAIRKV_LLAMA"),
           "llamacpp": ("fairkv-llamacpp", "examples/llamacpp", "FAIRKV_LLAMACPP_BIN")}
RUNNER_ENV = ENGINES["runner"][2]


def find_runner(explicit: str | None = None, engine: str = "runner") -> Path | None:
    """--runner, else the engine's environment variable, else the first build*/<folder>/<binary>, else PATH."""
    binary, folder, env = ENGINES[engine]
    for cand in (explicit, os.environ.get(env)):
        if cand:
            return Path(cand)
    for build in sorted(REPO_ROOT.glob("build*")):
        for rel in (f"{folder}/{binary}", f"bin/{binary}", binary):
            p = build / rel
            if p.is_file() and os.access(p, os.X_OK):
                return p
    found = shutil.which(binary)
    return Path(found) if found else None


@dataclasses.dataclass(frozen=True)
class Config:
    """The compression options of one configuration (one `--config` group of a sweep)."""
    policy: str                 # none | knorm | streaming_llm | snapkv | tova | h2o
    ratio: float
    fair: bool
    whitelist: tuple[str, ...]
    fair_mode: str | None = None    # --fair-mode proportional|paper (with --fair; paper: exactly two segments)
    sinks: int | None = None        # --sinks N: attention sinks kept under fair (None: the runner's default, 4)
    boundary: int = 0               # --boundary K: keep the first and last K tokens of every segment (0: off)
    segments: str | None = None     # --segments MODE: allocate over lines|paragraphs|sentences (None: the markers)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request(Config):
    """One configuration run alone."""
    system_marked: str          # system text with [[seg:NAME]] markers
    users: tuple[str, ...]      # each answered independently from the same compressed cache
    window: int = 16            # snapkv observation window: the paper uses 16
    max_new_tokens: int = 128
    threads: int = 2
    model: str | None = None
    extra: tuple[str, ...] = ()   # options of the engine's own (fairkv-llamacpp: --batch-invariant)


@dataclasses.dataclass(frozen=True)
class SweepRequest:
    system_marked: str
    users: tuple[str, ...]
    configs: tuple[Config, ...]
    window: int = 16
    max_new_tokens: int = 128
    threads: int = 2
    max_batch: int = 64
    model: str | None = None


class RunnerError(RuntimeError):
    def __init__(self, message: str, returncode: int, stderr: str):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


def config_args(c: Config) -> list[str]:
    args = ["--policy", c.policy, "--ratio", f"{c.ratio:g}"]
    if c.fair:
        args.append("--fair")
    if c.fair_mode:
        args += ["--fair-mode", c.fair_mode]
    if c.sinks is not None:
        args += ["--sinks", str(c.sinks)]
    if c.boundary:
        args += ["--boundary", str(c.boundary)]
    if c.segments:
        args += ["--segments", c.segments]
    for w in c.whitelist:
        args += ["--whitelist", w]
    return args


def _shared_args(binary: Path, req: Request | SweepRequest, json_path: Path) -> list[str]:
    cmd = [str(binary), "--system", req.system_marked]
    for u in req.users:
        cmd += ["--user", u]
    cmd += ["--window", str(req.window), "--max-new-tokens", str(req.max_new_tokens), "--threads", str(req.threads),
            "--json", str(json_path), "--quiet"]
    if req.model:
        cmd += ["--model", req.model]
    return cmd


def command(binary: Path, req: Request, json_path: Path) -> list[str]:
    return _shared_args(binary, req, json_path) + list(req.extra) + config_args(req)


def sweep_command(binary: Path, req: SweepRequest, json_path: Path) -> list[str]:
    cmd = _shared_args(binary, req, json_path) + ["--max-batch", str(req.max_batch)]
    for c in req.configs:
        cmd += ["--config"] + config_args(c)
    return cmd


def _invoke(cmd: list[str], json_path: Path, timeout_s: float):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        raise RunnerError(" | ".join(tail) or f"exit {proc.returncode}", proc.returncode, proc.stderr)
    try:
        # fairkv-llama writes well-formed UTF-8; replacing (as it does) keeps one odd byte from failing a sweep.
        doc = json.loads(json_path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, json.JSONDecodeError) as e:
        raise RunnerError(f"runner wrote no readable --json: {e}", proc.returncode, proc.stderr) from e
    return doc, wall


def _check_turns(doc: dict, n_users: int) -> None:
    if len(doc.get("turns", [])) != n_users:
        raise RunnerError(f"runner answered {len(doc.get('turns', []))} of {n_users} turns", 0, "")


def run(binary: Path, req: Request, timeout_s: float = 1800.0) -> tuple[dict, float]:
    """Run once; return the parsed --json document and the wall time in seconds."""
    with tempfile.TemporaryDirectory(prefix="pitfalls-") as tmp:
        json_path = Path(tmp) / "out.json"
        doc, wall = _invoke(command(binary, req, json_path), json_path, timeout_s)
    _check_turns(doc, len(req.users))
    return doc, wall


def run_sweep(binary: Path, req: SweepRequest, timeout_s: float = 7200.0,
              extra_args: tuple[str, ...] | list[str] = ()) -> tuple[list, float]:
    """One invocation for every configuration: a list with, per configuration in order, its --json document or
    a RunnerError (a configuration the runner could not run, e.g. a whitelist over the keep budget).
    extra_args: more options of the whole run (e.g. the evidence mode's --continuation / --reference)."""
    with tempfile.TemporaryDirectory(prefix="pitfalls-") as tmp:
        json_path = Path(tmp) / "out.json"
        cmd = sweep_command(binary, req, json_path)
        cmd[cmd.index("--config"):cmd.index("--config")] = list(extra_args)
        docs, wall = _invoke(cmd, json_path, timeout_s)
    if not isinstance(docs, list) or len(docs) != len(req.configs):
        raise RunnerError(f"runner reported {len(docs) if isinstance(docs, list) else 'no'} of "
                          f"{len(req.configs)} configurations", 0, "")
    out: list = []
    for doc in docs:
        if doc.get("error"):
            out.append(RunnerError(doc["error"], 0, doc["error"]))
        else:
            _check_turns(doc, len(req.users))
            out.append(doc)
    return out, wall


def is_budget_error(err: RunnerError) -> bool:
    """Tokens forced kept (a whitelist, attention sinks, boundary tokens) beyond the keep budget are a property of
    the configuration, not a failure."""
    text = (str(err) + err.stderr).lower()
    # fairkv-llama says: "the whitelist holds 120 distinct positions but sequence 0 keeps only 12 of ..."
    return (any(w in text for w in ("whitelist", "sink", "boundary", "forced"))
            and any(w in text for w in ("budget", "more than", "exceed", "keeps only")))
