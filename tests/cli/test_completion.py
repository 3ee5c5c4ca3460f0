"""Shell completion for ``steadq`` and ``steadqd`` in bash, zsh and fish (issue 17, point 6).

Each script comes from the installed console script and is driven in its own shell: bash
through ``COMP_WORDS``/``COMP_CWORD``, zsh with ``compadd`` and friends replaced by functions
that print what would be offered (``words``/``CURRENT`` set as the completion system would),
fish with ``complete -C``, its own way to ask what it would complete. A shell that is not
installed skips here and fails under ``STEADQ_SYSTEM_TESTS=require``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import installed, steadq

STEADQD = shutil.which("steadqd", path=os.path.dirname(sys.executable))


def _script(program: str, shell: str) -> str:
    if program == "steadq":
        r = steadq("completion", shell)
        assert r.code == 0, r.err
        return r.out
    assert STEADQD is not None
    p = subprocess.run([STEADQD, "completion", shell], capture_output=True, text=True, timeout=60, check=True)
    return p.stdout


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "queues"
    d.mkdir()
    (d / "render.yaml").write_text("queue: /srv/queues/render\nworker:\n  command: [/bin/true]\n")
    (d / "mail.yaml").write_text("# a comment\nqueue: /srv/queues/mail\n")
    return d


def _run(argv: list[str], script: str, config_dir: Path) -> list[str]:
    env = {**os.environ, "STEADQ_CONFIG_DIR": str(config_dir), "HOME": str(config_dir.parent)}
    p = subprocess.run([*argv, script], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


# (program, words typed so far, the word being completed, what must be offered, what must not)
CASES = [
    ("steadq", [], "ad", {"admin"}, {"init"}),
    ("steadq", [], "", {"init", "put", "show", "completion"}, set()),
    ("steadq", ["admin"], "pu", {"purge"}, {"dead-list"}),
    ("steadq", ["lease"], "--d", {"--duration", "--duration-seconds"}, {"--handle-file"}),
    ("steadq", ["put", "/q"], "--js", {"--json", "--jsonl"}, set()),
    ("steadq", ["ls", "/srv/queues/render"], "", {"ready", "leased", "dead", "all"}, {"/srv/queues/render"}),
    ("steadq", ["ls", "--json", "/q"], "de", {"dead", "delayed"}, {"ready"}),
    ("steadq", ["stats"], "/srv/queues/", {"/srv/queues/render", "/srv/queues/mail"}, set()),
    ("steadq", ["admin", "purge", "/q"], "", {"dead", "quarantine"}, set()),
    ("steadq", ["completion"], "", {"bash", "zsh", "fish"}, set()),
    ("steadqd", [], "", {"worker", "sweeper", "run", "check-config", "completion"}, set()),
    ("steadqd", ["worker"], "", {"render", "mail"}, {"/srv/queues/render"}),
    ("steadqd", ["--config-dir", "/x", "sweeper"], "re", {"render"}, {"mail"}),
    ("steadqd", ["check-config", "render"], "", {"render", "mail"}, set()),
    ("steadqd", ["check-config"], "--", {"--open", "--user", "--config-dir"}, set()),
    # past `work QUEUE --` comes the job's command line: command names, never steadq's own options
    ("steadq", ["work", "/q", "--"], "tru", {"true"}, set()),
    ("steadq", ["work", "/q", "--", "nice"], "tru", {"true"}, set()),
    ("steadq", ["work", "/q", "--"], "--", set(), {"--concurrency", "--once", "--json", "--help"}),
    ("steadq", ["work", "/q", "--", "nice"], "--", set(), {"--concurrency", "--once", "--json", "--help"}),
]


def _bash_offers(program: str, words: list[str], cur: str, config_dir: Path) -> set[str]:
    bash = installed("bash", "bash")
    all_words = [program, *words, cur]
    quoted = " ".join(f"'{w}'" for w in all_words)
    fn = "_" + program
    driver = f'\nCOMP_WORDS=({quoted}); COMP_CWORD={len(all_words) - 1}; {fn}; printf "%s\\n" "${{COMPREPLY[@]}}"\n'
    return set(_run([bash, "-c"], _script(program, "bash") + driver, config_dir))


def _zsh_offers(program: str, words: list[str], cur: str, config_dir: Path) -> set[str]:
    zsh = installed("zsh", "zsh")
    all_words = [program, *words, cur]
    quoted = " ".join(f"'{w}'" for w in all_words)
    stubs = (
        'compadd() { [[ $1 == -- ]] && shift; print -rl -- "$@"; }\n'
        "_files() { print FILES; }\n_directories() { print DIRS; }\n"
        "_command_names() { print -rl -- ${(k)commands}; }\n"  # the commands on $PATH, as the real one offers
        "compdef() { :; }\n"
    )
    driver = f"\nwords=({quoted}); CURRENT={len(all_words)}; _{program}\n"
    offered = _run([zsh, "-f", "-c"], stubs + _script(program, "zsh") + driver, config_dir)
    return {w for w in offered if w.startswith(cur)}  # compadd itself filters by the prefix


def _fish_offers(program: str, words: list[str], cur: str, config_dir: Path) -> set[str]:
    fish = installed("fish", "fish")
    line = " ".join([program, *words, cur])
    driver = f"\ncomplete -C '{line}'\n"
    out = _run([fish, "--no-config", "-c"], _script(program, "fish") + driver, config_dir)
    return {w.split("\t", 1)[0] for w in out}


OFFERS = {"bash": _bash_offers, "zsh": _zsh_offers, "fish": _fish_offers}


@pytest.mark.parametrize("shell", sorted(OFFERS))
@pytest.mark.parametrize(("program", "words", "cur", "wanted", "unwanted"), CASES)
def test_completion_offers(
    shell: str,
    program: str,
    words: list[str],
    cur: str,
    wanted: set[str],
    unwanted: set[str],
    config_dir: Path,
) -> None:
    offered = OFFERS[shell](program, words, cur, config_dir)
    assert wanted <= offered, (shell, words, cur, offered)
    assert not unwanted & offered, (shell, words, cur, offered)


@pytest.mark.parametrize("program", ["steadq", "steadqd"])
@pytest.mark.parametrize("shell", sorted(OFFERS))
def test_scripts_parse_in_their_shell(program: str, shell: str) -> None:
    exe = installed(shell, shell)
    p = subprocess.run([exe, "-n"], input=_script(program, shell), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_values_of_file_options_complete_files(config_dir: Path) -> None:
    (config_dir.parent / "h.json").write_text("{}")
    offered = _bash_offers("steadq", ["ack", "/q", "--handle-file"], str(config_dir.parent / "h."), config_dir)
    assert offered == {str(config_dir.parent / "h.json")}
    offered = _bash_offers("steadq", ["ack", "/q", "--handle-file", "h.json"], "", config_dir)
    assert "--handle-file" not in offered  # a valued option's value is not taken for a positional


def test_an_unknown_shell_is_refused_with_the_choices() -> None:
    r = steadq("completion", "tcsh")
    assert r.code == 1 and "bash" in r.err and "fish" in r.err
