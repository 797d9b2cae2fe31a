"""An MkDocs hook: a fence's test tag (```python notest, ```bash norun, ```python test-file;
see tests/test_docs.py) is for the docs' tests, not the site. Markdown's fenced_code takes only
a language after the backticks, so a tagged fence would not open a code block and every fence
after it would pair up wrongly (headings swallowed into code): the tag is dropped before the
page is rendered."""

from __future__ import annotations

import re
from typing import Any

_TAGGED_FENCE = re.compile(r"^(?P<fence>[ \t]*(?:`{3,}|~{3,})[\w#.+-]+)[ \t]+[\w-]+[ \t]*$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """``markdown`` with each fence's test tag removed (its language kept)."""
    return _TAGGED_FENCE.sub(r"\g<fence>", markdown)
