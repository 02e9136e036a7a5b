"""The one rule that keeps a secret out of every output: a database URL's password is shown as ``***``.

A store URL (``postgresql://alice:PASSWORD@host/db``) reaches errors, log lines, stored run options, reports and
exports; each of them passes its text through :func:`hide_passwords` (or stored data through
:func:`hide_passwords_in`), never its own rule. The store keeps the real URL only to connect.
"""
from __future__ import annotations

import re
from typing import Any

MASK = "***"
"""What a hidden password reads as (as SQLAlchemy's ``URL.render_as_string(hide_password=True)`` writes it)."""

_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#]*:)(?P<secret>\S*)(?P<at>@)")
"""``scheme://user:SECRET@``: the password of a URL's user information, up to the last ``@`` of the word (a
password may hold an unescaped ``@`` or ``/``, as SQLAlchemy's own URL parser allows)."""
_QUERY = re.compile(r"(?P<head>[?&;\s](?:password|passwd|pwd)=)(?P<secret>[^&\s'\"]*)", re.IGNORECASE)
"""``?password=SECRET`` and ``password=SECRET`` in a libpq key-value DSN or a URL's query."""


def hide_passwords(text: str) -> str:
    """``text`` with every URL password (user information or a ``password=`` parameter) replaced by ``***``;
    anything else unchanged, so a message still names the host, database and user."""
    text = _USERINFO.sub(lambda m: m["head"] + (MASK if m["secret"] else "") + m["at"], text)
    return _QUERY.sub(lambda m: m["head"] + (MASK if m["secret"] else ""), text)


def hide_passwords_in(data: Any) -> Any:
    """JSON-like ``data`` (dicts, lists, tuples, strings) with :func:`hide_passwords` applied to every string."""
    if isinstance(data, str):
        return hide_passwords(data)
    if isinstance(data, dict):
        return {k: hide_passwords_in(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(hide_passwords_in(v) for v in data)
    return data
