"""The Cockpit page (cockpit-steadq) in a real browser, against real Cockpit and real systemd (issue 34 #1).

What an administrator and a user do: ``apt-get install`` both packages (offline, in the harness's
throwaway root, never the host's systemd), log in to Cockpit with a password, find "Job queues"
in the menu, and watch a queue while jobs arrive; open a job's story; pause and resume; cancel,
requeue and purge. What the tests hold the page to:

* a job whose metadata and payload are HTML (``<img src=x onerror=alert(1)>``) is shown as that
  text: no element is made of it and no script runs;
* a user outside the queue's group gets one sentence ("You are not in group steadq"), not an
  error dump;
* Cockpit's Content-Security-Policy never had to refuse anything (the browser's log has no CSP
  report).
* an administrator (group sudo; Cockpit's superuser started with sudo at login) sees the throughput
  sparkline count acked jobs, restarts a worker unit from the page and follows Logs to Cockpit's
  journal page; a member without administrative access sees the unit buttons disabled with the reason.
* both see the units' states as systemd has them: the overview's Units column ("promoter active,
  sweeper active, worker active" for a running queue, from `steadq list` as the user) and the queue
  view's units table (`systemctl show`; as the member without administrative access, as the
  administrator as root), each checked against what root's systemctl says.

Rows are redrawn under the test (the overview every 5 s, running rows every watch frame): every
lookup of a row is re-done inside a bounded wait (``_get``, ``_click``), never after a sleep.

How: the root's network namespace has only a loopback device. cockpit.socket gets a drop-in that
listens on 127.0.0.1:9090 only (plain HTTP: Cockpit allows it from localhost). Unlike the other
system roots, this one runs its own system bus (Debian's dbus, not masked: sysroot.MASKED_WITH_DBUS),
as every machine with Cockpit has: a user's `systemctl is-active`/`show` asks systemd over it, so
the page shows the unit states a user sees on a real machine (without the bus: "–"/"unknown").
The test process enters that network namespace
(setns, this thread only) to start chromedriver and Debian's chromium, so the browser reaches
127.0.0.1:9090 inside the root and nothing else at all: it cannot phone home. Chromium runs headless with a
fresh profile under the test's tmp dir; screenshots of each step are saved there too.

The root is offline and sees the host's packages: cockpit-ws, cockpit-bridge, cockpit-system, dbus,
chromium and chromium-driver must be installed on the host (``./dev.sh setup`` does), selenium
in the venv (the test extra); the test skips naming what is missing (fails under
STEADQ_SYSTEM_TESTS=require).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .sysroot import MASKED_WITH_DBUS, SystemdRoot
from .test_packages_e2e import _build_unavailable, _host_has, package_prerequisites, root_with_deb

pytestmark = [pytest.mark.system, pytest.mark.packaging]

HOST_PACKAGES = ("cockpit-ws", "cockpit-bridge", "cockpit-system", "dbus", "chromium", "chromium-driver")
NAME = "demo"
QUEUE = f"/var/lib/steadq/{NAME}"
MEMBER, OUTSIDER = "ann", "bob"
# An administrator as Cockpit knows one: in group sudo (Debian's sudoers: %sudo ALL=(ALL:ALL) ALL), so
# Cockpit's superuser bridge (`sudo -k -A cockpit-bridge --privileged`, the login password on askpass) starts.
ADMIN = "carol"
PASSWORD = "Queue-pass-1"
XSS = "<img src=x onerror=alert(1)>"
URL = "http://127.0.0.1:9090"
PAGE = f"{URL}/cockpit/@localhost/steadq/index.html"
DEADLINE = 60.0
# A second queue with a running worker: its job reports progress (HTML in the text) and waits to be
# cancelled from the page, at most 60 s.
LIVE = "live"
LIVE_JOB = "/usr/local/bin/cockpit-e2e-job"
LIVE_SCRIPT = """#!/bin/sh
echo "42 frame <b>42</b>/100" > "$STEADQ_PROGRESS"
i=0
while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
"""
# A third queue whose worker acks every job at once (/bin/true): the throughput sparkline and the unit controls.
FAST = "fast"
FAST_WORKER = f"steadq-worker@{FAST}.service"
# A private queue of the member's (0700): an administrator's session shows it with administrative access.
# (Below the root's ext4 spool, which only group steadq may enter: a strict queue refuses overlayfs, /home's.)
PRIVATE = f"/var/lib/steadq/{MEMBER}-private/q"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)
CLONE_NEWNET = 0x40000000


@pytest.fixture(scope="module")
def cockpit_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdRoot]:
    """A booted root with its own system bus, steadqd and cockpit-steadq installed by apt-get, Cockpit
    on 127.0.0.1:9090, the queue ``demo`` (no worker: jobs stay where the test puts them), ``ann`` in
    group steadq and ``bob`` outside it."""
    package_prerequisites()
    for package in HOST_PACKAGES:
        if not _host_has(package):
            _build_unavailable(f"{package} is not installed on the host (the offline root needs it; ./dev.sh setup)")
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[test]')")
    with root_with_deb(tmp_path_factory, "cockpit-steadq_*_all.deb", masked=MASKED_WITH_DBUS) as root:
        # The bus answers a user (what the page's `steadq list` and `systemctl show` need).
        bus = root.run("runuser", "-u", "nobody", "--", "systemctl", "is-active", "dbus.service", check=False)
        assert bus.stdout.strip() == "active", (bus.stdout, bus.stderr)
        root.sh(
            f"""
            set -e
            mkdir -p /etc/systemd/system/cockpit.socket.d
            printf '[Socket]\\nListenStream=\\nListenStream=127.0.0.1:9090\\n' \\
                > /etc/systemd/system/cockpit.socket.d/listen.conf
            systemctl daemon-reload
            systemctl restart cockpit.socket
            useradd -m -s /bin/bash -G steadq {MEMBER}
            useradd -m -s /bin/bash {OUTSIDER}
            useradd -m -s /bin/bash -G steadq,sudo {ADMIN}
            printf '%s\\n' '{MEMBER}:{PASSWORD}' '{OUTSIDER}:{PASSWORD}' '{ADMIN}:{PASSWORD}' | chpasswd
            install -d -m 0700 -o {MEMBER} -g {MEMBER} {os.path.dirname(PRIVATE)}
            runuser -u {MEMBER} -- steadq init {PRIVATE} --shards 4
            install -d -m 2770 -o steadq -g steadq {QUEUE}
            runuser -u steadq -- steadq init {QUEUE} --shared --shards 4
            printf 'queue: {QUEUE}\\nworker:\\n  command: ["/bin/true"]\\n' > /etc/steadq/queues/{NAME}.yaml
            install -d -m 2770 -o steadq -g steadq /var/lib/steadq/{LIVE}
            runuser -u steadq -- steadq init /var/lib/steadq/{LIVE} --shared --shards 4
            printf 'queue: /var/lib/steadq/{LIVE}\\nworker:\\n  command: ["{LIVE_JOB}"]\\n' > /etc/steadq/queues/{LIVE}.yaml
            install -d -m 2770 -o steadq -g steadq /var/lib/steadq/{FAST}
            runuser -u steadq -- steadq init /var/lib/steadq/{FAST} --shared --shards 4
            printf 'queue: /var/lib/steadq/{FAST}\\nworker:\\n  command: ["/bin/true"]\\n' > /etc/steadq/queues/{FAST}.yaml
            """
        )
        root.run("install", "-m", "0755", "/dev/stdin", LIVE_JOB, input=LIVE_SCRIPT)
        root.run("systemctl", "enable", "--now", f"steadq-worker@{LIVE}.service", FAST_WORKER)
        listen = root.run("systemctl", "show", "-P", "Listen", "cockpit.socket").stdout.strip()
        assert listen == "127.0.0.1:9090 (Stream)", listen
        yield root


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


@pytest.fixture
def browser(cockpit_root: SystemdRoot, tmp_path: Path) -> Iterator[Any]:
    """Headless chromium in the root's network namespace (only its loopback), a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    driver = None
    try:
        target = os.open(f"/proc/{cockpit_root.pid1}/ns/net", os.O_RDONLY)
        try:
            _setns(target)  # chromedriver and chromium inherit it; so do selenium's sockets
        finally:
            os.close(target)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path="/usr/bin/chromedriver", log_output=str(tmp_path / "chromedriver.log"))
        driver = webdriver.Chrome(service=service, options=options)
        driver.implicitly_wait(0)
        yield driver
    finally:
        if driver is not None:
            driver.quit()
        _setns(own)
        os.close(own)


def _until(driver: Any, what: str, fn: Callable[[], object], timeout: float = DEADLINE) -> Any:
    """Wait for an observable fact of the page; on timeout, name it and show the page's text."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def probe(_: Any) -> object:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - an element not there yet (stale, missing) is "not yet"
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(probe)
    except TimeoutException:
        body = driver.find_element("tag name", "body").text
        raise AssertionError(
            f"timed out waiting for {what} at {driver.current_url}; the page says:\n{body[:3000]}"
        ) from None


def _get(driver: Any, what: str, fn: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    """fn()'s value, read inside a bounded wait: the page redraws its rows (the overview every 5 s,
    the running rows every watch frame), so an element found a moment ago may be stale by the time
    it is read; the read is then done again on the element found anew."""
    return _until(driver, what, lambda: (fn(),), timeout)[0]


def _click(driver: Any, what: str, css: str, timeout: float = DEADLINE) -> None:
    """Find and click inside a bounded wait, for the same reason: a click on a row redrawn between
    the find and the click raises StaleElementReferenceException (and clicks nothing)."""

    def attempt() -> bool:
        driver.find_element("css selector", css).click()
        return True

    _until(driver, what, attempt, timeout)


def _login(driver: Any, user: str, shots: Path, *, admin: bool = False) -> None:
    driver.get(URL + "/")
    _until(driver, "the login form", lambda: driver.find_element("id", "login-user-input").is_displayed())
    if admin:
        # What Cockpit's own test library does for an administrator's login: the login page sends
        # localStorage's "superuser:USER" as X-Superuser ("none" unless set), and "any" makes the
        # session start its privileged bridge with sudo and the login password.
        driver.execute_script("window.localStorage.setItem(arguments[0], 'any')", f"superuser:{user}")
    driver.find_element("id", "login-user-input").send_keys(user)
    driver.find_element("id", "login-password-input").send_keys(PASSWORD)
    driver.find_element("id", "login-button").click()
    # The shell's menu lists the page from its manifest.json.
    _until(driver, "the menu entry 'Job queues'", lambda: "Job queues" in driver.find_element("tag name", "body").text)
    if admin:
        _until(
            driver,
            "the shell's 'Administrative access' (sudo worked)",
            lambda: "Administrative access" in driver.find_element("tag name", "body").text,
        )
    driver.save_screenshot(str(shots / f"{user}-shell.png"))


def _text(driver: Any, css: str) -> str:
    return str(driver.find_element("css selector", css).text)


def _cell(driver: Any, column: int) -> str:
    """A cell of the demo row of the overview (1: ready, 2: delayed, 3: running, 4: dead)."""
    row = driver.find_element("css selector", f'#queues tr[data-queue="{NAME}"]')
    return str(row.find_elements("tag name", "td")[column].text)


def _units_cell(driver: Any, queue: str) -> str:
    """The Units cell of a queue's overview row ("promoter active, sweeper active, worker active")."""
    row = driver.find_element("css selector", f'#queues tr[data-queue="{queue}"]')
    return str(row.find_elements("tag name", "td")[7].text)


def _units_text(root: SystemdRoot, queue: str) -> str:
    """What the Units cell must say: root's own `systemctl is-active` (systemd's private socket, not
    the bus the page's user goes through), in the page's words."""
    units = [f"steadq-{role}@{queue}.service" for role in ("promoter", "sweeper", "worker")]
    states = root.run("systemctl", "is-active", *units, check=False).stdout.split()
    assert len(states) == 3, states
    return ", ".join(f"{role} {state}" for role, state in zip(("promoter", "sweeper", "worker"), states, strict=True))


def _unit_states_shown(driver: Any) -> dict[str, str]:
    """The queue view's units table: unit -> its state cell ("active (running)")."""
    return {
        str(tr.get_attribute("data-unit")): str(tr.find_elements("tag name", "td")[1].text)
        for tr in driver.find_elements("css selector", "#units tr")
    }


def _unit_states_root(root: SystemdRoot, queue: str) -> dict[str, str]:
    """The same as root's `systemctl show` has them, in the page's words."""
    units = [f"steadq-{role}@{queue}.service" for role in ("worker", "sweeper", "promoter")]
    out = root.run("systemctl", "show", "--property=Id,ActiveState,SubState", "--", *units).stdout
    states = {}
    for block in out.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[props["Id"]] = f"{props['ActiveState']} ({props['SubState']})"
    assert sorted(states) == sorted(units), out
    return states


def _assert_unit_states(root: SystemdRoot, driver: Any, queue: str, who: str) -> None:
    """The queue view's units table shows each unit's state as systemd has it (all three running)."""
    expected = _unit_states_root(root, queue)
    assert set(expected.values()) == {"active (running)"}, expected
    _until(driver, f"the unit states {who} sees: {expected}", lambda: _unit_states_shown(driver) == expected)


def _put(root: SystemdRoot, payload: str, *extra: str) -> str:
    out = root.run("steadq", "put", NAME, "-", *extra, user=MEMBER, input=payload).stdout
    m = re.search(r"^job_id: ([0-9a-f]{32})$", out, re.M)
    assert m, out
    return m[1]


def _watchers(root: SystemdRoot) -> int:
    """How many `steadq --json watch` processes the member's Cockpit session runs now."""
    out = root.run("pgrep", "-c", "-u", MEMBER, "-f", "steadq --json watch", check=False).stdout.strip()
    return int(out or 0)


def _no_csp_refusal(driver: Any) -> None:
    log = driver.get_log("browser")
    refused = [e for e in log if "Content Security Policy" in str(e.get("message", ""))]
    assert refused == [], refused


def _paused(root: SystemdRoot) -> object:
    listing = json.loads(root.run("steadq", "--json", "list", user=MEMBER).stdout)
    (entry,) = [q for q in listing["queues"] if q["name"] == NAME]
    return entry["paused"]


def test_member_watches_the_queue_opens_a_job_and_acts(cockpit_root: SystemdRoot, browser: Any, tmp_path: Path) -> None:
    root, driver = cockpit_root, browser
    _login(driver, MEMBER, tmp_path)

    # -- all queues: the counts follow the jobs as they are enqueued ------------------------------
    driver.get(PAGE)
    _until(driver, "the demo row with 0 ready", lambda: _cell(driver, 1) == "0")
    # -- the units' states, as the member's `steadq list` gets them over the bus ------------------
    live = _units_text(root, LIVE)
    assert live == "promoter active, sweeper active, worker active", live
    _until(driver, f"the live row's units: {live}", lambda: _units_cell(driver, LIVE) == live)
    idle = _units_text(root, NAME)
    assert idle == "promoter inactive, sweeper inactive, worker inactive", idle
    _until(driver, f"the demo row's units: {idle}", lambda: _units_cell(driver, NAME) == idle)
    for i in range(3):
        _put(root, f"job {i}")
    _until(driver, "3 ready in the overview", lambda: _cell(driver, 1) == "3")
    hostile = _put(root, "<script>alert(2)</script>", "--meta", f"task={XSS}")
    _until(driver, "4 ready in the overview", lambda: _cell(driver, 1) == "4")
    driver.save_screenshot(str(tmp_path / "overview.png"))

    # -- one queue: the watch stream's counts and the ready list ---------------------------------
    _click(driver, "the demo row's link", f'#queues tr[data-queue="{NAME}"] button')
    _until(driver, "4 ready in the queue view", lambda: _text(driver, "#queue-counts").startswith("4 ready"))
    _until(driver, "4 rows of ready jobs", lambda: len(driver.find_elements("css selector", "#ready tr")) == 4)
    _put(root, "one more")
    _until(driver, "5 ready from the stream", lambda: _text(driver, "#queue-counts").startswith("5 ready"))
    _until(driver, "5 rows of ready jobs", lambda: len(driver.find_elements("css selector", "#ready tr")) == 5)

    # -- the hostile job's story: its metadata and payload are text, nothing ran ------------------
    _click(driver, "the hostile job's link", f'#ready tr[data-job="{hostile}"] button')
    _until(driver, "the job's story", lambda: "Metadata" in _text(driver, "#job-story"))
    story = _text(driver, "#job-story")
    assert XSS in story and "<script>alert(2)</script>" in story, story
    assert driver.execute_script("return document.querySelectorAll('img, #job-story script').length") == 0
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - an onerror=alert(1) that ran would have opened one
    driver.save_screenshot(str(tmp_path / "job.png"))

    # -- pause and resume from the page; the CLI sees the same state -----------------------------
    driver.find_element("id", "back-queue").click()
    _until(driver, "the queue view", lambda: _text(driver, "#queue-counts").startswith("5 ready"))
    driver.find_element("id", "pause-reason").send_keys(f"maintenance {XSS}")
    driver.find_element("id", "pause").click()
    _until(driver, "the pause line", lambda: "paused since" in _text(driver, "#queue-paused"))
    line = _text(driver, "#queue-paused")
    assert f" by {MEMBER}@" in line and line.endswith(f": maintenance {XSS}"), line
    paused = _paused(root)
    assert isinstance(paused, dict) and paused["reason"] == f"maintenance {XSS}", paused
    driver.save_screenshot(str(tmp_path / "paused.png"))
    driver.find_element("id", "resume").click()
    _until(driver, "the pause line gone", lambda: not driver.find_element("id", "queue-paused").is_displayed())
    assert _paused(root) is None

    # -- cancel, requeue, purge (the dry run's count is what the page asks to confirm) ------------
    _click(driver, "Cancel of the hostile job", f'#ready tr[data-job="{hostile}"] button[data-action="cancel"]')
    _until(
        driver,
        "the cancelled job in the dead list",
        lambda: "cancelled" in _text(driver, f'#dead tr[data-job="{hostile}"]'),
    )
    _click(driver, "Requeue of the hostile job", f'#dead tr[data-job="{hostile}"] button[data-action="requeue"]')
    _until(driver, "the dead list empty after requeue", lambda: not driver.find_elements("css selector", "#dead tr"))
    _until(driver, "5 ready after requeue", lambda: _text(driver, "#queue-counts").startswith("5 ready"))
    first = _get(
        driver,
        "the first ready job",
        lambda: driver.find_elements("css selector", "#ready tr")[0].get_attribute("data-job"),
    )
    _click(driver, "Cancel of the first ready job", f'#ready tr[data-job="{first}"] button[data-action="cancel"]')
    _until(driver, "one dead job", lambda: len(driver.find_elements("css selector", "#dead tr")) == 1)
    driver.find_element("id", "purge").click()
    _until(driver, "the purge confirmation", lambda: driver.find_element("id", "confirm").is_displayed())
    assert _text(driver, "#confirm-text") == f"Remove 1 dead job(s) of {NAME} for good? This cannot be undone."
    driver.find_element("id", "confirm-yes").click()
    _until(driver, "the dead list empty after purge", lambda: not driver.find_elements("css selector", "#dead tr"))
    _until(driver, "0 dead", lambda: _text(driver, "#queue-counts").endswith("0 dead"))
    ls = json.loads(root.run("steadq", "--json", "ls", NAME, "dead", user=MEMBER).stdout)
    assert ls == [], ls
    _no_csp_refusal(driver)


def test_member_sees_a_running_job_s_progress_and_cancels_it(
    cockpit_root: SystemdRoot, browser: Any, tmp_path: Path
) -> None:
    """The running list: elapsed time and the progress the job reports (from the watch stream), as text."""
    root, driver = cockpit_root, browser
    _login(driver, MEMBER, tmp_path)
    out = root.run("steadq", "put", LIVE, "-", user=MEMBER, input="work").stdout
    m = re.search(r"^job_id: ([0-9a-f]{32})$", out, re.M)
    assert m, out
    job = m[1]
    driver.get(PAGE + "#/" + LIVE)
    row = f'#running tr[data-job="{job}"]'
    _until(driver, "the running job's progress", lambda: "frame <b>42</b>/100" in _text(driver, row))
    _until(
        driver,
        "the progress bar at 42",
        lambda: driver.find_element("css selector", f"{row} progress").get_attribute("value") == "42",
    )
    assert driver.find_elements("css selector", f"{row} b") == []
    # Elapsed since the lease (show's in_state_since_ns against the watch frame's time), ticking with the frames.
    elapsed = lambda: driver.find_element("css selector", row).find_elements("tag name", "td")[2].text  # noqa: E731
    _until(driver, "the running job's elapsed time", lambda: re.fullmatch(r"\d+s", elapsed()))
    first = int(_get(driver, "the elapsed time", elapsed)[:-1])
    _until(driver, "the elapsed time ticking", lambda: re.fullmatch(r"\d+s", elapsed()) and int(elapsed()[:-1]) > first)
    driver.save_screenshot(str(tmp_path / "running.png"))
    # One `steadq watch` for the open queue view (not a process per refresh); leaving the view ends it.
    assert _watchers(root) == 1, root.run("ps", "-ef", check=False).stdout
    driver.find_element("id", "back-overview").click()
    _until(driver, "the watch process ended", lambda: _watchers(root) == 0)
    driver.get(PAGE + "#/" + LIVE)
    _until(driver, "the running job again", lambda: "frame <b>42</b>/100" in _text(driver, row))
    _click(driver, "Cancel of the running job", f'{row} button[data-action="cancel"]')
    _until(
        driver,
        "the cancelled job in the dead list",
        lambda: "cancelled" in _text(driver, f'#dead tr[data-job="{job}"]'),
    )
    assert driver.find_elements("css selector", "#running tr") == []
    _no_csp_refusal(driver)


def test_outsider_gets_one_sentence(cockpit_root: SystemdRoot, browser: Any, tmp_path: Path) -> None:
    """bob is not in group steadq: the queue view says so, in one sentence; nothing of the queue shows."""
    driver = browser
    _login(driver, OUTSIDER, tmp_path)
    driver.get(PAGE + "#/" + NAME)
    _until(driver, "the message", lambda: driver.find_element("id", "message").is_displayed())
    message = _text(driver, "#message")
    assert message == "You are not in group steadq: ask an administrator to add you, then log in again.", message
    assert driver.find_elements("css selector", "#ready tr, #dead tr, #running tr") == []
    driver.save_screenshot(str(tmp_path / "outsider.png"))
    # The overview still lists the queue (list exits 1 for it, with its document): the CLI's one line, as text.
    driver.get(PAGE + "#/")
    _until(driver, "the demo row", lambda: _cell(driver, 6).startswith(f"cannot open queue {QUEUE}"))
    assert _get(driver, "the demo row's ready cell", lambda: _cell(driver, 1)) == "–"
    _no_csp_refusal(driver)


def _acked(root: SystemdRoot) -> int:
    """The fast queue's acked jobs of the last hour, as root reads the journal (the CLI's count)."""
    history = json.loads(root.run("steadq", "--json", "history", FAST, "--since", "1h").stdout)
    return int(history["totals"]["acked"])


def _unit(root: SystemdRoot, unit: str) -> dict[str, str]:
    out = root.run("systemctl", "show", "--property=ActiveState,MainPID,ActiveEnterTimestampMonotonic", unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _page_frame(driver: Any) -> None:
    """Into the shell's frame of the page (the shell URL /steadq loads it as cockpit1:localhost/steadq)."""
    css = 'iframe[name="cockpit1:localhost/steadq"]'
    frame = _until(driver, "the page's frame in the shell", lambda: driver.find_element("css selector", css))
    driver.switch_to.frame(frame)


def test_administrator_sees_throughput_and_restarts_the_worker(
    cockpit_root: SystemdRoot, browser: Any, tmp_path: Path
) -> None:
    """carol (groups steadq and sudo) logs in with administrative access: the fast queue's sparkline
    counts the jobs its worker acked and follows new ones without a reload; Restart of the worker
    unit from the page restarts it (a new main process, a new ActiveEnterTimestamp); Logs opens
    Cockpit's journal page on that unit; another user's private queue is shown through the
    superuser ("try"), saying so."""
    root, driver = cockpit_root, browser
    before = _acked(root)
    for i in range(3):
        root.run("steadq", "put", FAST, "-", user=ADMIN, input=f"fast {i}")
    _until(driver, "3 jobs acked in the journal", lambda: _acked(root) == before + 3)
    _login(driver, ADMIN, tmp_path, admin=True)
    driver.get(URL + "/steadq")
    _page_frame(driver)

    # -- the sparkline: its accessible name and its visible text count the acked jobs -------------
    spark = f'#queues tr[data-queue="{FAST}"] svg.spark'
    label = _until(
        driver,
        f"the sparkline counting {before + 3} acked",
        lambda: (lambda t: t.startswith(f"Last hour: {before + 3} acked, 0 buried") and t)(
            driver.find_element("css selector", spark).get_attribute("aria-label")
        ),
    )
    title = _get(
        driver,
        "the sparkline's title",
        lambda: driver.find_element("css selector", f"{spark} title").get_attribute("textContent"),
    )
    assert title == label, (title, label)
    points = _get(
        driver,
        "the acked line",
        lambda: driver.find_element("css selector", f"{spark} polyline.spark-acked").get_attribute("points"),
    )
    assert len(points.split()) == 60 and any(not p.endswith(",24") for p in points.split()), points
    _until(
        driver,
        "a sparkline in every row (the screenshot docs/img/dashboard.png is this one)",
        lambda: len(driver.find_elements("css selector", "#queues svg.spark")) == 3,
    )
    # The units' states: `steadq list` runs as carol herself (not through the superuser), over the bus.
    for queue in (LIVE, FAST):
        shown = _units_text(root, queue)
        assert shown == "promoter active, sweeper active, worker active", (queue, shown)
        _until(driver, f"the {queue} row's units: {shown}", lambda q=queue, t=shown: _units_cell(driver, q) == t)
    driver.save_screenshot(str(tmp_path / "overview-throughput.png"))
    # New verdicts reach the open overview (history is read again within a minute, not per second).
    for i in range(2):
        root.run("steadq", "put", FAST, "-", user=ADMIN, input=f"more {i}")
    _until(
        driver,
        f"the sparkline counting {before + 5} acked",
        lambda: (
            f"{before + 5} acked, 0 buried"
            in driver.find_element("css selector", f'#queues tr[data-queue="{FAST}"] .spark-text').text
        ),
        timeout=DEADLINE + 45,
    )

    # -- the worker unit: restart from the page ------------------------------------------------
    _click(driver, "the fast row's link", f'#queues tr[data-queue="{FAST}"] button')
    row = f'#units tr[data-unit="{FAST_WORKER}"]'
    _until(driver, "the worker unit active", lambda: _text(driver, row).split("\n")[0].startswith(FAST_WORKER))
    _until(driver, "the worker's state", lambda: "active (running)" in _text(driver, row))
    _until(
        driver,
        "Restart enabled",
        lambda: driver.find_element("css selector", f'{row} button[data-action="restart"]').is_enabled(),
    )
    assert not driver.find_element("id", "units-note").is_displayed()
    old = _unit(root, FAST_WORKER)
    assert old["ActiveState"] == "active", old
    _click(driver, "Restart of the worker", f'{row} button[data-action="restart"]')
    _until(
        driver,
        "the worker restarted (new main PID and start time)",
        lambda: (
            lambda new: (
                new["ActiveState"] == "active"
                and new["MainPID"] not in ("0", old["MainPID"])
                and new["ActiveEnterTimestampMonotonic"] != old["ActiveEnterTimestampMonotonic"]
            )
        )(_unit(root, FAST_WORKER)),
    )
    _until(driver, "the worker's state after the restart", lambda: "active (running)" in _text(driver, row))
    _assert_unit_states(root, driver, FAST, ADMIN)
    assert not driver.find_element("id", "message").is_displayed(), _text(driver, "#message")
    driver.save_screenshot(str(tmp_path / "units-admin.png"))

    # -- another user's private queue: shown through the superuser, saying so ---------------------
    driver.switch_to.default_content()
    driver.get(PAGE + "#/" + PRIVATE.replace("/", "%2F"))
    _until(driver, "the private queue's counts", lambda: _text(driver, "#queue-counts").startswith("0 ready"))
    message = _get(driver, "the message", lambda: _text(driver, "#message"))
    assert re.fullmatch(
        r"You are not in (group \S+|this queue's group): shown with administrative access\.", message
    ), message

    # -- Logs: Cockpit's journal page, filtered to the unit, as its Services page links it ---------
    driver.switch_to.default_content()
    driver.get(URL + "/steadq#/" + FAST)
    _page_frame(driver)
    # Clicked once the view has its answers (the counts, the unit's state), as a person would. The
    # rows no longer move while those arrive (the member's test checks the layout); before, a click
    # at that moment could land on whatever row had moved under the pointer.
    _until(driver, "the fast queue's counts", lambda: _text(driver, "#queue-counts").endswith("dead"))
    _until(driver, "the worker's state on the shell's page", lambda: "active (running)" in _text(driver, row))
    _click(driver, "Logs of the worker", f'{row} button[data-action="logs"]')
    driver.switch_to.default_content()
    from urllib.parse import unquote

    _until(
        driver,
        "the shell on the journal page of the worker unit",
        lambda: "/system/logs" in driver.current_url and f"service={FAST_WORKER}" in unquote(driver.current_url),
    )
    _no_csp_refusal(driver)


def test_member_without_administrative_access_sees_unit_controls_disabled(
    cockpit_root: SystemdRoot, browser: Any, tmp_path: Path
) -> None:
    """ann may act on the queue but not on its units: Start/Stop/Restart are disabled with the reason
    (as their title and as a note), not an error after a click; Logs stays usable. The states show."""
    root, driver = cockpit_root, browser
    _login(driver, MEMBER, tmp_path)
    driver.get(PAGE + "#/" + FAST)
    # The note says "Checking administrative access…" until Cockpit has answered; then the reason.
    reason = "Starting, stopping and restarting units needs administrative access"
    note = _until(
        driver,
        "the units note giving the reason",
        lambda: (lambda t: t.startswith(reason) and t)(_text(driver, "#units-note")),
    )

    def controls() -> tuple[list[str], list[tuple[str, bool, str]], list[bool]]:
        # Read in one go, inside a bounded wait: the rows are redrawn every 10 s (the unit states).
        units = [r.get_attribute("data-unit") for r in driver.find_elements("css selector", "#units tr")]
        verbs = [
            (b.get_attribute("data-action"), b.is_enabled(), b.get_attribute("title"))
            for b in driver.find_elements("css selector", "#units button[data-action]")
            if b.get_attribute("data-action") != "logs"
        ]
        logs = [b.is_enabled() for b in driver.find_elements("css selector", '#units button[data-action="logs"]')]
        return units, verbs, logs

    # The states themselves: `systemctl show` as ann (no superuser), over the bus.
    _assert_unit_states(root, driver, FAST, MEMBER)
    units, verbs, logs = _get(driver, "the unit rows and their buttons", controls)
    assert units == [f"{u}@{FAST}.service" for u in ("steadq-worker", "steadq-sweeper", "steadq-promoter")], units
    assert verbs == [(v, False, note) for _ in range(3) for v in ("start", "stop", "restart")], verbs
    assert logs == [True, True, True], logs
    assert not driver.find_element("id", "message").is_displayed()
    # The note comes and goes (and changes) when Cockpit answers whether the session has administrative
    # access, a moment after the rows appear: it sits below them, so that answer never moves a button
    # under the pointer (a click on a row's Logs went to the row that had moved under it).
    table, note_box = (
        driver.execute_script("return document.querySelector(arguments[0]).getBoundingClientRect().toJSON()", css)
        for css in ("table.units", "#units-note")
    )
    assert note_box["top"] >= table["bottom"], (table, note_box)
    driver.save_screenshot(str(tmp_path / "units-member.png"))
    _no_csp_refusal(driver)
