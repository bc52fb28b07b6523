"""Every relative link in README.md and docs/*.md resolves: the file exists, and a `#anchor` names a heading.

Anchors follow GitHub's heading slugs: lowercase, punctuation other than `-` and `_` dropped, spaces
turned into `-`, and `-1`, `-2`... appended to repeated headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in _prose(page.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(page: Path) -> list[str]:
    """One line per link of `page` that does not resolve, naming the link and why."""
    problems = []
    for line in _prose(page.read_text()):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if _EXTERNAL.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_to_every_page_in_docs() -> None:
    linked = {target.partition("#")[0] for target in _LINK.findall((ROOT / "README.md").read_text())}
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= linked


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Spec fields", "spec-fields"),
        ("`ddpjob report`", "ddpjob-report"),
        ("Children, names and labels", "children-names-and-labels"),
        ("The trainer's metrics", "the-trainers-metrics"),
        ("GPU recipe: not measured", "gpu-recipe-not-measured"),
        ("runPolicy -> ours", "runpolicy---ours"),
        ("The trainer: `ddp_trainer`", "the-trainer-ddp_trainer"),
    ],
)
def test_a_heading_slug_follows_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Same\n\n## Same\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#same-1) [ok](#page) `[code](nowhere.md)` [web](https://example.com/x)\n"
        "[gone](missing.md) [bad](other.md#same-2) [bad](#nope)\n\n```\n[fenced](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        f"missing.md: no file {tmp_path / 'missing.md'}",
        "other.md#same-2: no heading with anchor #same-2 in other.md",
        "#nope: no heading with anchor #nope in page.md",
    ]
