"""Every relative link of README.md, docs/*.md and examples' Markdown leads somewhere: the file exists, and an
``#anchor`` names a heading of the page it points to (GitHub's slugs: lower case, punctuation but ``-`` and ``_``
dropped, spaces as ``-``, a repeated heading numbered ``-1``, ``-2``). Links inside code are not links."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(\n])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def pages() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
    return [p for p in found if "node_modules" not in p.parts]


def prose(text: str) -> str:
    """``text`` without fenced blocks and code spans (kept line for line, so positions stay meaningful)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub("", text)


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here (no network)
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            out.append(f"{target}: no file {path}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            out.append(f"{target}: no heading #{anchor} in {destination.name}")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading(page):
    assert broken_links(page) == []


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# The `--depth` option (new)\n\n## Same\n\n## Same\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#the---depth-option-new) [ok2](other.md#same-1) [self](#title)\n# Title\n"
        "[gone](missing.md) [no anchor](other.md#nowhere) `[in code](missing.md)`\n"
        "```\n[in a block](missing.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["missing.md: no file missing.md", "other.md#nowhere: no heading #nowhere in other.md"]
