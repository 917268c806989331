"""The trailing question of a prompt: the units at the end of the last user message (or
of a completion prompt) that compression keeps whole.

Users paste a document and ask about it at the end; the question may be several
sentences, and is often followed by a paragraph of politeness ("Thanks in advance! Bullet
points would be great."). FleetOpt §5.2's recency invariant keeps the last 2 sentences,
which loses the question as soon as 2–3 polite sentences follow it. The rule here, on one
text's units (compressor/sentences.py: a unit owns the whitespace before it, so a unit
that starts with a blank line opens a paragraph):

1. Walk back from the last unit while the suffix stays within `budget` tokens; the tail
   starts at the earliest unit so reached that opens a paragraph or follows a document
   boundary (a line `---`, `===`, `\"\"\"`, a closing fence or tag such as `</document>`),
   and a boundary stops the walk: what precedes it is the pasted material. Several short
   trailing paragraphs (question, then thanks) are thus kept together.
2. If no paragraph starts within the budget (one long last paragraph, or a question
   glued to the document by a single line break), the tail is the trailing units that fit
   the budget, at least the last one.

Cost: O(units in the tail), a few string checks each. The caller adds the tail to the
mandatory units; if the tail alone does not fit the target the request does not fit.
"""

from __future__ import annotations

import re

from compressor.document import Document

DEFAULT_TAIL_TOKENS = 256  # a question with a few sentences of context and politeness

_PARAGRAPH = re.compile(r"[^\S\n]*\n[^\S\n]*\n")  # a unit that starts with a blank line
_BOUNDARY = re.compile(
    r"(?:^|\n)[^\S\n]*(?:-{3,}|={3,}|\"\"\"|'''|`{3,}|~{3,}|</[\w:.-]+>)[^\S\n]*$"
)


def question_tail(doc: Document, text: int, budget: int) -> int:
    """Index of the first unit of text `text`'s trailing question (see the module
    docstring); units from it to the text's last unit are kept whole."""
    units = doc.units
    group = doc.group
    first = int(group.searchsorted(text, side="left"))
    end = int(group.searchsorted(text, side="right"))
    if end <= first:
        return end
    tokens = doc.tokens
    used = 0
    fallback = end - 1
    best = -1
    i = end - 1
    while i >= first:
        used += int(tokens[i])
        if used > budget:
            break
        fallback = i
        a, b = units.span(i)
        if _PARAGRAPH.match(units.text, a, b) or i == first:
            best = i
        if i > first:
            pa, _ = units.span(i - 1)
            if _BOUNDARY.search(units.text[pa:a].rstrip()):
                best = i
                break
        i -= 1
    return best if best >= 0 else fallback
