"""An independent encoder and publisher of vLLM's KV events, for the Rust decoder's tests.

The structs are declared with msgspec exactly as vLLM declares them in
vllm/distributed/kv_events.py (the field layout copied, not vLLM itself), in three layouts:
- V09: vllm-project/vllm@b4e69e0af33f4698e157a262cc787fe61983cd3d, the first release with events
  (array_like everywhere, no `medium`, no `data_parallel_rank`);
- ARRAY: the last array-encoded layout, every field up to `kv_cache_spec_sliding_window`
  (before vllm-project/vllm#42892);
- MAP: vllm-project/vllm@0181ea3173e53eea8cf04a86891488e3dc89bb34 (events and batch as maps).

Usage:
  kv_events_wire.py golden
      prints `name hex` lines: the payloads of tests/wire/golden.txt.
  kv_events_wire.py publish TOPIC [topic-in-replay]
      binds a publisher and a replay ROUTER on 127.0.0.1 port 0, prints `ports PUB REPLAY`, then
      `subscribed TOPIC_HEX` for each subscription and `replayed START` for each replay served,
      and serves commands from stdin, answering each with `ok`:
        pub SEQ                  publish batch SEQ (MAP layout) and keep it for replay
        lose SEQ                 keep batch SEQ for replay without publishing it
        restart                  close the publisher and bind it again on the same port,
                                 forgetting what it held for replay
        forget                   drop the oldest batch held for replay (a full buffer)
        raw FRAME...             publish raw frames, each hex (`-` for an empty frame)
        quit
  kv_events_wire.py connect ENDPOINT
      connects a publisher to ENDPOINT (a picker's shared socket, as a vLLM configured with
      `"endpoint": "tcp://picker:5557"` does), prints `subscribed TOPIC_HEX` for each
      subscription the bound SUB socket sends, and serves from stdin, answering each with `ok`:
        pub TOPIC SEQ            publish batch SEQ (MAP layout) on TOPIC
        raw FRAME...             publish raw frames, as above
        quit
With `topic-in-replay` the replay replies carry the topic before the sequence number (and an
empty one before the end marker), as current vLLM sends them; without, as SGLang and earlier vLLM.
The publisher is an XPUB socket only so that the test can see its subscription arrive (no
sleeping for the slow joiner); to the subscriber it is the PUB socket vLLM binds. The replay
handler is vLLM's `_service_replay`.
"""

import sys
import time

import msgspec
import zmq

ExternalBlockHash = bytes | int


def layout_v09():
    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int]

    class AllBlocksCleared(KVCacheEvent):
        pass

    return namespace(locals())


def namespace(classes: dict):
    return type("Layout", (), {k: v for k, v in classes.items() if isinstance(v, type)})


def layout(array_like: bool):
    class EventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False):
        ts: float
        events: list
        data_parallel_rank: int | None = None

    class KVCacheEvent(
        msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True
    ):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        parent_block_hash: ExternalBlockHash | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    # An event kind from some future engine: the decoder must skip it.
    class BlockMoved(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        to_medium: str

    return namespace(locals())


V09 = layout_v09()
ARRAY = layout(True)
MAP = layout(False)

ENC = msgspec.msgpack.Encoder()


def golden():
    cases = []
    for name, L in (("map", MAP), ("array", ARRAY)):
        cases.append(
            (
                f"{name}_stored",
                L.EventBatch(
                    ts=1.5,
                    events=[
                        L.BlockStored(
                            block_hashes=[1, 2**64 - 1],
                            parent_block_hash=None,
                            token_ids=[1, 2, 300, 70000],
                            block_size=2,
                            lora_id=None,
                            medium="GPU",
                            lora_name=None,
                        )
                    ],
                    data_parallel_rank=0,
                ),
            )
        )
        cases.append(
            (
                f"{name}_newer_fields",
                L.EventBatch(
                    ts=2.0,
                    events=[
                        L.BlockStored(
                            block_hashes=[b"\x01" * 32],
                            parent_block_hash=b"\x02" * 32,
                            token_ids=[5, 6],
                            block_size=2,
                            lora_id=7,
                            medium="CPU",
                            lora_name="adapter",
                            extra_keys=[("mm", 1)],
                            group_idx=1,
                            kv_cache_spec_kind="full_attention",
                            kv_cache_spec_sliding_window=4096,
                        ),
                        L.BlockRemoved(block_hashes=[-5], medium=None, group_idx=1),
                    ],
                    data_parallel_rank=3,
                ),
            )
        )
        cases.append(
            (
                f"{name}_removed_cleared_unknown",
                L.EventBatch(
                    ts=3.25,
                    events=[
                        L.BlockRemoved(block_hashes=[9, 10], medium="GPU"),
                        L.BlockMoved(block_hashes=[9], to_medium="CPU"),
                        L.AllBlocksCleared(),
                    ],
                ),
            )
        )
    cases.append(
        (
            "v09_stored_removed",
            V09.EventBatch(
                ts=4.0,
                events=[
                    V09.BlockStored(
                        block_hashes=[11, -12],
                        parent_block_hash=10,
                        token_ids=[1, 2],
                        block_size=1,
                        lora_id=None,
                    ),
                    V09.BlockRemoved(block_hashes=[11]),
                    V09.AllBlocksCleared(),
                ],
            ),
        )
    )
    for name, batch in cases:
        print(name, ENC.encode(batch).hex())


def batch(seq: int) -> bytes:
    """Batch `seq` as the live publisher sends it: one block stored, hash 1000 + seq."""
    return ENC.encode(
        MAP.EventBatch(
            ts=1_000_000.0 + seq,
            events=[
                MAP.BlockStored(
                    block_hashes=[1000 + seq],
                    parent_block_hash=None if seq == 0 else 999 + seq,
                    token_ids=[seq, seq + 1],
                    block_size=2,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                )
            ],
            data_parallel_rank=0,
        )
    )


END_SEQ = (-1).to_bytes(8, "big", signed=True)


def announce_subscription(pub):
    """Prints a subscription the XPUB socket received (what the tests wait for)."""
    msg = pub.recv()
    if msg[:1] == b"\x01":
        print("subscribed", msg[1:].hex(), flush=True)


def next_command():
    """The next stdin command as (name, args); None at its end or on `quit`."""
    line = sys.stdin.readline()
    if not line:
        return None
    cmd, *args = line.split()
    return None if cmd == "quit" else (cmd, args)


def unknown_command(cmd):
    print("unknown command", cmd, file=sys.stderr, flush=True)
    sys.exit(2)


def publish(topic: str, topic_in_replay: bool):
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.bind("tcp://127.0.0.1:0")
    replay = ctx.socket(zmq.ROUTER)
    replay.bind("tcp://127.0.0.1:0")
    port = lambda s: s.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
    print("ports", port(pub), port(replay), flush=True)
    topic_bytes = topic.encode()
    buffer: list[tuple[int, bytes]] = []

    poller = zmq.Poller()
    poller.register(pub, zmq.POLLIN)
    poller.register(replay, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        ready = dict(poller.poll())
        if pub in ready:
            announce_subscription(pub)
        if replay in ready:
            # vLLM's ZmqEventPublisher._service_replay.
            frame = replay.recv_multipart()
            if len(frame) != 3:
                continue
            client_id, _, start_seq_bytes = frame
            start_seq = int.from_bytes(start_seq_bytes, "big")
            head = (client_id, b"", topic_bytes) if topic_in_replay else (client_id, b"")
            for seq, buf in buffer:
                if seq >= start_seq:
                    replay.send_multipart((*head, seq.to_bytes(8, "big"), buf))
            end_head = (client_id, b"", b"") if topic_in_replay else (client_id, b"")
            replay.send_multipart((*end_head, END_SEQ, b""))
            print("replayed", start_seq, flush=True)
        if sys.stdin.fileno() in ready or sys.stdin in ready:
            command = next_command()
            if command is None:
                return
            cmd, args = command
            if cmd in ("pub", "lose"):
                seq = int(args[0])
                payload = batch(seq)
                buffer.append((seq, payload))
                if cmd == "pub":
                    pub.send_multipart((topic_bytes, seq.to_bytes(8, "big"), payload))
            elif cmd == "restart":
                # A new publisher process, as the subscriber sees it: the connection drops, the
                # same port accepts again, nothing is held for replay.
                port = pub.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
                poller.unregister(pub)
                pub.close(linger=0)
                pub = ctx.socket(zmq.XPUB)
                pub.setsockopt(zmq.XPUB_VERBOSE, 1)
                # libzmq closes the old listener on its I/O thread: poll until the port is free.
                for attempt in range(500):
                    try:
                        pub.bind(f"tcp://127.0.0.1:{port}")
                        break
                    except zmq.ZMQError as e:
                        if e.errno != zmq.EADDRINUSE or attempt == 499:
                            raise
                        time.sleep(0.01)
                poller.register(pub, zmq.POLLIN)
                buffer.clear()
            elif cmd == "forget":
                # The oldest buffered batch falls out, as from vLLM's bounded `buffer_steps`.
                buffer.pop(0)
            elif cmd == "raw":
                pub.send_multipart([b"" if a == "-" else bytes.fromhex(a) for a in args])
            else:
                unknown_command(cmd)
            print("ok", flush=True)


def connect(endpoint: str):
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.connect(endpoint)
    poller = zmq.Poller()
    poller.register(pub, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        ready = dict(poller.poll())
        if pub in ready:
            announce_subscription(pub)
        if sys.stdin.fileno() in ready or sys.stdin in ready:
            command = next_command()
            if command is None:
                return
            cmd, args = command
            if cmd == "pub":
                topic, seq = args[0], int(args[1])
                pub.send_multipart((topic.encode(), seq.to_bytes(8, "big"), batch(seq)))
            elif cmd == "raw":
                pub.send_multipart([b"" if a == "-" else bytes.fromhex(a) for a in args])
            else:
                unknown_command(cmd)
            print("ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["golden"]:
        golden()
    elif len(sys.argv) == 3 and sys.argv[1] == "connect":
        connect(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "publish":
        publish(sys.argv[2], False)
    elif sys.argv[1:2] == ["publish"] and sys.argv[3:] == ["topic-in-replay"]:
        publish(sys.argv[2], True)
    else:
        sys.exit(__doc__)
