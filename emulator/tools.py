"""Tool calls: when a chat request's `tools` and `tool_choice` make vLLM answer with one,
and the arguments the emulated model "generates".

vLLM 0.33 (`chat_completion/serving.py`, WIRE_SPEC §3–§4) answers with a tool call when

- `tool_choice` names a function (`{"type": "function", "function": {"name": N}}`):
  guided decoding makes the output the arguments of N; `finish_reason` is the engine's
  own (`stop`, as OpenAI answers a named call), not `tool_calls`;
- `tool_choice` is `"required"`: the output is a JSON list of calls; `finish_reason`
  becomes `tool_calls` when the engine stopped (`stop`);
- `tool_choice` is `"auto"` (the default when `tools` are given) and the tool parser
  finds a call in the output; `finish_reason` is `tool_calls`. The emulated model's
  rule, deterministic: it calls the first tool whose function name occurs in the last
  user message's text, else it answers with text.

`"none"` (or no tools) never calls. A named function that is not among `tools` is a 400.

SGLang (`serving_chat.py` `_process_tool_calls`, with `--tool-call-parser`: the emulator
serves as if one were set) calls in the same three cases, by the same rule for `auto`;
every call the engine ended by itself finishes `tool_calls` — a named one too (its
constrained output is parsed as a JSON list of calls). A named function not among
`tools`, or `required` / a named function without `tools`, is a 400 with SGLang's texts
(`_validate_request`). Its call ids and shapes are the wire's (emulator/wire_sglang.py).

One call per choice, id `chatcmpl-tool-` + 16 hex (vLLM 0.33's `random_uuid()`). Its
arguments are a JSON object built from the function's `parameters` schema
(`example`): every property, the first enum / const / default value, bounds respected,
`$ref`s into `$defs` / `definitions` followed; `pattern` and `format` are not
(a plain string is given). The same request gives the same arguments.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from emulator.schema import ApiError

_MAX_DEPTH = 8  # nested objects / arrays / $refs followed before giving the simplest value


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The call every choice of the request makes."""

    name: str
    arguments: str  # the whole JSON text, as the message carries it
    finish: str  # the finish_reason when the engine stopped by itself ("stop" / "tool_calls")


def new_call_id() -> str:
    return "chatcmpl-tool-" + secrets.token_hex(8)


def plan_tool(body: Mapping[str, Any], vllm: bool = True) -> ToolPlan | None:
    """The tool call this chat request gets, or None for a text answer (`vllm`: vLLM's
    rules, else SGLang's)."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if not vllm and not tools and (choice == "required" or isinstance(choice, Mapping)):
        what = "required" if choice == "required" else "a specific tool"
        raise ApiError(
            400, f"Tools cannot be empty if tool choice is set to {what}.", "BadRequestError"
        )
    if not tools or not isinstance(tools, list):
        return None
    functions = [
        t["function"]
        for t in tools
        if isinstance(t, Mapping)
        and isinstance(t.get("function"), Mapping)
        and isinstance(t["function"].get("name"), str)
    ]
    if not functions:
        return None
    if choice is None:
        choice = "auto"
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        chosen = next((f for f in functions if f["name"] == name), None)
        if chosen is None and not vllm:
            raise ApiError(400, f"Tool '{name}' not found in tools list.", "BadRequestError")
        if chosen is None:
            raise ApiError(
                400,
                f"Tool '{name}' has not been passed in `tools`.",
                "BadRequestError",
                "tool_choice",
            )
        # guided decoding: the output is the arguments object itself (vLLM), or a JSON
        # list of the one call, parsed as a call (SGLang)
        return ToolPlan(chosen["name"], _arguments(chosen), "stop" if vllm else "tool_calls")
    if choice == "required":
        f = functions[0]
        return ToolPlan(f["name"], _arguments(f), "tool_calls")
    if choice == "auto":
        text = _last_user_text(body.get("messages"))
        for f in functions:
            if f["name"] in text:
                return ToolPlan(f["name"], _arguments(f), "tool_calls")
    return None


def _arguments(function: Mapping[str, Any]) -> str:
    # vLLM re-serializes parsed calls with json.dumps(…, ensure_ascii=False): ", " and ": "
    return json.dumps(example(function.get("parameters")), ensure_ascii=False)


def _last_user_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    for m in reversed(messages):
        if isinstance(m, Mapping) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    p["text"]
                    for p in content
                    if isinstance(p, Mapping) and isinstance(p.get("text"), str)
                )
            return ""
    return ""


def example(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A value valid against a (simple) JSON schema; `{}` for a missing one."""
    if root is None:
        root = schema
    if not isinstance(schema, Mapping):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and depth < _MAX_DEPTH:
        target = _resolve(ref, root)
        if target is not None:
            return example(target, root, depth + 1)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            if key == "allOf":  # the parent and every part, properties merged
                merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
                props = dict(merged.get("properties") or {})
                for o in options:
                    if isinstance(o, Mapping):
                        merged.update(o)
                        props.update(o.get("properties") or {})
                merged["properties"] = props
                return example(merged, root, depth + 1)
            return example(options[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        if depth >= _MAX_DEPTH:
            props = {k: v for k, v in props.items() if k in (schema.get("required") or ())}
        return {k: example(v, root, depth + 1) for k, v in props.items()}
    if kind == "array":
        n = max(1, int(schema.get("minItems") or 0))
        if "maxItems" in schema:
            n = min(n, int(schema["maxItems"]))
        if depth >= _MAX_DEPTH:
            n = int(schema.get("minItems") or 0)
        items = schema.get("items")
        return [example(items, root, depth + 1) for _ in range(n)]
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema)


def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
    low = schema.get("minimum")
    if low is None and "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + (1 if integer else 0.5)
    high = schema.get("maximum")
    if high is None and "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - (1 if integer else 0.5)
    value: float = 1 if low is None else low
    if high is not None and value > high:
        value = high
    step = schema.get("multipleOf")
    if step:
        value = (value // step + (1 if value % step else 0)) * step
    if integer:
        return math.ceil(value)
    return float(value)


def _string(schema: Mapping[str, Any]) -> str:
    text = "example"
    low = int(schema.get("minLength") or 0)
    if len(text) < low:
        text = text + "x" * (low - len(text))
    high = schema.get("maxLength")
    if high is not None:
        text = text[: int(high)]
    return text


def _resolve(ref: str, root: Any) -> Any:
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node
