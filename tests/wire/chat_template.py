"""The independent reference for src/tokenizer/chat_template.rs: renders chat templates as
Hugging Face transformers does (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loop controls; transformers' tojson, raise_exception and strftime_now), over
messages prepared as vLLM prepares them (tool-call arguments parsed from their JSON string; list
contents joined into one string, by "\n", for a template that does not loop over a content).

stdin: {"cases": [{"template": str, "config": {...}, "messages": [...], "tools": [...] | null,
"add_generation_prompt": bool}]}; stdout: one rendering (or {"error": str}) per case.
"""
import json
import re
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
           "mask_token", "additional_special_tokens"]
TEXT_PARTS = {"text", "input_text", "output_text"}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def loops_over_content(template):
    return re.search(r"for\s+\w+\s+in\s+(message|m|msg)(\.content|\[['\"]content['\"]\])",
                     template) is not None


def prepare(messages, string_content):
    out = []
    for m in messages:
        if isinstance(m, dict):
            m = dict(m)
            calls = m.get("tool_calls")
            if m.get("role") == "assistant" and isinstance(calls, list):
                m["tool_calls"] = [prepare_call(c) for c in calls]
            content = m.get("content")
            if string_content and isinstance(content, list):
                texts = [p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str)
                         and p.get("type", "text") in TEXT_PARTS]
                m["content"] = "\n".join(texts)
        out.append(m)
    return out


def prepare_call(call):
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            return call
        call = dict(call)
        call["function"] = dict(fn, arguments=args)
    return call


def render(case):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = case["template"]
    config = case.get("config", {})
    special = {}
    for key in SPECIAL:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            special[key] = value
    messages = prepare(case["messages"], not loops_over_content(template))
    try:
        return env.from_string(template).render(
            messages=messages, tools=case.get("tools"), documents=None,
            add_generation_prompt=case["add_generation_prompt"], **special)
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    request = json.load(sys.stdin)
    json.dump([render(c) for c in request["cases"]], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
