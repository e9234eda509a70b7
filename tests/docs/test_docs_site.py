"""The docs site (mkdocs.yml, docs/) builds in strict mode: a broken link or anchor, a page the nav names that does
not exist, or any other warning fails it; every page of the site's sections is in the nav; and the README says how
to build and serve it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

pytest.importorskip("mkdocs", reason="the dev extra installs mkdocs and mkdocs-material")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # Material's notice about its successor is printed, not a warning; it is silenced to keep the output short
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=300)


def test_the_site_builds_in_strict_mode(tmp_path):
    result = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "config.html").is_file()
    # search is on: its index lists the pages
    assert "getting-started/laptop.html" in (tmp_path / "site" / "search" / "search_index.json").read_text()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The repository's settings on a one-page site whose page links to a page that does not exist."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guide.md) and [a section](#nowhere).\n")
    settings = (REPO / "mkdocs.yml").read_text()
    settings = settings.replace("docs_dir: docs", f"docs_dir: {docs}").split("\nnav:")[0] + "\n"
    config = tmp_path / "mkdocs.yml"
    config.write_text(settings)
    result = build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "guide.md" in result.stderr and "#nowhere" in result.stderr


def nav_pages() -> set[str]:
    return set(re.findall(r":\s+(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M))


def test_every_page_is_in_the_nav():
    """User pages, guides, references and records; docs/data/ holds study outputs, which the pages link to."""
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")
             if path.relative_to(DOCS).parts[0] != "data"} | {"data/README.md"}
    assert pages - nav_pages() == set(), "pages missing from the nav in mkdocs.yml"
    assert nav_pages() - pages == set(), "nav entries without a page"


def test_the_readme_says_how_to_build_and_serve_the_site():
    readme = (REPO / "README.md").read_text()
    assert "mkdocs serve" in readme and "mkdocs build --strict" in readme
