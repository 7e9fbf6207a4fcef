"""kvcache-aware's vectors, computed independently of prefix-picker with Python's hashlib.

Prints one JSON document: cases of token ids cut into blocks (the Runtime's
compute_standardized_hash per block, Kthena's key format), the Redis hashes a writer would hold,
the candidates (owner id, container start or null) and the scores Kthena's kvcache_aware.go
(volcano-sh/kthena 3cc0572: freshOwners, the candidate filter, calculatePodScores) gives them.
"""

import hashlib
import json


def std_hash(tokens):
    if not tokens:
        return 0
    data = b"".join(t.to_bytes(4, "big") for t in tokens)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") & 0x7FFFFFFFFFFFFFFF


def blocks(tokens, size, max_blocks):
    return [tokens[i:i + size] for i in range(0, len(tokens), size)][:max_blocks]


def key(model, h):
    return f"matrix:kv:block:{model}@{h}"


def fresh(entries, started):
    out = []
    for owner, written in entries.items():
        if owner in started:
            try:
                w = int(written)
            except ValueError:
                out.append(owner)
                continue
            if w <= started[owner]:
                continue
        out.append(owner)
    return out


def scores(hashes, redis, model, candidates):
    started = {c["owner"]: c["started"] for c in candidates if c["started"]}
    names = {c["owner"] for c in candidates}
    block_pods = {}
    for h in hashes:
        owners = [o for o in fresh(redis.get(key(model, h), {}), started) if o in names]
        if owners:
            block_pods[h] = owners
    if not hashes or hashes[0] not in block_pods:
        return {}, 0
    run = {p: 1 for p in block_pods[hashes[0]]}
    last = 0
    for i in range(1, len(hashes)):
        pods = block_pods.get(hashes[i])
        if not pods:
            break
        still = 0
        for p in pods:
            if run.get(p) == i:
                run[p] += 1
                still += 1
        if still == 0:
            break
        last = i
    total = len(hashes)
    return {p: int(m / total * 100) for p, m in run.items()}, last + 1


def case(name, tokens, size, max_blocks, held, candidates, model="org/model-7b"):
    """held: owner -> (block indexes, written at)."""
    cut = blocks(tokens, size, max_blocks)
    hashes = [std_hash(b) for b in cut]
    redis = {}
    for owner, (indexes, written) in held.items():
        for i in indexes:
            redis.setdefault(key(model, hashes[i]), {})[owner] = written
    got, longest = scores(hashes, redis, model, candidates)
    return {
        "name": name,
        "model": model,
        "tokens": tokens,
        "block_size": size,
        "max_blocks": max_blocks,
        "hashes": hashes,
        "keys": [key(model, h) for h in hashes],
        "redis": redis,
        "candidates": candidates,
        "scores": {c["owner"]: got.get(c["owner"], 0) for c in candidates},
        "longest": longest,
    }


def cand(owner, started=None):
    return {"owner": owner, "started": started}


tokens = list(range(1000, 1000 + 70))  # 4 full blocks of 16 and a partial one of 6
CASES = [
    case("partial last block", tokens, 16, 128,
         {"a.ns": ([0, 1, 2, 3, 4], "200"), "b.ns": ([0, 1, 2, 3], "200")},
         [cand("a.ns"), cand("b.ns")]),
    case("match broken in the middle", tokens, 16, 128,
         {"a.ns": ([0, 1, 3, 4], "200"), "b.ns": ([0, 1, 2], "200")},
         [cand("a.ns"), cand("b.ns")]),
    case("owner older than its pod's start", tokens, 16, 128,
         {"a.ns": ([0, 1, 2, 3, 4], "100"), "b.ns": ([0, 1], "101")},
         [cand("a.ns", 100), cand("b.ns", 100)]),
    case("non-candidate owner", tokens, 16, 128,
         {"x.other": ([0, 1, 2, 3, 4], "200"), "a.ns": ([0], "200")},
         [cand("a.ns")]),
    case("maxBlocksToMatch caps", tokens, 8, 3,
         {"a.ns": ([0, 1, 2], "200")},
         [cand("a.ns"), cand("b.ns")]),
    case("large token ids", [0, 4294967295, 2147483648, 7], 3, 128,
         {"a.ns": ([0], "1")},
         [cand("a.ns")]),
]

print(json.dumps({"cases": CASES}))
