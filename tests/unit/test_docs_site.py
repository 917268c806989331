"""The documentation site builds strictly: `mkdocs build --strict` fails on a broken link or
anchor, a page of docs/ left out of the navigation, or a nav entry with no page
(mkdocs.yml's `validation`); docs/hooks.py checks links to repository files outside docs/.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleetgate_docs_hooks", ROOT / "docs/hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    # the README is the home page, the other READMEs are pages, and every doc is in the site
    assert "Two commands" in (tmp_path / "s/index.html").read_text()
    assert (tmp_path / "s/DEPLOY/index.html").exists()
    for page in (ROOT / "docs").glob("*.md"):
        assert (tmp_path / "s" / page.stem / "index.html").exists(), page.name


def _page(src_uri: str) -> SimpleNamespace:
    return SimpleNamespace(file=SimpleNamespace(src_uri=src_uri))


def test_links_are_resolved_from_the_file_in_the_repository(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hooks = _hooks()
    config = {"docs_dir": str(ROOT / "docs"), "repo_url": None}
    # README.md (the home page) links as GitHub reads it: docs/… and deploy/README.md are pages
    home = hooks.on_page_markdown(
        "[a](docs/CONFIG.md#listen) [b](deploy/README.md) [c](config/gateway.yaml)",
        _page("index.md"),
        config,
        None,
    )
    assert home == "[a](CONFIG.md#listen) [b](DEPLOY.md) c"
    page = hooks.on_page_markdown(
        "[a](../README.md) [b](../config/gateway.yaml) `[x](y)` [c](https://e.org/z)",
        _page("OPERATIONS.md"),
        {**config, "repo_url": "https://example.org/fg"},
        None,
    )
    assert page == (
        "[a](index.md) [b](https://example.org/fg/blob/main/config/gateway.yaml) `[x](y)` "
        "[c](https://e.org/z)"
    )
    # a repository file that does not exist is a warning, which --strict makes an error
    with caplog.at_level(logging.WARNING):
        hooks.on_page_markdown("[gone](../config/nope.yaml)", _page("API.md"), config, None)
    assert "not in the repository" in caplog.text
