"""Real text that is on the machine offline, for tests/shapes.py's prompt shapes.

Nothing is downloaded and nothing is committed; every source is optional (a slim image
without man pages or licences still builds the shapes from what is there, the Python
reference manual at least):
- licences: /usr/share/common-licenses (Debian's base-files);
- man pages: /usr/share/man/man{1,5,8}/*.gz, turned into plain text by a small roff
  stripper (the macros become paragraph breaks and headings, font escapes vanish), and
  the Chinese and Japanese translations under /usr/share/man/{zh_CN,zh_TW,ja};
- READMEs: the long descriptions in the installed distributions' METADATA files;
- logs: syslog and Python-logging lines made by a seeded generator whose hosts are fixed,
  process names are installed distributions and messages are the standard library's own
  error, warning and log strings (`raise X("…")`, `warnings.warn("…")`, `log.info("…")`),
  so the words are real and only the interleaving is synthetic;
- JSON: the installed distributions' metadata as JSON documents (name, version, summary,
  requirements, classifiers, project URLs), as a user pastes an API answer or a lock file.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import random
import re
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.corpus import Source, code_sources, doc_sources

LICENCES = Path("/usr/share/common-licenses")
MAN = Path("/usr/share/man")


@lru_cache(maxsize=1)
def licence_sources() -> tuple[Source, ...]:
    if not LICENCES.is_dir():
        return ()
    out: dict[str, Source] = {}
    for path in sorted(LICENCES.iterdir()):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        real = os.path.realpath(path)
        if len(text) > 1500 and real not in out:
            out[real] = Source(f"the {path.name} licence", text)
    return tuple(out.values())


_ESCAPES = (
    (re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\s[+-]?\d"), ""),
    (re.compile(r"\\\((?:em|en)"), "—"),
    (re.compile(r"\\\((?:aq|cq)"), "'"),
    (re.compile(r"\\\((?:lq|rq|dq)"), '"'),
    (re.compile(r"\\\(bu"), "•"),
    (re.compile(r"\\\*?\(..|\\\*\[[^\]]*\]|\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[-e]"), lambda m: "-" if m.group() == "\\-" else "\\"),
    (re.compile(r"\\[&|^:%]|\\c$"), ""),
    (re.compile(r"\\ "), " "),
)


def _unescape(line: str) -> str:
    for pattern, repl in _ESCAPES:
        line = pattern.sub(repl, line)  # type: ignore[arg-type]
    return line


def roff_to_text(src: str) -> str:
    """Plain text of a man page's roff source: .SH/.SS headings, paragraph macros as
    blank lines, font macros as their words, other requests dropped."""
    paragraphs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            paragraphs.append(" ".join(current).strip())
            current.clear()

    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"", '.\\"')) or line.strip() == ".":
            continue
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].partition(" ")
            rest = _unescape(rest).replace('"', "").strip()
            if macro in ("SH", "SS"):
                flush()
                paragraphs.append(rest.upper() if macro == "SH" else rest)
            elif macro in ("PP", "LP", "P", "TP", "IP", "HP", "sp", "br"):
                flush()
                if macro == "IP" and rest:
                    current.append(rest.split(" ")[0])
            elif macro in ("B", "I", "SM", "SB"):
                current.append(rest)
            elif macro in ("BI", "IB", "BR", "RB", "IR", "RI"):
                current.append(rest.replace(" ", ""))
            continue
        text = _unescape(line).strip()
        if text:
            current.append(text)
    flush()
    return "\n\n".join(p for p in paragraphs if p)


@lru_cache(maxsize=1)
def man_sources(limit: int = 240) -> tuple[Source, ...]:
    """Man pages of 4–40 KB compressed (long enough to paste, short enough to mix), a
    stable selection of at most `limit` in name order."""
    paths: list[Path] = []
    for section in ("man1", "man5", "man8"):
        folder = MAN / section
        if folder.is_dir():
            paths.extend(
                p for p in sorted(folder.glob("*.gz")) if 4000 <= p.stat().st_size <= 40000
            )
    step = max(1, len(paths) // limit)
    out = []
    for path in paths[::step][:limit]:
        try:
            src = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError):
            continue
        text = roff_to_text(src)
        if len(text) > 3000:
            name = path.name.removesuffix(".gz")
            out.append(Source(f"the {name.rsplit('.', 1)[0]} man page", text))
    return tuple(out)


@lru_cache(maxsize=4)
def cjk_sources(lang: str) -> tuple[Source, ...]:
    """Chinese (`zh_CN`, `zh_TW`) or Japanese (`ja`) man pages as plain text: the
    translated pages the distribution installs under /usr/share/man/<lang>, any size
    with more than 1,500 characters of text (a CJK character is ~1 token, so short pages
    are joined by the shape builders)."""
    folder = MAN / lang
    out = []
    for path in sorted(folder.glob("man*/*.gz")) if folder.is_dir() else ():
        try:
            src = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError):
            continue
        text = roff_to_text(src)
        if len(text) > 1500:
            name = path.name.removesuffix(".gz")
            out.append(Source(f"the {name.rsplit('.', 1)[0]} man page ({lang})", text))
    return tuple(out)


@lru_cache(maxsize=1)
def _distributions() -> tuple[importlib.metadata.Distribution, ...]:
    seen: set[str] = set()
    out = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name and name not in seen:
            seen.add(name)
            out.append(dist)
    return tuple(sorted(out, key=lambda d: d.metadata["Name"].lower()))


@lru_cache(maxsize=1)
def readme_sources() -> tuple[Source, ...]:
    out = []
    for dist in _distributions():
        body = dist.metadata.get_payload()  # type: ignore[attr-defined]
        if isinstance(body, str) and len(body) > 3000:
            out.append(Source(f"the {dist.metadata['Name']} README", body.strip()))
    return tuple(out)


def prose_sources() -> tuple[Source, ...]:
    """Every prose source, documentation first."""
    return licence_sources() + man_sources() + readme_sources() + doc_sources()


# ---------------------------------------------------------------- JSON


@lru_cache(maxsize=1)
def package_records() -> tuple[dict[str, Any], ...]:
    """Installed distributions' metadata as JSON-ready records."""
    out = []
    for dist in _distributions():
        md = dist.metadata
        record: dict[str, Any] = {
            "name": md["Name"],
            "version": md["Version"],
            "summary": md.get("Summary") or "",
            "license": md.get("License-Expression") or md.get("License") or None,
            "requires_python": md.get("Requires-Python"),
            "requires_dist": md.get_all("Requires-Dist") or [],
            "classifiers": md.get_all("Classifier") or [],
            "project_urls": dict(
                u.split(", ", 1) for u in (md.get_all("Project-URL") or []) if ", " in u
            ),
        }
        if record["license"] and len(record["license"]) > 200:
            record["license"] = record["license"][:200]
        out.append(record)
    return tuple(out)


def json_document(rng: random.Random, records: list[dict[str, Any]], style: int) -> str:
    """A JSON text of `records` as an API or tool would print it."""
    if style == 0:
        return json.dumps({"packages": records, "count": len(records)}, indent=2)
    if style == 1:
        return json.dumps(records, indent=4)
    return "\n".join(json.dumps(r) for r in records)  # JSON lines


# ---------------------------------------------------------------- logs

_MESSAGE = re.compile(
    r"""(?:raise\s+\w+|warnings\.warn|(?:log|logger|_log|self\.logger)\.(?:debug|info|warning|error|exception|critical))"""
    r"""\(\s*[fr]?(["'])([^"'\\\n]{16,120})\1"""
)
_LOG_MODULES = (
    "asyncio/base_events.py",
    "asyncio/selector_events.py",
    "logging/config.py",
    "concurrent/futures/process.py",
    "multiprocessing/pool.py",
    "http/client.py",
    "urllib/request.py",
    "ssl.py",
    "socket.py",
    "subprocess.py",
    "tarfile.py",
    "zipfile.py",
    "shutil.py",
    "json/decoder.py",
    "configparser.py",
    "argparse.py",
    "email/message.py",
    "smtplib.py",
    "ftplib.py",
    "imaplib.py",
    "sqlite3/__init__.py",
    "importlib/_bootstrap_external.py",
    "unittest/case.py",
    "threading.py",
    "selectors.py",
    "ipaddress.py",
)


@lru_cache(maxsize=1)
def log_messages() -> tuple[str, ...]:
    """Error, warning and log strings of the standard library (real wording)."""
    root = sysconfig.get_paths()["stdlib"]
    out: list[str] = []
    for rel in _LOG_MODULES:
        path = os.path.join(root, rel)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                out.extend(m.group(2).strip() for m in _MESSAGE.finditer(f.read()))
    for src in code_sources():  # more of the same from the code corpus's modules
        out.extend(m.group(2).strip() for m in _MESSAGE.finditer(src.text))
    return tuple(dict.fromkeys(m for m in out if " " in m))


_HOSTS = ("web-01", "web-02", "api-gw", "db-primary", "worker-3", "cache-1")
_LEVELS = ("INFO", "INFO", "INFO", "WARNING", "ERROR", "DEBUG")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def log_text(rng: random.Random, lines: int, style: int) -> str:
    """`lines` log lines: 0 syslog (`Mon DD HH:MM:SS host proc[pid]: msg`), 1 Python
    logging (`YYYY-MM-DD HH:MM:SS,mmm LEVEL name: msg`), 2 journal-like with levels."""
    messages = log_messages()
    procs = [d.metadata["Name"].lower() for d in _distributions()][:40] or ["app"]
    month = rng.randrange(12)
    day = rng.randint(1, 28)
    t = rng.randrange(86400 - 4 * lines)
    pids = {p: rng.randint(200, 65000) for p in procs}
    hot = rng.sample(messages, min(12, len(messages)))  # recurring lines, as real logs have
    out = []
    for _ in range(lines):
        t += rng.choice((0, 0, 1, 1, 2, 5))
        hh, mm, ss = t // 3600, t // 60 % 60, t % 60
        proc = rng.choice(procs[:8]) if rng.random() < 0.7 else rng.choice(procs)
        msg = rng.choice(hot) if rng.random() < 0.35 else rng.choice(messages)
        host = rng.choice(_HOSTS)
        if style == 0:
            out.append(
                f"{_MONTHS[month]} {day:2d} {hh:02d}:{mm:02d}:{ss:02d} {host} {proc}[{pids[proc]}]: {msg}"
            )
        elif style == 1:
            level = rng.choice(_LEVELS)
            out.append(
                f"2025-{month + 1:02d}-{day:02d} {hh:02d}:{mm:02d}:{ss:02d},{rng.randrange(1000):03d} "
                f"{level} {proc}.{rng.choice(('core', 'worker', 'http', 'db'))}: {msg}"
            )
        else:
            level = rng.choice(_LEVELS).lower()
            out.append(
                f"{hh:02d}:{mm:02d}:{ss:02d} {host} level={level} svc={proc} msg={json.dumps(msg)}"
            )
    return "\n".join(out)
