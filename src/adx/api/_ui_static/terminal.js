// The dashboard's terminal: a shell on a real pseudo-terminal in a running Environment, over the data plane.
//
// execd streams a PTY command to its client only (a PTY command cannot be a background one), so the shell is a
// foreground `POST /v1/environments/{id}/commands` with "pty": {rows, cols}, read with fetch streaming: one
// NDJSON frame per chunk of output as it is produced, no polling delay. Keystrokes go to `.../stdin` (raw body),
// panel resizes to `.../resize`, and closing kills the command (`.../kill`) before hanging up. The renderer is a
// small screen buffer: enough of VT100/xterm (CR, LF, backspace, tabs, cursor moves, erase, scroll region,
// alternate screen) for a shell prompt and line editing; colours and other attributes are dropped.
"use strict";

const TERM_SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi";

// -- screen ------------------------------------------------------------------------------------------------------
class Screen {
  constructor(rows, cols) {
    this.rows = rows;
    this.cols = cols;
    this.lines = Array.from({ length: rows }, () => this.blank());
    this.x = 0;
    this.y = 0;
    this.top = 0; // scroll region, inclusive
    this.bottom = rows - 1;
    this.saved = [0, 0];
    this.appCursor = false; // DECCKM: arrows send ESC O x instead of ESC [ x
    this.pending = ""; // an escape sequence cut between two output chunks
    this.wrapNext = false; // the cursor sits past the last column: the next character wraps
  }

  blank() { return new Array(this.cols).fill(" "); }

  resize(rows, cols) {
    const lines = this.lines.map((l) => (l.length >= cols ? l.slice(0, cols) : l.concat(new Array(cols - l.length).fill(" "))));
    this.cols = cols;
    // Fewer rows: drop lines below the cursor first, then the oldest ones, so the prompt stays in view.
    while (lines.length > rows && lines.length - 1 > this.y) lines.pop();
    while (lines.length > rows) { lines.shift(); this.y = Math.max(0, this.y - 1); }
    while (lines.length < rows) lines.push(this.blank());
    this.lines = lines;
    this.rows = rows;
    this.top = 0;
    this.bottom = rows - 1;
    this.x = Math.min(this.x, cols - 1);
    this.y = Math.min(this.y, rows - 1);
  }

  scrollUp() {
    this.lines.splice(this.top, 1);
    this.lines.splice(this.bottom, 0, this.blank());
  }

  scrollDown() {
    this.lines.splice(this.bottom, 1);
    this.lines.splice(this.top, 0, this.blank());
  }

  lineFeed() {
    if (this.y === this.bottom) this.scrollUp();
    else if (this.y < this.rows - 1) this.y += 1;
  }

  put(ch) {
    if (this.wrapNext) { this.x = 0; this.lineFeed(); this.wrapNext = false; }
    this.lines[this.y][this.x] = ch;
    if (this.x === this.cols - 1) this.wrapNext = true; else this.x += 1;
  }

  write(text) {
    const s = this.pending + text;
    this.pending = "";
    let i = 0;
    while (i < s.length) {
      const ch = s[i];
      if (ch === "\x1b") {
        const used = this.escape(s, i);
        if (used === 0) { this.pending = s.slice(i); return; } // incomplete: wait for the next chunk
        i += used;
        continue;
      }
      i += 1;
      if (ch === "\r") { this.x = 0; this.wrapNext = false; }
      else if (ch === "\n" || ch === "\v" || ch === "\f") { this.lineFeed(); this.wrapNext = false; }
      else if (ch === "\b") { this.x = Math.max(0, this.x - 1); this.wrapNext = false; }
      else if (ch === "\t") { this.x = Math.min(this.cols - 1, (Math.floor(this.x / 8) + 1) * 8); }
      else if (ch >= " " && ch !== "\x7f") this.put(ch);
      // other control characters (BEL, NUL, SO/SI...) draw nothing
    }
  }

  // The length of the escape sequence at s[i] (0: not complete yet), applied to the screen.
  escape(s, i) {
    if (i + 1 >= s.length) return 0;
    const kind = s[i + 1];
    if (kind === "[") {
      let j = i + 2;
      while (j < s.length && !(s[j] >= "@" && s[j] <= "~")) j += 1;
      if (j >= s.length) return s.length - i > 64 ? s.length - i : 0; // a runaway sequence is dropped
      this.csi(s.slice(i + 2, j), s[j]);
      return j + 1 - i;
    }
    if (kind === "]" || kind === "P" || kind === "_" || kind === "^") { // OSC/DCS...: ends with BEL or ESC \
      for (let j = i + 2; j < s.length; j += 1) {
        if (s[j] === "\x07") return j + 1 - i;
        if (s[j] === "\x1b" && j + 1 < s.length && s[j + 1] === "\\") return j + 2 - i;
      }
      return s.length - i > 4096 ? s.length - i : 0;
    }
    if ("()*+#%".includes(kind)) return i + 2 < s.length ? 3 : 0; // character set selection: ignored
    if (kind === "7") this.saved = [this.x, this.y];
    else if (kind === "8") [this.x, this.y] = this.saved;
    else if (kind === "D") this.lineFeed();
    else if (kind === "E") { this.x = 0; this.lineFeed(); }
    else if (kind === "M") { if (this.y === this.top) this.scrollDown(); else this.y = Math.max(0, this.y - 1); }
    else if (kind === "c") { this.resize(this.rows, this.cols); this.clear(2); this.x = 0; this.y = 0; }
    return 2;
  }

  clear(mode) {
    const from = mode === 1 ? 0 : this.y + 1;
    const to = mode === 0 ? this.rows : this.y;
    if (mode === 2 || mode === 3) { for (let r = 0; r < this.rows; r += 1) this.lines[r] = this.blank(); return; }
    for (let r = from; r < to; r += 1) this.lines[r] = this.blank();
    this.eraseLine(mode);
  }

  eraseLine(mode) {
    const line = this.lines[this.y];
    const [from, to] = mode === 0 ? [this.x, this.cols] : mode === 1 ? [0, this.x + 1] : [0, this.cols];
    for (let c = from; c < to; c += 1) line[c] = " ";
  }

  csi(params, final) {
    const privateMode = params.startsWith("?");
    const args = params.replace(/^[?>=!]/, "").split(";").map((p) => parseInt(p, 10));
    const n = (k, d = 1) => (Number.isFinite(args[k]) && args[k] > 0 ? args[k] : d);
    const clampX = (x) => Math.max(0, Math.min(this.cols - 1, x));
    const clampY = (y) => Math.max(0, Math.min(this.rows - 1, y));
    this.wrapNext = false;
    switch (final) {
      case "A": this.y = Math.max(this.top, this.y - n(0)); break;
      case "B": case "e": this.y = Math.min(this.bottom, this.y + n(0)); break;
      case "C": case "a": this.x = clampX(this.x + n(0)); break;
      case "D": this.x = clampX(this.x - n(0)); break;
      case "E": this.x = 0; this.y = clampY(this.y + n(0)); break;
      case "F": this.x = 0; this.y = clampY(this.y - n(0)); break;
      case "G": case "`": this.x = clampX(n(0) - 1); break;
      case "d": this.y = clampY(n(0) - 1); break;
      case "H": case "f": this.y = clampY(n(0) - 1); this.x = clampX(n(1) - 1); break;
      case "J": this.clear(Number.isFinite(args[0]) ? args[0] : 0); break;
      case "K": this.eraseLine(Number.isFinite(args[0]) ? args[0] : 0); break;
      case "X": for (let c = this.x; c < Math.min(this.cols, this.x + n(0)); c += 1) this.lines[this.y][c] = " "; break;
      case "P": { const l = this.lines[this.y]; l.splice(this.x, n(0)); while (l.length < this.cols) l.push(" "); break; }
      case "@": { const l = this.lines[this.y]; l.splice(this.x, 0, ...new Array(n(0)).fill(" ")); l.length = this.cols; break; }
      case "L": for (let k = 0; k < n(0); k += 1) { this.lines.splice(this.bottom, 1); this.lines.splice(this.y, 0, this.blank()); } break;
      case "M": for (let k = 0; k < n(0); k += 1) { this.lines.splice(this.y, 1); this.lines.splice(this.bottom, 0, this.blank()); } break;
      case "S": for (let k = 0; k < n(0); k += 1) this.scrollUp(); break;
      case "T": for (let k = 0; k < n(0); k += 1) this.scrollDown(); break;
      case "r": this.top = clampY(n(0) - 1); this.bottom = clampY(n(1, this.rows) - 1); this.x = 0; this.y = 0; break;
      case "s": this.saved = [this.x, this.y]; break;
      case "u": [this.x, this.y] = this.saved; break;
      case "h": case "l":
        if (privateMode) {
          const on = final === "h";
          if (args.includes(1)) this.appCursor = on;
          if (args.includes(1049) || args.includes(47) || args.includes(1047)) { // alternate screen: start clean
            if (on) this.saved = [this.x, this.y];
            this.clear(2);
            if (!on) [this.x, this.y] = this.saved;
          }
        }
        break;
      default: break; // SGR (m, colours) and the rest: nothing to draw
    }
  }

  text() { return this.lines.map((l) => l.join("").trimEnd()).join("\n"); }
}

// -- keys -----------------------------------------------------------------------------------------------------
const KEYS = {
  Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", Delete: "\x1b[3~", Insert: "\x1b[2~",
  Home: "\x1b[H", End: "\x1b[F", PageUp: "\x1b[5~", PageDown: "\x1b[6~",
};
const ARROWS = { ArrowUp: "A", ArrowDown: "B", ArrowRight: "C", ArrowLeft: "D" };

// The bytes a key press sends to the terminal ("" for keys that send nothing, e.g. Shift alone).
function keyBytes(event, appCursor) {
  if (event.metaKey) return "";
  if (ARROWS[event.key]) return (appCursor ? "\x1bO" : "\x1b[") + ARROWS[event.key];
  if (KEYS[event.key]) return KEYS[event.key];
  if (event.key.length !== 1) return "";
  if (event.ctrlKey && !event.altKey) {
    const code = event.key.toUpperCase().charCodeAt(0);
    if (code >= 64 && code <= 95) return String.fromCharCode(code - 64); // Ctrl-A..Ctrl-_, Ctrl-C is \x03
    if (event.key === " ") return "\x00";
    return "";
  }
  return (event.altKey ? "\x1b" : "") + event.key;
}

// -- the panel ------------------------------------------------------------------------------------------------
class TerminalPanel {
  // api(method, path, body) answers JSON (for kill and resize); authHeader() gives the Authorization header.
  constructor(envId, elements, authHeader) {
    this.envId = envId;
    this.el = elements; // {panel, screen, title, status}
    this.authHeader = authHeader;
    this.base = `/v1/environments/${encodeURIComponent(envId)}/commands`;
    this.abort = new AbortController();
    this.commandId = null;
    this.sending = Promise.resolve(); // keystrokes go one request after another, in order
    this.closed = false;
    this.renderTimer = null;
    const [rows, cols] = this.fit();
    this.screen = new Screen(rows, cols);
    this.setSize(rows, cols);
  }

  setSize(rows, cols) {
    this.size = [rows, cols];
    this.el.panel.dataset.rows = String(rows);
    this.el.panel.dataset.cols = String(cols);
  }

  // Rows and columns of the screen element at its current size, from the width of one character.
  fit() {
    const probe = document.createElement("span");
    probe.textContent = "MMMMMMMMMM";
    this.el.screen.append(probe);
    const box = probe.getBoundingClientRect();
    probe.remove();
    const style = getComputedStyle(this.el.screen);
    const width = this.el.screen.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const height = this.el.screen.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
    const cols = Math.max(20, Math.floor(width / (box.width / 10 || 8)));
    // The line box, not the glyph box: rows are line-height apart.
    const rows = Math.max(5, Math.floor(height / (parseFloat(style.lineHeight) || box.height || 16)));
    return [Math.min(rows, 500), Math.min(cols, 500)];
  }

  headers(contentType) {
    return { Authorization: this.authHeader(), "Content-Type": contentType };
  }

  setStatus(text) { this.el.status.textContent = text; }

  async start() {
    const [rows, cols] = this.size;
    const body = { argv: ["/bin/sh", "-c", TERM_SHELL], pty: { rows, cols }, env: { TERM: "xterm" } };
    this.setStatus("starting…");
    let response;
    try {
      response = await fetch(this.base, {
        method: "POST", headers: this.headers("application/json"), body: JSON.stringify(body),
        cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer", signal: this.abort.signal,
      });
    } catch (err) {
      if (!this.closed) this.setStatus(`cannot start the terminal: ${err.message}`);
      return;
    }
    if (!response.ok) {
      const text = await response.text();
      let message = text.slice(0, 200);
      try { const e = JSON.parse(text).error; message = `${response.status} ${e.code}: ${e.message}`; } catch { /* not JSON */ }
      this.setStatus(`cannot start the terminal: ${message}`);
      return;
    }
    await this.read(response.body.getReader());
  }

  async read(reader) {
    const decoder = new TextDecoder();
    let buffered = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, nl);
          buffered = buffered.slice(nl + 1);
          if (line.trim()) this.frame(JSON.parse(line));
        }
      }
    } catch (err) {
      if (!this.closed) this.setStatus(`connection lost: ${err.message}`);
      return;
    }
    if (!this.closed && !this.el.status.textContent.startsWith("exited")) this.setStatus("connection ended");
  }

  frame(f) {
    if ("exitCode" in f) {
      this.setStatus(f.signal ? `exited (signal ${f.signal})` : `exited with status ${f.exitCode}`);
      this.commandId = null;
      this.el.panel.dataset.commandId = "";
    } else if ("stream" in f) {
      this.screen.write(f.data);
      this.scheduleRender();
    } else if ("id" in f) {
      this.commandId = f.id;
      this.el.panel.dataset.commandId = f.id;
      this.setStatus(`running (command ${f.id})`);
    }
  }

  scheduleRender() {
    if (this.renderTimer !== null) return;
    this.renderTimer = setTimeout(() => { this.renderTimer = null; this.render(); }, 16);
  }

  render() {
    const s = this.screen;
    const before = s.lines.slice(0, s.y).map((l) => `${l.join("").trimEnd()}\n`).join("");
    const row = s.lines[s.y];
    const after = s.lines.slice(s.y + 1).map((l) => `\n${l.join("").trimEnd()}`).join("").trimEnd();
    const cursor = document.createElement("span");
    cursor.className = "cursor";
    cursor.textContent = row[s.x];
    this.el.screen.replaceChildren(
      before + row.slice(0, s.x).join(""), cursor, row.slice(s.x + 1).join("").trimEnd() + after);
  }

  send(data) {
    if (!data || this.commandId === null || this.closed) return;
    const id = this.commandId;
    this.sending = this.sending.then(async () => {
      try {
        const r = await fetch(`${this.base}/${encodeURIComponent(id)}/stdin`, {
          method: "POST", headers: this.headers("application/octet-stream"), body: data,
          cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
        });
        if (!r.ok && !this.closed) this.setStatus(`input refused: ${r.status}`);
      } catch (err) {
        if (!this.closed) this.setStatus(`input lost: ${err.message}`);
      }
    });
  }

  onKey(event) {
    const data = keyBytes(event, this.screen.appCursor);
    if (!data) return;
    event.preventDefault(); // Tab, Backspace, Ctrl-W...: for the shell, not the page
    this.send(data);
  }

  async resized() {
    const [rows, cols] = this.fit();
    if (rows === this.size[0] && cols === this.size[1]) return;
    this.setSize(rows, cols);
    this.screen.resize(rows, cols);
    this.render();
    if (this.commandId === null) return;
    try {
      await fetch(`${this.base}/${encodeURIComponent(this.commandId)}/resize`, {
        method: "POST", headers: this.headers("application/json"), body: JSON.stringify({ rows, cols }),
        cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
      });
    } catch {
      // The shell keeps its old size; the next resize tries again.
    }
  }

  // Kill the shell (and its process group) first, then hang up: hanging up alone would also kill a foreground
  // command, but only once execd notices the client is gone.
  async close() {
    this.closed = true;
    const id = this.commandId;
    if (id !== null) {
      try {
        await this.sending;
        await fetch(`${this.base}/${encodeURIComponent(id)}/kill`, {
          method: "POST", headers: this.headers("application/json"), body: JSON.stringify({ signal: "SIGKILL" }),
          cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
        });
      } catch {
        // Unreachable: the abort below still ends the request, and execd kills a command whose client left.
      }
    }
    this.abort.abort();
  }
}

// -- wiring -------------------------------------------------------------------------------------------------------
const terminal = { current: null, observer: null, resizeTimer: null };

// Open a terminal on envId in the panel (closing the one open before).
async function openTerminal(envId, authHeader) {
  if (terminal.current) await closeTerminal();
  const panel = document.getElementById("terminal");
  const elements = {
    panel, screen: document.getElementById("term-screen"),
    title: document.getElementById("term-title"), status: document.getElementById("term-status"),
  };
  elements.title.textContent = envId;
  elements.screen.replaceChildren();
  panel.dataset.env = envId;
  panel.dataset.commandId = "";
  panel.hidden = false;
  const t = new TerminalPanel(envId, elements, authHeader);
  terminal.current = t;
  elements.screen.focus();
  terminal.observer = new ResizeObserver(() => {
    clearTimeout(terminal.resizeTimer);
    terminal.resizeTimer = setTimeout(() => { if (terminal.current === t) t.resized(); }, 100);
  });
  terminal.observer.observe(elements.screen);
  t.start();
}

async function closeTerminal() {
  const t = terminal.current;
  if (!t) return;
  terminal.current = null;
  if (terminal.observer) terminal.observer.disconnect();
  terminal.observer = null;
  const panel = document.getElementById("terminal");
  await t.close();
  if (!terminal.current) { panel.hidden = true; panel.dataset.env = ""; panel.dataset.commandId = ""; }
}

document.addEventListener("DOMContentLoaded", () => {
  const screen = document.getElementById("term-screen");
  screen.addEventListener("keydown", (event) => { if (terminal.current) terminal.current.onKey(event); });
  screen.addEventListener("paste", (event) => {
    if (!terminal.current) return;
    event.preventDefault();
    terminal.current.send(event.clipboardData.getData("text").replace(/\r?\n/g, "\r"));
  });
  document.getElementById("term-close").addEventListener("click", closeTerminal);
  window.addEventListener("pagehide", () => { if (terminal.current) terminal.current.close(); });
});
