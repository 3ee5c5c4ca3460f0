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
