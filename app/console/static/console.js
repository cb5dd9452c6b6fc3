// tinker-serve web console: plain JS over the REST API (no build step). The API key lives in sessionStorage and
// travels only as the X-API-Key header. Views: #/ (sessions, runs, server) and #/runs/<id> (curves, checkpoints).
"use strict";

(() => {
  const HISTORY_POLL_MS = 1000; // an open run page asks for new history points this often (after_seq paging)
  const STATUS_POLL_MS = 5000; // the overview refreshes the server panel this often
  const CHECKPOINT_EVERY_POLLS = 10; // the run page's checkpoint list refreshes at least this often (in polls)
  const HISTORY_PAGE = 5000; // points per history request (the endpoint's maximum)
  const KEY_ITEM = "tinker-console-key";
  const SERIES_COLORS = { forward_backward: "#2563eb", forward: "#db2777", optim_step: "#059669" };

  const view = document.getElementById("view");
  // what the page plots, for tests and the curious: charts by metric (uPlot instances: .data is what is drawn)
  const exposed = (window.tinkerConsole = { pollMs: HISTORY_POLL_MS, charts: {}, kinds: {}, points: [], lastSeq: -1 });
  let stopView = () => {}; // ends the current view's polling
  let generation = 0; // counts renders: a view whose render was overtaken draws nothing more

  // ---- small helpers -------------------------------------------------------------------------------------------

  /** An element with attributes (on* become listeners) and children (strings become text, never markup). */
  function h(tag, attrs = {}, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else if (name === "class") el.className = value;
      else el.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child !== null && child !== undefined && child !== false) el.append(child);
    }
    return el;
  }

  function toast(message, isError = false) {
    const el = document.getElementById("toast");
    el.textContent = message;
    el.className = isError ? "error" : "";
    el.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => (el.hidden = true), isError ? 6000 : 2500);
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) (n /= 1024), i++;
    return `${n.toFixed(i && n < 10 ? 1 : 0)} ${units[i]}`;
  }

  function when(iso) {
    return iso ? new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" }) : "–";
  }

  function remaining(iso) {
    if (!iso) return "never";
    const s = (new Date(iso) - Date.now()) / 1000;
    if (s <= 0) return "expiring";
    if (s < 3600) return `in ${Math.ceil(s / 60)} min`;
    if (s < 36 * 3600) return `in ${Math.round(s / 3600)} h`;
    return `in ${Math.round(s / 86400)} days`;
  }

  function short(id, keep = 10) {
    return id.length > keep * 2 + 1 ? `${id.slice(0, keep)}…${id.slice(-keep)}` : id;
  }

  // ---- the API -------------------------------------------------------------------------------------------------

  class ApiError extends Error {}

  async function api(method, path, body) {
    const headers = { "X-API-Key": sessionStorage.getItem(KEY_ITEM) || "" };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(`api/v1/${path}`, init);
    const data = await response.json().catch(() => null);
    if (response.status === 401) {
      signOut((data && data.error) || "This key was refused.");
      throw new ApiError("unauthorized");
    }
    if (!response.ok) throw new ApiError((data && data.error) || `${response.status} ${response.statusText}`);
    return data;
  }

  const enc = encodeURIComponent;
  const runPath = (runId) => `training_runs/${enc(runId)}`;
  // checkpoint ids are `{kind}/{name}`: the slash stays a path separator, as the routes expect
  const checkpointPath = (runId, id) => `${runPath(runId)}/checkpoints/${id.split("/").map(enc).join("/")}`;

  // ---- sign in / out -------------------------------------------------------------------------------------------

  function signOut(reason) {
    sessionStorage.removeItem(KEY_ITEM);
    render(reason);
  }

  function loginView(reason) {
    const input = h("input", {
      id: "api-key", type: "password", autocomplete: "off", spellcheck: "false", placeholder: "tml-…", required: true,
    });
    const error = h("p", { class: "error-text", id: "login-error" }, reason || "");
    const form = h("form", { class: "card login", id: "login-form", onsubmit: async (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_ITEM, input.value.trim());
      try {
        await api("GET", "training_runs?limit=1"); // a 401 signs out again, with the server's reason
        render();
      } catch (err) {
        if (!(err instanceof ApiError && err.message === "unauthorized")) error.textContent = err.message;
      }
    } },
      h("h1", {}, "Sign in"),
      h("p", { class: "muted" }, "Your Tinker API key. It stays in this browser tab (session storage) and is sent " +
        "only in the X-API-Key header of API calls."),
      h("label", { for: "api-key" }, "API key"), input,
      h("button", { type: "submit", class: "primary", id: "sign-in" }, "Sign in"),
      error);
    view.replaceChildren(form);
    input.focus();
  }

  // ---- overview: sessions, runs, server ------------------------------------------------------------------------

  function table(headings, rows, empty, id) {
    if (!rows.length) return h("p", { class: "muted empty" }, empty);
    return h("table", { class: "responsive", id },
      h("thead", {}, h("tr", {}, headings.map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.map((cells) => h("tr", {},
        cells.map((cell, i) => h("td", { "data-label": headings[i] }, cell))))));
  }

  const runLink = (runId) => h("a", { href: `#/runs/${enc(runId)}`, class: "mono", title: runId }, short(runId, 14));

  async function overview() {
    const runsBox = h("section", { class: "card", id: "runs" }, h("h2", {}, "Training runs"), h("p", { class: "muted" }, "Loading…"));
    const sessionsBox = h("section", { class: "card", id: "sessions" }, h("h2", {}, "Sessions"), h("p", { class: "muted" }, "Loading…"));
    const serverBox = h("section", { class: "card", id: "server" }, h("h2", {}, "Server"), h("p", { class: "muted" }, "Loading…"));
    view.replaceChildren(h("div", { class: "grid" }, runsBox, serverBox, sessionsBox));
    const refresh = async () => serverBox.replaceChildren(h("h2", {}, "Server"), serverPanel(await api("GET", "server_status")));
    const serverShown = refresh();

    const [runs, sessions] = await Promise.all([
      api("GET", "training_runs?limit=100"),
      api("POST", "sessions/search", { limit: 20 }),
    ]);
    runsBox.replaceChildren(...[h("h2", {}, "Training runs ", h("span", { class: "count" }, runs.cursor.total_count)),
      table(["Run", "Base model", "LoRA rank", "Started"], runs.training_runs.map((r) => [
        runLink(r.training_run_id), r.base_model, String(r.lora_rank), when(r.last_request_time),
      ]), "No training runs yet: create a LoRA training client with the tinker SDK.", "runs-table"),
      runs.cursor.total_count > runs.training_runs.length
        ? h("p", { class: "muted small" }, `The newest ${runs.training_runs.length} of ${runs.cursor.total_count}.`) : null,
    ].filter(Boolean));

    const members = await Promise.all(sessions.sessions.map((s) => api("GET", `sessions/${enc(s.session_id)}`)
      .catch(() => ({ training_run_ids: [] }))));
    sessionsBox.replaceChildren(h("h2", {}, "Sessions"),
      table(["Session", "Started", "Status", "Runs", "Checkpoints"], sessions.sessions.map((s, i) => [
        h("span", {}, s.display_name ? h("b", {}, s.display_name, " ") : null, h("span", { class: "mono", title: s.session_id }, short(s.session_id))),
        when(s.created_at),
        statusBadge(s.status),
        h("span", { class: "links" }, members[i].training_run_ids.map(runLink)),
        `${s.checkpoints_count} · ${bytes(s.checkpoint_storage_bytes)}`,
      ]), "No sessions yet.", "sessions-table"));

    await serverShown;
    const timer = setInterval(() => refresh().catch(() => {}), STATUS_POLL_MS);
    return () => clearInterval(timer);
  }

  function statusBadge(status) {
    if (!status) return h("span", { class: "badge" }, "expired");
    if (status.type === "active") return h("span", { class: "badge live" }, "active");
    return h("span", { class: "badge" }, `finished: ${status.reason.type}`);
  }

  function replicaText(replicas) {
    if (!replicas) return "unknown";
    const entries = Object.entries(replicas);
    return entries.length ? entries.map(([state, n]) => `${n} ${state.toLowerCase()}`).join(", ") : "none";
  }

  function serverPanel(status) {
    return h("div", { class: "server" }, status.base_models.map((m) => h("div", { class: "model" },
      h("h3", {}, m.name, h("span", { class: "muted" }, ` · context ${m.max_context_length}`)),
      h("dl", {},
        m.trainers.map((t) => [
          h("dt", {}, `Trainer ${t.name}`),
          h("dd", {}, dot(t.ready), `${t.num_workers} worker${t.num_workers === 1 ? "" : "s"} × ${t.cpus_per_worker} CPU${t.use_gpu ? " + GPU" : ""} · ` +
            `${replicaText(t.replicas)} · queue ${t.in_flight}`),
        ]),
        h("dt", {}, "Samplers"),
        h("dd", {}, dot(m.sampler.ready), `${replicaText(m.sampler.replicas)} ` +
          `(autoscale ${m.sampler.min_replicas}–${m.sampler.max_replicas}) · queue ${m.sampler.in_flight} / ${m.sampler.max_pending}`),
      ))),
      h("p", { class: "muted small" }, `Queues count this ingress replica's requests (of ${status.ingress_replicas}).`));
  }

  const dot = (ok) => h("span", { class: `dot ${ok ? "ok" : "down"}`, title: ok ? "answering" : "not answering" });

  // ---- a run: curves and checkpoints ---------------------------------------------------------------------------

  async function runView(runId, stale) {
    const run = await api("GET", runPath(runId));
    if (stale()) return () => {};
    Object.assign(exposed, { charts: {}, kinds: {}, points: [], lastSeq: -1, drawnSeq: -1, drawnAt: null });
    const steps = h("dd", { id: "steps" }, "–");
    const updated = h("span", { class: "muted small", id: "updated" });
    const live = h("span", { class: "badge live", id: "live" }, "live");
    const charts = h("div", { class: "charts", id: "charts" });
    const checkpoints = h("section", { class: "card", id: "checkpoints" }, h("h2", {}, "Checkpoints"));
    view.replaceChildren(
      h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Overview"), " / run"),
      h("section", { class: "card run-head" },
        h("h1", { class: "mono", title: run.training_run_id }, run.training_run_id),
        h("dl", { class: "facts" },
          h("dt", {}, "Base model"), h("dd", {}, run.base_model),
          h("dt", {}, "LoRA rank"), h("dd", {}, String(run.lora_rank)),
          h("dt", {}, "Started"), h("dd", {}, when(run.last_request_time)),
          h("dt", {}, "Last snapshot"), h("dd", {}, when(run.last_snapshot_time)),
          h("dt", {}, "Steps"), steps,
          h("dt", {}, "Curves"), h("dd", {}, live, " ", updated))),
      h("section", { class: "card" }, h("h2", {}, "Metrics"), charts),
      checkpoints);

    const plots = new Map(); // chart name -> {rows, kinds, plot}
    let stopped = false;
    let busy = false;
    let polls = 0;

    const poll = async () => {
      if (busy || stopped || document.hidden) return;
      busy = true;
      try {
        let fresh = [];
        for (;;) { // page until the end: a new page starts after the last point drawn
          const page = await api("GET", `${runPath(runId)}/history?after_seq=${exposed.lastSeq}&limit=${HISTORY_PAGE}`);
          fresh = fresh.concat(page.points);
          if (page.points.length) exposed.lastSeq = page.points[page.points.length - 1].seq_id;
          if (page.next_after_seq === null || stopped) break;
        }
        updated.textContent = `checked ${new Date().toLocaleTimeString()}`;
        if (fresh.length && !stopped) {
          exposed.points.push(...fresh);
          addPoints(charts, plots, fresh);
          const last = exposed.points[exposed.points.length - 1];
          steps.textContent = `${last.step} optimizer steps · ${exposed.points.length} operations`;
          exposed.drawnSeq = exposed.lastSeq;
          exposed.drawnAt = Date.now();
        }
        // checkpoints: on the first poll, after new steps, and now and then (a save is no history point)
        if ((fresh.length || polls % CHECKPOINT_EVERY_POLLS === 0) && !stopped) await showCheckpoints(checkpoints, runId);
        polls += 1;
      } catch (err) {
        if (!(err instanceof ApiError && err.message === "unauthorized")) toast(`History: ${err.message}`, true);
      } finally {
        busy = false;
      }
    };
    await poll();
    const timer = setInterval(poll, HISTORY_POLL_MS);
    const onResize = () => plots.forEach((p) => p.plot && p.plot.setSize(chartSize(p.box)));
    window.addEventListener("resize", onResize);
    return () => {
      stopped = true;
      clearInterval(timer);
      window.removeEventListener("resize", onResize);
      plots.forEach((p) => p.plot && p.plot.destroy());
    };
  }

  function chartSize(box) {
    const width = Math.max(240, box.clientWidth);
    return { width, height: Math.round(Math.min(260, Math.max(170, width * 0.45))) };
  }

  /** Each metric (and the learning rate) is one chart over optimizer steps, one series per operation kind. */
  function addPoints(container, plots, points) {
    const touched = new Set();
    for (const p of points) {
      const values = Object.entries(p.metrics || {});
      if (p.kind === "optim_step" && p.learning_rate !== null) values.push(["learning_rate", p.learning_rate]);
      for (const [name, value] of values) {
        if (typeof value !== "number") continue;
        let chart = plots.get(name);
        if (!chart) {
          chart = { rows: [], kinds: [], box: h("div", { class: "chart", "data-metric": name }) };
          plots.set(name, chart);
          container.append(h("figure", {}, h("figcaption", {}, name), chart.box));
        }
        chart.rows.push({ seq: p.seq_id, step: p.step, kind: p.kind, value });
        touched.add(name);
      }
    }
    [...plots.keys()].sort(metricOrder).forEach((name) => container.append(plots.get(name).box.parentElement));
    for (const name of touched) draw(name, plots.get(name));
  }

  const metricOrder = (a, b) => rank(a) - rank(b) || a.localeCompare(b);
  const rank = (name) => (name.startsWith("loss") ? 0 : name === "learning_rate" ? 2 : 1);

  function draw(name, chart) {
    const kinds = [...new Set(chart.rows.map((r) => r.kind))];
    const data = [chart.rows.map((r) => r.step), ...kinds.map((k) => chart.rows.map((r) => (r.kind === k ? r.value : null)))];
    chart.box.dataset.points = String(chart.rows.length);
    if (chart.plot && kinds.join() === chart.kinds.join()) {
      chart.plot.setData(data);
      return;
    }
    if (chart.plot) chart.plot.destroy();
    chart.kinds = kinds;
    const single = chart.rows.length < 2;
    chart.plot = new uPlot({
      ...chartSize(chart.box),
      scales: { x: { time: false } },
      axes: [
        { label: "step", stroke: "#64748b", grid: { stroke: "#e2e8f0" }, size: 38 },
        { stroke: "#64748b", grid: { stroke: "#e2e8f0" }, size: 58, values: (u, ticks) => ticks.map((v) => fmt(u, v)) },
      ],
      series: [
        { label: "step", value: (u, v) => (v === null || v === undefined ? "–" : String(v)) },
        ...kinds.map((k) => ({
          label: k, stroke: SERIES_COLORS[k] || "#7c3aed", width: 2, spanGaps: true,
          points: { show: single || undefined, size: 6 }, value: (u, v) => (v === null || v === undefined ? "–" : fmt(u, v)),
        })),
      ],
      legend: { live: true },
    }, data, chart.box);
    exposed.charts[name] = chart.plot;
    exposed.kinds[name] = kinds;
  }

  function fmt(u, v) {
    if (v === null || v === undefined) return "";
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : String(+v.toPrecision(4));
  }

  async function showCheckpoints(box, runId) {
    const { checkpoints } = await api("GET", `${runPath(runId)}/checkpoints`);
    const rows = checkpoints.map((c) => {
      const act = (label, handler, cls = "") => h("button", {
        type: "button", class: `small ${cls}`, "data-action": label.toLowerCase(), onclick: async (event) => {
          event.target.disabled = true;
          try {
            await handler();
          } catch (err) {
            if (!(err instanceof ApiError && err.message === "unauthorized")) toast(err.message, true);
          } finally {
            event.target.disabled = false;
          }
          await showCheckpoints(box, runId);
        } }, label);
      const path = checkpointPath(runId, c.checkpoint_id);
      return h("tr", { "data-checkpoint": c.checkpoint_id, "data-public": String(c.public) },
        h("td", { "data-label": "Checkpoint" }, h("span", { class: "mono" }, c.checkpoint_id),
          h("div", { class: "muted small" }, c.checkpoint_type, " · ", when(c.time))),
        h("td", { "data-label": "Size" }, bytes(c.size_bytes)),
        h("td", { "data-label": "Expires", title: c.expires_at || "kept until deleted" }, remaining(c.expires_at)),
        h("td", { "data-label": "Published" }, c.public ? h("span", { class: "badge live" }, "public") : h("span", { class: "badge" }, "private")),
        h("td", { class: "actions", "data-label": "" },
          c.public
            ? act("Unpublish", () => api("DELETE", `${path}/publish`).then(() => toast("Unpublished")))
            : act("Publish", () => api("POST", `${path}/publish`).then(() => toast("Published: other users can read it"))),
          act("TTL", () => editTtl(c, path)),
          act("Copy path", () => copy(c.tinker_path)),
          act("Delete", async () => {
            if (confirm(`Delete ${c.tinker_path}? This cannot be undone.`)) {
              await api("DELETE", path);
              toast("Deleted");
            }
          }, "danger")));
    });
    const heading = h("h2", {}, "Checkpoints ", h("span", { class: "count" }, checkpoints.length));
    if (!rows.length) {
      box.replaceChildren(heading, h("p", { class: "muted empty" }, "No checkpoints yet (save_state or save_weights_for_sampler with a name)."));
    } else {
      box.replaceChildren(heading, h("table", { class: "responsive", id: "checkpoints-table" },
        h("thead", {}, h("tr", {}, ["Checkpoint", "Size", "Expires", "Published", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows)));
    }
  }

  function editTtl(checkpoint, path) {
    const dialog = document.getElementById("ttl-dialog");
    document.getElementById("ttl-target").textContent = checkpoint.tinker_path;
    return new Promise((resolve, reject) => {
      dialog.addEventListener("close", async () => {
        try {
          if (dialog.returnValue === "set") {
            const amount = Number(document.getElementById("ttl-amount").value);
            const unit = Number(document.getElementById("ttl-unit").value);
            await api("PUT", `${path}/ttl`, { ttl_seconds: Math.round(amount * unit) });
            toast("TTL set");
          } else if (dialog.returnValue === "keep") {
            await api("PUT", `${path}/ttl`, { ttl_seconds: null });
            toast("Kept until deleted");
          }
          resolve();
        } catch (err) {
          reject(err);
        }
      }, { once: true });
      dialog.returnValue = "cancel";
      dialog.showModal();
    });
  }

  async function copy(text) {
    try {
      await navigator.clipboard.writeText(text);
    } catch { // no clipboard outside secure contexts (plain http off localhost): select it for a manual copy
      const field = h("input", { value: text, readonly: true, class: "copy-field" });
      document.body.append(field);
      field.select();
      document.execCommand("copy");
      field.remove();
    }
    toast(`Copied ${text}`);
  }

  // ---- routing -------------------------------------------------------------------------------------------------

  async function render(reason) {
    stopView();
    stopView = () => {};
    if (!sessionStorage.getItem(KEY_ITEM)) generation++; // signing out overtakes any view still loading
    const signedIn = Boolean(sessionStorage.getItem(KEY_ITEM));
    document.getElementById("nav").hidden = !signedIn;
    if (!signedIn) return loginView(reason);
    const match = location.hash.match(/^#\/runs\/(.+)$/);
    const mine = ++generation;
    const stale = () => mine !== generation;
    try {
      const stop = await (match ? runView(decodeURIComponent(match[1]), stale) : overview());
      if (!stale() && sessionStorage.getItem(KEY_ITEM)) stopView = stop;
      else stop();
    } catch (err) {
      if (stale() || (err instanceof ApiError && err.message === "unauthorized")) return;
      view.replaceChildren(h("section", { class: "card" }, h("h2", {}, "Could not load this page"),
        h("p", { class: "error-text" }, err.message), h("a", { href: "#/" }, "Back to the overview")));
    }
  }

  document.getElementById("sign-out").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", () => render());
  render();
})();
