"""The settings table of docs/settings.md, generated from the one description of each setting.

``python -m stacks.settings_doc`` prints the table of ``ClusterSettings``' context keys;
``--write`` replaces the table between docs/settings.md's ``settings-table`` markers with it.
tests/stack/test_settings.py fails when that table differs from this one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from constructs_lib.cluster_settings import ClusterSettings
from constructs_lib.setting import described_fields

PAGE = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
START = "<!-- settings-table:start (generated: python -m stacks.settings_doc --write) -->"
END = "<!-- settings-table:end -->"


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`"
    return f"`{value}`"


def settings_table(cls: type = ClusterSettings) -> str:
    """The markdown table: context key, default, accepted values, meaning."""
    rows = ["| context key | default | accepted | meaning |", "|---|---|---|---|"]
    for field, desc in described_fields(cls):
        default = desc.default_doc or _default(field.default)
        rows.append(f"| `{desc.key}` | {default} | {desc.limits} | {desc.doc} |")
    # the table lives in docs/: the descriptions' links to docs/ pages are siblings there
    return "\n".join(rows).replace("](docs/", "](") + "\n"


def readme_table(text: str) -> str:
    """The table between the markers of a page's text."""
    start, end = text.index(START) + len(START) + 1, text.index(END)
    return text[start:end]


def write_readme(path: Path = PAGE) -> bool:
    """Replace the page's table; True if it changed."""
    text = path.read_text()
    start, end = text.index(START) + len(START) + 1, text.index(END)
    new = text[:start] + settings_table() + text[end:]
    path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/settings.md in place")
    args = parser.parse_args(argv)
    if args.write:
        changed = write_readme()
        print("docs/settings.md " + ("updated" if changed else "already up to date"))
    else:
        sys.stdout.write(settings_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
