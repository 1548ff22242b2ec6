"""Loading the evaluation data (read-only, shared/data/pitfalls) and picking the subset."""
from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

from . import jsonl

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_data_dir() -> Path:
    """$FAIRKV_PITFALLS_DATA, else shared/ inside the repo, else shared/ beside it (CI's layout)."""
    env = os.environ.get("FAIRKV_PITFALLS_DATA")
    if env:
        return Path(env)
    for base in (REPO_ROOT / "shared", REPO_ROOT.parent / "shared"):
        if (base / "data" / "pitfalls" / "sys_ifeval.jsonl").is_file():
            return base / "data" / "pitfalls"
    return REPO_ROOT.parent / "shared" / "data" / "pitfalls"


@dataclasses.dataclass(frozen=True)
class Item:
    key: int
    prompt: str                     # the original single-turn IFEval prompt (some checkers need it)
    instruction_id_list: list[str]
    kwargs: list[dict]
    system: str                     # the verifiable instruction(s): compressed
    user: str                       # the task: appended after compression

    @property
    def multi(self) -> bool:
        return len(self.instruction_id_list) > 1


def load_items(data_dir: Path) -> list[Item]:
    path = data_dir / "sys_ifeval.jsonl"
    if not path.is_file():
        raise FileNotFoundError(path)
    s = jsonl.scan(path, required="key", kind=int)
    if s.bad:   # the evaluation data is read-only and must be whole: no item is silently left out
        raise ValueError(f"{path}:{s.bad[0].line}: {s.bad[0].reason}")
    items = []
    for d in s.records:
        roles = [m["role"] for m in d["messages"]]
        if roles != ["system", "user"]:
            raise ValueError(f"item {d['key']}: expected [system, user] messages, got {roles}")
        items.append(Item(d["key"], d["prompt"], list(d["instruction_id_list"]), list(d["kwargs"]),
                          d["messages"][0]["content"], d["messages"][1]["content"]))
    return items


def load_defenses(data_dir: Path) -> dict[str, str]:
    return json.loads((data_dir / "defenses.json").read_text(encoding="utf-8"))


def load_attack(data_dir: Path) -> str:
    return json.loads((data_dir / "attacks.json").read_text(encoding="utf-8"))["plain"]


def pick_subset(items: list[Item], n: int | None, seed: int = 0) -> list[Item]:
    """n items, half single-instruction and half multi-instruction (the rank correlation between the
    two needs both), drawn with a fixed seed so every machine runs the same subset. They alternate
    single, multi, single, ... so that a sweep stopped early has finished a balanced prefix of items."""
    if n is None or n >= len(items):
        return list(items)
    rng = random.Random(seed)
    single = [i for i in items if not i.multi]
    multi = [i for i in items if i.multi]
    n_multi = min(len(multi), n // 2)
    s = sorted(rng.sample(single, min(len(single), n - n_multi)), key=lambda i: i.key)
    m = sorted(rng.sample(multi, n_multi), key=lambda i: i.key)
    out = []
    for k in range(max(len(s), len(m))):
        out += s[k:k + 1] + m[k:k + 1]
    return out
