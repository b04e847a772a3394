// The SQL editor: statements run on a WebSocket session of their own; rows are shown as they arrive, and a
// SUBSCRIBE is a live table (its changes consolidated into the current rows) until it is cancelled.

import { h, replace, cellText, errorBox } from "../dom.js";
import { SqlSocket } from "../sql.js";

const TEXT_KEY = "headrace.console.editor";
const MAX_SHOWN_ROWS = 1000; // a result's rows past this are counted, not drawn

export function editorPage(root) {
  const editor = h("textarea", { id: "sql-input", rows: 8, spellcheck: "false",
    placeholder: "SELECT * FROM headrace_internal.webhook_counters;" }, sessionStorage.getItem(TEXT_KEY) ?? "");
  const run = h("button", { id: "sql-run", type: "button", onclick: () => execute() }, "Run (Ctrl+Enter)");
  const cancel = h("button", { id: "sql-cancel", type: "button", disabled: true, onclick: () => stop() }, "Cancel");
  const status = h("span", { id: "sql-status", class: "muted" });
  const results = h("div", { id: "sql-results" });
  replace(root, h("h1", {}, "SQL"), editor, h("div", { class: "toolbar" }, run, cancel, status), results);
  editor.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); execute(); }
  });
  editor.addEventListener("input", () => sessionStorage.setItem(TEXT_KEY, editor.value));

  let socket = null;
  let running = false;

  async function execute() {
    if (running) stop();
    const text = editor.value.trim();
    if (!text) return;
    replace(results);
    socket = socket || new SqlSocket();
    const session = socket;
    running = true; // Run stays enabled: running again cancels this statement first (a SUBSCRIBE runs until then)
    cancel.disabled = false;
    replace(status, "running…");
    const started = performance.now();
    let current = null;
    try {
      await session.stream(text, {
        starting: (info) => { current = new ResultBlock(results, info.is_streaming); },
        columns: (columns) => current?.setColumns(columns),
        row: (values) => current?.add(values),
        complete: (tag) => { (current || new ResultBlock(results, false)).complete(tag); current = null; },
        error: (error) => {
          current?.flush();
          current = null;
          if (socket === session) results.append(errorBox(error)); // else: cancelled, the socket closed on purpose
        },
        notice: (notice) => results.append(h("p", { class: "notice" }, `${notice.severity}: ${notice.message}`)),
      });
      if (socket === session) replace(status, `done in ${((performance.now() - started) / 1000).toFixed(2)} s`);
    } catch (error) {
      results.append(errorBox(error));
      replace(status, "");
    } finally {
      current?.flush();
      if (socket === session) { running = false; cancel.disabled = true; }
    }
  }

  // Closing the session's socket cancels what it runs (a SUBSCRIBE streams until then); the next run opens another.
  function stop() {
    socket?.close();
    socket = null;
    running = false;
    cancel.disabled = true;
    replace(status, "cancelled");
  }

  return { refresh: null, dispose: () => socket?.close() };
}

class ResultBlock {
  constructor(parent, streaming) {
    this.streaming = streaming;
    this.columns = [];
    this.count = 0;
    this.pending = [];
    this.live = new Map(); // SUBSCRIBE: data columns (JSON) -> multiplicity
    this.updates = 0;
    this.caption = h("p", { class: "result-caption" });
    this.body = h("tbody", {});
    this.head = h("thead", {});
    this.node = h("div", { class: streaming ? "result live" : "result" }, this.caption,
      h("table", { class: "grid", "data-live": streaming ? "true" : "false" }, this.head, this.body));
    parent.append(this.node);
    this.scheduled = false;
  }

  setColumns(columns) {
    this.columns = columns.map((column) => column.name);
    // SUBSCRIBE's rows: hr_timestamp, [hr_progressed], hr_diff, then the data columns
    this.dataFrom = this.streaming ? this.columns.indexOf("hr_diff") + 1 : 0;
    const shown = this.streaming ? ["count", ...this.columns.slice(this.dataFrom)] : this.columns;
    replace(this.head, h("tr", {}, shown.map((name) => h("th", {}, name))));
    this.caption.textContent = this.streaming ? "SUBSCRIBE: waiting for the snapshot…" : "";
  }

  add(values) {
    if (this.streaming) {
      const progressed = this.columns.includes("hr_progressed") && values[this.columns.indexOf("hr_progressed")];
      if (!progressed) {
        const key = JSON.stringify(values.slice(this.dataFrom));
        const count = (this.live.get(key) || 0) + Number(values[this.dataFrom - 1]);
        if (count === 0) this.live.delete(key);
        else this.live.set(key, count);
        this.updates += 1;
      }
    } else {
      this.count += 1;
      if (this.count <= MAX_SHOWN_ROWS) this.pending.push(values);
    }
    this.schedule();
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.scheduled = false;
    if (this.streaming) {
      const rows = [...this.live.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      replace(this.body, rows.map(([key, count]) => h("tr", { class: "live-row" },
        h("td", { class: "num" }, String(count)), JSON.parse(key).map((value) => h("td", {}, cellText(value))))));
      this.caption.textContent = `SUBSCRIBE: ${this.live.size} rows, ${this.updates} changes, ` +
        `last at ${new Date().toLocaleTimeString()} (live until cancelled)`;
      this.caption.setAttribute("data-updates", String(this.updates));
      return;
    }
    for (const values of this.pending.splice(0)) this.body.append(h("tr", {}, values.map((value) => h("td", {}, cellText(value)))));
    if (!this.done) this.caption.textContent = `${this.count} rows${this.count > MAX_SHOWN_ROWS ? ` (first ${MAX_SHOWN_ROWS} shown)` : ""}…`;
  }

  complete(tag) {
    this.flush();
    this.done = true;
    this.caption.textContent = this.count > MAX_SHOWN_ROWS ? `${tag} (first ${MAX_SHOWN_ROWS} rows shown)` : tag;
    this.caption.setAttribute("data-tag", tag);
    if (!this.columns.length) this.node.querySelector("table").remove();
  }
}
