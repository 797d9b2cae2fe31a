"""A Griffe extension (for mkdocs.yml) that reads the reST habits of producerkit's docstrings.

The docstrings are Markdown-compatible except for three reST habits, rewritten here before
mkdocstrings renders them:

- ``:class:`~producerkit.Failure``` (any Sphinx role) becomes a cross-reference,
  ``[`Failure`][producerkit.Failure]``; ``~`` shows the last part of the name, as in Sphinx. A
  name without dots (``:attr:`failures```) is looked up from the docstring's own object outward
  (mkdocstrings' ``scoped_crossrefs``). A reference that resolves nowhere fails
  ``mkdocs build --strict``.
- ``Text::`` before an indented block becomes ``Text:`` (a lone ``::`` line is dropped); the
  indented block is a code block in Markdown too.
- ``\\ `` (reST's escaped space, as in ````Nats-Msg-Id``\\ s``) is dropped.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`(~?)([\w.]+)(?:\(\))?`")
LITERAL_MARKER = re.compile(r"^([ \t]*)(.*?)::[ \t]*$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    tilde, target = match[1], match[2]
    shown = target.rsplit(".", 1)[-1] if tilde else target
    return f"[`{shown}`][{target}]"


def _literal_marker(match: re.Match[str]) -> str:
    indent, text = match[1], match[2]
    return f"{indent}{text}:" if text.strip() else ""


def rewrite(text: str) -> str:
    text = ROLE.sub(_role, text)
    text = LITERAL_MARKER.sub(_literal_marker, text)
    return text.replace("\\ ", "")


class RstRoles(griffe.Extension):
    """Rewrites the docstrings of a package when it has been loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg)

    def _visit(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._visit(member)  # type: ignore[arg-type]
