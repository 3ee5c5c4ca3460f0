/* The steadq Cockpit page: every queue, one queue live, one job's story.
 *
 * Why it is built this way:
 * - Everything comes from the steadq command (`--json`), run as the logged-in user through
 *   cockpit.spawn: the queue's own permissions decide what a user sees and may do, exactly
 *   as on a shell. A user outside the queue's group gets the command's permission error
 *   (exit 5), which the page turns into one sentence.
 * - Anything from a job, the tree or the journal is attacker-chosen text (metadata, payload,
 *   journal messages, paths): it is only ever inserted with textContent/createTextNode,
 *   never as HTML. The page has no inline script or style (Cockpit's CSP forbids both).
 * - One long-running `steadq watch QUEUE --json` per open queue view (not a process per
 *   refresh); the job lists are re-read only when the watch frame's counts change.
 * - The formatting and rendering functions take the document as an argument and do not
 *   touch `cockpit`, so tests/cockpit runs them under Node without a browser.
 */
(function (root, factory) {
    "use strict";
    const api = factory();
    if (typeof module === "object" && module.exports) {
        module.exports = api;
    } else {
        root.steadqPage = api;
        if (typeof root.cockpit !== "undefined" && typeof root.document !== "undefined") {
            root.document.addEventListener("DOMContentLoaded", () => api.start(root.cockpit, root.document));
        }
    }
}(typeof self !== "undefined" ? self : this, function () {
    "use strict";

    const EXIT_PERMISSION = 5; // docs/cli.md, "Exit codes"
    const OVERVIEW_REFRESH_MS = 5000;
    const LIST_LIMIT = 200; // rows shown per state; the count line says how many there are
    const SHOW_RUNNING_LIMIT = 20; // running jobs whose lease start is read (one `show` each, on a count change)
    const HISTORY_BINS = 60; // the sparkline: one bin per minute of the last hour
    const HISTORY_MIN_MS = 15000; // a queue's history is read again at most this often (when its counts moved)
    const HISTORY_MAX_MS = 60000; // and at least this often while the overview is open
    const UNIT_REFRESH_MS = 10000; // the unit states on the queue view
    const ADMIN_WAIT_MS = 5000; // how long a refusal waits to learn whether the session is an administrator's
    const SPARK_W = 120;
    const SPARK_H = 24;
    const QUEUE_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/; // steadqd/queue_names.py QUEUE_NAME
    const UNIT_ROLES = ["worker", "sweeper", "promoter"];

    // ---------------------------------------------------------------- formatting (pure)

    /** "40s", "2m 05s", "3h 02m", "4d 01h"; "–" for null (an empty state has no oldest job). */
    function formatAge(seconds) {
        if (seconds === null || seconds === undefined || !Number.isFinite(Number(seconds))) {
            return "–";
        }
        let s = Math.max(0, Math.floor(Number(seconds)));
        const pad = n => String(n).padStart(2, "0");
        if (s < 60) return s + "s";
        const m = Math.floor(s / 60);
        s %= 60;
        if (m < 60) return m + "m " + pad(s) + "s";
        const h = Math.floor(m / 60);
        if (h < 24) return h + "h " + pad(m % 60) + "m";
        return Math.floor(h / 24) + "d " + pad(h % 24) + "h";
    }

    /**
     * Whole seconds from sinceNs to nowNs, or null when either is unknown. Both come from the
     * server (a watch frame's time_ns, show's in_state_since_ns), so the browser's clock never counts.
     */
    function elapsedSeconds(nowNs, sinceNs) {
        if (nowNs === null || nowNs === undefined || sinceNs === null || sinceNs === undefined) return null;
        const diff = BigInt(nowNs) - BigInt(sinceNs);
        return diff < 0n ? 0 : Number(diff / 1000000000n);
    }

    /** A wall time in nanoseconds as an ISO-8601 UTC string to the second. */
    function formatTimeNs(ns) {
        if (ns === null || ns === undefined) return "–";
        return new Date(Number(BigInt(ns) / 1000000n)).toISOString().replace(/\.\d+Z$/, "Z");
    }

    /** The pause line, as `steadq stats` words it: "paused since … by …: REASON". */
    function pausedText(paused) {
        if (!paused) return "";
        let text = "paused since " + formatTimeNs(paused.since_ns) + " by " + String(paused.by || "?");
        if (paused.reason) text += ": " + String(paused.reason);
        if (paused.problem) text += " (" + String(paused.problem) + ")";
        return text;
    }

    /** "3/5" from a job's attempt and max_attempts. */
    function attemptText(job) {
        return String(job.attempt ?? "?") + "/" + String(job.max_attempts ?? "?");
    }

    /**
     * The sentence for a command that failed: a permission refusal becomes the group message. A
     * bucket queue's refusal is not a group's: the command's own line says whose credentials
     * file it could not read (or that the store refused them).
     */
    function failureText(exitStatus, stderr, group, bucket) {
        const first = String(stderr || "").trim().split("\n")[0];
        if (exitStatus === EXIT_PERMISSION && bucket) {
            return (first || "steadq was refused (exit 5)") + ". A bucket queue opens with its daemons' " +
                "credentials file: with administrative access the page reads it as root.";
        }
        if (exitStatus === EXIT_PERMISSION) {
            return group ? "You are not in group " + group + ": ask an administrator to add you, then log in again."
                : "You are not in this queue's group: ask an administrator to add you, then log in again.";
        }
        return first || "steadq failed (exit " + String(exitStatus) + ")";
    }

    /** The word for a unit's state, shortened: "worker active". */
    function unitsText(units) {
        if (!units) return "–";
        return Object.keys(units).sort().map(unit => {
            const role = unit.replace(/^steadq-/, "").replace(/@.*$/, "");
            return role + " " + String(units[unit] ?? "?");
        }).join(", ");
    }

    /** The `watch --json` rows as counts: {ready, delayed, running, dead}. */
    function frameCounts(frame) {
        const states = (frame && frame.states) || {};
        const count = name => (states[name] ? states[name].objects : null);
        return { ready: count("ready"), delayed: count("delayed"), running: count("running"), dead: count("dead") };
    }

    function countsText(counts) {
        const c = counts || {};
        const n = v => (v === null || v === undefined ? "?" : String(v));
        return n(c.ready) + " ready, " + n(c.delayed) + " delayed, " + n(c.running) + " running, " + n(c.dead) + " dead";
    }

    function sameCounts(a, b) {
        return !!a && !!b && a.ready === b.ready && a.delayed === b.delayed && a.running === b.running &&
            a.dead === b.dead;
    }

    /** A progress report as text: "42% frame 42/100". */
    function progressText(progress) {
        if (!progress) return "";
        const parts = [];
        if (progress.percent !== null && progress.percent !== undefined) parts.push(String(progress.percent) + "%");
        if (progress.text) parts.push(String(progress.text));
        return parts.join(" ");
    }

    /**
     * A reader of a stream that arrives in arbitrary chunks: calls onLine(text) once per whole
     * line, keeps a partial line until its newline arrives. `watch --json` writes one object per
     * line, but a pipe may split or join them anywhere.
     */
    function lineReader(onLine) {
        let pending = "";
        return function (chunk) {
            pending += chunk;
            let nl;
            while ((nl = pending.indexOf("\n")) >= 0) {
                const line = pending.slice(0, nl);
                pending = pending.slice(nl + 1);
                if (line.trim() !== "") onLine(line);
            }
        };
    }

    /** One `watch --json` line as an object, or null when it is not a JSON object. */
    function parseFrame(line) {
        try {
            const frame = JSON.parse(line);
            return frame && typeof frame === "object" && !Array.isArray(frame) ? frame : null;
        } catch (e) {
            return null;
        }
    }

    /**
     * A queue path and its parents, deepest first, up to (not including) "/": where to look for
     * the group that refused a user. A bucket URL (s3://) has none.
     */
    function ancestors(path) {
        if (!path.startsWith("/")) return [];
        const out = [];
        let p = path.replace(/\/+$/, "");
        while (p.length > 1) {
            out.push(p);
            p = p.slice(0, p.lastIndexOf("/")) || "/";
        }
        return out;
    }

    /** Whether a queue (a `list --json` entry's `queue`, a watch frame's `queue`) is a bucket's (StowQ/1). */
    function isBucket(queue) {
        return typeof queue === "string" && queue.startsWith("s3://");
    }

    /**
     * The queue view's note on a bucket queue, from a watch frame: how often it refreshes (the
     * frame's own interval; `watch` raises the page's 1 s to 2 s there) and why not faster. "" for
     * a directory queue, whose frames come every second.
     */
    function refreshNote(frame) {
        if (!frame || !isBucket(frame.queue)) return "";
        const s = Number(frame.interval_seconds);
        const every = Number.isFinite(s) && s > 0 ? String(Math.round(s * 10) / 10) + " s" : "few seconds";
        return "A bucket queue: refreshes every " + every + ", since each refresh lists the bucket " +
            "(requests the store counts and may bill).";
    }

    /** Jobs of an `ls --json` listing (in shard order) sorted oldest first, as an operator reads them. */
    function oldestFirst(jobs) {
        return jobs.slice().sort((a, b) => (Number(b.age_seconds) || 0) - (Number(a.age_seconds) || 0));
    }

    /** A command's stdout: its JSON document, or the text itself when it is not JSON. */
    function parseOutput(text) {
        try {
            return JSON.parse(text);
        } catch (e) {
            return text;
        }
    }

    /** The document of a `list` that exited non-zero (a queue with an error), or null if it printed none. */
    function listFromFailure(ex) {
        const out = ex && typeof ex.output === "string" ? parseOutput(ex.output) : null;
        return out && typeof out === "object" && Array.isArray(out.queues) ? out : null;
    }

    /** The argument that names a queue to the command: its configured name, else its path. */
    function queueArg(entry) {
        return entry.name || entry.queue;
    }

    // ---------------------------------------------------------------- throughput (pure)

    /**
     * The sparkline's two series from a `history --json` document: `bins` numbers each for acked
     * and buried, oldest first, each bin `minutesPerBin` of the document's minute rows (contiguous,
     * zeros included), counted back from the newest row, so the last bin holds the current minute.
     * Older rows are left out (`--since 1h` gives 61 rows: the first minute is a partial one); fewer
     * rows leave zeros at the old end. The totals are of the bins drawn, so text and picture agree.
     */
    function sparkSeries(history, bins, minutesPerBin) {
        const n = Math.max(1, Math.floor(Number(bins) || HISTORY_BINS));
        const width = Math.max(1, Math.floor(Number(minutesPerBin) || 1));
        const rows = (history && Array.isArray(history.minutes)) ? history.minutes : [];
        const count = (row, key) => Math.max(0, Math.floor(Number(row && row[key]) || 0));
        const acked = new Array(n).fill(0);
        const buried = new Array(n).fill(0);
        for (let i = rows.length - 1, k = 0; i >= 0 && k < n * width; i--, k++) {
            const bin = n - 1 - Math.floor(k / width);
            acked[bin] += count(rows[i], "acked");
            buried[bin] += count(rows[i], "buried");
        }
        const sum = values => values.reduce((a, b) => a + b, 0);
        return {
            acked,
            buried,
            totals: { acked: sum(acked), buried: sum(buried) },
            peak: Math.max(0, ...acked, ...buried),
            minutesPerBin: width,
        };
    }

    /**
     * SVG polyline points for `values` in a width x height box, against a common `peak` (so the
     * buried line is drawn to the acked line's scale). Zero sits on the bottom edge, the peak on the
     * top; a peak of 0 draws a flat line. One value is drawn as a level line across the box.
     */
    function sparkPoints(values, width, height, peak) {
        const top = Math.max(Number(peak) || 0, 1);
        const n = values.length;
        const round = v => Math.round(v * 100) / 100;
        const y = v => round(height - (Math.min(Math.max(Number(v) || 0, 0), top) / top) * height);
        if (n === 0) return "";
        if (n === 1) return "0," + y(values[0]) + " " + width + "," + y(values[0]);
        return values.map((v, i) => round((i * width) / (n - 1)) + "," + y(v)).join(" ");
    }

    /** The sparkline's text alternative: "Last hour: 12 acked, 1 buried (at most 5 a minute)". */
    function sparkText(series) {
        let text = "Last hour: " + series.totals.acked + " acked, " + series.totals.buried + " buried";
        if (series.peak > 0) {
            text += " (at most " + series.peak + (series.minutesPerBin > 1 ? " per " + series.minutesPerBin +
                " minutes)" : " a minute)");
        }
        return text;
    }

    /**
     * Whether a queue's history is read again now: never read, older than HISTORY_MAX_MS, or the
     * queue's counts moved and the last read is at least HISTORY_MIN_MS old. One `history` process
     * per queue per minute at most while nothing changes; a busy queue at most every 15 s.
     */
    function historyDue(last, nowMs, counts) {
        if (!last) return true;
        const age = nowMs - last.atMs;
        if (age >= HISTORY_MAX_MS) return true;
        return age >= HISTORY_MIN_MS && !sameCounts(last.counts, counts);
    }

    // ---------------------------------------------------------------- units (pure)

    /** The queue's three unit names, or [] for a name that is no configured queue name (a path). */
    function unitNames(name) {
        if (typeof name !== "string" || !QUEUE_NAME.test(name)) return [];
        return UNIT_ROLES.map(role => "steadq-" + role + "@" + name + ".service");
    }

    /**
     * `systemctl show --property=Id,ActiveState,SubState,... UNIT...` as {Id: {property: value}}:
     * one block of KEY=VALUE lines per unit, blocks separated by a blank line.
     */
    function parseUnitShow(text) {
        const out = {};
        for (const block of String(text || "").split(/\n\s*\n/)) {
            const props = {};
            for (const line of block.split("\n")) {
                const eq = line.indexOf("=");
                if (eq > 0) props[line.slice(0, eq)] = line.slice(eq + 1);
            }
            if (props.Id) out[props.Id] = props;
        }
        return out;
    }

    /** "active (running)", "inactive (dead)", "unknown". */
    function unitStateText(props) {
        if (!props || !props.ActiveState) return "unknown";
        return props.ActiveState + (props.SubState ? " (" + props.SubState + ")" : "");
    }

    /** Cockpit's journal page filtered to one unit, as its own Services page links it. */
    function logsLocation(unit) {
        return "/system/logs/#/?prio=debug&service=" + unit;
    }

    /**
     * Whether the unit buttons work, from cockpit.permission({admin: true}).allowed: true (the
     * session has administrative access), false (it has not), null (not known yet).
     */
    function unitControl(allowed) {
        if (allowed === true) return { disabled: false, reason: "" };
        if (allowed === null || allowed === undefined) return { disabled: true, reason: "Checking administrative access…" };
        return {
            disabled: true,
            reason: "Starting, stopping and restarting units needs administrative access: switch to it in " +
                "Cockpit's top bar (\"Limited access\"), if your account may use sudo.",
        };
    }

    // ---------------------------------------------------------------- rendering (document passed in)

    /**
     * An element with text children only. `children` are strings (made text nodes) or nodes.
     * This is the page's one way to put anything on screen: there is no HTML string anywhere.
     */
    function el(doc, tag, attrs, children) {
        const node = doc.createElement(tag);
        for (const [key, value] of Object.entries(attrs || {})) {
            if (key === "className") node.className = value;
            else if (key === "text") node.textContent = String(value);
            else node.setAttribute(key, String(value));
        }
        for (const child of children || []) {
            node.appendChild(typeof child === "string" ? doc.createTextNode(child) : child);
        }
        return node;
    }

    function clear(node) {
        while (node.firstChild) node.removeChild(node.firstChild);
    }

    /** One row of the overview from one `list --json` queue. `open(entry)` follows its link. */
    function queueRow(doc, entry, open) {
        const counts = entry.counts || {};
        const oldest = entry.oldest_age_seconds || {};
        const link = el(doc, "button", { className: "link", type: "button", text: String(queueArg(entry)) });
        link.addEventListener("click", () => open(entry));
        let state = "not paused";
        let stateClass = "";
        if (entry.error) {
            state = String(entry.error);
            stateClass = "state-error";
        } else if (entry.paused) {
            state = pausedText(entry.paused);
            stateClass = "state-paused";
        }
        const num = v => el(doc, "td", { className: "num", text: v === null || v === undefined ? "–" : String(v) });
        return el(doc, "tr", { "data-queue": String(queueArg(entry)) }, [
            el(doc, "td", {}, [link]),
            num(counts.ready), num(counts.delayed), num(counts.running), num(counts.dead),
            el(doc, "td", { className: "num", text: formatAge(oldest.ready) }),
            el(doc, "td", { className: stateClass, text: state }),
            el(doc, "td", { text: unitsText(entry.units) }),
        ]);
    }

    /**
     * One job of an `ls --json` listing. `actions` is a list of [label, fn(job)]; `extra` are the
     * cells between the age and the buttons (the running job's progress, the dead job's reason).
     */
    function jobRow(doc, job, openJob, actions, extra) {
        const id = String(job.job_id);
        const link = el(doc, "button", { className: "link mono", type: "button", text: id });
        link.addEventListener("click", () => openJob(id));
        const buttons = (actions || []).map(([label, fn]) => {
            const b = el(doc, "button", { type: "button", text: label, "data-action": label.toLowerCase() });
            b.addEventListener("click", () => fn(job));
            return b;
        });
        return el(doc, "tr", { "data-job": id }, [
            el(doc, "td", {}, [link]),
            el(doc, "td", { className: "num", text: attemptText(job) }),
            el(doc, "td", { className: "num", text: formatAge(job.age_seconds) }),
            ...(extra || []),
            el(doc, "td", {}, buttons),
        ]);
    }

    /** The progress cell of a running job: a <progress> bar when there is a percentage, and the text. */
    function progressCell(doc, progress) {
        const cell = el(doc, "td", {});
        if (progress && progress.percent !== null && progress.percent !== undefined) {
            cell.appendChild(el(doc, "progress", { max: "100", value: String(Number(progress.percent) || 0) }));
            cell.appendChild(doc.createTextNode(" "));
        }
        cell.appendChild(doc.createTextNode(progress && progress.text ? String(progress.text) : ""));
        return cell;
    }

    function facts(doc, pairs) {
        const dl = el(doc, "dl", { className: "facts" });
        for (const [term, value] of pairs) {
            dl.appendChild(el(doc, "dt", { text: term }));
            dl.appendChild(el(doc, "dd", { text: value === null || value === undefined ? "–" : String(value) }));
        }
        return dl;
    }

    /** One job's story from `show --json`: facts, metadata, payload preview (text), runs, journal. */
    function jobStory(doc, story) {
        const box = el(doc, "div", {});
        box.appendChild(facts(doc, [
            ["State", story.state + (story.reason_name ? " (" + story.reason_name + ")" : "")],
            ["Attempt", attemptText(story)],
            ["Generation", story.generation],
            ["Created", formatTimeNs(story.created_at_ns)],
            ["In this state since", formatTimeNs(story.in_state_since_ns)],
            ["Content type", story.content_type],
            ["Producer", story.producer_id],
            ["Payload", story.payload_length === null ? null : story.payload_length + " bytes" +
                (story.payload_verified ? ", verified" : "")],
            ["Problem", story.problem],
            ["Progress", progressText(story.progress) || null],
        ]));
        const metadata = story.metadata || {};
        const keys = Object.keys(metadata).sort();
        box.appendChild(el(doc, "h3", { text: "Metadata" }));
        box.appendChild(keys.length ? facts(doc, keys.map(k => [k, metadata[k]]))
            : el(doc, "p", { className: "note", text: "none" }));

        box.appendChild(el(doc, "h3", { text: "Payload (first bytes)" }));
        if (story.payload_head_text !== null && story.payload_head_text !== undefined) {
            box.appendChild(el(doc, "pre", { className: "payload", text: story.payload_head_text }));
        } else if (story.payload_head_base64) {
            box.appendChild(el(doc, "p", {
                className: "note",
                text: "binary: " + String(story.payload_head_bytes) + " bytes not shown (steadq show --payload prints it)",
            }));
        } else {
            box.appendChild(el(doc, "p", { className: "note", text: "not read" }));
        }

        const failure = story.failure;
        if (failure && failure.runs && failure.runs.length) {
            box.appendChild(el(doc, "h3", { text: "Attempts" }));
            const head = el(doc, "tr", {}, ["Attempt", "Verdict", "Exit", "Duration", "Time"].map(
                h => el(doc, "th", { text: h })));
            const body = el(doc, "tbody", {}, failure.runs.map(run => el(doc, "tr", {}, [
                el(doc, "td", { className: "num", text: String(run.attempt ?? "?") }),
                el(doc, "td", { text: String(run.verdict ?? "?") }),
                el(doc, "td", {
                    text: run.signal ? "signal " + run.signal : (run.timed_out ? "timed out"
                        : String(run.exit_status ?? "–")),
                }),
                el(doc, "td", { className: "num", text: run.duration_ms === null ? "–" : run.duration_ms + " ms" }),
                el(doc, "td", { text: String(run.time ?? "") }),
            ])));
            box.appendChild(el(doc, "table", { className: "grid" }, [el(doc, "thead", {}, [head]), body]));
        }
        if (failure && failure.outcomes && failure.outcomes.length) {
            box.appendChild(el(doc, "ul", {}, failure.outcomes.map(o => el(doc, "li", { text: o }))));
        }
        if (failure && failure.stderr_tail && failure.stderr_tail.length) {
            box.appendChild(el(doc, "h3", { text: "Last lines on stderr" }));
            box.appendChild(el(doc, "pre", { className: "stderr", text: failure.stderr_tail.join("\n") }));
        }

        box.appendChild(el(doc, "h3", { text: "Journal" }));
        const journal = story.journal;
        if (!journal) {
            box.appendChild(el(doc, "p", { className: "note", text: "not read" }));
        } else if (journal.error) {
            box.appendChild(el(doc, "p", { className: "note", text: String(journal.error) }));
        } else if (!journal.entries || !journal.entries.length) {
            box.appendChild(el(doc, "p", { className: "note", text: journal.note ? String(journal.note) : "no entries" }));
        } else {
            box.appendChild(el(doc, "table", { className: "grid journal" }, [el(doc, "tbody", {},
                journal.entries.map(e => el(doc, "tr", {}, [
                    el(doc, "td", { className: "mono", text: String(e.time ?? "") }),
                    el(doc, "td", { text: String(e.unit ?? e.identifier ?? "") }),
                    el(doc, "td", { text: String(e.message ?? "") }),
                ])))]));
        }
        return box;
    }

    const SVG_NS = "http://www.w3.org/2000/svg";

    /**
     * The throughput sparkline: an SVG made through the DOM (no markup string), acked and buried
     * per minute drawn to one scale, with its text alternative as the SVG's accessible name and
     * <title>, and visibly next to it.
     */
    function sparkline(doc, series) {
        const text = sparkText(series);
        const svg = doc.createElementNS(SVG_NS, "svg");
        for (const [k, v] of [["class", "spark"], ["viewBox", "0 0 " + SPARK_W + " " + SPARK_H],
            ["width", SPARK_W], ["height", SPARK_H], ["role", "img"], ["aria-label", text],
            ["preserveAspectRatio", "none"]]) {
            svg.setAttribute(k, String(v));
        }
        const title = doc.createElementNS(SVG_NS, "title");
        title.textContent = text;
        svg.appendChild(title);
        // Buried first, so the acked line is drawn over it where both are zero.
        for (const [cls, values] of [["buried", series.buried], ["acked", series.acked]]) {
            const line = doc.createElementNS(SVG_NS, "polyline");
            line.setAttribute("class", "spark-" + cls);
            line.setAttribute("points", sparkPoints(values, SPARK_W, SPARK_H, series.peak));
            svg.appendChild(line);
        }
        const box = el(doc, "span", { className: "throughput" }, [svg]);
        box.appendChild(el(doc, "span", { className: "spark-text", text: series.totals.acked + " acked, " +
            series.totals.buried + " buried" }));
        return box;
    }

    /** The throughput cell of a queue: its sparkline, or why there is none (as text). */
    function throughputCell(doc, state) {
        const cell = el(doc, "td", { className: "throughput-cell" });
        if (!state) {
            cell.appendChild(el(doc, "span", { className: "note", text: "–" }));
        } else if (state.error) {
            cell.appendChild(el(doc, "span", { className: "note", title: state.error, text: "no history" }));
        } else {
            cell.appendChild(sparkline(doc, sparkSeries(state.history, HISTORY_BINS)));
        }
        return cell;
    }

    /**
     * One unit's row on the queue view: name, state, Start/Stop/Restart (disabled, with the reason
     * as their title, when `control.disabled`), and a Logs link. `onAction(verb, unit)`, `onLogs(unit)`.
     */
    function unitRow(doc, unit, props, control, onAction, onLogs) {
        const buttons = ["Start", "Stop", "Restart"].map(label => {
            const b = el(doc, "button", { type: "button", text: label, "data-action": label.toLowerCase() });
            if (control.disabled) {
                b.disabled = true;
                b.setAttribute("disabled", "");
                b.setAttribute("title", control.reason);
            }
            b.addEventListener("click", () => onAction(label.toLowerCase(), unit));
            return b;
        });
        const logs = el(doc, "button", { className: "link", type: "button", text: "Logs", "data-action": "logs" });
        logs.addEventListener("click", () => onLogs(unit));
        const state = unitStateText(props);
        return el(doc, "tr", { "data-unit": unit }, [
            el(doc, "td", { className: "mono", text: unit }),
            el(doc, "td", { className: state.startsWith("failed") ? "unit-failed" : "", text: state }),
            el(doc, "td", {}, buttons),
            el(doc, "td", {}, [logs]),
        ]);
    }

    // ---------------------------------------------------------------- the page (browser only)

    function start(cockpit, doc) {
        const $ = id => doc.getElementById(id);
        let overviewTimer = null;
        let watchProc = null;
        let watchQueue = null;
        let lastCounts = null;
        let listing = false; // an `ls` round is under way
        let relist = false; // the counts changed during it: list again when it ends
        let progress = {};
        let frameTimeNs = null; // the last watch frame's time: "now" on the server's clock
        let runningSince = {}; // job id -> in_state_since_ns (from show), for the elapsed time
        let entries = {}; // queue argument -> list --json entry (its path, for the group lookup)
        let confirmAction = null;
        let histories = {}; // queue argument -> {atMs, counts, history, error}: the sparklines' data
        let historyRound = false; // a round of `history` reads is under way
        let throughputCells = {}; // queue argument -> its overview cell, redrawn when its history arrives
        let unitTimer = null;
        let unitProps = {}; // unit -> `systemctl show` properties, for the open queue view
        // Queues this user cannot open as themselves, shown with administrative access ("try") because
        // the session has it: another user's private queue, say.
        const adminQueues = {};
        // Whether the session has administrative access (Cockpit's superuser): the unit buttons need it.
        // Cockpit reloads the page when it changes.
        const admin = cockpit.permission({ admin: true });

        function showMessage(text, isError) {
            const m = $("message");
            m.textContent = text || "";
            m.className = isError ? "message error" : "message";
            m.hidden = !text;
        }

        /**
         * Run steadq with --json; resolves to the parsed output (the raw text when not JSON). A
         * failure rejects with cockpit's ProcessError (exit_status, message: stderr), its stdout
         * kept as `output`.
         */
        function steadq(args, queue) {
            return new Promise((resolve, reject) => {
                cockpit.spawn(["steadq", "--json", ...args], spawnOptions(queue)).then(
                    out => resolve(parseOutput(out)),
                    (ex, out) => {
                        if (ex && typeof ex === "object") ex.output = out;
                        reject(ex);
                    });
            });
        }

        /**
         * The spawn options for a command about `queue`: as the user, or with administrative access
         * ("try": root when the session has it, else the user) for a queue the user could not open.
         */
        function spawnOptions(queue) {
            return queue !== undefined && adminQueues[queue] ? { err: "message", superuser: "try" } : { err: "message" };
        }

        /** `list`: exits 1 when a queue could not be opened, but its document still has every queue. */
        function steadqList() {
            return steadq(["list"]).catch(ex => {
                const listing = listFromFailure(ex);
                if (listing === null) throw ex;
                return listing;
            });
        }

        /**
         * The group of the directory that refused the user, for the "not in group" sentence: the
         * queue's directory, or the nearest parent this user may stat (a queue below a 2770 spool
         * cannot even be stat'ed by an outsider; the spool that refused can). Null if unknown.
         */
        function queueGroup(queue) {
            const entry = entries[queue];
            const paths = entry && entry.queue ? ancestors(String(entry.queue)) : [];
            const next = i => (i >= paths.length ? Promise.resolve(null)
                : Promise.resolve(cockpit.spawn(["stat", "-c", "%G", "--", paths[i]], { err: "ignore" }))
                    .then(out => out.trim() || null, () => next(i + 1)));
            return next(0);
        }

        function reportFailure(queue, ex) {
            const status = ex && ex.exit_status !== undefined ? ex.exit_status : null;
            const stderr = ex && ex.message ? ex.message : String(ex);
            if (status === EXIT_PERMISSION && queue && adminQueues[queue]) {
                // A refusal of a command started as the user before the switch below: superseded.
                return Promise.resolve();
            }
            if (status === EXIT_PERMISSION && queue && admin.allowed === null && !ex.waitedForAdmin) {
                // Whether the session is an administrator's is not known yet: decide once it is
                // (or after ADMIN_WAIT_MS, as not one).
                ex.waitedForAdmin = true;
                return new Promise(resolve => {
                    const decide = () => {
                        admin.removeEventListener("changed", decide);
                        clearTimeout(timer);
                        resolve(reportFailure(queue, ex));
                    };
                    const timer = setTimeout(decide, ADMIN_WAIT_MS);
                    admin.addEventListener("changed", decide);
                });
            }
            if (status === EXIT_PERMISSION && queue && admin.allowed === true) {
                // Not this user's queue, but the session is an administrator's: show it as root.
                adminQueues[queue] = true;
                return queueGroup(queue).then(group => {
                    reopen(queue);
                    showMessage((group ? "You are not in group " + group : "You are not in this queue's group") +
                        ": shown with administrative access.", false);
                });
            }
            if (status === EXIT_PERMISSION && queue && isBucket(entries[queue] ? entries[queue].queue : queue)) {
                showMessage(failureText(status, stderr, null, true), true);
                return Promise.resolve();
            }
            if (status === EXIT_PERMISSION && queue) {
                return queueGroup(queue).then(group => showMessage(failureText(status, stderr, group), true));
            }
            showMessage(failureText(status, stderr, null), true);
            return Promise.resolve();
        }

        // -- all queues
        function refreshOverview() {
            steadqList().then(doc_ => {
                const body = $("queues");
                clear(body);
                entries = {};
                const queues = (doc_ && doc_.queues) || [];
                throughputCells = {};
                for (const entry of queues) {
                    const q = queueArg(entry);
                    entries[q] = entry;
                    const row = queueRow(doc, entry, e => cockpit.location.go([String(queueArg(e))]));
                    throughputCells[q] = row.appendChild(throughputCell(doc, histories[q]));
                    body.appendChild(row);
                }
                readHistories(queues);
                $("overview-note").textContent = queues.length ? "" : "No queue is configured in " +
                    String((doc_ && doc_.config_dir) || "/etc/steadq/queues") + ".";
            }, ex => reportFailure(null, ex)).finally(() => {
                if (overviewTimer !== null) overviewTimer = setTimeout(refreshOverview, OVERVIEW_REFRESH_MS);
            });
        }

        /**
         * The sparklines' data: `steadq history NAME --since 1h` for each configured queue that is due
         * (historyDue), one process at a time, never two rounds at once. It runs with administrative
         * access when the session has it ("try"): the verdicts are the system journal's, which a user
         * outside systemd-journal/adm cannot read; the output is counts only.
         */
        function readHistories(queues) {
            if (historyRound) return;
            const now = Date.now();
            const due = queues.filter(e => unitNames(e.name).length && historyDue(histories[queueArg(e)], now, e.counts));
            if (!due.length) return;
            historyRound = true;
            const next = i => {
                if (i >= due.length || overviewTimer === null) {
                    historyRound = false;
                    return;
                }
                const entry = due[i];
                const q = queueArg(entry);
                cockpit.spawn(["steadq", "--json", "history", entry.name, "--since", "1h"],
                    { err: "message", superuser: "try" }).then(
                    out => ({ history: parseOutput(out), error: null }),
                    ex => ({ history: null, error: failureText(ex && ex.exit_status, ex && ex.message, null) }))
                    .then(result => {
                        histories[q] = { atMs: Date.now(), counts: entry.counts, ...result };
                        const cell = throughputCells[q];
                        if (cell && cell.parentNode) cell.parentNode.replaceChild(throughputCell(doc, histories[q]), cell);
                        next(i + 1);
                    });
            };
            next(0);
        }

        function stopOverview() {
            if (overviewTimer !== null) clearTimeout(overviewTimer);
            overviewTimer = null;
        }

        // -- one queue
        function stopWatch() {
            // With a problem code the bridge kills the process (SIGTERM: watch ends between lines);
            // a plain close() only closes the channel and leaves `watch` writing into a pipe nobody reads.
            if (watchProc) watchProc.close("terminated");
            watchProc = null;
            watchQueue = null;
            lastCounts = null;
        }

        function startWatch(queue) {
            if (watchQueue === queue && watchProc) return;
            stopWatch();
            watchQueue = queue;
            progress = {};
            const proc = cockpit.spawn(["steadq", "--json", "watch", queue, "--interval", "1s"], spawnOptions(queue));
            watchProc = proc;
            proc.stream(lineReader(line => {
                const frame = parseFrame(line);
                if (!frame || watchProc !== proc) return;
                onFrame(queue, frame);
            }));
            proc.then(null, ex => {
                if (watchProc === proc && ex && ex.problem !== "terminated") reportFailure(queue, ex);
            });
        }

        function onFrame(queue, frame) {
            const counts = frameCounts(frame);
            $("queue-counts").textContent = countsText(counts);
            const paused = $("queue-paused");
            paused.textContent = pausedText(frame.paused);
            paused.hidden = !frame.paused;
            const note = $("queue-refresh");
            note.textContent = refreshNote(frame);
            note.hidden = note.textContent === "";
            progress = frame.progress || {};
            frameTimeNs = frame.time_ns ?? null;
            if (!sameCounts(counts, lastCounts)) {
                lastCounts = counts;
                refreshLists(queue);
            } else {
                // Only the progress cells change: redraw the running rows from the last listing.
                drawRunning(queue);
            }
        }

        let running = [];
        function drawRunning(queue) {
            const body = $("running");
            clear(body);
            for (const job of running) {
                // The Elapsed column: since the lease (show's in_state_since_ns), not ls's age since enqueue.
                const elapsed = elapsedSeconds(frameTimeNs, runningSince[job.job_id]);
                body.appendChild(jobRow(doc, { ...job, age_seconds: elapsed }, id => cockpit.location.go([queue, id]),
                    [["Cancel", j => act(queue, ["cancel", queue, j.job_id])]],
                    [progressCell(doc, progress[job.job_id])]));
            }
        }

        /** The ready/delayed/dead/running lists: one `ls` per state, only when the counts changed. */
        function refreshLists(queue) {
            if (listing) {
                relist = true;
                return;
            }
            listing = true;
            relist = false;
            const states = ["running", "ready", "delayed", "dead"];
            Promise.all(states.map(s => steadq(["ls", queue, s], queue))).then(lists => {
                if (watchQueue !== queue) return;
                const [run, ready, delayed, dead] = lists.map(l => (Array.isArray(l) ? oldestFirst(l).slice(0, LIST_LIMIT) : []));
                running = run;
                drawRunning(queue);
                readLeaseStarts(queue, run);
                const open = id => cockpit.location.go([queue, id]);
                const cancel = [["Cancel", j => act(queue, ["cancel", queue, j.job_id])]];
                for (const [id, jobs, actions] of [["ready", ready, cancel], ["delayed", delayed, cancel]]) {
                    const body = $(id);
                    clear(body);
                    for (const job of jobs) body.appendChild(jobRow(doc, job, open, actions));
                }
                const body = $("dead");
                clear(body);
                for (const job of dead) {
                    body.appendChild(jobRow(doc, job, open,
                        [["Requeue", j => act(queue, ["admin", "requeue", queue, j.job_id])]],
                        [el(doc, "td", { text: String(job.reason_name ?? job.reason ?? "") })]));
                }
            }, ex => reportFailure(queue, ex)).finally(() => {
                listing = false;
                if (relist && watchQueue === queue) refreshLists(queue);
            });
        }

        /** When each running job was leased (one `show --no-journal` per job not read yet, at most SHOW_RUNNING_LIMIT). */
        function readLeaseStarts(queue, jobs) {
            const ids = jobs.map(j => j.job_id);
            const known = {};
            for (const id of ids) if (runningSince[id] !== undefined) known[id] = runningSince[id];
            runningSince = known; // forget the jobs that stopped running
            const wanted = ids.filter(id => known[id] === undefined).slice(0, SHOW_RUNNING_LIMIT);
            Promise.all(wanted.map(id => steadq(["show", queue, id, "--no-journal"], queue).then(story => {
                if (story && story.state === "leased" && story.in_state_since_ns !== undefined) {
                    runningSince[id] = story.in_state_since_ns;
                }
            }, () => null))).then(() => {
                if (watchQueue === queue) drawRunning(queue);
            });
        }

        /** Run an action, then list again (a requeue may leave the counts where they were). */
        function act(queue, args) {
            return steadq(args, queue).then(() => {
                showMessage("");
                if (watchQueue === queue) refreshLists(queue);
            }, ex => reportFailure(queue, ex));
        }

        function askPurge(queue) {
            steadq(["admin", "purge", queue, "dead", "--dry-run"], queue).then(result => {
                const n = result && typeof result === "object" ? result.selected : "?";
                $("confirm-text").textContent = "Remove " + String(n) + " dead job(s) of " + queue +
                    " for good? This cannot be undone.";
                $("confirm").hidden = false;
                confirmAction = () => act(queue, ["admin", "purge", queue, "dead"]);
            }, ex => reportFailure(queue, ex));
        }

        // -- the queue's units
        /** The configured name of the queue argument (its units' instance), or null for a path. */
        function queueName(queue) {
            const entry = entries[queue];
            if (entry) return unitNames(entry.name).length ? entry.name : null;
            return unitNames(queue).length ? queue : null;
        }

        function drawUnits(queue) {
            const body = $("units");
            clear(body);
            const names = unitNames(queueName(queue));
            const control = unitControl(admin.allowed);
            const note = $("units-note");
            note.textContent = !names.length ? "This queue is named by its path: it has no units of its own."
                : control.reason;
            note.hidden = note.textContent === "";
            for (const unit of names) {
                body.appendChild(unitRow(doc, unit, unitProps[unit], control,
                    (verb, u) => unitAction(queue, verb, u), u => cockpit.jump(logsLocation(u))));
            }
        }

        /** The units' states (`systemctl show`; as root when the session may, which needs no D-Bus). */
        function readUnits(queue) {
            const names = unitNames(queueName(queue));
            if (!names.length) return;
            cockpit.spawn(["systemctl", "show", "--property=Id,ActiveState,SubState", "--", ...names],
                { err: "message", superuser: "try" }).then(
                out => parseUnitShow(out), () => ({})).then(props => {
                if (watchQueue !== queue) return;
                unitProps = props;
                drawUnits(queue);
            });
        }

        /** systemctl start/stop/restart of one of the queue's units, through Cockpit's superuser. */
        function unitAction(queue, verb, unit) {
            if (!["start", "stop", "restart"].includes(verb) || !unitNames(queueName(queue)).includes(unit)) return;
            cockpit.spawn(["systemctl", verb, "--", unit], { err: "message", superuser: "require" }).then(
                () => showMessage(""),
                ex => showMessage("systemctl " + verb + " " + unit + ": " +
                    (String((ex && ex.message) || "").trim().split("\n")[0] || "failed"), true))
                .then(() => readUnits(queue));
        }

        function startUnits(queue) {
            stopUnits();
            unitProps = {};
            drawUnits(queue);
            readUnits(queue);
            unitTimer = setInterval(() => readUnits(queue), UNIT_REFRESH_MS);
        }

        function stopUnits() {
            if (unitTimer !== null) clearInterval(unitTimer);
            unitTimer = null;
        }

        /** Show a queue's view again from the start (after switching it to administrative access). */
        function reopen(queue) {
            const path = cockpit.location.path;
            if (path[0] !== queue) return;
            if (path.length === 1) {
                stopWatch();
                startWatch(queue);
            } else if (path.length === 2) {
                showJob(queue, path[1]);
            }
        }

        // -- one job
        function showJob(queue, jobId) {
            $("job-title").textContent = queue + " / " + jobId;
            const box = $("job-story");
            clear(box);
            box.appendChild(el(doc, "p", { className: "note", text: "reading…" }));
            steadq(["show", queue, jobId], queue).then(story => {
                clear(box);
                box.appendChild(jobStory(doc, story));
            }, ex => {
                clear(box);
                return reportFailure(queue, ex);
            });
        }

        // -- navigation: [] all queues, [queue] one queue, [queue, job] one job
        function route() {
            const path = cockpit.location.path;
            showMessage("");
            $("confirm").hidden = true;
            $("overview").hidden = path.length !== 0;
            $("queue").hidden = path.length !== 1;
            $("job").hidden = path.length !== 2;
            if (path.length !== 1) stopUnits();
            if (path.length === 0) {
                stopWatch();
                if (overviewTimer === null) {
                    overviewTimer = 0;
                    refreshOverview();
                }
                return;
            }
            stopOverview();
            const queue = path[0];
            if (path.length === 1) {
                $("queue-name").textContent = queue;
                if (watchQueue !== queue) {
                    for (const id of ["running", "ready", "delayed", "dead"]) clear($(id));
                    $("queue-counts").textContent = "";
                    running = [];
                    runningSince = {};
                }
                startWatch(queue);
                startUnits(queue);
            } else {
                stopWatch();
                showJob(queue, path[1]);
            }
        }

        $("back-overview").addEventListener("click", () => cockpit.location.go([]));
        $("back-queue").addEventListener("click", () => cockpit.location.go([cockpit.location.path[0]]));
        $("pause").addEventListener("click", () => {
            const q = cockpit.location.path[0];
            const reason = $("pause-reason").value.trim();
            act(q, ["pause", q, ...(reason ? ["--reason", reason] : [])]);
        });
        $("resume").addEventListener("click", () => act(cockpit.location.path[0], ["resume", cockpit.location.path[0]]));
        $("purge").addEventListener("click", () => askPurge(cockpit.location.path[0]));
        $("confirm-yes").addEventListener("click", () => {
            $("confirm").hidden = true;
            if (confirmAction) confirmAction();
            confirmAction = null;
        });
        $("confirm-no").addEventListener("click", () => {
            $("confirm").hidden = true;
            confirmAction = null;
        });
        cockpit.addEventListener("locationchanged", route);
        admin.addEventListener("changed", () => {
            if (cockpit.location.path.length === 1) drawUnits(cockpit.location.path[0]);
        });
        // The queue names come from `list`: read it once before the first route, so a page opened
        // straight on a queue can still name its group.
        steadqList().then(d => {
            for (const entry of (d && d.queues) || []) entries[queueArg(entry)] = entry;
        }, () => null).finally(route);
    }

    return {
        EXIT_PERMISSION,
        formatAge,
        formatTimeNs,
        elapsedSeconds,
        pausedText,
        attemptText,
        failureText,
        unitsText,
        frameCounts,
        countsText,
        sameCounts,
        progressText,
        lineReader,
        parseFrame,
        isBucket,
        refreshNote,
        queueArg,
        ancestors,
        parseOutput,
        listFromFailure,
        oldestFirst,
        el,
        clear,
        queueRow,
        jobRow,
        progressCell,
        jobStory,
        sparkSeries,
        sparkPoints,
        sparkText,
        historyDue,
        unitNames,
        parseUnitShow,
        unitStateText,
        logsLocation,
        unitControl,
        sparkline,
        throughputCell,
        unitRow,
        HISTORY_MIN_MS,
        HISTORY_MAX_MS,
        start,
    };
}));
