"""The emulator's pure pieces: chat template costs, prefix hashes, the EOS model, output text."""

from __future__ import annotations

import statistics

from compressor.tokenizer import cl100k
from emulator.chat_template import BOS, EOS, decode, render_chat, render_completion
from emulator.prefix import block_hashes
from emulator.sampling import OutputModel, output_text, plan_output, token_text


def test_chat_template_overhead_is_the_documented_formula() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    enc = cl100k().encode
    expected = 1 + sum(len(enc(m["role"])) + len(enc("\n\n" + m["content"])) + 3 for m in msgs) + 4
    ids = render_chat(msgs)
    assert len(ids) == expected
    assert ids[0] == BOS and ids.count(EOS) == 2
    text = decode(ids)
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    )
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_content_parts_and_completion_prompts() -> None:
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hi "},
                {"type": "image_url"},
                {"type": "text", "text": "there"},
            ],
        }
    ]
    assert render_chat(parts) == render_chat([{"role": "user", "content": "Hi there"}])
    assert render_completion("Hello") == [BOS, *cl100k().encode("Hello")]
    assert render_completion([5, 6, 7]) == [5, 6, 7]


def test_block_hashes_share_exactly_the_common_full_blocks() -> None:
    a = list(range(100))
    b = [*range(40), 999, *range(41, 100)]
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 100 // 16
    assert ha[:2] == hb[:2] and ha[2] != hb[2]  # token 40 is in block 2
    assert all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))  # chained: divergence sticks
    assert block_hashes(a[:15]) == ()


def test_eos_model_is_deterministic_with_the_configured_mean() -> None:
    m = OutputModel(mean_output_tokens=50, seed=1)
    lengths = [m.natural_length([i, i + 1]) for i in range(4000)]
    assert lengths == [m.natural_length([i, i + 1]) for i in range(4000)]
    assert 45 < statistics.mean(lengths) < 55 and min(lengths) >= 1
    other = [OutputModel(50, seed=2).natural_length([i, i + 1]) for i in range(100)]
    assert other != lengths[:100]  # the seed matters
    assert plan_output(10, 5, ignore_eos=False) == 5
    assert plan_output(3, 5, ignore_eos=False) == 3
    assert plan_output(3, 5, ignore_eos=True) == 5
    # min_tokens=8: EOS is masked until 8 tokens exist, so it is the 9th (8 with text).
    assert plan_output(3, 50, ignore_eos=False, min_tokens=8) == 9


def test_output_text_is_one_token_per_position() -> None:
    for n in (1, 10, 97, 98, 99, 250):
        assert len(cl100k().encode(output_text(0, n))) == n
    assert all(len(cl100k().encode(token_text(i))) == 1 for i in range(200))
    assert output_text(0, 5) + output_text(5, 9) == output_text(0, 9)
