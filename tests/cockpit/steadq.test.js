// The Cockpit page's logic under Node's test runner (run by tests/cockpit/test_page.py).
// The page's rendering functions take the document as an argument; here it is a small
// stand-in whose innerHTML/outerHTML/insertAdjacentHTML throw, so a rendering that ever
// parsed HTML fails these tests instead of passing text through as markup.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const path = require("node:path");

const page = require(path.join(__dirname, "..", "..", "cockpit", "steadq.js"));

const XSS = "<img src=x onerror=alert(1)>";

class FakeText {
    constructor(text) { this.nodeType = 3; this.data = String(text); this.parentNode = null; }
    get textContent() { return this.data; }
}

class FakeElement {
    constructor(tag) {
        this.nodeType = 1; this.tagName = tag.toUpperCase(); this.childNodes = []; this.attributes = {};
        this.parentNode = null; this.className = ""; this.listeners = {};
    }
    get firstChild() { return this.childNodes[0] || null; }
    appendChild(child) {
        if (!(child instanceof FakeElement || child instanceof FakeText)) throw new TypeError("not a node");
        child.parentNode = this; this.childNodes.push(child); return child;
    }
    removeChild(child) { this.childNodes = this.childNodes.filter(c => c !== child); child.parentNode = null; return child; }
    setAttribute(name, value) {
        if (/^on/i.test(name)) throw new Error("event handler attribute set: " + name);
        this.attributes[name] = String(value);
    }
    getAttribute(name) { return this.attributes[name] ?? null; }
    addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
    click() { for (const fn of this.listeners.click || []) fn(); }
    get textContent() { return this.childNodes.map(c => c.textContent).join(""); }
    set textContent(value) { this.childNodes = []; this.appendChild(new FakeText(value)); }
    set innerHTML(_) { throw new Error("innerHTML used"); }
    set outerHTML(_) { throw new Error("outerHTML used"); }
    insertAdjacentHTML() { throw new Error("insertAdjacentHTML used"); }
    // Every element below, this one included.
    all() { return [this, ...this.childNodes.filter(c => c instanceof FakeElement).flatMap(c => c.all())]; }
    // The HTML a browser would serialise: text escaped, as the DOM does.
    serialize() {
        const esc = s => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
        const attrs = Object.entries(this.attributes).map(([k, v]) => ` ${k}="${esc(v).replace(/"/g, "&quot;")}"`).join("");
        const inner = this.childNodes.map(c => (c instanceof FakeText ? esc(c.data) : c.serialize())).join("");
        return `<${this.tagName.toLowerCase()}${attrs}>${inner}</${this.tagName.toLowerCase()}>`;
    }
}

const doc = {
    createElement: tag => new FakeElement(tag),
    createElementNS: (ns, tag) => Object.assign(new FakeElement(tag), { namespaceURI: ns }),
    createTextNode: text => new FakeText(text),
    write() { throw new Error("document.write used"); },
};

function story(extra) {
    return {
        job_id: "3fb4eebd1b790994de836a738fe3e67c", state: "dead", reason_name: "attempts_exhausted",
        attempt: 3, max_attempts: 3, generation: 0, created_at_ns: 1796531114096169401,
        in_state_since_ns: 1796531114104927961, content_type: "text/plain", producer_id: XSS,
        metadata: { task: XSS, [XSS]: "key too" }, payload_length: 40, payload_verified: true, problem: null,
        payload_head_text: "<script>alert(2)</script>\n", payload_head_base64: null, payload_head_bytes: 26,
        progress: { percent: 42, text: XSS, updated_ns: 1 },
        journal: { error: null, note: null, entries: [
            { time: "2026-12-06T04:25:18Z", unit: "steadq-worker@render.service", message: "job finished: " + XSS },
        ] },
        failure: {
            runs: [{ attempt: 1, verdict: "retry", exit_status: 1, signal: null, timed_out: false, duration_ms: 200,
                time: "2026-12-06T04:25:18Z" }],
            outcomes: ["job 3fb4 buried: " + XSS], reason: "0x0004", stderr_tail: [XSS, "out of memory"],
        },
        ...extra,
    };
}

test("a job's story shows the XSS metadata, payload, journal and stderr as text, never as markup", () => {
    const box = page.jobStory(doc, story());
    const tags = new Set(box.all().map(e => e.tagName));
    assert.ok(!tags.has("IMG") && !tags.has("SCRIPT"), [...tags].join(","));
    const text = box.textContent;
    assert.ok(text.includes("task" + XSS), "metadata value shown literally");
    assert.ok(text.includes(XSS + "key too"), "metadata key shown literally");
    assert.ok(text.includes("<script>alert(2)</script>"), "payload preview shown literally");
    assert.ok(text.includes("job finished: " + XSS), "journal message shown literally");
    assert.ok(text.includes("42% ") && text.includes(XSS + "\nout of memory"));
    const html = box.serialize();
    assert.ok(!html.includes("<img") && !html.includes("<script"), html);
    assert.ok(html.includes("&lt;img src=x onerror=alert(1)&gt;"));
});

test("a binary payload is not shown, only its size", () => {
    const box = page.jobStory(doc, story({ payload_head_text: null, payload_head_base64: "AAEC", payload_head_bytes: 3 }));
    assert.ok(box.textContent.includes("binary: 3 bytes not shown"));
    assert.ok(!box.textContent.includes("AAEC"));
});

test("a story without journal or failure says so", () => {
    const box = page.jobStory(doc, story({ journal: null, failure: null, metadata: {} }));
    assert.ok(box.textContent.includes("Journal") && box.textContent.includes("not read"));
    assert.ok(box.textContent.includes("Metadata") && box.textContent.includes("none"));
});

test("an overview row with a hostile name, error and pause reason renders them as text", () => {
    let opened = null;
    const entry = {
        name: XSS, queue: "/var/lib/steadq/x", counts: { ready: 3, delayed: 0, running: 1, dead: 2 },
        oldest_age_seconds: { ready: 125 }, paused: { reason: XSS, since_ns: 1796531118442681914, by: "ann@h", problem: null },
        error: null, units: { "steadq-worker@x": "active", "steadq-sweeper@x": "failed" },
    };
    const row = page.queueRow(doc, entry, e => { opened = e; });
    assert.ok(!row.all().some(e => e.tagName === "IMG"));
    const cells = row.childNodes.map(c => c.textContent);
    assert.deepEqual(cells, [XSS, "3", "0", "1", "2", "2m 05s",
        "paused since 2026-12-06T04:25:18Z by ann@h: " + XSS, "sweeper failed, worker active"]);
    assert.equal(row.getAttribute("data-queue"), XSS);
    row.all().find(e => e.tagName === "BUTTON").click();
    assert.equal(opened, entry);
    const broken = page.queueRow(doc, { ...entry, name: null, counts: null, oldest_age_seconds: null, paused: null,
        error: "cannot open queue " + XSS, units: null }, () => {});
    assert.deepEqual(broken.childNodes.map(c => c.textContent),
        ["/var/lib/steadq/x", "–", "–", "–", "–", "–", "cannot open queue " + XSS, "–"]);
});

test("a job row: the id opens the story, each action gets the job; extra cells in between", () => {
    const calls = [];
    const job = { job_id: "ab" + XSS, attempt: 1, max_attempts: 3, age_seconds: 3700 };
    const row = page.jobRow(doc, job, id => calls.push(["open", id]), [["Cancel", j => calls.push(["cancel", j.job_id])]],
        [page.progressCell(doc, { percent: 50, text: XSS })]);
    assert.deepEqual(row.childNodes.map(c => c.textContent), ["ab" + XSS, "1/3", "1h 01m", " " + XSS, "Cancel"]);
    const [open, cancel] = row.all().filter(e => e.tagName === "BUTTON");
    open.click();
    cancel.click();
    assert.deepEqual(calls, [["open", "ab" + XSS], ["cancel", "ab" + XSS]]);
    assert.equal(row.all().find(e => e.tagName === "PROGRESS").getAttribute("value"), "50");
});

test("ages: seconds, minutes, hours, days; null is a dash", () => {
    assert.equal(page.formatAge(null), "–");
    assert.equal(page.formatAge(undefined), "–");
    assert.equal(page.formatAge(0), "0s");
    assert.equal(page.formatAge(59.9), "59s");
    assert.equal(page.formatAge(60), "1m 00s");
    assert.equal(page.formatAge(3599), "59m 59s");
    assert.equal(page.formatAge(3600), "1h 00m");
    assert.equal(page.formatAge(86399), "23h 59m");
    assert.equal(page.formatAge(90061), "1d 01h");
    assert.equal(page.formatAge(-5), "0s");
    assert.equal(page.formatAge("abc"), "–");
});

test("times in nanoseconds keep their precision and print as UTC", () => {
    assert.equal(page.formatTimeNs(1796531118442681914), "2026-12-06T04:25:18Z");
    assert.equal(page.formatTimeNs("1796531118999999999"), "2026-12-06T04:25:18Z");
    assert.equal(page.formatTimeNs(null), "–");
});

test("the watch stream is read by whole lines, however the pipe splits it", () => {
    const frames = [
        { states: { ready: { objects: 3 }, delayed: { objects: 0 }, running: { objects: 1 }, dead: { objects: 0 } },
            paused: null, progress: { a: { percent: 1, text: "x\ny" } } },
        { states: { ready: { objects: 2 }, delayed: { objects: 0 }, running: { objects: 2 }, dead: { objects: 1 } },
            paused: { reason: "r", since_ns: 1, by: "b" } },
    ];
    const text = frames.map(f => JSON.stringify(f) + "\n").join("");
    for (const size of [1, 2, 7, 50, text.length]) {
        const seen = [];
        const feed = page.lineReader(line => seen.push(page.parseFrame(line)));
        for (let i = 0; i < text.length; i += size) feed(text.slice(i, i + size));
        assert.deepEqual(seen, frames, "chunk size " + size);
    }
    const seen = [];
    const feed = page.lineReader(line => seen.push(line));
    feed("{\"a\":1}\n\n{\"b\"");
    assert.deepEqual(seen, ["{\"a\":1}"], "a partial line waits for its newline; blank lines are skipped");
    feed(":2}\n");
    assert.deepEqual(seen, ["{\"a\":1}", "{\"b\":2}"]);
    assert.deepEqual(page.frameCounts(frames[1]), { ready: 2, delayed: 0, running: 2, dead: 1 });
    assert.equal(page.countsText(page.frameCounts(frames[0])), "3 ready, 0 delayed, 1 running, 0 dead");
    assert.ok(page.sameCounts(page.frameCounts(frames[0]), page.frameCounts(frames[0])));
    assert.ok(!page.sameCounts(page.frameCounts(frames[0]), page.frameCounts(frames[1])));
    assert.ok(!page.sameCounts(page.frameCounts(frames[0]), null));
});

test("a line that is not a JSON object is no frame", () => {
    assert.equal(page.parseFrame("not json"), null);
    assert.equal(page.parseFrame("[1,2]"), null);
    assert.equal(page.parseFrame("null"), null);
    assert.deepEqual(page.parseFrame("{\"x\": 1}"), { x: 1 });
});

test("a bucket queue's view says how often it refreshes and why; a directory queue's says nothing", () => {
    assert.equal(page.refreshNote({ queue: "s3://render/farm", interval_seconds: 2.0 }),
        "A bucket queue: refreshes every 2 s, since each refresh lists the bucket " +
        "(requests the store counts and may bill).");
    assert.match(page.refreshNote({ queue: "s3://render/farm", interval_seconds: 2.5 }), /every 2\.5 s,/);
    assert.match(page.refreshNote({ queue: "s3://render/farm" }), /every few seconds,/);
    assert.equal(page.refreshNote({ queue: "/var/lib/steadq/render", interval_seconds: 1.0 }), "");
    assert.equal(page.refreshNote({ queue: "s3-looking/dir", interval_seconds: 2.0 }), "");
    assert.equal(page.refreshNote(null), "");
    assert.equal(page.isBucket("s3://b"), true);
    assert.equal(page.isBucket(null), false);
});

test("a bucket queue's refusal (exit 5) is the command's own line, not the group sentence", () => {
    const line = "cannot open queue s3://render/farm (queue render, from /etc/steadq/queues/render.yaml): " +
        "credentials file /etc/steadq/render.aws: this user may not read it (it belongs to steadq, mode 0600, " +
        "as the queue's daemons need it): run the command as steadq or root";
    const text = page.failureText(5, line + "\nsecond line\n", null, true);
    assert.equal(text, line + ". A bucket queue opens with its daemons' credentials file: with administrative " +
        "access the page reads it as root.");
    assert.doesNotMatch(text, /not in/);
    assert.match(page.failureText(5, "", null, true), /^steadq was refused \(exit 5\)\. /);
    assert.match(page.failureText(5, line, "steadq", false), /^You are not in group steadq/);
    assert.equal(page.failureText(6, "cannot reach the object store\n", null, true), "cannot reach the object store");
});

test("a permission refusal (exit 5) becomes the group sentence; other failures their first stderr line", () => {
    assert.equal(page.failureText(5, "cannot open queue /var/lib/steadq/x: Permission denied", "steadq"),
        "You are not in group steadq: ask an administrator to add you, then log in again.");
    assert.match(page.failureText(5, "whatever", null), /not in this queue's group/);
    assert.equal(page.failureText(1, "not found: 3fb4\nmore", null), "not found: 3fb4");
    assert.equal(page.failureText(6, "", null), "steadq failed (exit 6)");
});

test("pause text, progress text, attempts, queue argument", () => {
    assert.equal(page.pausedText(null), "");
    assert.equal(page.pausedText({ reason: "", since_ns: 1796531118442681914, by: "ann@h", problem: "torn" }),
        "paused since 2026-12-06T04:25:18Z by ann@h (torn)");
    assert.equal(page.progressText({ percent: 42.5, text: "frame" }), "42.5% frame");
    assert.equal(page.progressText({ percent: null, text: "" }), "");
    assert.equal(page.attemptText({ attempt: 0, max_attempts: 3 }), "0/3");
    assert.equal(page.queueArg({ name: null, queue: "/srv/q" }), "/srv/q");
    assert.equal(page.queueArg({ name: "render", queue: "/srv/q" }), "render");
});

test("the group lookup walks from the queue up to its first parent below /", () => {
    assert.deepEqual(page.ancestors("/var/lib/steadq/demo/"), ["/var/lib/steadq/demo", "/var/lib/steadq", "/var/lib", "/var"]);
    assert.deepEqual(page.ancestors("s3://bucket/prefix"), []);
    assert.deepEqual(page.ancestors("/"), []);
});

test("a list that exited 1 (one queue could not be opened) still gives its document", () => {
    const listing = { config_dir: "/etc/steadq/queues", queues: [{ name: "demo", error: "cannot open queue" }] };
    assert.deepEqual(page.listFromFailure({ exit_status: 1, output: JSON.stringify(listing) }), listing);
    assert.equal(page.listFromFailure({ exit_status: 6, output: "" }), null);
    assert.equal(page.listFromFailure({ exit_status: 1, output: "[1]" }), null);
    assert.equal(page.listFromFailure({ problem: "not-found" }), null);
    assert.equal(page.listFromFailure(null), null);
    assert.equal(page.parseOutput("not json"), "not json");
    assert.deepEqual(page.parseOutput("{\"a\": [1]}"), { a: [1] });
});

test("job lists are shown oldest first, without changing the listing given", () => {
    const jobs = [{ job_id: "a", age_seconds: 5 }, { job_id: "b", age_seconds: 50 }, { job_id: "c", age_seconds: null }];
    assert.deepEqual(page.oldestFirst(jobs).map(j => j.job_id), ["b", "a", "c"]);
    assert.deepEqual(jobs.map(j => j.job_id), ["a", "b", "c"]);
});

test("elapsed seconds are counted on the server's clock, in nanoseconds, never negative", () => {
    assert.equal(page.elapsedSeconds(1796532556890126467n, 1796532554775947404n), 2);
    assert.equal(page.elapsedSeconds(1796532556890126467, 1796532496890126467), 60);
    assert.equal(page.elapsedSeconds(1, 5000000000), 0);
    assert.equal(page.elapsedSeconds(null, 1), null);
    assert.equal(page.elapsedSeconds(1, undefined), null);
    assert.equal(page.formatAge(page.elapsedSeconds(1796532556890126467, 1796532556890126467 - 3725e9)), "1h 02m");
});

// ---------------------------------------------------------------- throughput sparkline

function minutes(rows) {
    return { minutes: rows.map(([acked, buried], i) => ({ start_ns: 1796126400000000000 + i * 60e9, acked, retried: 0,
        buried, abandoned: 0 })) };
}

test("the sparkline keeps the newest 60 minutes of a 61-row hour, oldest first, totals of what it draws", () => {
    const rows = Array.from({ length: 61 }, (_, i) => [i === 0 ? 100 : i % 10 === 0 ? 3 : 0, i === 60 ? 2 : 0]);
    const s = page.sparkSeries(minutes(rows), 60);
    assert.equal(s.acked.length, 60);
    assert.equal(s.buried.length, 60);
    assert.deepEqual(s.acked.slice(0, 10), [0, 0, 0, 0, 0, 0, 0, 0, 0, 3], "row 0 (a partial minute) is left out");
    assert.equal(s.acked[59], 3);
    assert.equal(s.buried[59], 2, "the newest row is the last bin");
    assert.deepEqual(s.totals, { acked: 18, buried: 2 });
    assert.equal(s.peak, 3);
    assert.equal(page.sparkText(s), "Last hour: 18 acked, 2 buried (at most 3 a minute)");
});

test("fewer rows than bins leave zeros at the old end; wider bins sum their minutes", () => {
    const s = page.sparkSeries(minutes([[1, 0], [2, 1], [4, 0]]), 5);
    assert.deepEqual(s.acked, [0, 0, 1, 2, 4]);
    assert.deepEqual(s.buried, [0, 0, 0, 1, 0]);
    const w = page.sparkSeries(minutes([[1, 0], [2, 1], [4, 0], [8, 0], [16, 5]]), 2, 2);
    assert.deepEqual(w.acked, [6, 24], "bins of two minutes counted back from the newest; the oldest row is out");
    assert.deepEqual(w.buried, [1, 5]);
    assert.equal(page.sparkText(w), "Last hour: 30 acked, 6 buried (at most 24 per 2 minutes)");
});

test("a history with junk counts, no rows or no document draws zeros, not NaN", () => {
    const junk = { minutes: [{ acked: "x", buried: -4 }, { acked: null, buried: 2.7 }, null] };
    const s = page.sparkSeries(junk, 3);
    assert.deepEqual(s.acked, [0, 0, 0]);
    assert.deepEqual(s.buried, [0, 2, 0]);
    for (const empty of [null, {}, { minutes: "no" }]) {
        const e = page.sparkSeries(empty, 4);
        assert.deepEqual(e.acked, [0, 0, 0, 0]);
        assert.equal(e.peak, 0);
        assert.equal(page.sparkText(e), "Last hour: 0 acked, 0 buried");
    }
});

test("sparkline points: zero on the bottom edge, the common peak on the top, a flat line without any", () => {
    assert.equal(page.sparkPoints([0, 5, 10], 100, 20, 10), "0,20 50,10 100,0");
    assert.equal(page.sparkPoints([0, 1], 100, 20, 4), "0,20 100,15", "the buried line is scaled to the acked peak");
    assert.equal(page.sparkPoints([0, 0, 0], 120, 24, 0), "0,24 60,24 120,24");
    assert.equal(page.sparkPoints([3], 120, 24, 3), "0,0 120,0");
    assert.equal(page.sparkPoints([], 120, 24, 0), "");
    assert.equal(page.sparkPoints([1, 2, 3], 100, 30, 3), "0,20 50,10 100,0");
    assert.equal(page.sparkPoints([50], 10, 10, 5), "0,0 10,0", "a value above the peak stays in the box");
});

test("the sparkline is an SVG built through the DOM with its totals as its accessible name", () => {
    const s = page.sparkSeries(minutes([[2, 0], [5, 1]]), 60);
    const box = page.sparkline(doc, s);
    const svg = box.all().find(e => e.tagName === "SVG");
    assert.equal(svg.namespaceURI, "http://www.w3.org/2000/svg");
    assert.equal(svg.getAttribute("role"), "img");
    const text = "Last hour: 7 acked, 1 buried (at most 5 a minute)";
    assert.equal(svg.getAttribute("aria-label"), text);
    assert.equal(svg.all().find(e => e.tagName === "TITLE").textContent, text);
    const lines = svg.all().filter(e => e.tagName === "POLYLINE");
    assert.deepEqual(lines.map(l => l.getAttribute("class")), ["spark-buried", "spark-acked"], "acked drawn on top");
    const acked = lines[1].getAttribute("points").split(" ");
    assert.equal(acked.length, 60);
    assert.deepEqual(acked.slice(-2), ["117.97,14.4", "120,0"], "2 then 5 (the peak) in the last two minutes");
    assert.equal(lines[0].getAttribute("points").split(" ").slice(-1)[0], "120,19.2", "1 buried, to the same scale");
    assert.ok(box.textContent.endsWith("7 acked, 1 buried"), box.textContent);
});

test("a queue without history says so as text; its error is a title, never markup", () => {
    const failed = page.throughputCell(doc, { history: null, error: "history: no journal " + XSS });
    assert.equal(failed.textContent, "no history");
    assert.equal(failed.all().find(e => e.tagName === "SPAN").getAttribute("title"), "history: no journal " + XSS);
    assert.ok(!failed.all().some(e => e.tagName === "IMG"));
    assert.equal(page.throughputCell(doc, undefined).textContent, "–");
    const drawn = page.throughputCell(doc, { history: minutes([[1, 0]]), error: null });
    assert.ok(drawn.all().some(e => e.tagName === "SVG"));
});

test("a queue's history is read again after a minute, or after 15 s when its counts moved", () => {
    const counts = { ready: 1, delayed: 0, running: 0, dead: 0 };
    const moved = { ...counts, ready: 0 };
    assert.ok(page.historyDue(undefined, 0, counts), "never read");
    const last = { atMs: 1000000, counts };
    assert.ok(!page.historyDue(last, 1000000 + page.HISTORY_MIN_MS - 1, moved), "moved, but too soon");
    assert.ok(page.historyDue(last, 1000000 + page.HISTORY_MIN_MS, moved), "moved, 15 s later");
    assert.ok(!page.historyDue(last, 1000000 + page.HISTORY_MAX_MS - 1, counts), "quiet queue: once a minute");
    assert.ok(page.historyDue(last, 1000000 + page.HISTORY_MAX_MS, counts));
    assert.ok(page.HISTORY_MIN_MS >= 10000 && page.HISTORY_MAX_MS >= page.HISTORY_MIN_MS, "not a process per second");
});

// ---------------------------------------------------------------- unit controls

test("a queue's units are its configured name's three; a path or a hostile name has none", () => {
    assert.deepEqual(page.unitNames("demo"),
        ["steadq-worker@demo.service", "steadq-sweeper@demo.service", "steadq-promoter@demo.service"]);
    for (const bad of ["/var/lib/steadq/demo", XSS, "a".repeat(65), "-x", "", null, undefined, "a b", "a\nb"]) {
        assert.deepEqual(page.unitNames(bad), [], String(bad));
    }
    assert.equal(page.unitNames("a".repeat(64)).length, 3);
    assert.equal(page.logsLocation("steadq-worker@demo.service"),
        "/system/logs/#/?prio=debug&service=steadq-worker@demo.service");
});

test("systemctl show output is read block by block", () => {
    const text = "Id=steadq-worker@demo.service\nActiveState=active\nSubState=running\n\n" +
        "Id=steadq-sweeper@demo.service\nActiveState=failed\nSubState=failed\n\nActiveState=orphan\n";
    const props = page.parseUnitShow(text);
    assert.deepEqual(Object.keys(props), ["steadq-worker@demo.service", "steadq-sweeper@demo.service"]);
    assert.equal(page.unitStateText(props["steadq-worker@demo.service"]), "active (running)");
    assert.equal(page.unitStateText(props["steadq-promoter@demo.service"]), "unknown");
    assert.equal(page.unitStateText({ ActiveState: "inactive", SubState: "" }), "inactive");
    assert.deepEqual(page.parseUnitShow(""), {});
});

test("without administrative access the unit buttons are disabled with the reason; Logs still works", () => {
    assert.deepEqual(page.unitControl(true), { disabled: false, reason: "" });
    assert.match(page.unitControl(false).reason, /needs administrative access/);
    assert.ok(page.unitControl(false).disabled && page.unitControl(null).disabled);
    const calls = [];
    const unit = "steadq-worker@demo.service";
    const props = { Id: unit, ActiveState: "failed", SubState: "failed" };
    const off = page.unitRow(doc, unit, props, page.unitControl(false), (v, u) => calls.push([v, u]),
        u => calls.push(["logs", u]));
    assert.deepEqual(off.childNodes.map(c => c.textContent), [unit, "failed (failed)", "StartStopRestart", "Logs"]);
    assert.equal(off.childNodes[1].className, "unit-failed");
    const buttons = off.all().filter(e => e.tagName === "BUTTON");
    for (const b of buttons.slice(0, 3)) {
        assert.equal(b.getAttribute("disabled"), "");
        assert.match(b.getAttribute("title"), /needs administrative access/);
    }
    assert.equal(buttons[3].getAttribute("disabled"), null);
    buttons[3].click();
    assert.deepEqual(calls, [["logs", unit]]);
    const on = page.unitRow(doc, unit, undefined, page.unitControl(true), (v, u) => calls.push([v, u]), () => {});
    const restart = on.all().find(e => e.getAttribute("data-action") === "restart");
    assert.equal(restart.getAttribute("disabled"), null);
    restart.click();
    assert.deepEqual(calls[1], ["restart", unit]);
    assert.equal(on.childNodes[1].textContent, "unknown");
});
