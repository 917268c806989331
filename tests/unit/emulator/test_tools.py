"""emulator/tools.py: when a request gets a tool call, and arguments valid against the
function's schema (checked with jsonschema, independent of the generator)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from emulator.schema import ApiError
from emulator.tools import example, plan_tool

SCHEMAS = [
    {},
    {"type": "object"},
    {"type": "object", "properties": {"q": {"type": "string", "minLength": 12, "maxLength": 20}}},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "exclusiveMinimum": 3, "maximum": 9, "multipleOf": 2}
        },
    },
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -2.5, "maximum": -1}}},
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3}
        },
    },
    {
        "type": "object",
        "properties": {
            "mode": {"enum": ["a", "b"]},
            "k": {"const": 7},
            "d": {"type": "string", "default": "dflt"},
        },
    },
    {
        "type": "object",
        "properties": {
            "v": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
            "w": {"type": ["null", "integer"]},
        },
    },
    {
        "type": "object",
        "properties": {"node": {"$ref": "#/definitions/node"}},
        "definitions": {
            "node": {
                "type": "object",
                "properties": {"child": {"$ref": "#/definitions/node"}, "id": {"type": "integer"}},
                "required": ["id"],
            }
        },
    },
    {
        "type": "object",
        "properties": {"b": {"type": "integer"}},
        "required": ["b"],
        "allOf": [{"properties": {"a": {"type": "boolean"}}, "required": ["a"]}],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_arguments_conform_to_the_schema(schema: dict) -> None:
    value = example(schema)
    jsonschema.validate(value, schema)
    json.dumps(value)  # JSON-serialisable


def _body(choice: object, text: str = "hi") -> dict:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMAS[2]}},
             {"type": "function", "function": {"name": "other"}}]  # fmt: skip
    return {"messages": [{"role": "user", "content": text}], "tools": tools,
            "tool_choice": choice}  # fmt: skip


def test_which_requests_get_a_call() -> None:
    named = plan_tool(_body({"type": "function", "function": {"name": "other"}}))
    assert named is not None and (named.name, named.finish, named.arguments) == (
        "other",
        "stop",
        "{}",
    )
    required = plan_tool(_body("required"))
    assert required is not None and (required.name, required.finish) == ("lookup", "tool_calls")
    assert plan_tool(_body("auto", "please run other now")).name == "other"  # type: ignore[union-attr]
    assert plan_tool(_body(None, "use lookup")).name == "lookup"  # type: ignore[union-attr]
    assert plan_tool(_body("auto", "nothing to call")) is None
    assert plan_tool(_body("none", "use lookup")) is None
    assert plan_tool({"messages": [], "tool_choice": "required"}) is None  # no tools
    with pytest.raises(ApiError) as e:
        plan_tool(_body({"type": "function", "function": {"name": "missing"}}))
    assert e.value.status == 400


def test_sglang_s_rules() -> None:
    """SGLang (with a tool-call parser): the same calls, every one finishing "tool_calls"
    (a named one too), and its own refusals."""
    named = plan_tool(_body({"type": "function", "function": {"name": "other"}}), vllm=False)
    assert named is not None and (named.name, named.finish) == ("other", "tool_calls")
    assert plan_tool(_body("required"), vllm=False).finish == "tool_calls"  # type: ignore[union-attr]
    assert plan_tool(_body("auto", "use lookup"), vllm=False).name == "lookup"  # type: ignore[union-attr]
    assert plan_tool(_body("none", "use lookup"), vllm=False) is None
    with pytest.raises(ApiError) as e:
        plan_tool(_body({"type": "function", "function": {"name": "missing"}}), vllm=False)
    assert (e.value.status, e.value.message) == (400, "Tool 'missing' not found in tools list.")
    with pytest.raises(ApiError) as e:
        plan_tool({"messages": [], "tool_choice": "required"}, vllm=False)
    assert e.value.message == "Tools cannot be empty if tool choice is set to required."
