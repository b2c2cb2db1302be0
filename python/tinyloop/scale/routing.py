"""The routing rules, in plain Python (no Ray here, so they are tested alone):

- `routing_key(path, body, keys)`: what a request shares with others, hashed. Chat: the
  system prompt plus the messages before the last user turn (`chat="history"`, the
  default), or the system prompt plus the first user turn (`"conversation"`: every turn of
  one conversation stays put), or the system prompt only (`"system"`). Completions: the
  first `prefix_chars` characters of a text prompt or the first `prefix_tokens` ids of a
  token prompt (of the first prompt of a batch). None (no affinity: least-loaded) for
  other paths, bodies that do not parse, and chats with nothing shared.
- `rank_replicas(route, replicas, spill_at)`: rendezvous hashing over the live replicas
  (each replica scores hash(key, replica id), the highest wins: a key moves only when its
  replica goes, and a new replica takes keys from every other one evenly); the preferred
  replica first, the others next; when the preferred one already holds `spill_at` or
  more requests, the others come first (Serve takes the least-loaded of a rank), the
  preferred one last.
- `merge_metrics({replica: text})`: the replicas' Prometheus texts as one, each sample
  labelled `replica="..."`.
- `publish_live` / `live`, `count_decision` / `decisions`: what the router of this process
  saw, for the ingress's /metrics. They live here, not in router.py: Serve ships the router
  class to the handle's process pickled *by value* with its module, so globals of router.py
  would be a private copy there.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass

CHAT_MODES = ("history", "conversation", "system", "none")
SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class KeyConfig:
    chat: str = "history"        # history | conversation | system | none
    prefix_chars: int = 256      # completions: text prompts keyed on their first N characters
    prefix_tokens: int = 64      # completions: token-id prompts keyed on their first N ids

    def __post_init__(self):
        if self.chat not in CHAT_MODES:
            raise ValueError(f"chat routing mode must be one of {', '.join(CHAT_MODES)}, not {self.chat!r}")
        if self.prefix_chars < 1 or self.prefix_tokens < 1:
            raise ValueError("prefix_chars and prefix_tokens must be at least 1")


def _digest(material) -> str:
    raw = json.dumps(material, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def chat_key_material(messages, mode: str):
    """The messages a chat request shares with others under `mode` (None: nothing)."""
    if mode == "none" or not isinstance(messages, list):
        return None
    msgs = [m for m in messages if isinstance(m, dict)]
    system = [m for m in msgs if m.get("role") in SYSTEM_ROLES]
    users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
    if mode == "system":
        picked = system
    elif mode == "conversation":
        first_user = users[0] if users else len(msgs)
        picked = [m for i, m in enumerate(msgs) if i <= first_user or m.get("role") in SYSTEM_ROLES]
    else:  # history: everything before the last user turn, and the system prompt wherever it is
        last_user = users[-1] if users else len(msgs)
        picked = [m for i, m in enumerate(msgs) if i < last_user or m.get("role") in SYSTEM_ROLES]
    if not picked:
        return None
    return [[m.get("role"), m.get("content"), m.get("name")] for m in picked]


def completion_key_material(prompt, keys: KeyConfig):
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        prompt = prompt[0]  # a batch: its first prompt
    if isinstance(prompt, str):
        return prompt[:keys.prefix_chars] if prompt else None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt[:keys.prefix_tokens]
    return None


def routing_key(path: str, body: bytes, keys: KeyConfig = KeyConfig()) -> str | None:
    """The hashed routing key of a request (a hex string), or None."""
    if path not in ("/v1/chat/completions", "/v1/completions") or not body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the replica answers the 400
    if not isinstance(data, dict):
        return None
    if path == "/v1/chat/completions":
        material = chat_key_material(data.get("messages"), keys.chat)
        kind = "chat"
    else:
        material = completion_key_material(data.get("prompt"), keys)
        kind = "cmpl"
    if material is None:
        return None
    return _digest([kind, data.get("model"), material])


# ---------------------------------------------------------------------------- ranking

@dataclass(frozen=True)
class ReplicaView:
    id: str
    queue_len: int | None = None   # ongoing requests as last seen (None: unknown, Serve probes)


def score(key: str, replica_id: str) -> int:
    """Rendezvous (highest random weight) score of a replica for a key."""
    h = hashlib.blake2b(f"{key}\x00{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big")


def preferred_order(key: str, replica_ids) -> list[str]:
    return sorted(replica_ids, key=lambda r: (score(key, r), r), reverse=True)


def rank_replicas(route: dict | None, replicas: list[ReplicaView], spill_at: int) -> tuple[list[list[str]], str]:
    """Ranked replica ids for one request, and the decision taken:
    'pinned' (route['pin']: that replica only, [] while it is not live), 'least_loaded'
    (no key: one rank of every replica), 'affinity' (the key's replica, then the others),
    'spill' (the key's replica holds >= spill_at requests: the others first).
    route['avoid']: replica ids left out (a retry after a failure), unless nothing else is left."""
    route = route or {}
    ids = [r.id for r in replicas]
    pin = route.get("pin")
    if pin is not None:
        return ([[pin]] if pin in ids else []), "pinned"
    avoid = set(route.get("avoid") or ())
    pool = [r for r in replicas if r.id not in avoid] or list(replicas)
    if not pool:
        return [], "least_loaded"
    key = route.get("key")
    if key is None:
        return [[r.id for r in pool]], "least_loaded"
    by_id = {r.id: r for r in pool}
    order = preferred_order(key, by_id)
    first, rest = order[0], order[1:]
    q = by_id[first].queue_len
    if q is not None and q >= spill_at and rest:
        return [rest, [first]], "spill"
    return ([[first], rest] if rest else [[first]]), "affinity"


# ---------------------------------------------------------------------------- metrics

def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _label_sample(line: str, label: str) -> str:
    """'name{a="1"} 3' -> 'name{replica="r",a="1"} 3'; 'name 3' -> 'name{replica="r"} 3'."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        inner_start = brace + 1
        rest = line[inner_start:]
        return line[:inner_start] + label + ("," if not rest.startswith("}") else "") + rest
    if space == -1:
        return line
    return line[:space] + "{" + label + "}" + line[space:]


def merge_metrics(texts: dict[str, str]) -> str:
    """Prometheus texts of several replicas as one: each metric family's HELP / TYPE once,
    then every replica's samples with a `replica` label."""
    families: dict[str, dict] = {}
    order: list[str] = []
    for replica, text in texts.items():
        label = f'replica="{_escape(replica)}"'
        current = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    fam = families.get(current)
                    if fam is None:
                        fam = families[current] = {"meta": [], "samples": []}
                        order.append(current)
                    if len(fam["meta"]) < 2 and line not in fam["meta"]:
                        fam["meta"].append(line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            fam_name = current if current and name.startswith(current) else name
            fam = families.get(fam_name)
            if fam is None:
                fam = families[fam_name] = {"meta": [], "samples": []}
                order.append(fam_name)
            fam["samples"].append(_label_sample(line, label))
    out: list[str] = []
    for name in order:
        out += families[name]["meta"] + families[name]["samples"]
    return "\n".join(out) + ("\n" if out else "")


# ---------------------------------------------------------------------------- what the router saw

_lock = threading.Lock()
_live: dict[str, list[str]] = {}   # deployment name -> live replica ids, as the router has them
_decisions: Counter = Counter()    # (decision, replica id or "") -> count


def publish_live(deployment: str, replica_ids) -> None:
    with _lock:
        _live[deployment] = sorted(replica_ids)


def live(deployment: str) -> list[str]:
    with _lock:
        return list(_live.get(deployment, ()))


def count_decision(decision: str, replica: str = "") -> None:
    with _lock:
        _decisions[(decision, replica)] += 1


def decisions() -> dict:
    with _lock:
        return dict(_decisions)
