"""The man pages (issue 17, point 6): one per command group plus steadqd(1) and steadq.yaml(5),
written for people, clean under groff's warnings, and kept in step with the parsers: every
command and every option either program accepts is in some page, and every page links only to
pages that exist or that other packages provide.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from steadqd.cli.main import build_parser

from .helpers import installed

MAN = Path(__file__).resolve().parents[2] / "man"
PAGES = sorted(MAN.glob("*.[15]"))
SECTIONS = ("NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "FILES", "EXAMPLES", "SEE ALSO")
# Pages of other packages the SEE ALSO sections may name.
FOREIGN = {"sysexits(3)", "systemd.service(5)"}


def _text(page: Path) -> str:
    """The page's words with roff's escaped hyphens as plain ones."""
    return page.read_text().replace("\\-", "-")


def test_the_pages_are_the_expected_ones() -> None:
    assert [p.name for p in PAGES] == [
        "steadq-admin.1",
        "steadq-fsck.1",
        "steadq-lease.1",
        "steadq-put.1",
        "steadq-stats.1",
        "steadq.1",
        "steadq.yaml.5",
        "steadqd.1",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_has_the_sections_people_look_for(page: Path) -> None:
    headings = re.findall(r"^\.SH (.+)$", page.read_text(), re.M)
    wanted = [s for s in SECTIONS if not (page.suffix == ".5" and s == "EXIT STATUS")]
    assert [h for h in headings if h in SECTIONS] == wanted, headings


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_is_clean_for_groff_and_renders_with_man(page: Path) -> None:
    groff = installed("groff", "groff-base")
    p = subprocess.run([groff, "-man", "-z", "-ww", str(page)], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stderr) == (0, "")
    man = installed("man", "man-db")
    env = {"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    p = subprocess.run([man, "-l", str(page)], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "EXAMPLES" in p.stdout


def test_see_also_names_only_pages_that_exist() -> None:
    ours = {f"{p.stem}({p.suffix[1:]})" for p in PAGES}
    for page in PAGES:
        named = set(re.findall(r"^\.BR ([a-z.-]+) \((\d)\)", _text(page), re.M))
        for name, section in named:
            assert f"{name}({section})" in ours | FOREIGN, (page.name, name, section)


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public introspection
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sp in action.choices.items():
                found[f"{prefix}{name}"] = sp
                found |= _commands(sp, f"{prefix}{name} ")
    return found


def test_every_steadq_command_and_option_is_in_a_page() -> None:
    text = " ".join(_text(p) for p in PAGES)
    missing = []
    for name, sp in _commands(build_parser()).items():
        if f"steadq {name}" not in text and f".B {name}" not in text and f".BR {name} " not in text:
            missing.append(name)
        for action in sp._actions:  # noqa: SLF001
            missing += [f"{name} {o}" for o in action.option_strings if o.startswith("--") and o not in text]
    assert missing == []


def test_every_steadqd_command_is_in_its_page() -> None:
    from steadqd.daemon import main as daemon

    text = _text(MAN / "steadqd.1")
    help_text = subprocess.run(
        [daemon.sys.executable, "-m", "steadqd.daemon.main", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    commands = re.findall(r"^    ([a-z][a-z-]+)\s", help_text, re.M)
    assert "worker" in commands and "check-config" in commands, help_text
    for name in commands:
        assert f"steadqd {name}" in text or f"{name}" in re.findall(r"\.B[R]? ([a-z-]+)", text), name
