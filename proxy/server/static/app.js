// loopwarden's page: reads the same JSON API as the CLI. Everything that comes from the log (tool
// arguments, results, repeated text, session ids, judge reasoning) is set as text, never as markup.
"use strict";

const TYPES = ["tool_call", "tool_cycle", "tool_error", "reply", "content", "llm"];
const REFRESH_MS = 10000;
const $ = (id) => document.getElementById(id);
let view = "overview";
let openSession = null;
let scrollToSession = false;  // the next timeline shown is scrolled into view (a click, or `#open=`)

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "swatch") node.style.setProperty("--swatch", `var(--${value})`);
    else node[key] = value;
  }
  for (const child of children) node.append(child);  // strings become text nodes
  return node;
}

function token() { return sessionStorage.getItem("loopwarden-token") || ""; }

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}), ...(token() ? { Authorization: `Bearer ${token()}` } : {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401 || response.status === 403) {
    const body = await response.json().catch(() => ({}));
    throw Object.assign(new Error(body.error ? body.error.message : response.statusText), { status: response.status });
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
  }
  return response.json();
}

function showOnly(section) {
  for (const id of ["login", "overview", "sessions"]) $(id).hidden = id !== section;
  $("tabs").hidden = section === "login";
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.view === section);
  }
}

function askForToken(message) {
  showOnly("login");
  $("login-error").textContent = message || "";
}

function time(iso) { return iso ? new Date(iso).toLocaleString() : ""; }

// As the CLI shows it: a warning past the allowed ones (weak evidence only) must not read as a stop.
function episodeLabel(d) {
  if (d.action === "stopped") return "stop";
  return d.episode > d.episode_limit ? `${d.episode} (past ${d.episode_limit})` : `${d.episode}/${d.episode_limit}`;
}
// How strong the evidence was: strong evidence may stop a task, weak evidence only warns, judged is the judge's.
function strengthLabel(d) { return d.strength || (d.detail && d.detail.strength) || ""; }

function evidence(detail) {
  return describe(detail || {}).replaceAll("\u0000", "…");  // a masked run, in rows logged before it was shown so
}

function describe(detail) {
  if (detail.repeated !== undefined) {
    const where = detail.channel ? ` (in the ${detail.channel})` : "";  // a chant in the model's reasoning
    return `"${detail.repeated}" ×${detail.occurrences || ""}${where}`;
  }
  if (detail.cycle) {
    const args = detail.cycle_arguments || [];
    return detail.cycle.map((name, i) => `${name} ${args[i] || ""}`).join(" → ");
  }
  if (detail.tool !== undefined) {
    let text = `${detail.tool} ${detail.arguments || ""}`;
    if (detail.error) text += ` → ${detail.error}`;
    else if (detail.result) text += ` → ${detail.result}`;
    return text;
  }
  if (detail.confidence !== undefined) return `judge ${detail.confidence}: ${detail.analysis || ""}`;
  return "";
}

function query(extra = {}) {
  const params = new URLSearchParams({ since: $("since").value, ...extra });
  for (const [name, id] of [["type", "type"], ["action", "action"], ["mark", "mark"], ["session", "session-filter"]]) {
    if ($(id).value) params.set(name, $(id).value.trim());
  }
  return params.toString();
}

// The share of marked detections people said were not loops: "2 of 5" per type or agent, "" when none marked.
function notLoops(counts) {
  const marked = counts.loop + counts.not_a_loop;
  return marked ? `${counts.not_a_loop} of ${marked}` : "";
}

function markedCard(stats) {
  const total = { loop: 0, not_a_loop: 0 };
  for (const counts of Object.values(stats.marked)) { total.loop += counts.loop; total.not_a_loop += counts.not_a_loop; }
  const marked = total.loop + total.not_a_loop;
  const share = marked ? `${Math.round((total.not_a_loop / marked) * 100)}%` : "–";
  const parts = [...TYPES.map((t) => [t, stats.marked[t]]), ...Object.entries(stats.marked_by_agent)]
    .filter(([, counts]) => notLoops(counts)).map(([name, counts]) => `${name} ${notLoops(counts)}`);
  return card("marked not a loop", share, marked ? parts.join(" · ") : "no detection marked yet");
}

// Two buttons a detection: a person's word on it. A stop said not to be a loop lets its task go on.
function markButtons(d) {
  const buttons = [["loop", "loop"], ["not_a_loop", "not a loop"]].map(([verdict, label]) => {
    const button = el("button", { type: "button", class: d.mark === verdict ? "mark chosen" : "mark",
                                  title: verdict === "loop" ? "it was a loop" : "it was healthy work" }, label);
    button.addEventListener("click", async (event) => {
      event.stopPropagation();
      await api(`/loopwarden/api/detections/${d.id}/mark`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ verdict }) });
      const resumed = verdict === "not_a_loop" && d.action === "stopped" && d.enforced !== false;
      $("status").textContent = `detection ${d.id} marked ${label}` + (resumed ? ": its task goes on" : "");
      await loadOverview();
    });
    return button;
  });
  return el("td", { class: "marks" }, ...buttons);
}

function card(label, value, sub) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label),
            el("div", { class: "value" }, String(value)), el("div", { class: "sub" }, sub || ""));
}

async function loadOverview() {
  const since = new URLSearchParams({ since: $("since").value }).toString();
  const [stats, series, recent] = await Promise.all([
    api(`/loopwarden/api/stats?${since}`),
    api(`/loopwarden/api/timeline?${query({ buckets: 48 })}`),
    api(`/loopwarden/api/detections?${query({ limit: 50 })}`),
  ]);
  const rate = stats.recovery_rate === null ? "–" : `${Math.round(stats.recovery_rate * 100)}%`;
  const recounting = stats.complete === false || series.complete === false
    ? [el("div", { class: "card notice" }, "The figures are being recounted from the log: they are not whole yet.")]
    : [];
  $("cards").replaceChildren(
    ...recounting,
    card("detections", stats.detections, TYPES.map((t) => `${t} ${stats.by_type[t]}`).join(" · ")),
    card("actions", `${stats.by_action.warned} / ${stats.by_action.stopped} / ${stats.by_action.cut}`,
         // A chant found once its task had ended (the person wrote next) is counted only when there is one.
         "warned / stopped / cut" + (stats.by_action.late ? ` · ${stats.by_action.late} found too late to act on` : "")),
    card("sessions affected", stats.sessions_affected),
    card("recovery rate", rate, `${stats.recovered_tasks} of ${stats.warned_tasks} warned tasks moved on`),
    card("tokens saved", stats.tokens_saved_estimate.toLocaleString(), "estimate, a lower bound"),
    card("judge checks", stats.judge_checks, `${stats.judge_tokens.toLocaleString()} tokens`),
    card("observed, not enforced", stats.observed.detections,
         `would have stopped ${stats.observed.would_have_stopped_tasks} tasks`),
    markedCard(stats),
  );
  drawChart(series);
  $("recent").tBodies[0].replaceChildren(...recent.data.map((d) => {
    const row = el("tr", { class: "clickable" },
      el("td", {}, time(d.created_at)), el("td", {}, d.session_id), el("td", {}, d.model || ""),
      el("td", {}, el("span", { class: "badge", swatch: d.type }, d.type)),
      el("td", {}, d.action + (d.enforced === false ? " (observed)" : "")), el("td", {}, episodeLabel(d)),
      el("td", {}, strengthLabel(d)),
      el("td", { class: "evidence", title: evidence(d.detail) }, evidence(d.detail)), markButtons(d));
    row.addEventListener("click", () => showSession(d.session_id));
    return row;
  }));
  if (!recent.data.length) {
    $("recent").tBodies[0].replaceChildren(el("tr", {}, el("td", { colSpan: 9, class: "muted" }, "no detections")));
  }
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  return node;
}

function drawChart(series) {
  const width = 960, height = 180, left = 30, bottom = 18;
  const totals = Array.from({ length: series.buckets }, (_, i) => TYPES.reduce((s, t) => s + series.series[t][i], 0));
  const top = Math.max(1, ...totals);
  const bar = (width - left) / series.buckets;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "detections over time" });
  chart.append(svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, stroke: "#e4e7ec" }));
  const scaleLabel = svg("text", { x: 2, y: 12, "font-size": 11, fill: "#667085" });
  scaleLabel.textContent = String(top);
  chart.append(scaleLabel);
  for (let i = 0; i < series.buckets; i++) {
    let y = height - bottom;
    for (const type of TYPES) {
      const count = series.series[type][i];
      if (!count) continue;
      const h = (count / top) * (height - bottom - 16);
      y -= h;
      const rect = svg("rect", { x: left + i * bar + 1, y, width: Math.max(1, bar - 2), height: h,
                                 fill: getComputedStyle(document.body).getPropertyValue(`--${type}`).trim(),
                                 "data-type": type });
      const tip = svg("title", {});
      tip.textContent = `${count} ${type}`;
      rect.append(tip);
      chart.append(rect);
    }
  }
  const start = new Date(series.start);
  for (const [i, anchor] of [[0, "start"], [series.buckets, "end"]]) {
    const label = svg("text", { x: left + i * bar, y: height - 3, "font-size": 11, fill: "#667085", "text-anchor": anchor });
    label.textContent = new Date(start.getTime() + i * series.bucket_seconds * 1000).toLocaleString();
    chart.append(label);
  }
  $("chart").replaceChildren(chart);
  $("legend").replaceChildren(...TYPES.map((t) => el("span", { swatch: t }, t)));
}

// A session's status, as its list row and its timeline say it.
const STATUS = {
  stopped: "stopped: its current task is refused until a person resumes it (the stop's link, Reset, or loopwarden resume)",
  warned: "warned: the model was told it is looping; the next repeat warns again or stops",
  ok: "ok: no loop in its current task",
  off: "off: detection disabled for this session",
};

async function loadSessions() {
  const list = await api(`/loopwarden/api/sessions?since=30d&limit=200`);
  $("session-list").tBodies[0].replaceChildren(...list.data.map((s) => {
    const row = el("tr", { class: "clickable" },
      el("td", {}, s.session_id), el("td", { class: "agent" }, s.agent || ""),
      el("td", { class: "title", title: s.title || "" }, s.title || ""),
      el("td", {}, time(s.last_seen)), el("td", {}, String(s.messages)),
      el("td", {}, String(s.detections)),
      el("td", { class: `status status-${s.status}`, title: STATUS[s.status] || "" }, s.status),
      el("td", {}, s.model || ""));
    row.dataset.search = [s.session_id, s.agent || "", s.title || ""].join("\n").toLowerCase();
    row.addEventListener("click", () => showSession(s.session_id));
    return row;
  }));
  filterSessions();
  if (openSession) await loadSession(openSession);
}

function filterSessions() {
  // The search box keeps the sessions whose id, agent or title holds its words (as text, in any case).
  const words = $("session-search").value.toLowerCase().split(/\s+/).filter(Boolean);
  const rows = [...$("session-list").tBodies[0].rows];
  let shown = 0;
  for (const row of rows) {
    row.hidden = !words.every((word) => row.dataset.search.includes(word));
    if (!row.hidden) shown += 1;
  }
  $("session-count").textContent = words.length ? `${shown} of ${rows.length} sessions` : `${rows.length} sessions`;
}

async function showSession(id) {
  openSession = id;
  scrollToSession = true;
  switchView("sessions");
}

async function loadSession(id) {
  const found = await api(`/loopwarden/api/sessions/${encodeURIComponent(id)}`);
  const session = found.data[0];
  $("session-detail").hidden = false;
  $("detail-id").textContent = session.session_id;
  $("detail-agent").textContent = `${session.agent || "unknown agent"}: ${session.title || "(no prompt seen)"}`;
  $("detail-summary").textContent = `${session.requests} requests, ${session.messages} messages, last seen ` +
    `${time(session.last_seen)} — ${STATUS[session.status] || session.status}`;
  const tasks = new Map();
  for (const entry of session.timeline) {
    if (!tasks.has(entry.task)) tasks.set(entry.task, []);
    tasks.get(entry.task).push(entry);
  }
  const blocks = [];
  let n = 0;
  for (const [task, entries] of tasks) {
    n += 1;
    blocks.push(el("div", { class: "task" }, el("h3", {}, `task ${n} (${task})`), ...entries.map(timelineEntry)));
  }
  $("timeline").replaceChildren(...(blocks.length ? blocks : [el("p", { class: "muted" }, "no episodes")]));
  if (scrollToSession) {  // once: a refresh leaves the page where the reader scrolled it
    scrollToSession = false;
    $("session-detail").scrollIntoView({ block: "start" });
  }
}

function timelineEntry(entry) {
  if (entry.kind === "resume") {
    return el("div", { class: "entry resume" },
      el("div", { class: "head" }, "resumed by a person: the stop and warnings forgiven"),
      el("div", { class: "muted" }, time(entry.at)));
  }
  if (entry.kind === "judge_check") {
    return el("div", { class: "entry judge", swatch: "llm" },
      el("div", { class: "head" }, `judge check at turn ${entry.turn}: confidence ${entry.confidence ?? "none"}`),
      el("div", { class: "muted" }, time(entry.at)), el("pre", {}, entry.analysis || ""));
  }
  return el("div", { class: "entry detection", swatch: entry.type },
    el("div", { class: "head" }, `${entry.action}${entry.enforced === false ? " (observed)" : ""} · ${entry.type} · ` +
       `${episodeLabel(entry)} · ${strengthLabel(entry) ? `${strengthLabel(entry)} evidence · ` : ""}turn ${entry.turn}`),
    el("div", { class: "muted" }, time(entry.at)),
    el("pre", { class: "evidence" }, evidence(entry.detail)),
    el("pre", { class: "message" }, entry.message || ""));
}

async function control(action) {
  await api(`/loopwarden/api/sessions/${encodeURIComponent(openSession)}/${action}`, { method: "POST" });
  await loadSessions();
  $("status").textContent = `${action}: done`;
}

function switchView(name) {
  view = name;
  showOnly(name);
  refresh();
}

async function refresh() {
  try {
    if (view === "overview") await loadOverview();
    else await loadSessions();
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    if (error.status === 401) askForToken(token() ? "That token was refused." : "");
    else if (error.status === 403) { showOnly("login"); $("login-error").textContent = error.message; }
    else $("status").textContent = `error: ${error.message}`;
  }
}

function filtersFromAddress() {
  // `#since=30d&type=content` opens the page with those filters (a link to a view).
  const wanted = new URLSearchParams(location.hash.slice(1));
  for (const [name, id] of [["since", "since"], ["type", "type"], ["action", "action"], ["mark", "mark"],
                            ["session", "session-filter"]]) {
    if (wanted.has(name)) $(id).value = wanted.get(name);
  }
}

function start() {
  filtersFromAddress();
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => { openSession = null; $("session-detail").hidden = true;
                                             switchView(button.dataset.view); });
  }
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("loopwarden-token", $("token").value.trim());
    $("token").value = "";
    switchView("overview");
  });
  for (const id of ["since", "type", "action", "mark"]) $(id).addEventListener("change", refresh);
  $("session-filter").addEventListener("change", refresh);
  $("session-search").addEventListener("input", filterSessions);
  $("session-search-form").addEventListener("submit", (event) => event.preventDefault());
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  $("reset").addEventListener("click", () => control("reset"));
  $("disable").addEventListener("click", () => control("disable"));
  $("enable").addEventListener("click", () => control("enable"));
  // Refresh while the page is open and showing the log.
  setInterval(() => { if (!document.hidden && $("login").hidden) refresh(); }, REFRESH_MS);
  // `#open=SESSION` (the link an alert carries) opens that session's timeline.
  const opened = new URLSearchParams(location.hash.slice(1)).get("open");
  if (opened) showSession(opened);
  else switchView("overview");
}

start();
