// dex-ha web console: the cluster, the sessions, and one session's timeline, live.
//
// Plain JavaScript, no build step and no outside files. It calls the node that served it
// (the page's own origin) with the token kept in this tab's sessionStorage, and marks its
// calls `Dex-Forward: active`: on a standby, the node passes them on to the active node, so
// the console works from any node's address with the one token. Every piece of text from
// the server goes into the page as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "dex-ha-token";
const NAMESPACE_KEY = "dex-ha-namespace"; // empty: name none (the token's only one, else default)
const CLUSTER_POLL_MS = 1000;
const SESSIONS_POLL_MS = 2000; // the sessions list refreshes itself this often
const FILTER_TYPING_MS = 300; // a filter typed into applies once the typing pauses this long
const STREAM_RETRY_MS = 1000;
const HISTORY_PAGE = 50; // conversation items shown at first, and added by "earlier"
const TURNS_PAGE = 20; // turns shown at first, and added by "earlier"

// ------------------------------------------------------------------ small helpers

/** An element: h("td", {class: "x", onclick: fn}, "text", child, ...). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Replace an element's children; null and undefined (a part with nothing to show) are left out. */
function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined));
}

/** A time in UTC, saying so (every node and every operator reads the same clock). */
function timeOf(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "";
}

function duration(start, end) {
  if (!start) return "";
  return `${(((end || Date.now()) - start) / 1000).toFixed(1)} s${end ? "" : " so far"}`;
}

function json(value) {
  return value === undefined ? "" : JSON.stringify(value);
}

function showError(message) {
  const banner = document.getElementById("error-banner");
  banner.textContent = message || "";
  banner.hidden = !message;
}

// ------------------------------------------------------------------ the token and the API

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function namespace() {
  return sessionStorage.getItem(NAMESPACE_KEY) || "";
}

/** The token and the namespace of every request (the session routes read Dex-Namespace), and
 * the ask to pass it on to the active node when this node is a standby. */
function authHeaders() {
  const headers = { "Dex-Forward": "active" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (namespace()) headers["Dex-Namespace"] = namespace();
  return headers;
}

function setUpNamespaceField() {
  const field = document.getElementById("namespace-input");
  field.value = namespace();
  field.addEventListener("change", () => {
    sessionStorage.setItem(NAMESPACE_KEY, field.value.trim());
    route();
  });
}

class ApiError extends Error {
  constructor(status, body) {
    super(`${status} ${body.error || ""}: ${body.message || ""}`);
    this.status = status;
    this.code = body.error;
    this.leaderUrl = body.leader_url;
  }
}

/** Call the API of this node; JSON in and out. A 401 asks for a token. */
async function api(method, path, body) {
  const headers = { ...authHeaders() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const answer = await resp.json().catch(() => ({}));
  if (resp.status === 401) askForToken();
  if (!resp.ok) throw new ApiError(resp.status, answer);
  return answer;
}

function askForToken() {
  const dialog = document.getElementById("token-dialog");
  if (dialog.open) return;
  document.getElementById("token-input").value = "";
  dialog.showModal();
}

function setUpTokenDialog() {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-button").addEventListener("click", askForToken);
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "save") sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
    if (dialog.returnValue === "forget") sessionStorage.removeItem(TOKEN_KEY);
    if (dialog.returnValue !== "cancel") route();
  });
}

/** Ask the operator to confirm; resolves to true or false. */
function confirmAction(text) {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true }));
}

/** Run an action of a button; show its error; then refresh the view. */
async function act(what, call, refresh) {
  try {
    await call();
    showError("");
  } catch (err) {
    showError(`${what} failed: ${err.message}`);
  }
  if (refresh) await refresh();
}

// ------------------------------------------------------------------ routing
//
// #/cluster, #/sessions?status=..&agent=..&awaiting_approval=true&outcome_unknown=true,
// #/session/<id>. Each view gets a fresh AbortController: leaving a view stops its polls
// and its event stream.

let viewAbort = new AbortController();

function route() {
  viewAbort.abort();
  viewAbort = new AbortController();
  showError("");
  const hash = location.hash || "#/cluster";
  const [path, query] = hash.slice(1).split("?");
  const main = document.getElementById("view");
  fill(main);
  if (path.startsWith("/session/")) {
    sessionView(main, decodeURIComponent(path.slice("/session/".length)), viewAbort.signal);
  } else if (path === "/sessions") {
    sessionsView(main, new URLSearchParams(query || ""), viewAbort.signal);
  } else {
    clusterView(main, viewAbort.signal);
  }
}

/** Poll `tick` every `ms` until `signal` aborts. */
async function poll(tick, ms, signal) {
  while (!signal.aborted) {
    await tick();
    await new Promise((resolve) => setTimeout(resolve, ms));
  }
}

/** The header's note on this node: its id and role, and, on a standby, the active node its
 * calls go to (with a link to that node's own console). Read from this node's /v1/cluster. */
async function watchThisNode() {
  const note = document.getElementById("this-node");
  for (;;) {
    try {
      const view = await api("GET", "/v1/cluster");
      const active = view.role === "active";
      fill(note, `node ${view.node_id} (${view.role})`,
        active ? null
          : view.leader_url
            ? h("span", {}, " · your requests go to the active node ",
              h("a", { href: `${view.leader_url}/ui`, "data-testid": "active-link" }, view.leader_id || view.leader_url))
            : h("span", { class: "unreachable" }, " · no node is active right now"));
    } catch (err) {
      fill(note, h("span", { class: "unreachable" }, `this node does not answer: ${err.message}`));
    }
    await new Promise((resolve) => setTimeout(resolve, CLUSTER_POLL_MS));
  }
}

// ------------------------------------------------------------------ cluster view

function clusterView(main, signal) {
  const table = h("table", { "data-testid": "cluster-table" });
  const controls = h("div", {});
  main.append(h("h2", {}, "Cluster"), table, controls);
  const refresh = async () => {
    try {
      const answer = await api("GET", "/v1/cluster/nodes");
      if (signal.aborted) return;
      renderClusterTable(table, answer.nodes, refresh);
      if (!controls.firstChild) controls.append(...clusterControls(refresh));
      fillStepDownTargets(controls.querySelector("[data-testid=step-down-to]"), answer.nodes);
    } catch (err) {
      if (!signal.aborted) showError(`cannot read the cluster: ${err.message}`);
    }
  };
  poll(refresh, CLUSTER_POLL_MS, signal);
}

function renderClusterTable(table, nodes, refresh) {
  const leader = nodes.find((n) => n.view && n.view.role === "active") || nodes.find((n) => n.view && n.view.leader_id === n.id);
  const leaderMembers = new Map(((leader && leader.view.members) || []).map((m) => [m.id, m]));
  // The consistency alarm is replicated: any node's view names the members under it.
  const alarms = new Set(nodes.flatMap((n) => (n.view ? Object.keys(n.view.consistency_alarms || {}) : [])));
  const header = h("tr", {}, ["node", "role", "ready", "term", "lease left", "applied index", "lag", "last contact", "progress", "URL", ""].map((t) => h("th", {}, t)));
  const rows = nodes.map((node) => {
    const view = node.view;
    if (!node.reachable) {
      return h("tr", { "data-node": node.id, "data-role": "unreachable" },
        h("td", {}, node.id), h("td", { class: "unreachable", colspan: 8 }, `unreachable: ${node.error}`),
        h("td", {}, node.url || ""), h("td", {}, removeButton(node, refresh)));
    }
    const lag = leader ? Math.max(0, leader.view.commit_index - view.applied_index) : "";
    const contact = leaderMembers.get(node.id);
    const contactText = node.id === (leader && leader.id) ? "(leader)"
      : contact && contact.contacted === false ? "never"
      : contact && contact.last_contact_ms_ago !== null && contact.last_contact_ms_ago !== undefined ? `${contact.last_contact_ms_ago} ms ago` : "";
    return h("tr", { "data-node": node.id, "data-role": view.role },
      h("td", {}, node.id),
      h("td", { class: `role-${view.role}`, "data-testid": `role-${node.id}` }, view.role + (node.voter ? "" : " (learner)"),
        alarms.has(node.id)
          ? h("strong", { class: "unreachable", "data-testid": `alarm-${node.id}`, title: "its state differed from the majority's: it will not become active; replace it" }, " CONSISTENCY ALARM")
          : ""),
      h("td", {}, view.role === "active" ? "ready" : "not ready"),
      h("td", {}, view.term),
      h("td", {}, view.lease_remaining_ms > 0 ? `${view.lease_remaining_ms} ms` : "none"),
      h("td", {}, view.applied_index),
      h("td", {}, lag),
      h("td", {}, contactText),
      h("td", { "data-testid": `progress-${node.id}` }, catchUpProgress(node.id === (leader && leader.id), contact, lag)),
      h("td", {}, node.url ? h("a", { href: `${node.url}/ui` }, node.url) : ""),
      h("td", {}, removeButton(node, refresh)));
  });
  fill(table, header, ...rows);
}

/** How far a member is in catching up, as the leader sees it (a learner installing a snapshot
 * shows the bytes sent so far; a member that lost entries it had stored says so until it has
 * them again). `lag` counts from the index the member itself says it applied. */
function catchUpProgress(isLeader, member, lag) {
  if (isLeader) return "leader";
  if (!member) return "";
  if (member.contacted === false) return "not reached yet";
  const bytes = member.snapshot_bytes;
  if (bytes) {
    const [sent, total] = bytes;
    return `snapshot ${mib(sent)} of ${mib(total)} MiB (${total ? Math.floor((100 * sent) / total) : 0}%)`;
  }
  if (member.lost_acknowledged_index) {
    return `LOST ENTRIES: had stored up to ${member.lost_acknowledged_index}, has ${member.match_index}; catching up`;
  }
  if (member.replication === "snapshot") return "snapshot sent, applying";
  return lag > 0 ? `catching up (${lag} behind)` : "caught up";
}

function mib(bytes) {
  return (bytes / (1024 * 1024)).toFixed(1);
}

function removeButton(node, refresh) {
  return h("button", {
    type: "button", "data-testid": `remove-${node.id}`,
    onclick: async () => {
      if (await confirmAction(`Remove member ${node.id} from the cluster?`)) {
        await act(`removing ${node.id}`, () => api("DELETE", `/v1/cluster/members/${encodeURIComponent(node.id)}`), refresh);
      }
    },
  }, "Remove");
}

/** The voters to hand leadership to, keeping the operator's choice while it is still one. */
function fillStepDownTargets(select, nodes) {
  const ids = nodes.filter((n) => n.voter).map((n) => n.id);
  const shown = [...select.options].map((o) => o.value).slice(1);
  if (shown.join() === ids.join()) return;
  const chosen = select.value;
  fill(select, h("option", { value: "" }, "the most caught-up voter"), ...ids.map((id) => h("option", { value: id }, id)));
  select.value = ids.includes(chosen) ? chosen : "";
}

function clusterControls(refresh) {
  const target = h("select", { "data-testid": "step-down-to" }, h("option", { value: "" }, "the most caught-up voter"));
  const stepDown = h("form", { class: "inline", "data-testid": "step-down-form" },
    h("strong", {}, "Step down"), "the active node, handing over to", target,
    h("button", { type: "submit", "data-testid": "step-down" }, "Step down"));
  stepDown.addEventListener("submit", async (event) => {
    event.preventDefault();
    const to = target.value || null;
    if (await confirmAction(`Step down the active node${to ? ` and hand leadership to ${to}` : ""}? Running attempts are drained first.`)) {
      await act("step down", () => api("POST", "/v1/cluster/step-down", to ? { to } : {}), refresh);
    }
  });
  const id = h("input", { placeholder: "node id", size: 8, "data-testid": "member-id" });
  const raft = h("input", { placeholder: "raft host:port", size: 18, "data-testid": "member-raft" });
  const url = h("input", { placeholder: "http://host:8801", size: 24, "data-testid": "member-url" });
  const add = h("form", { class: "inline" }, h("strong", {}, "Add a member"), "(as a learner)", id, raft, url,
    h("button", { type: "submit", "data-testid": "add-member" }, "Add"));
  add.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (await confirmAction(`Add ${id.value} (${raft.value}, ${url.value}) as a learner?`)) {
      await act("adding a member", () => api("POST", "/v1/cluster/members", { id: id.value, raft_addr: raft.value, url: url.value }), refresh);
    }
  });
  return [h("fieldset", {}, stepDown), h("fieldset", {}, add)];
}

// ------------------------------------------------------------------ sessions list
//
// The filters live in the URL (#/sessions?q=..&agent=..), apply as they change, and the list
// reads its page again every SESSIONS_POLL_MS. The server filters and orders (newest first).

/** The list's filters: [URL parameter, API parameter]. */
const SESSION_FILTERS = [["q", "id_contains"], ["agent", "agent"], ["status", "status"], ["metadata", "metadata"],
  ["order", "order"], ["awaiting_approval", "awaiting_approval"], ["outcome_unknown", "outcome_unknown"]];

function sessionsView(main, params, signal) {
  const text = (name, placeholder, size) => h("input", { name, placeholder, size, value: params.get(name) || "", "data-testid": `filter-${name}` });
  const search = text("q", "session id contains", 20);
  const agent = text("agent", "agent", 12);
  const metadata = text("metadata", "metadata key=value", 20);
  const status = h("select", { name: "status", "data-testid": "filter-status" },
    ["", "idle", "running"].map((s) => h("option", { value: s, selected: params.get("status") === s }, s || "any status")));
  const order = h("select", { name: "order", "data-testid": "filter-order" },
    [["newest", "newest first"], ["id", "by id"]].map(([v, label]) => h("option", { value: v, selected: (params.get("order") || "newest") === v }, label)));
  const approval = h("input", { type: "checkbox", name: "awaiting_approval", checked: params.get("awaiting_approval") === "true", "data-testid": "filter-approval" });
  const unknown = h("input", { type: "checkbox", name: "outcome_unknown", checked: params.get("outcome_unknown") === "true", "data-testid": "filter-unknown" });
  const filters = h("form", { class: "inline", "data-testid": "filters" }, search, agent, status, metadata, order,
    h("label", {}, approval, "waiting for approval"), h("label", {}, unknown, "has outcome_unknown"));
  const table = h("table", { "data-testid": "sessions-table" });
  const pager = h("div", {});
  const refreshed = h("p", { class: "muted", "data-testid": "sessions-refreshed" });
  main.append(h("h2", {}, "Sessions"), filters, table, pager, refreshed);

  // Cursors of the pages seen, so "Previous" can go back: the API pages forward only.
  let cursors = [null];
  let generation = 0; // an answer to a read that a newer one overtook is dropped
  let rendered = ""; // the page on show: a refresh that changed nothing leaves the table be
  const current = () => {
    const query = new URLSearchParams();
    if (search.value.trim()) query.set("q", search.value.trim());
    if (agent.value.trim()) query.set("agent", agent.value.trim());
    if (status.value) query.set("status", status.value);
    if (metadata.value.trim()) query.set("metadata", metadata.value.trim());
    if (order.value !== "newest") query.set("order", order.value);
    if (approval.checked) query.set("awaiting_approval", "true");
    if (unknown.checked) query.set("outcome_unknown", "true");
    return query;
  };
  const load = async () => {
    const shown = current();
    const query = new URLSearchParams({ limit: "50" });
    for (const [name, apiName] of SESSION_FILTERS) if (shown.has(name)) query.set(apiName, shown.get(name));
    const after = cursors[cursors.length - 1];
    if (after) query.set("after", after);
    const mine = ++generation;
    try {
      const page = await api("GET", `/v1/sessions?${query}`);
      if (signal.aborted || mine !== generation) return;
      showError("");
      const seen = JSON.stringify([page, cursors]);
      if (seen !== rendered) renderSessions(table, pager, page, cursors, load);
      rendered = seen;
      refreshed.textContent = `Refreshed ${timeOf(Date.now())}; the list refreshes itself every ${SESSIONS_POLL_MS / 1000} s.`;
    } catch (err) {
      if (!signal.aborted && mine === generation) showError(`cannot list sessions: ${err.message}`);
    }
  };
  // A change of filter starts again from the first page, and shows in the URL (no new view).
  const apply = () => {
    history.replaceState(null, "", `#/sessions?${current()}`);
    cursors = [null];
    load();
  };
  let typing = null;
  for (const field of [search, agent, metadata]) {
    field.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(apply, FILTER_TYPING_MS); });
  }
  for (const field of [status, order, approval, unknown]) field.addEventListener("change", apply);
  filters.addEventListener("submit", (event) => { event.preventDefault(); clearTimeout(typing); apply(); });
  poll(load, SESSIONS_POLL_MS, signal);
}

function renderSessions(table, pager, page, cursors, load) {
  const header = h("tr", {}, ["session", "agent", "status", "turns", "waiting approvals", "outcome_unknown", "created", "updated", "metadata"].map((t) => h("th", {}, t)));
  const rows = page.sessions.map((s) => h("tr", { "data-session": s.session_id },
    h("td", {}, h("a", { href: `#/session/${encodeURIComponent(s.session_id)}` }, s.session_id)),
    h("td", {}, s.agent), h("td", {}, s.status), h("td", {}, s.turn_count),
    h("td", {}, s.pending_approvals || ""),
    h("td", { class: s.outcome_unknown_calls ? "status-outcome_unknown" : "" }, s.outcome_unknown_calls || ""),
    h("td", { "data-testid": "created" }, timeOf(s.created_at)), h("td", {}, timeOf(s.updated_at)),
    h("td", { class: "mono" }, s.metadata ? json(s.metadata) : "")));
  fill(table, header, ...rows);
  if (!rows.length) table.append(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No sessions match.")));
  fill(pager,
    h("button", { type: "button", disabled: cursors.length < 2, onclick: () => { cursors.pop(); load(); } }, "Previous page"),
    h("button", { type: "button", disabled: !page.next_after, "data-testid": "next-page", onclick: () => { cursors.push(page.next_after); load(); } }, "Next page"));
}

// ------------------------------------------------------------------ live text (the rules of dex_ha/client/stream_text.py)
//
// Per step: a delta of a newer attempt starts the text afresh; attempt_failed drops the
// failed attempt's text; a late delta of an attempt that failed or was overtaken is
// ignored. Unlike StreamText, the dropped text is kept, to be shown struck through.

class LiveText {
  constructor() { this.steps = new Map(); }

  step(stepId) {
    if (!this.steps.has(stepId)) this.steps.set(stepId, { attempt: 0, failedUpto: 0, pieces: [], dropped: [] });
    return this.steps.get(stepId);
  }

  delta(stepId, attempt, text) {
    if (typeof text !== "string") return;
    const step = this.step(stepId);
    if (attempt <= step.failedUpto || attempt < step.attempt) return;
    if (attempt > step.attempt) {
      this.drop(step);
      step.attempt = attempt;
    }
    step.pieces.push(text);
  }

  failed(stepId, attempt) {
    const step = this.step(stepId);
    step.failedUpto = Math.max(step.failedUpto, attempt);
    if (step.attempt <= attempt) {
      this.drop(step);
      step.attempt = 0;
    }
  }

  drop(step) {
    if (step.pieces.length) step.dropped.push({ attempt: step.attempt, text: step.pieces.join("") });
    step.pieces = [];
  }
}

/** Read the session's SSE stream with fetch (EventSource cannot send the token); resume after a drop. */
async function followEvents(sessionId, signal, onEvent) {
  let after = "";
  while (!signal.aborted) {
    try {
      const query = after ? `?after=${after}` : "";
      const resp = await fetch(`/v1/sessions/${encodeURIComponent(sessionId)}/events${query}`, { headers: authHeaders(), signal });
      if (resp.ok) {
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const event = parseSse(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            if (event.id) after = event.id;
            if (event.data) onEvent(event.type, JSON.parse(event.data));
          }
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, STREAM_RETRY_MS));
  }
}

function parseSse(block) {
  const event = { id: "", type: "message", data: "" };
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") event.id = value;
    else if (field === "event") event.type = value;
    else if (field === "data") event.data += (event.data ? "\n" : "") + value;
  }
  return event;
}

// ------------------------------------------------------------------ one session

function sessionView(main, sessionId, signal) {
  const live = new LiveText();
  // How much of a long session is on show; "earlier" buttons add to it, refreshes keep it.
  const shown = { history: HISTORY_PAGE, turns: TURNS_PAGE };
  const body = h("div", {});
  main.append(h("p", {}, h("a", { href: "#/sessions" }, "← sessions")), body);
  let snapshot = null;
  let loading = null;
  const refresh = async () => {
    try {
      snapshot = await api("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`);
      if (!signal.aborted) renderSession(body, snapshot, live, shown, refresh);
    } catch (err) {
      if (!signal.aborted) showError(`cannot read session ${sessionId}: ${err.message}`);
    }
  };
  // A committed event changes the snapshot: read it again (one read at a time, coalesced).
  // An event that arrives while a read is under way may be newer than what that read
  // returns, so it asks for one more read after it; dropping it left the page stale.
  let readAgain = false;
  const refreshSoon = () => {
    if (loading) { readAgain = true; return; }
    loading = new Promise((resolve) => setTimeout(resolve, 100)).then(refresh).finally(() => {
      loading = null;
      if (readAgain) { readAgain = false; refreshSoon(); }
    });
  };
  refresh();
  followEvents(sessionId, signal, (type, event) => {
    if (type === "delta") {
      live.delta(event.step_id, event.attempt, event.data && event.data.text);
      if (snapshot) renderLiveText(body, live);
      return;
    }
    const data = event.data || {};
    if (type === "attempt_failed" && data.step_id) live.failed(data.step_id, data.attempt);
    refreshSoon();
  });
}

function renderSession(body, s, live, shown, refresh) {
  const typed = typedValues(body);
  const rerender = () => renderSession(body, s, live, shown, refresh);
  fill(body,
    h("h2", {}, `Session ${s.session_id}`),
    h("p", { "data-testid": "session-status" }, `namespace ${s.namespace || "default"} · agent ${s.agent} · status `,
      h("strong", {}, s.status),
      s.waiting_for ? ` · waiting for ${s.waiting_for}` : "",
      ` · created ${timeOf(s.created_at)}`),
    s.metadata ? h("p", { class: "muted" }, "metadata ", h("code", {}, json(s.metadata))) : null,
    cancelButton(s, refresh),
    pendingApprovals(s, refresh),
    pendingQuestions(s, refresh),
    unknownCalls(s, refresh),
    messageForm(s, refresh),
    h("h3", {}, "Conversation"),
    conversation(s, shown, rerender),
    h("h3", {}, `Turns (${s.turns.length})`),
    earlierButton("turns-earlier", s.turns.length - shown.turns, "turns", () => { shown.turns += TURNS_PAGE; rerender(); }),
    ...s.turns.slice(-shown.turns).map((turn) => turnCard(turn, s)),
  );
  restoreTyped(body, typed);
  renderLiveText(body, live);
}

/** A button that shows more of what is hidden before the items on show (nothing when none is). */
function earlierButton(testId, hidden, what, onclick) {
  if (hidden <= 0) return null;
  return h("button", { type: "button", "data-testid": testId, onclick }, `Show earlier ${what} (${hidden} more)`);
}

/** The running turn's Cancel button (POST /cancel): the turn ends, its open calls record how far they got. */
function cancelButton(s, refresh) {
  if (!s.current_turn) return null;
  const cancel = async () => {
    if (await confirmAction(`Cancel the running turn ${s.current_turn.number} of ${s.session_id}?`)) {
      await act("cancelling the turn", () => api("POST", `/v1/sessions/${encodeURIComponent(s.session_id)}/cancel`,
        { reason: "cancelled from the console" }), refresh);
    }
  };
  return h("p", {}, h("button", { type: "button", "data-testid": "cancel-turn", onclick: cancel }, `Cancel turn ${s.current_turn.number}`));
}

/** The session's history as it is stored: what the user said, what the model answered and
 * which tools it called with what, and what each tool returned. The latest items first on
 * show; "Show earlier" pages back. */
function conversation(s, shown, rerender) {
  const items = s.history || [];
  const box = h("div", { class: "conversation", "data-testid": "conversation" });
  if (s.summary) {
    box.append(h("div", { class: "card msg note", "data-testid": "summary" },
      h("div", { class: "who" }, `Summary of the items up to ${s.summary.upto_seq} (${timeOf(s.summary.at)})`), s.summary.text));
  }
  // Messages sent but not yet taken up by a turn are not history yet: shown after it, marked.
  const waiting = (s.waiting_messages || []).map((m) => h("div", { class: "card msg user waiting", "data-testid": "msg-waiting" },
    h("div", { class: "who" }, `User · waiting (${m.mode}) since ${timeOf(m.at)}`), h("div", { class: "text" }, m.text)));
  box.append(
    earlierButton("history-earlier", items.length - shown.history, "messages", () => { shown.history += HISTORY_PAGE; rerender(); }) || "",
    ...items.slice(-shown.history).map(historyItem),
    ...waiting,
  );
  if (!items.length && !waiting.length) box.append(h("p", { class: "muted" }, "No messages yet."));
  return box;
}

function historyItem(item) {
  const card = (kind, who, ...children) => h("div", { class: `card msg ${kind}`, "data-seq": item.seq, "data-testid": `msg-${kind}` },
    h("div", { class: "who" }, who), ...children);
  if (item.type === "user") return card("user", "User", h("div", { class: "text" }, item.text));
  if (item.type === "assistant") {
    return card("assistant", "Assistant",
      item.content ? h("div", { class: "text" }, typeof item.content === "string" ? item.content : json(item.content)) : null,
      (item.tool_calls || []).map((c) => h("div", { "data-testid": "msg-tool-call" }, "calls ",
        h("code", {}, `${c.name}(${json(c.arguments)})`), c.id ? h("span", { class: "muted" }, ` · id ${c.id}`) : null)));
  }
  if (item.type === "tool_result") {
    return card("tool_result", h("span", {}, `Tool ${item.name} · `, h("span", { class: `status-${item.status}` }, item.status),
      h("span", { class: "muted" }, ` · call ${item.call_id}`)),
      item.error !== undefined && item.error !== null ? h("div", { class: "status-failed" }, `error: ${item.error}`)
        : item.output === undefined || item.output === null ? h("div", { class: "muted" }, "no output")
          : h("pre", { class: "output" }, typeof item.output === "string" ? item.output : json(item.output)));
  }
  if (item.type === "note") return card("note", "Note", h("div", { class: "text" }, item.text));
  return card("other", item.type || "item", h("code", {}, json(item)));
}

/** What the operator has typed or chosen so far, so that a refresh does not wipe it. */
function typedValues(root) {
  const focused = document.activeElement && document.activeElement.getAttribute("data-testid");
  const values = new Map([...root.querySelectorAll("input[data-testid], textarea[data-testid], select[data-testid]")]
    .map((el) => [el.getAttribute("data-testid"), el.value]));
  return { focused, values };
}

function restoreTyped(root, typed) {
  for (const el of root.querySelectorAll("input[data-testid], textarea[data-testid], select[data-testid]")) {
    const id = el.getAttribute("data-testid");
    if (typed.values.has(id)) el.value = typed.values.get(id);
    if (id === typed.focused) el.focus();
  }
}

function pendingApprovals(s, refresh) {
  if (!s.pending_approvals.length) return null;
  return h("fieldset", { "data-testid": "approvals" }, h("legend", {}, "Waiting for approval"),
    s.pending_approvals.map((a) => {
      const reason = h("input", { placeholder: "reason (optional)", size: 30 });
      const decide = (approved) => async () => {
        const verb = approved ? "Approve" : "Deny";
        if (await confirmAction(`${verb} ${a.name}(${json(a.arguments)})?`)) {
          await act(`${verb.toLowerCase()} ${a.call_id}`, () => api("POST",
            `/v1/sessions/${encodeURIComponent(s.session_id)}/approvals/${encodeURIComponent(a.call_id)}`,
            { approved, reason: reason.value || null }), refresh);
        }
      };
      return h("div", { class: "inline", "data-call": a.call_id },
        h("code", {}, `${a.name}(${json(a.arguments)})`), ` call ${a.call_id} `, reason,
        h("button", { type: "button", "data-testid": `approve-${a.call_id}`, onclick: decide(true) }, "Approve"),
        h("button", { type: "button", "data-testid": `deny-${a.call_id}`, onclick: decide(false) }, "Deny"));
    }));
}

function pendingQuestions(s, refresh) {
  if (!s.pending_questions.length) return null;
  return h("fieldset", { "data-testid": "questions" }, h("legend", {}, "Questions"),
    s.pending_questions.map((q) => {
      const answer = h("input", { placeholder: "answer (JSON or text)", size: 40, "data-testid": `answer-input-${q.question_id}` });
      const form = h("form", { class: "inline" }, h("span", {}, json(q.question)), answer,
        h("button", { type: "submit", "data-testid": `answer-${q.question_id}` }, "Answer"));
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        let value = answer.value;
        try { value = JSON.parse(value); } catch (err) { /* plain text is an answer too */ }
        await act(`answering ${q.question_id}`, () => api("POST",
          `/v1/sessions/${encodeURIComponent(s.session_id)}/questions/${encodeURIComponent(q.question_id)}/answer`, { answer: value }), refresh);
      });
      return form;
    }));
}

function unknownCalls(s, refresh) {
  const calls = s.tool_calls.filter((c) => c.status === "outcome_unknown");
  if (!calls.length) return null;
  return h("fieldset", { "data-testid": "unknown-calls" }, h("legend", {}, "Outcome unknown: find out what happened, then record it"),
    calls.map((c) => {
      const outcome = h("select", { "data-testid": `reconcile-outcome-${c.call_id}` },
        h("option", { value: "succeeded" }, "it succeeded"), h("option", { value: "failed" }, "it failed"));
      const note = h("input", { placeholder: "note: what you found", size: 40, "data-testid": `reconcile-note-${c.call_id}` });
      const form = h("form", { class: "inline", "data-call": c.call_id },
        h("code", {}, `${c.name}(${json(c.arguments)})`), ` key ${c.idempotency_key} `, outcome, note,
        h("button", { type: "submit", "data-testid": `reconcile-${c.call_id}` }, "Reconcile"));
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        // The note is the call's result when it succeeded and its error when it failed.
        const body = outcome.value === "succeeded" ? { outcome: "succeeded", result: note.value || null }
          : { outcome: "failed", error: note.value || null };
        if (await confirmAction(`Record ${c.name} call ${c.call_id} as ${outcome.value}?`)) {
          await act(`reconciling ${c.call_id}`, () => api("POST",
            `/v1/sessions/${encodeURIComponent(s.session_id)}/tool-calls/${encodeURIComponent(c.call_id)}/reconcile`, body), refresh);
        }
      });
      return form;
    }));
}

function messageForm(s, refresh) {
  const text = h("textarea", { rows: 2, cols: 60, placeholder: "a message to the agent", "data-testid": "message-text" });
  const mode = h("select", {}, h("option", { value: "queue" }, "after the running turn"), h("option", { value: "steer" }, "at the next model call"));
  const form = h("form", { class: "inline" }, text, mode, h("button", { type: "submit", "data-testid": "send-message" }, "Send"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!text.value.trim()) return;
    // One message_id per message: a retried send is then a no-op, never a second message.
    const body = { text: text.value, mode: mode.value, message_id: crypto.randomUUID() };
    await act("sending the message", () => api("POST", `/v1/sessions/${encodeURIComponent(s.session_id)}/messages`, body), refresh);
    text.value = "";
  });
  return h("fieldset", {}, h("legend", {}, "Send a message"), form);
}

function turnCard(turn, s) {
  const calls = new Map(s.tool_calls.map((c) => [c.call_id, c]));
  return h("div", { class: "card turn", "data-turn": turn.turn_id },
    h("div", {}, h("strong", {}, `Turn ${turn.number}`), " ", h("span", { class: `status-${turn.status}` }, turn.status),
      h("span", { class: "muted" }, ` · started ${timeOf(turn.started_at)} · ${duration(turn.started_at, turn.ended_at)}`),
      turn.error ? h("div", { class: "status-failed" }, `error: ${turn.error}`) : null),
    // A call's summary goes under its first step only (approval, then the call's attempts).
    turn.steps.map((step, i) => stepCard(step, turn.steps.findIndex((st) => st.call_id === step.call_id) === i
      ? calls.get(step.call_id) : undefined)));
}

function stepCard(step, call) {
  return h("div", { class: "step", "data-step": step.step_id },
    h("div", {}, h("strong", {}, step.kind), ` ${step.step_id} · `, h("span", { class: `status-${step.status}` }, step.status),
      ` · attempts ${step.attempts_used}/${step.max_attempts ?? "∞"}`, step.error ? ` · error: ${step.error}` : ""),
    call ? h("div", { "data-testid": `call-${call.call_id}` }, "call ", h("code", {}, `${call.name}(${json(call.arguments)})`),
      " → ", h("span", { class: `status-${call.status}`, "data-testid": `call-status-${call.call_id}` }, call.status),
      call.attempt_progress ? ` · attempt_progress ${call.attempt_progress}` : "",
      call.error ? ` · error: ${call.error}` : "", call.output !== null && call.output !== undefined ? ` · output ${json(call.output)}` : "",
      call.reconciled_at ? ` · reconciled ${timeOf(call.reconciled_at)}` : "") : null,
    step.attempts.map((a) => h("div", { class: "attempt", "data-attempt": a.number },
      `attempt ${a.number} · `, h("span", { class: `status-${a.status}` }, a.status),
      a.attempt_progress ? ` · attempt_progress ${a.attempt_progress}` : "",
      ` · term ${a.term} · worker ${a.worker_id || ""}`,
      a.idempotency_key ? h("span", {}, " · key ", h("code", {}, a.idempotency_key)) : "",
      ` · ${timeOf(a.started_at)} · ${duration(a.started_at, a.ended_at)}`,
      a.error ? h("div", { class: "status-failed" }, `error: ${a.error}`) : null)),
    h("div", { class: "live", "data-live-step": step.step_id }));
}

/** Put each step's live text (and the struck-through text of failed attempts) under the step. */
function renderLiveText(body, live) {
  for (const [stepId, step] of live.steps) {
    let slot = body.querySelector(`[data-live-step="${CSS.escape(stepId)}"]`);
    if (!slot) {
      slot = h("div", { class: "live", "data-live-step": stepId });
      body.append(h("div", { class: "step" }, h("span", { class: "muted" }, `streaming ${stepId}`), slot));
    }
    fill(slot,
      ...step.dropped.map((d) => h("div", { class: "dropped", "data-testid": "dropped-text", title: `attempt ${d.attempt} failed: its text is dropped` },
        `attempt ${d.attempt} (failed, dropped): ${d.text}`)),
      step.pieces.length ? h("div", { class: "live-text", "data-testid": "live-text" }, step.pieces.join("")) : null);
  }
}

// ------------------------------------------------------------------ start

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  setUpTokenDialog();
  setUpNamespaceField();
  route();
  watchThisNode();
});
