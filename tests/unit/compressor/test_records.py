"""Pasted JSON loses whole records, never lines, and stays valid JSON (compressor/records.py).

The oracle is the standard library's `json.loads` on the result, and the records the
original held: the kept ones are exactly the items asked for, unchanged."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from compressor.compress import fit_request
from compressor.content import classify, json_paste
from compressor.records import find_records, keep_records, spread

_records = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.text(min_size=1, max_size=20),
            "version": st.text(alphabet="0123456789.", min_size=1, max_size=8),
            "requires": st.lists(st.text(max_size=12), max_size=4),
            "score": st.floats(allow_nan=False, allow_infinity=False),
        }
    ),
    min_size=4,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    records=_records,
    indent=st.sampled_from([None, 2, 4, "\t"]),
    wrapped=st.booleans(),
    lead=st.sampled_from(["", "Here is the JSON:\n\n"]),
    data=st.data(),
)
def test_kept_records_parse_and_are_the_ones_asked_for(records, indent, wrapped, lead, data):
    value = {"packages": records, "count": len(records)} if wrapped else records
    body = json.dumps(value, indent=indent, ensure_ascii=False)
    text = lead + body + "\n\nWhich package is newest?"
    found = find_records(text)
    assert found is not None and len(found.items) == len(records)
    keep = sorted(data.draw(st.sets(st.integers(0, len(records) - 1), min_size=1)))
    out = keep_records(text, found, keep)
    assert out.startswith(lead) and out.endswith("\n\nWhich package is newest?")
    parsed = json.loads(out[len(lead) : -len("\n\nWhich package is newest?")])
    kept = parsed["packages"] if wrapped else parsed
    assert kept == [records[i] for i in keep]
    if wrapped:
        assert parsed["count"] == len(records)  # the rest of the object as it was


def test_spread_keeps_the_ends():
    assert spread(10, 3) == [0, 4, 9] or spread(10, 3) == [0, 5, 9]
    assert spread(5, 9) == [0, 1, 2, 3, 4] and spread(5, 1) == [0]


def test_text_that_is_not_a_record_array_is_left_to_the_compressor():
    assert find_records("[1] Source: the GPL\n\nsome prose " * 20) is None
    assert find_records('{"a": 1}\n' + "prose " * 200) is None  # the JSON is a small part
    assert find_records("{broken json, " * 50) is None


def test_indented_json_is_not_code_and_is_fitted_by_dropping_records():
    import importlib.metadata as md

    records = [
        {"name": d.metadata["Name"], "version": d.version, "summary": d.metadata["Summary"]}
        for d in list(md.distributions())[:400]
    ]
    body = json.dumps({"packages": records, "count": len(records)}, indent=2)
    question = "Which of these packages are about testing?"
    text = "Here is what our index returned:\n\n" + body + "\n\n" + question
    assert json_paste(text)
    messages = [{"role": "user", "content": text}]
    assert classify(messages=messages).value == "prose"
    full = fit_request(10**9, messages=messages, may_compress=False).tokens_before
    target = full * 2 // 3
    out = fit_request(target, messages=messages)
    assert out.fits and out.changed and out.tokens_after <= target
    sent = out.messages[0]["content"]
    assert sent.endswith(question)
    found = find_records(sent)
    assert found is not None
    parsed = json.loads(sent[found.start : found.end])
    assert all(r in records for r in parsed["packages"]) and parsed["count"] == len(records)
