"""`steadq` reads a queue's config with the daemons' own refusals (steadqd/queue_names.py, steadqd/yaml_doc.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadqd.errors import ConfigError
from steadqd.queue_names import read_queue_entry


@pytest.mark.parametrize(
    "text",
    [
        "queue: &q /srv/q\nother: *q\n",  # an alias: refused before composition, as the daemons refuse it
        "queue: !!python/object:os.system /srv/q\n",  # a tag
        "queue: " + "[" * 200 + "]" * 200 + "\n",  # nesting past the daemons' bound
    ],
)
def test_what_the_daemons_refuse_steadq_refuses_too(tmp_path: Path, text: str) -> None:
    (tmp_path / "render.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"not a valid configuration \(steadqd check-config render says more\)"):
        read_queue_entry("render", str(tmp_path))


def test_a_plain_config_names_its_queue(tmp_path: Path) -> None:
    (tmp_path / "render.yaml").write_text("queue: /srv/render\nworker:\n  command: [/bin/true]\n")
    assert read_queue_entry("render", str(tmp_path)).queue == "/srv/render"
