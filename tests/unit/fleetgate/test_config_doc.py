"""docs/CONFIG.md is generated from the configuration models and must be current: a key
added to gateway/config.py (or to token_pools' parameters) fails this test until
`python -m fleetgate.config_doc` is run, and it must come with a meaning."""

from __future__ import annotations

import re

from fleetgate import config_doc
from gateway.config import GatewayConfig

ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| (.*?) \| (.*) \|$")


def rows() -> list[tuple[str, str, str, str]]:
    return [m.groups() for line in config_doc.render().splitlines() if (m := ROW.match(line))]


def test_docs_config_md_is_current() -> None:
    assert config_doc.DOC.read_text() == config_doc.render(), (
        "docs/CONFIG.md is stale: run `python -m fleetgate.config_doc`"
    )
    assert config_doc.main(["--check"]) == 0


def test_every_key_has_a_type_a_default_and_a_meaning() -> None:
    found = rows()
    assert len(found) > 100
    for key, type_, default, meaning in found:
        assert type_ and default, key
        assert meaning.strip(), f"{key}: no meaning (write a comment beside it in the model)"


def test_every_key_of_the_model_is_listed() -> None:
    listed = {r[0] for r in rows()}
    for section, info in GatewayConfig.model_fields.items():
        assert section in listed
        model = config_doc._section_type(info.annotation)
        if model is None:
            continue
        prefix = section + (".<name>" if section == "pools" else "")
        for key in model.model_fields:
            assert f"{prefix}.{key}" in listed
    assert "pools.<name>.workers.<i>.url" in listed
    assert "admission.params.entitlements.<name>.class" in listed


def test_every_fallback_meaning_names_a_key() -> None:
    listed = {r[0] for r in rows()}
    assert set(config_doc.MEANINGS) <= listed, set(config_doc.MEANINGS) - listed


def test_a_stale_file_is_reported(tmp_path) -> None:
    out = tmp_path / "CONFIG.md"
    out.write_text("old\n")
    assert config_doc.main(["--check", "--out", str(out)]) == 1
    assert config_doc.main(["--out", str(out)]) == 0
    assert config_doc.main(["--check", "--out", str(out)]) == 0
