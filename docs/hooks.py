"""mkdocs hooks: the site is built from docs/ plus the repository's own READMEs, and its
links are written to work on GitHub (relative to the file, in the repository).

- README.md is the site's home page and deploy/, simulator/ and bench/ READMEs are pages of
  it (generated at build time, never copied into docs/, so there is one text of each).
- Every relative link is resolved against the file's place in the repository: a link to a
  page of the site becomes a link to that page; a link to any other file of the repository
  must name one that exists (else a warning, which `mkdocs build --strict` makes an error)
  and becomes a link into the repository at `repo_url` when one is configured, else the
  link's text (the site does not serve source files).
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.fleetgate")

# repository path → page of the site
REPO_PAGES = {
    "README.md": "index.md",
    "deploy/README.md": "DEPLOY.md",
    "simulator/README.md": "SIMULATOR_CHECKS.md",
    "bench/README.md": "BENCHMARKS.md",
}
PAGE_SOURCES = {page: repo for repo, page in REPO_PAGES.items()}
# [text](target) outside inline code; targets with a scheme or only an anchor are left alone
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
IMAGE = re.compile(r"!\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _repo_root(config: Any) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def on_files(files: Files, config: Any) -> Files:
    root = _repo_root(config)
    for repo_path, page in REPO_PAGES.items():
        files.append(File.generated(config, page, content=(root / repo_path).read_text()))
    return files


def _repo_path_of(page_src: str) -> str:
    return PAGE_SOURCES.get(page_src, "docs/" + page_src)


def _rewrite(match: re.Match[str], page_src: str, root: Path, repo_url: str | None) -> str:
    text, target = match.group("text"), match.group("target")
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return match.group(0)
    path, _, anchor = target.partition("#")
    here = posixpath.dirname(_repo_path_of(page_src))
    repo_path = posixpath.normpath(posixpath.join(here, path))
    suffix = "#" + anchor if anchor else ""
    page_dir = posixpath.dirname(page_src) or "."
    if repo_path in REPO_PAGES:
        return f"[{text}]({posixpath.relpath(REPO_PAGES[repo_path], page_dir)}{suffix})"
    if repo_path.startswith("docs/"):
        return f"[{text}]({posixpath.relpath(repo_path[len('docs/') :], page_dir)}{suffix})"
    if repo_path.startswith("..") or not (root / repo_path).exists():
        log.warning("%s links to %s, which is not in the repository", page_src, target)
        return match.group(0)
    if repo_url:
        kind = "tree" if (root / repo_path).is_dir() else "blob"
        return f"[{text}]({repo_url.rstrip('/')}/{kind}/main/{repo_path}{suffix})"
    return text


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    root = _repo_root(config)
    repo_url = config.get("repo_url")
    src = page.file.src_uri
    out, fence = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            line = IMAGE.sub(lambda m: "!" + _rewrite(m, src, root, None), line)
            line = LINK.sub(lambda m: _rewrite(m, src, root, repo_url), line)
        out.append(line)
    return "\n".join(out)
