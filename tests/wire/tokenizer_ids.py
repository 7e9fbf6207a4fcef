"""Token ids from Python's `tokenizers` for the Rust `tokenizer::file` tests.

Reads a JSON object {"tokenizer": <tokenizer.json as a string>, "texts": [...]} on stdin and
prints {"with_special": [[ids]...], "without_special": [[ids]...]} on stdout.
"""

import json
import sys

from tokenizers import Tokenizer

request = json.load(sys.stdin)
tokenizer = Tokenizer.from_str(request["tokenizer"])
texts = request["texts"]
json.dump(
    {
        "with_special": [tokenizer.encode(t, add_special_tokens=True).ids for t in texts],
        "without_special": [tokenizer.encode(t, add_special_tokens=False).ids for t in texts],
    },
    sys.stdout,
)
