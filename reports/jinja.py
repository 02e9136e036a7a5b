"""The one Jinja2 environment of the HTML views: templates/ beside this file, autoescaped, strict."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


@functools.cache
def template_env() -> jinja2.Environment:
    """Autoescaping is on: every string from results or suites is escaped; only SVG marked ``Markup`` is not."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
