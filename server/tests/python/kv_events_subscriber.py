"""A vLLM-style KV events subscriber (pyzmq + msgspec), run by
server/tests/kv_events.rs.

Usage: kv_events_subscriber.py SUB_ENDPOINT REPLAY_ENDPOINT TOPIC

Subscribes, prints "ready", collects live batches until a line arrives on
stdin and then a second passes without a message, asks the replay socket for
everything from sequence 0 (on a DEALER socket: one request, many replies),
and prints one JSON document on stdout:

  {"live": [[seq, batch], ...], "replay": [[seq, batch], ...],
   "live_equals_replay": bool, "topic_ok": bool}

Every payload is decoded three ways and must pass all three, or the script
exits non-zero: untyped (exact positional arity: batch 3, BlockStored 12,
BlockRemoved 4, AllBlocksCleared 1: every field of vLLM's structs, as msgspec
writes array-like structs), with the struct definitions of vLLM's
kv_events.py from before its map encoding (array_like, tagged), and with the
6-field BlockStored of vLLM's example subscriber (msgspec ignores extra
trailing fields).
"""

import json
import sys
import threading
import time
from typing import Any

import msgspec
import zmq


# vLLM's kv_events.py, positional ("array_like") form.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# vLLM's examples/online_serving/kv_events_subscriber.py (older, 6 fields).
class OldEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class OldKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldAllBlocksCleared(OldKVCacheEvent, tag="AllBlocksCleared"):
    pass


class OldKVEventBatch(OldEventBatch):
    events: list[OldBlockStored | OldBlockRemoved | OldAllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
OLD_DECODER = msgspec.msgpack.Decoder(type=OldKVEventBatch)
ARITY = {"BlockStored": 12, "BlockRemoved": 4, "AllBlocksCleared": 1}


def decode(payload: bytes) -> dict:
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and len(raw) == 3, f"batch arity: {raw!r}"
    assert isinstance(raw[0], float), f"ts is not a float: {raw[0]!r}"
    for ev in raw[1]:
        assert isinstance(ev, list) and ev, f"event is not a tagged array: {ev!r}"
        assert len(ev) == ARITY[ev[0]], f"{ev[0]} arity {len(ev)}: {ev!r}"
    batch = DECODER.decode(payload)
    old = OLD_DECODER.decode(payload)
    assert len(old.events) == len(batch.events)
    events = []
    for e, o in zip(batch.events, old.events):
        d = {"type": type(e).__name__}
        d.update(msgspec.structs.asdict(e))
        assert type(o).__name__ == "Old" + d["type"]
        if isinstance(e, BlockStored):
            assert (o.block_hashes, o.parent_block_hash, o.token_ids, o.medium) == (
                e.block_hashes,
                e.parent_block_hash,
                e.token_ids,
                e.medium,
            )
        events.append(d)
    return {"ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank, "events": events}


def main() -> None:
    sub_ep, replay_ep, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(sub_ep)
    replay = ctx.socket(zmq.DEALER)
    replay.connect(replay_ep)

    done = threading.Event()

    def wait_stdin() -> None:
        sys.stdin.readline()
        done.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    # Let the subscription reach the publisher before the test sends work
    # (anything missed anyway is in the replay).
    time.sleep(0.5)
    print("ready", flush=True)

    live: list[tuple[int, bytes]] = []
    topic_ok = True
    quiet_since = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if sub.poll(100):
            t, seq, payload = sub.recv_multipart()
            topic_ok &= t == topic.encode()
            live.append((int.from_bytes(seq, "big"), payload))
            quiet_since = None
        elif done.is_set():
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 1.0:
                break

    replay.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed: list[tuple[int, bytes]] = []
    while True:
        if not replay.poll(10_000):
            raise SystemExit("replay: no answer within 10 s")
        empty, seq, payload = replay.recv_multipart()
        assert empty == b""
        if seq == (-1).to_bytes(8, "big", signed=True):
            assert payload == b"", "end marker with a payload"
            break
        replayed.append((int.from_bytes(seq, "big"), payload))

    by_seq = dict(replayed)
    live_equals_replay = all(by_seq.get(s) == p for s, p in live)
    out = {
        "live": [[s, decode(p)] for s, p in live],
        "replay": [[s, decode(p)] for s, p in replayed],
        "live_equals_replay": live_equals_replay,
        "topic_ok": topic_ok,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
