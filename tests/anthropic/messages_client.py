"""One call of the official Anthropic SDK, for the Messages API end-to-end test
(tests/integration/e2e/messages.rs): reads {"base_url", "op", "params"} on stdin, makes the call
through Envoy and prints what the test asserts on as one JSON object.

op: "create" (messages.create), "stream" (messages.stream: the events' types, the final
message), "count_tokens" (messages.count_tokens). The pod that served is the response's
`x-served-by` header."""

import json
import sys

import anthropic


def main():
    request = json.load(sys.stdin)
    client = anthropic.Anthropic(
        base_url=request["base_url"], api_key="test", max_retries=0, timeout=30.0
    )
    op, params = request["op"], request["params"]
    if op == "create":
        raw = client.messages.with_raw_response.create(**params)
        out = {
            "served_by": raw.headers.get("x-served-by"),
            "message": raw.parse().model_dump(mode="json"),
        }
    elif op == "stream":
        with client.messages.stream(**params) as stream:
            events = [event.type for event in stream]
            out = {
                "served_by": stream.response.headers.get("x-served-by"),
                "events": events,
                "message": stream.get_final_message().model_dump(mode="json"),
            }
    elif op == "count_tokens":
        raw = client.messages.with_raw_response.count_tokens(**params)
        out = {
            "served_by": raw.headers.get("x-served-by"),
            "count": raw.parse().model_dump(mode="json"),
        }
    else:
        raise SystemExit(f"unknown op {op!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
