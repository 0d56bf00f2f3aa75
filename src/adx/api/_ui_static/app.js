// The ADX dashboard: plain DOM code over the JSON API (no framework, no build step). The key lives in this tab's
// sessionStorage only and travels as an Authorization header; it is never put in a URL.
"use strict";

const KEY = "adx.key";
const KIND = "adx.kind"; // "tenant" or "admin"
const ADMIN_PREFIX = "adxa_";
const REFRESH_MS = 2000;
const SPARK_POINTS = 30; // samples kept per Environment for the usage sparklines
const STATS_PER_REFRESH = 20; // at most this many running Environments are sampled per refresh

const $ = (id) => document.getElementById(id);
const state = {
  page: "environments", timer: null, busy: false, again: false, usage: new Map(), armedDelete: null,
  inflight: new Map(), // Environment ID -> the action requested and not yet answered
};

// -- API ----------------------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  toString() {
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

async function api(method, path, body, key) {
  const headers = { Authorization: `Bearer ${key || sessionStorage.getItem(KEY) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
    });
  } catch (err) {
    throw new ApiError(0, "unreachable", `cannot reach the API at ${location.origin}: ${err.message}`);
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) {
    const e = data && data.error ? data.error : { code: "http_error", message: text.slice(0, 200) || response.statusText };
    throw new ApiError(response.status, e.code, e.message);
  }
  return data;
}

// -- formatting ------------------------------------------------------------------------------------------------
const UNITS = [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]];
function bytes(n) {
  for (const [unit, size] of UNITS) if (n >= size) return `${+(n / size).toFixed(1)}${unit}`;
  return `${n}B`;
}
function cores(millis) { return `${+(millis / 1000).toFixed(3)} CPU`; }
function resources(r) { return r ? `${cores(r.cpuMillis)}, ${bytes(r.memoryBytes)} mem, ${bytes(r.diskBytes)} disk` : ""; }
function duration(seconds) {
  let s = Math.round(seconds);
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    const n = Math.floor(s / size);
    if (n) { parts.push(`${n}${unit}`); s -= n * size; }
  }
  return parts.slice(0, 2).join("") || "0s";
}
const TIME = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "long" });
function when(unixSeconds) { return unixSeconds ? TIME.format(new Date(unixSeconds * 1000)) : "never"; }
function isoWhen(iso) { return iso ? TIME.format(new Date(iso)) : ""; }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function showError(id, err) {
  const box = $(id);
  if (err) { box.textContent = String(err); box.hidden = false; } else { box.textContent = ""; box.hidden = true; }
}

// -- sign in / out --------------------------------------------------------------------------------------------
async function signIn(event) {
  event.preventDefault();
  const key = $("key").value.trim();
  const kind = key.startsWith(ADMIN_PREFIX) ? "admin" : "tenant";
  $("sign-in").disabled = true;
  try {
    // Check the key before keeping it: a wrong one is refused here, with the API's own reason.
    await api("GET", kind === "admin" ? "/v1/admin/cluster" : "/v1/environments", undefined, key);
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(KIND, kind);
    $("key").value = "";
    showError("login-error", null);
    enter();
  } catch (err) {
    showError("login-error", `Sign-in refused: ${err}`);
  } finally {
    $("sign-in").disabled = false;
  }
}

function signOut() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(KIND);
  clearTimeout(state.timer);
  closeTerminal();
  state.usage.clear();
  $("login").hidden = false;
  $("nav").hidden = true;
  $("who").hidden = true;
  for (const p of document.querySelectorAll(".page")) p.hidden = true;
}

function enter() {
  const kind = sessionStorage.getItem(KIND);
  $("login").hidden = true;
  $("nav").hidden = false;
  $("who").hidden = false;
  $("who-text").textContent = kind === "admin" ? "admin" : "tenant key";
  $("who").dataset.kind = kind;
  route();
}

// -- pages ------------------------------------------------------------------------------------------------------
function route() {
  if (!sessionStorage.getItem(KEY)) return signOut();
  const wanted = location.hash.replace("#", "");
  const fallback = sessionStorage.getItem(KIND) === "admin" ? "nodes" : "environments";
  state.page = ["environments", "nodes", "runs"].includes(wanted) ? wanted : fallback;
  for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== `page-${state.page}`;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.dataset.page === state.page);
  refresh();
}

async function refresh() {
  if (!sessionStorage.getItem(KEY)) return;
  if (state.busy) { state.again = true; return; } // one refresh at a time; run again once it ends
  state.busy = true;
  clearTimeout(state.timer);
  try {
    if (state.page === "environments") await refreshEnvironments();
    else if (state.page === "nodes") await refreshNodes();
    else await refreshRuns();
  } finally {
    state.busy = false;
  }
  clearTimeout(state.timer);
  if (sessionStorage.getItem(KEY)) state.timer = setTimeout(refresh, state.again ? 0 : REFRESH_MS);
  state.again = false;
}

// -- Environments ---------------------------------------------------------------------------------------------
async function refreshEnvironments() {
  const tenant = sessionStorage.getItem(KIND) === "tenant";
  $("envs-unavailable").hidden = tenant;
  $("envs-body").hidden = !tenant;
  if (!tenant) return;
  let list;
  try {
    list = (await api("GET", "/v1/environments")).environments;
  } catch (err) {
    return showError("env-error", `Cannot list Environments: ${err}`);
  }
  await sampleUsage(list.filter((e) => e.state === "running").slice(0, STATS_PER_REFRESH));
  renderEnvironments(list);
}

async function sampleUsage(running) {
  await Promise.all(running.map(async (e) => {
    try {
      const s = await api("GET", `/v1/environments/${encodeURIComponent(e.id)}/stats`);
      const series = state.usage.get(e.id) || { cpu: [], memory: [], last: 0 };
      if (s.sampledAt !== series.last) { // one point per node sample, not per poll
        series.last = s.sampledAt;
        series.cpu.push(s.cpuPercent ?? 0);
        series.memory.push(s.memoryBytes);
        series.memLimit = s.memoryLimitBytes;
        for (const k of ["cpu", "memory"]) if (series[k].length > SPARK_POINTS) series[k].shift();
      }
      state.usage.set(e.id, series);
    } catch {
      // Not running any more (409) or the node is away: the sparkline keeps its last points.
    }
  }));
}

function sparkline(points, max, label) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 60 16");
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const title = document.createElementNS(NS, "title");
  title.textContent = label;
  svg.append(title);
  svg.setAttribute("data-points", String(points.length));
  if (points.length) {
    const top = Math.max(max || 0, ...points, 1e-9);
    const xy = points.map((v, i) => [(i * 60) / (SPARK_POINTS - 1), 15 - (v / top) * 14]);
    if (xy.length === 1) { // one sample so far: a dot where the line will start
      const dot = document.createElementNS(NS, "circle");
      dot.setAttribute("cx", "1.5");
      dot.setAttribute("cy", xy[0][1].toFixed(1));
      dot.setAttribute("r", "1.5");
      svg.append(dot);
    } else {
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "));
      svg.append(line);
    }
  }
  return svg;
}

function usageCells(env) {
  const u = state.usage.get(env.id);
  if (!u || !u.cpu.length) return [el("td", { class: "usage" }, "–"), el("td", { class: "usage" }, "–")];
  const cpu = u.cpu[u.cpu.length - 1];
  const mem = u.memory[u.memory.length - 1];
  return [
    el("td", { class: "usage" }, sparkline(u.cpu, 100, `CPU ${cpu.toFixed(1)}% of its limit`), ` ${cpu.toFixed(0)}%`),
    el("td", { class: "usage" }, sparkline(u.memory, u.memLimit, `memory ${bytes(mem)}`), ` ${bytes(mem)}`),
  ];
}

function idleTimer(lc) {
  if (!lc || !lc.idleTimeoutSeconds) return "never";
  return `${lc.idleAction} after ${duration(lc.idleTimeoutSeconds)} idle`;
}

function lifetime(env) {
  if (!env.expiresAt) return "none";
  const action = env.lifecycle && env.lifecycle.lifetimeAction ? env.lifecycle.lifetimeAction : "delete";
  return `${action} at ${when(env.expiresAt)}`;
}

const ACTIONS = {
  pause: (s) => s === "running",
  resume: (s) => s === "paused",
  delete: (s) => s !== "deleting" && s !== "deleted",
  terminal: (s) => s === "running", // a shell on a PTY (terminal.js)
};

function renderEnvironments(list) {
  const body = $("envs").querySelector("tbody");
  const rows = list.map((env) => {
    const buttons = Object.entries(ACTIONS).map(([action, allowed]) => {
      const armed = action === "delete" && state.armedDelete === env.id;
      return el("button", {
        type: "button", "data-action": action, "data-env": env.id,
        disabled: !allowed(env.state) || state.inflight.has(env.id),
        textContent: armed ? "Confirm delete" : action[0].toUpperCase() + action.slice(1),
        class: armed ? "danger" : "",
      });
    });
    const stateCell = el("td", {}, el("span", { class: `state state-${env.state}`, "data-state": env.state }, env.state));
    if (state.inflight.has(env.id)) stateCell.append(el("div", { class: "detail" }, `${state.inflight.get(env.id)} requested…`));
    if (env.lastError) stateCell.append(el("div", { class: "detail" }, env.lastError));
    return el("tr", { "data-env-id": env.id },
      el("td", { class: "mono" }, env.id),
      stateCell,
      el("td", {}, env.node || "–"),
      el("td", {}, idleTimer(env.lifecycle)),
      el("td", {}, lifetime(env)),
      ...usageCells(env),
      el("td", { class: "actions" }, ...buttons));
  });
  body.replaceChildren(...rows);
  $("envs-empty").hidden = list.length > 0;
  const live = new Set(list.map((e) => e.id));
  for (const id of state.usage.keys()) if (!live.has(id)) state.usage.delete(id);
}

async function envAction(event) {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const { action, env } = button.dataset;
  if (action === "terminal") return openTerminal(env, () => `Bearer ${sessionStorage.getItem(KEY) || ""}`);
  if (action === "delete" && state.armedDelete !== env) {
    // Two steps instead of a confirm() dialog: a delete cannot be undone.
    state.armedDelete = env;
    button.textContent = "Confirm delete";
    button.classList.add("danger");
    setTimeout(() => { if (state.armedDelete === env) state.armedDelete = null; }, 5000);
    return;
  }
  state.armedDelete = null;
  state.inflight.set(env, action);
  for (const b of document.querySelectorAll(`button[data-env="${CSS.escape(env)}"]`)) b.disabled = true;
  button.closest("tr").querySelector("td:nth-child(2)").append(el("div", { class: "detail" }, `${action} requested…`));
  showError("env-error", null);
  const path = `/v1/environments/${encodeURIComponent(env)}`;
  try {
    if (action === "delete") await api("DELETE", path);
    else await api("POST", `${path}/${action}`); // pause and resume answer once done
  } catch (err) {
    showError("env-error", `${action} ${env}: ${err}`);
  } finally {
    state.inflight.delete(env);
  }
  refresh();
}

function createBody() {
  const cpu = Number($("create-cpu").value);
  const memory = Number($("create-memory").value);
  const idle = Number($("create-idle").value || 0);
  const lifetimeValue = $("create-lifetime").value.trim();
  const argv = $("create-entrypoint").value.trim();
  const body = {
    image: $("create-image").value.trim(),
    resources: { cpuMillis: Math.round(cpu * 1000), memoryBytes: Math.round(memory * 2 ** 20) },
    lifecycle: { idleTimeoutSeconds: idle, idleAction: $("create-idle-action").value },
  };
  if (argv) body.entrypoint = argv.split(/\s+/);
  if (lifetimeValue) body.lifecycle.lifetimeSeconds = Number(lifetimeValue);
  return body;
}

async function create(event) {
  event.preventDefault();
  $("create").disabled = true;
  showError("create-error", null);
  try {
    // The server validates the whole spec and names the field it refuses (e.g. resources.cpuMillis).
    await api("POST", "/v1/environments", createBody());
  } catch (err) {
    showError("create-error", `Create refused: ${err}`);
  } finally {
    $("create").disabled = false;
  }
  refresh();
}

// -- Nodes ------------------------------------------------------------------------------------------------------
async function refreshNodes() {
  const admin = sessionStorage.getItem(KIND) === "admin";
  $("nodes-unavailable").hidden = admin;
  $("nodes").hidden = !admin;
  $("cluster-summary").hidden = !admin;
  if (!admin) return;
  let cluster;
  try {
    cluster = await api("GET", "/v1/admin/cluster");
  } catch (err) {
    return showError("nodes-error", `Cannot read the cluster: ${err}`);
  }
  showError("nodes-error", null);
  const counts = Object.entries(cluster.environments).map(([s, n]) => `${n} ${s}`).join(", ") || "none";
  $("cluster-summary").replaceChildren(
    el("p", {}, `${cluster.nodes.length} node(s); Environments: ${counts}; leader ${cluster.leader}`));
  const rows = cluster.nodes.map((n) => {
    const admission = n.cordoned ? "cordoned" : n.admissionOpen ? "open" : `closed${n.admissionReason ? `: ${n.admissionReason}` : ""}`;
    const envs = Object.entries(n.environments || {}).map(([s, c]) => `${c} ${s}`).join(", ") || "none";
    return el("tr", { "data-node": n.name },
      el("td", {}, n.name), el("td", { class: "mono" }, n.address),
      el("td", {}, el("span", { class: `health health-${n.health}` }, n.health)),
      el("td", { class: "admission" }, admission),
      el("td", {}, resources(n.capacity)), el("td", {}, resources(n.reserved)), el("td", {}, resources(n.allocatable)),
      el("td", {}, envs), el("td", {}, when(n.lastHeartbeatAt)));
  });
  $("nodes").querySelector("tbody").replaceChildren(...rows);
}

// -- Agent runs --------------------------------------------------------------------------------------------------
async function refreshRuns() {
  const tenant = sessionStorage.getItem(KIND) === "tenant";
  const unavailable = $("runs-unavailable");
  if (!tenant) {
    unavailable.textContent = "Agent runs belong to a tenant: sign in with a tenant's API key to see them.";
    unavailable.hidden = false;
    $("runs").hidden = true;
    return;
  }
  let page;
  try {
    page = await api("GET", "/v1/agent-runs?limit=100");
  } catch (err) {
    $("runs").hidden = true;
    $("runs-empty").hidden = true;
    if (err.status === 503 || err.status === 404) {
      unavailable.textContent = `Agent runs are not available on this API server: ${err.message}`;
      unavailable.hidden = false;
    } else {
      showError("runs-error", `Cannot list agent runs: ${err}`);
    }
    return;
  }
  unavailable.hidden = true;
  showError("runs-error", null);
  $("runs").hidden = false;
  const rows = page.runs.map((r) => el("tr", { "data-run": r.runId, class: "clickable" },
    el("td", { class: "mono" }, el("button", { type: "button", class: "link", "data-run": r.runId, textContent: r.runId })),
    el("td", {}, `${r.graph}@${r.graphVersion}`),
    el("td", {}, el("span", { class: `status status-${r.status}` }, r.status)),
    el("td", {}, isoWhen(r.createdAt)), el("td", {}, isoWhen(r.updatedAt)),
    el("td", {}, `${r.usage.nodeCommits} steps, ${r.usage.modelCalls} model / ${r.usage.toolCalls} tool calls`)));
  $("runs").querySelector("tbody").replaceChildren(...rows);
  $("runs-empty").hidden = page.runs.length > 0;
}

async function showHistory(event) {
  const button = event.target.closest("button[data-run]");
  if (!button) return;
  const run = button.dataset.run;
  try {
    const history = await api("GET", `/v1/agent-runs/${encodeURIComponent(run)}/history`);
    $("run-history-id").textContent = run;
    $("run-history").querySelector("tbody").replaceChildren(...history.events.map((e) => el("tr", {},
      el("td", {}, isoWhen(e.createdAt)), el("td", {}, e.kind), el("td", {}, String(e.checkpointSeq)),
      el("td", {}, e.fence === null ? "" : String(e.fence)), el("td", {}, e.node || ""))));
    $("run-history").hidden = false;
    showError("runs-error", null);
  } catch (err) {
    showError("runs-error", `Cannot read the history of ${run}: ${err}`);
  }
}

// -- start ------------------------------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("create-form").addEventListener("submit", create);
  $("envs").addEventListener("click", envAction);
  $("runs").addEventListener("click", showHistory);
  window.addEventListener("hashchange", route);
  if (sessionStorage.getItem(KEY)) enter(); else signOut();
});
