// The operators' console: a page of the gateway's own admin API (/admin/v1), nothing else. The
// token an operator types is kept in this tab's sessionStorage and sent as a bearer token; the
// page holds no secret of its own, and shows files through the API (as blob: URLs), never a
// signed link. Everything a user or a provider wrote (prompts, errors, ids) goes in as text.
"use strict";

const session = {
  get token() { return sessionStorage.getItem("photoedit-console-token"); },
  get role() { return sessionStorage.getItem("photoedit-console-role"); },
  save(token, role) {
    sessionStorage.setItem("photoedit-console-token", token);
    sessionStorage.setItem("photoedit-console-role", role);
  },
  clear() { sessionStorage.removeItem("photoedit-console-token"); sessionStorage.removeItem("photoedit-console-role"); },
  get admin() { return this.role === "admin"; },
};

// Refreshes of the page shown (polling); cleared when another page is shown.
let timers = [];
// Object URLs of the images shown, revoked with their page.
let objectURLs = [];

/** An element with attributes (`on…` are listeners) and children (strings become text). */
function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

class ApiError extends Error {
  constructor(status, detail) { super(`${status}: ${detail}`); this.status = status; }
}

/** Calls the admin API; a problem answer throws with its detail. */
async function api(method, path, body, { raw = false } = {}) {
  const headers = { Authorization: `Bearer ${session.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!response.ok) {
    let detail = response.statusText;
    try { const problem = await response.json(); detail = problem.detail || problem.title || detail; } catch (_) { /* not JSON */ }
    if (response.status === 401) { session.clear(); location.hash = "#/"; }
    throw new ApiError(response.status, detail);
  }
  return raw ? response : response.json();
}

function say(text, isError = false) {
  const message = document.getElementById("message");
  message.textContent = text;
  message.className = isError ? "error" : "";
  message.hidden = !text;
}

/** Asks before an action; resolves to whether the operator went ahead. */
function confirmAction(text) {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

/** Runs an action after asking, says what it did, and refreshes the page. */
async function act(question, run, describe) {
  if (question && !(await confirmAction(question))) return;
  try {
    const result = await run();
    say(describe ? describe(result) : "Done.");
  } catch (error) {
    say(error.message, true);
  }
  render();
}

const ago = (iso) => {
  if (!iso) return "";
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 90) return `${seconds} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
};
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
const adminOnly = (...nodes) => (session.admin ? nodes : []);
const table = (id, headings, rows) =>
  h("div", { class: "scroll" }, h("table", { id }, h("thead", {}, h("tr", {}, headings.map((heading) => h("th", {}, heading)))), h("tbody", {}, rows)));

// MARK: Pages

async function queuePage() {
  const overview = await api("GET", "/admin/v1/overview");
  const counts = ["queued", "processing", "completed", "failed", "cancelled"];
  const effects = overview.effects.map((effect) =>
    h("tr", { "data-effect": effect.effect },
      h("td", {}, effect.effect), h("td", {}, effect.provider), h("td", {}, effect.queued), h("td", {}, effect.processing),
      h("td", {}, ago(effect.oldestQueuedAt)),
      h("td", { class: effect.paused ? "paused" : "" }, effect.paused ? "paused" : "running"),
      adminOnly(h("td", {}, effect.paused
        ? h("button", { class: "act resume", onclick: () => act(null, () => api("POST", `/admin/v1/effects/${encodeURIComponent(effect.effect)}/resume`), () => `Resumed ${effect.effect}.`) }, "Resume")
        : h("button", { class: "danger pause", onclick: () => act(`Pause ${effect.effect}? Its jobs stay queued until it is resumed.`, () => api("POST", `/admin/v1/effects/${encodeURIComponent(effect.effect)}/pause`), () => `Paused ${effect.effect}.`) }, "Pause")))));
  return [
    h("h1", {}, "Queue"),
    h("div", { class: "cards", id: "counts" }, counts.map((state) =>
      h("a", { class: "card", href: `#/jobs?state=${state}`, id: `count-${state}` }, h("b", {}, overview.counts[state] ?? 0), state))),
    h("h2", {}, "Last hour"),
    chart(overview.lastHour),
    h("h2", {}, "By effect"),
    table("effects-table", ["Effect", "Provider", "Queued", "Processing", "Oldest queued", "Dispatch", ...adminOnly("")], effects),
    overview.dispatching ? null : h("p", { class: "legend" }, "This jobs replica does not dispatch: workers and the last hour are the leader's."),
  ];
}

/** Completed and failed jobs of each minute of the last hour, as bars. */
function chart(minutes) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("id", "last-hour");
  svg.setAttribute("viewBox", "0 0 600 100");
  svg.setAttribute("preserveAspectRatio", "none");
  const most = Math.max(1, ...minutes.map((minute) => minute.completed + minute.failed));
  minutes.forEach((minute, index) => {
    let top = 100;
    for (const [count, colour] of [[minute.completed, "#1a7f37"], [minute.failed, "#cf222e"]]) {
      if (!count) continue;
      const height = (count / most) * 96;
      top -= height;
      const bar = document.createElementNS(ns, "rect");
      bar.setAttribute("x", index * 10 + 1);
      bar.setAttribute("y", top);
      bar.setAttribute("width", 8);
      bar.setAttribute("height", height);
      bar.setAttribute("fill", colour);
      svg.append(bar);
    }
  });
  const completed = minutes.reduce((sum, minute) => sum + minute.completed, 0);
  const failed = minutes.reduce((sum, minute) => sum + minute.failed, 0);
  return h("figure", { class: "chart" }, svg,
    h("figcaption", { class: "legend" }, h("span", { class: "ok" }, `${completed} completed`), " · ", h("span", { class: "bad" }, `${failed} failed`), " in the last 60 minutes, a bar a minute"));
}

const filterNames = ["state", "effect", "provider", "user", "error", "from", "to"];

async function jobsPage(query) {
  const filter = {};
  for (const name of filterNames) if (query.get(name)) filter[name] = query.get(name);
  const parameters = new URLSearchParams(filter);
  if (query.get("cursor")) parameters.set("cursor", query.get("cursor"));
  const page = await api("GET", `/admin/v1/jobs?${parameters}`);
  const field = (name, label, input) => h("label", {}, label, input);
  const text = (name, placeholder) => h("input", { id: `filter-${name}`, name, value: filter[name] || "", placeholder });
  const states = h("select", { id: "filter-state", name: "state" }, h("option", { value: "" }, "any"),
    ["queued", "processing", "completed", "failed", "cancelled"].map((state) => h("option", { value: state, selected: filter.state === state }, state)));
  const form = h("form", { class: "filters", id: "filters", onsubmit: (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const element of event.target.elements) if (element.name && element.value) next.set(element.name, element.value);
    location.hash = `#/jobs?${next}`;
  } },
  field("state", "State", states), field("effect", "Effect", text("effect", "nano-banana")), field("provider", "Provider", text("provider", "gemini, fal, none")),
  field("user", "User", text("user", "user id")), field("error", "Error contains", text("error", "quota")),
  field("from", "Created from", text("from", "2026-11-29T14:00:00Z")), field("to", "Created before", text("to", "2026-11-29T14:20:00Z")),
  h("button", { id: "filter-apply", type: "submit", class: "act" }, "Filter"));

  const selected = () => [...document.querySelectorAll(".job-select:checked")].map((box) => box.value);
  const batch = (verb, route) => [
    h("button", { id: `${verb}-selected`, class: verb === "cancel" ? "danger" : "act", onclick: () => {
      const ids = selected();
      if (!ids.length) return say("Select jobs first.", true);
      act(`${verb === "retry" ? "Retry" : "Cancel"} the ${ids.length} selected job(s)?`, () => api("POST", route, { ids }),
        (result) => `${verb}: ${result.changed} of ${result.matched} changed${result.denied ? `, ${result.denied} denied by quota` : ""}${result.settling ? `, ${result.settling} still settling` : ""}.`);
    } }, `${verb === "retry" ? "Retry" : "Cancel"} selected`),
    h("button", { id: `${verb}-matching`, class: verb === "cancel" ? "danger" : "act", onclick: () =>
      act(`${verb === "retry" ? "Retry" : "Cancel"} every job matching this filter (the newest 1,000)?`, () => api("POST", route, { filter }),
        (result) => `${verb}: ${result.changed} of ${result.matched} changed${result.denied ? `, ${result.denied} denied by quota` : ""}${result.settling ? `, ${result.settling} still settling` : ""}.`) },
    `${verb === "retry" ? "Retry" : "Cancel"} all matching`),
  ];
  const rows = page.jobs.map((job) => h("tr", { "data-job-id": job.id },
    adminOnly(h("td", {}, h("input", { type: "checkbox", class: "job-select", value: job.id, "aria-label": `select ${job.id}` }))),
    h("td", {}, h("a", { class: "job-link", href: `#/job/${encodeURIComponent(job.id)}` }, job.id.slice(0, 8))),
    h("td", { class: `state-${job.status}` }, job.status), h("td", {}, job.effect),
    h("td", { class: "hide-narrow" }, h("a", { href: `#/user/${encodeURIComponent(job.userId)}` }, job.userId)),
    h("td", { class: "wrap" }, job.error || ""), h("td", { class: "hide-narrow" }, when(job.createdAt))));
  const next = page.nextCursor ? (() => { const more = new URLSearchParams(filter); more.set("cursor", page.nextCursor); return h("a", { id: "next-page", href: `#/jobs?${more}` }, "Older jobs →"); })() : null;
  return [
    h("h1", {}, "Jobs"), form,
    h("p", { class: "legend" }, Object.entries(page.counts).map(([state, count]) => `${state} ${count}`).join(" · ")),
    h("div", { class: "actions" }, adminOnly(...batch("retry", "/admin/v1/jobs/retry"), ...batch("cancel", "/admin/v1/jobs/cancel"))),
    table("jobs-table", [...adminOnly(""), "Job", "State", "Effect", h("span", { class: "hide-narrow" }, "User"), "Error", h("span", { class: "hide-narrow" }, "Created")], rows),
    next,
  ];
}

async function jobPage(id) {
  const detail = await api("GET", `/admin/v1/jobs/${encodeURIComponent(id)}`);
  const job = detail.job;
  const images = h("div", { class: "images" });
  for (const [kind, present] of [["input", true], ["result", job.status === "completed"], ["thumbnail", job.status === "completed"]]) {
    if (!present) continue;
    const image = h("img", { id: `img-${kind}`, alt: `${kind} of ${job.id}` });
    images.append(h("figure", {}, image, h("figcaption", { class: "legend" }, kind)));
    api("GET", `/admin/v1/jobs/${encodeURIComponent(job.id)}/files/${kind}`, undefined, { raw: true })
      .then((response) => response.blob()).then((blob) => { const url = URL.createObjectURL(blob); objectURLs.push(url); image.src = url; })
      .catch(() => { image.alt = `${kind}: not available`; });
  }
  const fields = [
    ["Status", h("span", { id: "job-status", class: `state-${job.status}` }, job.status + (job.cancelRequested && job.status === "processing" ? " (cancel asked)" : ""))],
    ["User", h("a", { href: `#/user/${encodeURIComponent(job.userId)}` }, job.userId)],
    ["Effect", job.effect], ["Prompt", job.prompt || ""], ["Credits", `${job.credits} (${detail.settlement})`],
    ["Attempts", `${job.attempts} of ${job.maxAttempts}`], ["Progress", `${Math.round(job.progress * 100)} %`],
    ["Error", h("span", { id: "job-error" }, job.error || "")], ["Provider request", job.providerRequestId || ""], ["Trace", job.traceId || ""],
    ["Created", when(job.createdAt)], ["Started", when(job.startedAt)], ["Finished", when(job.finishedAt)], ["Updated", when(job.updatedAt)],
  ];
  if (!["completed", "failed", "cancelled"].includes(job.status)) timers.push(setTimeout(render, 2000));
  return [
    h("h1", {}, `Job ${job.id}`),
    h("div", { class: "actions" }, adminOnly(
      job.status === "failed" ? h("button", { id: "job-retry", class: "act", onclick: () =>
        act("Run this job again? Its credits are reserved again.", () => api("POST", "/admin/v1/jobs/retry", { ids: [job.id] }),
          (result) => (result.changed ? "Queued again." : result.denied ? "Quota refused: the user has no credits left." : result.settling ? "Its credits are still on their way back; try again in a moment." : "Not failed any more.")) }, "Retry") : null,
      ["queued", "processing"].includes(job.status) ? h("button", { id: "job-cancel", class: "danger", onclick: () =>
        act("Cancel this job? Its credits go back to the user.", () => api("POST", "/admin/v1/jobs/cancel", { ids: [job.id] }), () => "Cancel asked.") }, "Cancel") : null)),
    h("dl", { id: "job-detail" }, fields.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)])),
    h("h2", {}, "Attempts"),
    table("attempts-table", ["#", "Worker", "Started", "Ended", "Outcome", "Error"], detail.attempts.map((attempt) => h("tr", {},
      h("td", {}, attempt.attempt), h("td", {}, attempt.workerId || ""), h("td", {}, when(attempt.startedAt)), h("td", {}, when(attempt.endedAt)),
      h("td", { class: `state-${attempt.outcome || "processing"}` }, attempt.outcome || "running"), h("td", { class: "wrap" }, attempt.error || "")))),
    h("h2", {}, "Files"), images,
  ];
}

async function providersPage() {
  const overview = await api("GET", "/admin/v1/overview");
  const rows = overview.providers.map((provider) => {
    const base = `/admin/v1/providers/${encodeURIComponent(provider.provider)}`;
    const limit = h("input", { type: "number", min: 1, max: 10000, value: provider.limit ?? "", placeholder: "none", class: "limit-input" });
    return h("tr", { "data-provider": provider.provider },
      h("td", {}, provider.provider), h("td", {}, provider.queued), h("td", {}, provider.processing), h("td", {}, provider.inFlight ?? "?"),
      h("td", {}, provider.limit ?? "none", provider.limitSetLive ? " (live)" : ""), h("td", {}, ago(provider.oldestQueuedAt)),
      h("td", { class: "waits" }, provider.rateLimitWaits ?? "?"), h("td", { class: "refusals" }, provider.refusals ?? "?"),
      h("td", { class: provider.paused ? "paused" : "" }, provider.paused ? "paused" : "running"),
      adminOnly(h("td", {},
        provider.paused
          ? h("button", { class: "act resume", onclick: () => act(null, () => api("POST", `${base}/resume`), () => `Resumed ${provider.provider}.`) }, "Resume")
          : h("button", { class: "danger pause", onclick: () => act(`Pause ${provider.provider}? Its jobs stay queued until it is resumed.`, () => api("POST", `${base}/pause`), () => `Paused ${provider.provider}.`) }, "Pause"),
        " ", limit, " ",
        h("button", { class: "act set-limit", onclick: () => act(`Set ${provider.provider}'s concurrency to ${limit.value || "the configured one"}?`,
          () => api("PUT", `${base}/concurrency`, { limit: limit.value ? Number(limit.value) : null }), () => `Concurrency of ${provider.provider} set.`) }, "Set"),
        provider.limitSetLive ? h("button", { class: "reset-limit", onclick: () => act(null, () => api("PUT", `${base}/concurrency`, { limit: null }), () => "Back to the configured concurrency.") }, "Reset") : null)));
  });
  return [
    h("h1", {}, "Providers"),
    table("providers-table", ["Provider", "Queued", "Processing", "In flight", "Concurrency", "Oldest queued", "Rate-limit waits", "Refusals", "Dispatch", ...adminOnly("")], rows),
    h("p", { class: "legend" }, "In flight: jobs held by workers. Rate-limit waits (the provider asked to wait) and refusals (for safety) are counted over the connected workers since each started."),
  ];
}

async function workersPage() {
  const overview = await api("GET", "/admin/v1/overview");
  const rows = overview.workers.map((worker) => {
    const base = `/admin/v1/workers/${encodeURIComponent(worker.id)}`;
    return h("tr", { "data-worker": worker.id },
      h("td", {}, worker.id), h("td", {}, worker.host || ""), h("td", {}, worker.version || ""), h("td", {}, worker.capacity), h("td", {}, worker.prefetch),
      h("td", {}, worker.running), h("td", {}, worker.awaiting), h("td", {}, `${ago(worker.lastHeartbeat)} ago`),
      h("td", { class: worker.drained ? "paused" : "" }, worker.drained ? "drained" : worker.leaving ? "leaving" : "taking jobs"),
      adminOnly(h("td", {}, worker.drained
        ? h("button", { class: "act undrain", onclick: () => act(null, () => api("POST", `${base}/undrain`), () => `${worker.id} takes jobs again.`) }, "Undrain")
        : h("button", { class: "danger drain", onclick: () => act(`Drain ${worker.id}? It finishes what it holds and takes nothing new.`, () => api("POST", `${base}/drain`), () => `${worker.id} drained.`) }, "Drain"))));
  });
  return [
    h("h1", {}, "Workers"),
    table("workers-table", ["Worker", "Host", "Version", "Capacity", "Prefetch", "Running", "At providers", "Heartbeat", "State", ...adminOnly("")], rows),
    overview.workers.length ? null : h("p", {}, "No worker is connected."),
  ];
}

async function usersPage() {
  const input = h("input", { id: "user-search", placeholder: "user id, or a device id", required: true });
  return [
    h("h1", {}, "Users"),
    h("form", { class: "inline", onsubmit: (event) => {
      event.preventDefault();
      let id = input.value.trim();
      // A bare device id (the app's X-Device-Id) is the guest user `device:<id>`.
      if (/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(id)) id = `device:${id.toLowerCase()}`;
      location.hash = `#/user/${encodeURIComponent(id)}`;
    } }, h("label", {}, "User", input), h("button", { id: "user-search-button", type: "submit", class: "act" }, "Look up")),
  ];
}

async function userPage(id) {
  const encoded = encodeURIComponent(id);
  const [usage, jobs] = await Promise.all([api("GET", `/admin/v1/users/${encoded}/usage`), api("GET", `/admin/v1/jobs?user=${encoded}&limit=20`)]);
  const status = usage.status;
  const windows = [status.daily, status.monthly].map((window) => h("tr", { "data-window": window.name },
    h("td", {}, window.name), h("td", {}, window.limit ?? "none"), h("td", { class: "used" }, window.used),
    h("td", { class: "remaining", id: `user-${window.name}-remaining` }, window.remaining ?? "no limit"), h("td", {}, when(window.resetsAt))));
  const credits = h("input", { id: "grant-credits", type: "number", min: -10000, max: 10000, required: true, placeholder: "10, or -5 to take back" });
  const reason = h("input", { id: "grant-reason", required: true, maxlength: 500, placeholder: "why (for the audit log)" });
  const plan = h("select", { id: "plan-name" }, ["free", "pro"].map((name) => h("option", { value: name, selected: status.plan === name }, name)));
  const ends = h("input", { id: "plan-ends", placeholder: "ends at (ISO 8601), empty: never" });
  return [
    h("h1", {}, `User ${id}`),
    h("dl", {}, h("dt", {}, "Plan"), h("dd", { id: "user-plan" }, `${status.plan}${status.isPro ? " (PRO)" : ""}`),
      h("dt", {}, "Plan ends"), h("dd", {}, status.planEndsAt ? when(status.planEndsAt) : "never"),
      h("dt", {}, "Time zone"), h("dd", {}, status.timeZone || "UTC")),
    h("h2", {}, "Credits"),
    table("windows-table", ["Window", "Limit", "Used", "Left", "Resets"], windows),
    adminOnly(
      h("form", { class: "inline", id: "grant-form", onsubmit: (event) => {
        event.preventDefault();
        const amount = Number(credits.value);
        act(`${amount > 0 ? `Grant ${amount}` : `Take back ${-amount}`} credit(s) ${amount > 0 ? "to" : "from"} ${id}?`,
          () => api("POST", `/admin/v1/users/${encoded}/credits`, { credits: amount, reason: reason.value }), () => "Credits changed.");
      } }, h("label", {}, "Credits", credits), h("label", {}, "Reason", reason), h("button", { id: "grant-button", type: "submit", class: "act" }, "Apply")),
      h("form", { class: "inline", id: "plan-form", onsubmit: (event) => {
        event.preventDefault();
        act(`Put ${id} on ${plan.value}?`, () => api("PUT", `/admin/v1/users/${encoded}/plan`, { plan: plan.value, endsAt: ends.value || null }), () => "Plan changed.");
      } }, h("label", {}, "Plan", plan), h("label", {}, "Ends", ends), h("button", { id: "plan-button", type: "submit", class: "act" }, "Change plan"))),
    h("h2", {}, "Recent jobs"),
    table("user-jobs", ["Job", "State", "Effect", "Error", "Created"], jobs.jobs.map((job) => h("tr", { "data-job-id": job.id },
      h("td", {}, h("a", { href: `#/job/${encodeURIComponent(job.id)}` }, job.id.slice(0, 8))), h("td", { class: `state-${job.status}` }, job.status),
      h("td", {}, job.effect), h("td", { class: "wrap" }, job.error || ""), h("td", {}, when(job.createdAt))))),
    h("h2", {}, "Latest charges"),
    table("charges", ["Job", "Credits", "State"], usage.charges.slice(0, 20).map((charge) =>
      h("tr", {}, h("td", {}, charge.jobId), h("td", {}, charge.cost), h("td", {}, charge.state)))),
  ];
}

async function auditPage() {
  const page = await api("GET", "/admin/v1/audit?limit=200");
  return [
    h("h1", {}, "Audit log"),
    table("audit-table", ["When", "Who", "Action", "Target", "Filter", "Count", "Detail"], page.entries.map((entry) => h("tr", {},
      h("td", {}, when(entry.at)), h("td", {}, entry.actor), h("td", {}, entry.action), h("td", { class: "wrap" }, entry.target),
      h("td", { class: "wrap" }, entry.filter || ""), h("td", {}, entry.count), h("td", { class: "wrap" }, entry.detail || "")))),
  ];
}

// MARK: Routing

const routes = [
  [/^#\/?$/, queuePage, 3000],
  [/^#\/jobs(?:\?(.*))?$/, (match) => jobsPage(new URLSearchParams(match[1] || "")), 0],
  [/^#\/job\/(.+)$/, (match) => jobPage(decodeURIComponent(match[1])), 0],
  [/^#\/providers$/, providersPage, 3000],
  [/^#\/workers$/, workersPage, 3000],
  [/^#\/users$/, usersPage, 0],
  [/^#\/user\/(.+)$/, (match) => userPage(decodeURIComponent(match[1])), 0],
  [/^#\/audit$/, auditPage, 0],
];

let rendering = 0;
async function render() {
  for (const timer of timers) clearTimeout(timer);
  timers = [];
  const main = document.getElementById("main");
  if (!session.token) return showLogin();
  document.getElementById("nav").hidden = false;
  document.getElementById("who").hidden = false;
  document.getElementById("role").textContent = session.role;
  const hash = location.hash || "#/";
  const found = routes.map(([pattern, page, every]) => [hash.match(pattern), page, every]).find(([match]) => match);
  const [match, page, every] = found || [null, queuePage, 3000];
  for (const link of document.querySelectorAll("header nav a")) link.classList.toggle("current", hash.startsWith(link.getAttribute("href")) && link.getAttribute("href") !== "#/" || (hash === "#/" && link.id === "nav-queue"));
  const ticket = ++rendering;
  try {
    const content = await page(match || []);
    if (ticket !== rendering) return;
    for (const url of objectURLs.splice(0)) URL.revokeObjectURL(url);
    main.replaceChildren(...[content].flat(Infinity).filter(Boolean));
    main.dataset.page = page.name;
  } catch (error) {
    if (ticket !== rendering) return;
    if (!session.token) return showLogin();
    say(error.message, true);
  }
  if (every && ticket === rendering) timers.push(setTimeout(() => refresh(every), every));
}

/** A page's periodic refresh, put off while the operator types in it or answers a question. */
function refresh(every) {
  const focused = document.activeElement;
  const busy = document.getElementById("confirm-dialog").open || (focused && focused.matches("main input, main select"));
  if (busy) timers.push(setTimeout(() => refresh(every), every));
  else render();
}

function showLogin() {
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  const main = document.getElementById("main");
  const template = document.getElementById("login") || loginForm;
  main.replaceChildren(template);
  main.dataset.page = "login";
}

let loginForm;
async function signIn(event) {
  event.preventDefault();
  const token = document.getElementById("token").value;
  const response = await fetch("/admin/v1/session", { headers: { Authorization: `Bearer ${token}` } });
  if (!response.ok) return say(response.status === 403 ? "That token is neither the admin nor the viewer token." : `Sign-in failed: ${response.status}`, true);
  const { role } = await response.json();
  session.save(token, role);
  document.getElementById("token").value = "";
  say("");
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  loginForm = document.getElementById("login");
  loginForm.addEventListener("submit", signIn);
  document.getElementById("logout").addEventListener("click", () => { session.clear(); say(""); location.hash = "#/"; showLogin(); });
  window.addEventListener("hashchange", () => { say(""); render(); });
  render();
});
