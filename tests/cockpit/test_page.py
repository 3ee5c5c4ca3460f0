"""The Cockpit page (cockpit/, shipped as the cockpit-steadq package): its logic and its rules, without a browser.

Why these tests exist: the page shows text that anyone who can enqueue chooses (metadata, payloads,
journal lines), inside a session that can run commands as the logged-in user. One `innerHTML` with
such text is a cross-site scripting hole with a shell behind it. So:

- steadq.test.js runs the page's own formatting and rendering functions under Node's test runner
  against a stand-in document whose HTML-parsing entry points throw: a hostile metadata string,
  payload, journal line or queue name must come out as text. It also checks the age formatting and
  the line-by-line reading of the `watch --json` stream however a pipe splits it.
- The static checks hold the page to Cockpit's Content-Security-Policy (no inline script or style,
  no event-handler attribute) and to "nothing fetched from outside" (no URL with a scheme).
- The shapes the page reads are checked against the real CLI's output, so a renamed key breaks a
  test here rather than the page in a browser.

The browser itself (log in through cockpit-ws, click through, pause/resume) is
tests/system/test_cockpit_e2e.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "cockpit"
NODE_TESTS = Path(__file__).resolve().parent / "steadq.test.js"

# The keys steadq.js reads from each command's JSON (docs/cli-json.md), one place for the filesystem
# test below and the bucket one (tests/stowq/test_cockpit_bucket.py);
# test_every_key_listed_is_one_the_page_reads keeps the lists to what the script names.
LIST_KEYS = frozenset({"config_dir", "queues"})
LIST_QUEUE_KEYS = frozenset({"name", "queue", "counts", "oldest_age_seconds", "paused", "error", "units"})
COUNT_KEYS = frozenset({"ready", "delayed", "running", "dead"})  # list's counts, and a frame's states
FRAME_KEYS = frozenset({"time_ns", "queue", "interval_seconds", "states", "paused", "progress"})
LS_KEYS = frozenset({"job_id", "attempt", "max_attempts", "age_seconds"})
LS_DEAD_KEYS = LS_KEYS | {"reason", "reason_name"}
SHOW_KEYS = frozenset(
    {
        "state",
        "reason_name",
        "attempt",
        "max_attempts",
        "generation",
        "created_at_ns",
        "in_state_since_ns",
        "content_type",
        "producer_id",
        "metadata",
        "payload_length",
        "payload_verified",
        "problem",
        "payload_head_text",
        "payload_head_base64",
        "payload_head_bytes",
        "progress",
        "journal",
        "failure",
    }
)
PAUSED_KEYS = frozenset({"reason", "since_ns", "by", "problem"})
PURGE_KEYS = frozenset({"selected"})
HISTORY_KEYS = frozenset({"minutes"})
HISTORY_MINUTE_KEYS = frozenset({"acked", "buried"})
READ_KEYS = (
    LIST_KEYS | LIST_QUEUE_KEYS | COUNT_KEYS | FRAME_KEYS | LS_DEAD_KEYS | SHOW_KEYS | PAUSED_KEYS | PURGE_KEYS
) | (HISTORY_KEYS | HISTORY_MINUTE_KEYS)


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        # A skip here becomes a failure under STEADQ_SYSTEM_TESTS=require (tests/prereq.py).
        pytest.skip("node is not installed (apt-get install nodejs): the page's logic tests need Node >= 18")
    return node


def test_page_logic_under_node() -> None:
    """steadq.test.js: escaping, ages, the watch stream by lines, the permission sentence."""
    proc = subprocess.run([_node(), "--test", str(NODE_TESTS)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"^# pass [1-9]", proc.stdout, re.M), proc.stdout[-2000:]
    assert re.search(r"^# fail 0$", proc.stdout, re.M), proc.stdout[-2000:]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_data(self, data: str) -> None:
        if getattr(self, "_in_script", False):
            self.script_text += data

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False


def test_html_has_no_inline_script_style_or_remote_resource() -> None:
    """Cockpit's CSP forbids inline script and style; the page loads only cockpit.js and its own two files."""
    html = (PAGE / "index.html").read_text()
    parser = _Tags()
    parser.feed(html)
    scripts = [attrs.get("src") for tag, attrs in parser.tags if tag == "script"]
    assert scripts == ["../base1/cockpit.js", "steadq.js"], scripts
    assert parser.script_text.strip() == "", "inline script"
    assert not any(tag == "style" for tag, _ in parser.tags), "inline <style>"
    links = [attrs.get("href") for tag, attrs in parser.tags if tag == "link"]
    assert links == ["steadq.css"], links
    for tag, attrs in parser.tags:
        for name in attrs:
            assert name != "style" and not name.startswith("on"), f"<{tag} {name}=…>"
    for name in ("index.html", "steadq.js", "steadq.css", "manifest.json"):
        # SVG's namespace name is a URI the DOM compares, never fetches: the one allowed.
        text = (PAGE / name).read_text().replace('"http://www.w3.org/2000/svg"', '"SVG_NS"')
        assert not re.search(r"\b(https?|wss?|ftp)://", text), f"{name} names a remote URL"
    assert sorted(p.name for p in PAGE.iterdir()) == ["index.html", "manifest.json", "steadq.css", "steadq.js"]


def test_script_never_parses_html() -> None:
    """Everything from a job or the tree is inserted as text: no HTML-parsing or code-evaluating call exists."""
    js = (PAGE / "steadq.js").read_text()
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", js, flags=re.S)  # the comments may name what is forbidden
    for forbidden in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        'setTimeout("',
        "createContextualFragment",
        "DOMParser",
    ):
        assert forbidden not in code, forbidden


def test_administrative_access_only_where_it_is_meant() -> None:
    """Cockpit's superuser: "require" for the unit verbs only, "try" for the journal counts, the unit
    states and a queue this user could not open; every other command runs as the logged-in user."""
    js = (PAGE / "steadq.js").read_text()
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", js, flags=re.S)
    uses = re.findall(r"superuser\W*(\w+)", code)
    assert sorted(uses) == ["require", "try", "try", "try"], uses
    (require,) = [line for line in code.splitlines() if 'superuser: "require"' in line]
    assert '["systemctl", verb, "--", unit]' in require, require
    tries = [line.strip() for line in code.splitlines() if 'superuser: "try"' in line]
    assert any("adminQueues[queue]" in t for t in tries), tries
    # The verbs and units are checked before systemctl runs: only the queue's own three units.
    action = code[code.index("function unitAction") : code.index('superuser: "require"')]
    assert (
        '["start", "stop", "restart"].includes(verb)' in action
        and "unitNames(queueName(queue)).includes(unit)" in action
    )
    # cockpit.permission is asked (the shell's own signal for administrative access), never guessed from groups.
    assert "cockpit.permission({ admin: true })" in code


def test_manifest_names_the_menu_entry() -> None:
    manifest = json.loads((PAGE / "manifest.json").read_text())
    assert manifest["menu"]["index"]["label"] == "Job queues"
    assert "content-security-policy" not in manifest, "the page keeps Cockpit's default policy"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "steadqd.cli.main", "--json", *args], capture_output=True, text=True, timeout=60
    )


def test_the_shapes_the_page_reads_are_the_cli_s(tmp_path: Path) -> None:
    """list, watch, ls and show --json carry every key steadq.js reads (docs/cli-json.md)."""
    q = str(tmp_path / "q")
    assert _cli("init", q, "--shards", "4").returncode == 0
    put = subprocess.run(
        [sys.executable, "-m", "steadqd.cli.main", "put", q, "--meta", "task=<img src=x onerror=alert(1)>"],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert put.returncode == 0, put.stderr
    job_id = re.search(r"job_id: (\w+)", put.stdout)
    assert job_id, put.stdout
    frame = json.loads(_cli("watch", q, "--count", "1").stdout.splitlines()[0])
    assert FRAME_KEYS <= frame.keys()
    assert frame["states"]["ready"]["objects"] == 1 and COUNT_KEYS <= frame["states"].keys()
    listed = json.loads(_cli("ls", q, "ready").stdout)
    assert LS_KEYS <= listed[0].keys()
    story = json.loads(_cli("show", q, job_id.group(1), "--no-journal").stdout)
    assert SHOW_KEYS <= story.keys(), SHOW_KEYS - story.keys()
    assert story["metadata"] == {"task": "<img src=x onerror=alert(1)>"}
    paused = json.loads(_cli("pause", q, "--reason", "why").stdout)["paused"]
    assert PAUSED_KEYS <= paused.keys()
    purge = json.loads(_cli("admin", "purge", q, "dead", "--dry-run").stdout)
    assert purge["dry_run"] is True and purge["selected"] == 0 and PURGE_KEYS <= purge.keys()
    overview = json.loads(_cli("list").stdout)
    assert LIST_KEYS <= overview.keys()


def test_every_key_listed_is_one_the_page_reads() -> None:
    """The lists above are the script's: each key is read as `.key` (or `["key"]`) somewhere in steadq.js."""
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", (PAGE / "steadq.js").read_text(), flags=re.S)
    unread = sorted(k for k in READ_KEYS if not re.search(rf"\.{k}\b|\[\"{k}\"\]|\"{k}\"", code))
    assert unread == [], unread
