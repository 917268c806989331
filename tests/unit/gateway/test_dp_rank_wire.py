"""What the gateway adds to a dp_group request for its group's one endpoint (WIRE_SPEC §10):
the rank header for both engines, and SGLang's body field, last, so it wins."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from gateway.forward import with_rank


def _worker(engine: str) -> Any:
    return SimpleNamespace(engine=engine)


def test_vllm_gets_the_header_and_the_body_untouched():
    body = b'{"model":"m","prompt":"x"}'
    headers, out = with_rank(b"a: b\r\n", body, _worker("vllm"), 3)
    assert headers == b"a: b\r\nx-data-parallel-rank: 3\r\n" and out == body


def test_sglang_also_gets_the_body_field_which_wins_over_the_clients():
    body = b'{"model":"m","data_parallel_rank":0} \n'
    headers, out = with_rank(b"", body, _worker("sglang"), 2)
    assert headers == b"x-data-parallel-rank: 2\r\n"
    assert json.loads(out) == {"model": "m", "data_parallel_rank": 2}
    assert json.loads(with_rank(b"", b"{}", _worker("sglang"), 1)[1]) == {"data_parallel_rank": 1}
