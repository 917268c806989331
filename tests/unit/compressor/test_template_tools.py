"""Tools in the default (cl100k, Llama-3.0 layout) template: the compressor and the
emulator count the same ids, and the gateway's byte estimate includes them."""

import json

from compressor.template import chat_tokens
from emulator.chat_template import render_chat
from gateway.openai_request import CHAT, parse
from policies.budget import measure_chat

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Find a record.",
     "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
]  # fmt: skip
MESSAGES = [
    {"role": "user", "content": "Find record 42 and summarise it."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "lookup", "arguments": '{"id": "42"}'}}]},
    {"role": "tool", "tool_call_id": "a", "content": "Record 42: a blue widget, in stock."},
]  # fmt: skip


def test_compressor_counts_tools_as_the_emulator_renders_them():
    assert chat_tokens(MESSAGES, TOOLS) == len(render_chat(MESSAGES, tools=TOOLS))
    assert chat_tokens(MESSAGES, TOOLS) > chat_tokens(MESSAGES) + 30


def test_estimate_includes_tools_and_tool_calls():
    plain = [{**m, "tool_calls": None} for m in MESSAGES]
    with_tools = parse(
        json.dumps({"model": "m", "messages": MESSAGES, "tools": TOOLS}).encode(), CHAT
    )
    without = parse(json.dumps({"model": "m", "messages": plain}).encode(), CHAT)
    assert with_tools.prompt_bytes - without.prompt_bytes >= len(json.dumps(TOOLS)) - 20
    assert measure_chat(MESSAGES, TOOLS).content_bytes > measure_chat(plain).content_bytes + 150
