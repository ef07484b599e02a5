// The sluice operator console. It reads the admin APIs with the admin token
// and draws what they say. Every value is put on the page as text (text
// nodes, textContent, SVG attributes of numbers): the script never writes
// markup, so a key an attacker chose shows as the characters it is.
"use strict";

(function () {
  const TOKEN_KEY = "sluice.console.token";
  const VIEW_KEY = "sluice.console.view";
  const POLL_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";

  // ---- the token: kept for this tab only -----------------------------------

  // A token handed in the fragment (#token=…, which no server sees) moves to
  // the tab's session storage and leaves the address bar at once.
  function takeTokenFromFragment() {
    const hash = window.location.hash;
    if (!hash.startsWith("#token=")) return;
    let token = "";
    try {
      token = decodeURIComponent(hash.slice("#token=".length));
    } catch (_) {
      token = "";
    }
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  // ---- building the page, as text -------------------------------------------

  const ATTRIBUTES = new Set(["type", "title", "colspan", "role", "aria-label", "disabled", "value"]);

  // An element with `props` (class, dataset, the attributes above, onclick)
  // and children: nodes, or values put in as text.
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else if (name === "onclick") node.addEventListener("click", value);
      else if (ATTRIBUTES.has(name)) node.setAttribute(name, String(value));
      else throw new Error("attribute not allowed: " + name);
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  function $(id) {
    return document.getElementById(id);
  }

  function fill(id, ...children) {
    const node = $(id);
    node.replaceChildren();
    append(node, children);
  }

  function svg(tag, attributes) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    return node;
  }

  // ---- formats ---------------------------------------------------------------

  function rate(value) {
    if (value === null || value === undefined) return "–";
    if (value === 0) return "0";
    return value < 10 ? value.toFixed(1) : String(Math.round(value));
  }

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    if (value < 1) return (value * 1000).toFixed(value < 0.01 ? 2 : 1) + " ms";
    if (value < 120) return Math.round(value) + " s";
    if (value < 7200) return Math.round(value / 60) + " min";
    return Math.round(value / 3600) + " h";
  }

  function when(unixSeconds) {
    if (!unixSeconds) return "–";
    return new Date(unixSeconds * 1000).toLocaleString();
  }

  function field(label, ...value) {
    return [el("dt", null, label), el("dd", null, ...value)];
  }

  function badge(kind, text) {
    return el("span", { class: "badge " + kind }, text);
  }

  // ---- the APIs ----------------------------------------------------------------

  class Locked extends Error {}

  // Calls the admin API with the token. A 401 or 403 locks the page (unless
  // `keepOpen`: the consumers API refuses on its own terms).
  async function api(method, path, body, keepOpen) {
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = "Bearer " + token();
    const init = {
      method,
      headers,
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
      referrerPolicy: "no-referrer",
    };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if ((response.status === 401 || response.status === 403) && !keepOpen) {
      lock(response.status, data);
      throw new Locked("locked");
    }
    if (!response.ok) {
      const error = new Error(describeError(response.status, data));
      error.status = response.status;
      error.data = data;
      throw error;
    }
    return data;
  }

  function describeError(status, data) {
    const what = data && data.error ? data.error : "HTTP " + status;
    return data && data.reason ? what + ": " + data.reason : what;
  }

  // ---- locked and unlocked -----------------------------------------------------

  let locked = false;

  function lock(status, data) {
    locked = true;
    document.body.classList.add("is-locked");
    $("locked").hidden = false;
    $("views").hidden = true;
    let why = "This console needs the admin token.";
    if (status === 401 && token()) why = "The admin listener refused this token (401): enter the admin token.";
    else if (status === 401) why = "The admin listener needs its token (401): enter the admin token.";
    else if (data && data.reason) why = "The admin listener refused (403): " + data.reason;
    $("locked-why").textContent = why;
    $("forget").hidden = !token();
    clearData();
  }

  function unlock() {
    locked = false;
    document.body.classList.remove("is-locked");
    $("locked").hidden = true;
    $("views").hidden = false;
    $("forget").hidden = !token();
  }

  function clearData() {
    for (const id of ["config", "limiter", "routes", "upstreams", "consumers"]) fill(id);
    $("top").tBodies[0].replaceChildren();
    $("created").hidden = true;
    fill("created-key");
    fill("updated");
  }

  function showError(text) {
    $("error").textContent = text;
  }

  // ---- views and polling ---------------------------------------------------

  let view = sessionStorage.getItem(VIEW_KEY) || "overview";
  let timer = null;
  let held = 0; // actions waiting for a second click hold the polling

  function show(name) {
    view = name;
    sessionStorage.setItem(VIEW_KEY, name);
    for (const button of $("tabs").querySelectorAll("button")) {
      button.setAttribute("aria-selected", String(button.dataset.view === name));
    }
    for (const section of document.querySelectorAll(".view")) {
      section.hidden = section.id !== "view-" + name;
    }
    refresh();
  }

  async function refresh() {
    clearTimeout(timer);
    const shown = view;
    // An armed two-click button must not be drawn over by an answer that
    // arrives meanwhile.
    const draw = (render) => {
      if (held === 0) render();
    };
    try {
      if (shown === "overview") {
        const [status, rates] = await Promise.all([api("GET", "/v1/status"), api("GET", "/v1/rates")]);
        draw(() => renderOverview(status, rates));
      } else if (shown === "limited") {
        const filter = $("top-filter").value;
        const every = api("GET", "/v1/top?n=50");
        const one = filter ? api("GET", "/v1/top?n=50&" + filter) : every;
        const [all, top] = await Promise.all([every, one]);
        draw(() => renderTop(all.limits, top));
      } else if (shown === "upstreams") {
        const upstreams = await api("GET", "/v1/upstreams");
        draw(() => renderUpstreams(upstreams));
      } else if (shown === "consumers") {
        await loadConsumers();
      }
      unlock();
      showError("");
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      document.body.dataset.loaded = shown;
    } catch (error) {
      if (!(error instanceof Locked)) showError("Could not read the admin API: " + error.message);
    }
    if (!locked && shown !== "consumers") timer = setTimeout(poll, POLL_MS);
  }

  function poll() {
    if (held > 0) {
      timer = setTimeout(poll, POLL_MS);
      return;
    }
    refresh();
  }

  // A button that acts on its second click (within 4 s): a reset or a
  // revocation is not undone by a slip. Polling waits meanwhile.
  function twoStep(label, confirmLabel, action) {
    const button = el("button", { type: "button", class: "danger" }, label);
    let armed = null;
    const disarm = () => {
      if (armed === null) return;
      clearTimeout(armed);
      armed = null;
      held -= 1;
      button.textContent = label;
    };
    button.addEventListener("click", async () => {
      if (armed === null) {
        held += 1;
        button.textContent = confirmLabel;
        armed = setTimeout(disarm, 4000);
        return;
      }
      disarm();
      button.disabled = true;
      try {
        await action();
      } catch (error) {
        if (!(error instanceof Locked)) showError(error.message);
      }
      button.disabled = false;
    });
    return button;
  }

  // ---- overview ------------------------------------------------------------

  function renderOverview(status, rates) {
    $("version").textContent = status.version ? "v" + status.version : "";
    $("instance").textContent = instanceName(status.instance);
    renderConfig(status.config);
    renderLimiter(status.limiter);
    const series = new Map();
    for (const limit of rates.limits) series.set(limit.route + "\u0000" + limit.limit, limit);
    fill("routes", status.routes.map((route) => renderRoute(route, series, rates)));
  }

  // Which instance answers: its pod (and namespace) or host, and pid.
  function instanceName(instance) {
    if (!instance) return "";
    const where = instance.namespace ? " in " + instance.namespace : "";
    return (instance.pod ? "pod " : "host ") + instance.name + where + " \u00b7 pid " + instance.pid;
  }

  function renderConfig(config) {
    const reload = config.last_reload;
    const rows = [
      field("File", el("code", null, config.path)),
      field("Generation", String(config.generation)),
      field("Loaded", when(config.loaded_at)),
    ];
    let details = null;
    if (!reload) {
      rows.push(field("Last reload", el("span", { class: "muted" }, "none since start")));
    } else {
      const result = reload.result === "success" ? badge("ok", "applied") : badge("bad", "refused");
      rows.push(field("Last reload", result, " ", reload.cause, ", ", when(reload.at)));
      if (reload.result === "failure") {
        details = el(
          "div",
          { class: "problems" },
          el("p", null, "Still serving generation " + config.generation + ". The file was refused for:"),
          el("ul", null, reload.problems.map((problem) => el("li", null, el("code", null, problem))))
        );
      } else if (reload.changes.length > 0 || reload.needs_restart.length > 0) {
        details = el(
          "ul",
          { class: "changes" },
          reload.changes.map((change) => el("li", null, change)),
          reload.needs_restart.map((setting) => el("li", { class: "warn" }, "needs a restart: " + setting))
        );
      }
    }
    fill("config", el("dl", null, rows), details);
  }

  function renderLimiter(limiter) {
    const rows = [field("Backend", limiter.backend)];
    if (limiter.redis) {
      const link = limiter.redis.link === "connected" ? badge("ok", "connected") : badge("bad", limiter.redis.link);
      const circuit = limiter.redis.circuit === "closed" ? badge("ok", "closed") : badge("bad", "open");
      rows.push(field("Redis", limiter.redis.mode + " ", link));
      rows.push(field("Circuit", circuit));
    }
    const ready =
      limiter.readiness === "ready" ? badge("ok", "ready") : badge(limiter.readiness === "degraded" ? "warn" : "bad", limiter.readiness);
    rows.push(field("Readiness", ready, limiter.reason ? " " + limiter.reason : ""));
    rows.push(field("On Redis errors", limiter.on_error));
    const minute = limiter.last_minute;
    rows.push(field("Decisions", rate(minute.decisions_per_second) + " /s"));
    const fallbacks = minute.fallback_per_second;
    rows.push(field("Fallback decisions", fallbacks ? badge("warn", rate(fallbacks) + " /s") : rate(fallbacks) + " /s"));
    if (limiter.redis) {
      const p99 = minute.p99_redis_seconds;
      rows.push(field("Redis p99", p99 === "+Inf" ? "> 10 s" : p99 === null ? "–" : "≤ " + seconds(p99)));
    }
    fill("limiter", el("dl", null, rows), el("p", { class: "muted" }, "Rates over the last minute."));
  }

  function renderRoute(route, series, rates) {
    const target = route.target
      ? route.target.upstream !== undefined
        ? "→ upstream " + route.target.upstream
        : "→ answers " + route.target.respond
      : "";
    const match = [route.host || "", route.path || "", route.methods.length ? "(" + route.methods.join(", ") + ")" : ""];
    const rows = route.limits.map((limit) => renderLimit(route, limit, series.get(route.name + "\u0000" + limit.name), rates));
    return el(
      "article",
      { class: "route", dataset: { route: route.name } },
      el("h3", null, route.name, " ", el("span", { class: "muted" }, match.filter(Boolean).join(" "), " ", target)),
      rows.length
        ? el(
            "table",
            { class: "limits" },
            el("thead", null, el("tr", null, ["Limit", "", "Allowed /s", "Denied /s", "Shadow /s", "Last 5 minutes"].map((h) => el("th", null, h)))),
            el("tbody", null, rows)
          )
        : el("p", { class: "muted" }, "No limit.")
    );
  }

  // The last value, and whether any of the last `n` is above zero.
  function last(values) {
    for (let i = values.length - 1; i >= 0; i -= 1) if (values[i] !== null) return values[i];
    return null;
  }

  function recent(values, n) {
    return values.slice(-n).some((v) => v !== null && v > 0);
  }

  function renderLimit(route, limit, series, rates) {
    const allowed = series ? series.allowed : [];
    const denied = series ? series.denied : [];
    const shadow = series ? series.shadow_denied : [];
    const span = Math.max(1, Math.round(30 / rates.step_seconds));
    const state = recent(denied, span) ? "denying" : recent(shadow, span) ? "shadow-denying" : "quiet";
    const stateBadge =
      state === "denying" ? badge("bad", "denying") : state === "shadow-denying" ? badge("warn", "shadow-denying") : null;
    return el(
      "tr",
      { dataset: { limit: limit.name, state } },
      el("td", null, el("strong", null, limit.name), limit.shadow ? " (shadow)" : "", el("div", { class: "muted" }, limit.describe)),
      el("td", null, stateBadge),
      el("td", { class: "num allowed" }, rate(last(allowed))),
      el("td", { class: "num denied" }, rate(last(denied))),
      el("td", { class: "num shadow" }, rate(last(shadow))),
      el("td", null, chart([[allowed, "allowed"], [denied, "denied"], [shadow, "shadow"]], steps(rates)))
    );
  }

  // The steps a chart spans: the whole window, so that the newest is at the
  // right edge from the first minute on.
  function steps(rates) {
    return Math.max(rates.at.length, Math.round(rates.window_seconds / rates.step_seconds));
  }

  // A small chart of a few series over the same steps (null: no value).
  function chart(series, steps) {
    const width = 300;
    const height = 48;
    const top = Math.max(1, ...series.flatMap(([values]) => values.filter((v) => v !== null)));
    const graph = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "chart", role: "img" });
    graph.setAttribute("aria-label", "up to " + rate(top) + " per second");
    const x = (i) => (steps <= 1 ? width : (i * width) / (steps - 1));
    const y = (v) => height - 2 - (v / top) * (height - 12);
    for (const [values, kind] of series) {
      let points = [];
      const flush = () => {
        if (points.length > 0) graph.appendChild(svg("polyline", { points: points.join(" "), class: "line " + kind }));
        points = [];
      };
      const offset = steps - values.length;
      values.forEach((value, i) => {
        if (value === null) flush();
        else points.push(x(i + offset).toFixed(1) + "," + y(value).toFixed(1));
      });
      flush();
    }
    const label = svg("text", { x: 2, y: 9, class: "scale" });
    label.textContent = rate(top) + "/s";
    graph.appendChild(label);
    return graph;
  }

  // ---- who is limited -------------------------------------------------------------

  const usageShown = new Map(); // usage query → its last answer (kept across polls)

  // The limit filter: every limit, with its denials in the last minute.
  function renderFilter(limits) {
    const select = $("top-filter");
    const options = [["", "every limit"]].concat(
      limits.map((l) => [
        "route=" + encodeURIComponent(l.route) + "&limit=" + encodeURIComponent(l.limit),
        `${l.route} / ${l.limit} — ${l.denied} denied`,
      ])
    );
    const same =
      select.options.length === options.length && options.every(([value], i) => select.options[i].value === value);
    if (!same) {
      const chosen = select.value;
      select.replaceChildren(...options.map(([value, label]) => el("option", null, label)));
      options.forEach(([value], i) => {
        select.options[i].value = value;
      });
      select.value = options.some(([value]) => value === chosen) ? chosen : "";
    } else {
      options.forEach(([, label], i) => {
        select.options[i].textContent = label;
      });
    }
  }

  function renderTop(limits, top) {
    renderFilter(limits);
    const body = $("top").tBodies[0];
    const rows = [];
    top.keys.forEach((key, i) => {
      const parts = key.shown.length
        ? key.shown.map((p) => el("span", { class: "part" }, el("span", { class: "muted" }, p.part + "="), el("code", null, p.value)))
        : [el("code", null, key.key)];
      const actions = [];
      if (key.usage) {
        actions.push(el("button", { type: "button", onclick: () => peek(key.usage) }, "Usage"));
        actions.push(twoStep("Reset", "Reset: sure?", () => reset(key.usage)));
      } else {
        actions.push(el("span", { class: "muted", title: "a credential or a cut value: the usage API needs the whole value" }, "no usage link"));
      }
      rows.push(
        el(
          "tr",
          { dataset: { route: key.route, limit: key.limit, rank: String(i + 1) } },
          el("td", { class: "num" }, String(i + 1)),
          el("td", null, key.route),
          el("td", null, key.limit),
          el("td", { class: "key" }, parts),
          el("td", { class: "num" }, String(key.count), key.error ? el("span", { class: "muted" }, " ±" + key.error) : null),
          el("td", { class: "actions" }, actions)
        )
      );
      if (key.usage && usageShown.has(key.usage)) rows.push(usageRow(key.usage, usageShown.get(key.usage)));
    });
    body.replaceChildren(...rows);
    $("top-empty").hidden = top.keys.length > 0;
  }

  function usageRow(query, usage) {
    const text = usage.reset
      ? "Reset: the key starts afresh."
      : `Used ${usage.used} of ${usage.quota}; ${usage.remaining} remaining; resets in ${seconds(usage.reset_seconds)}.`;
    return el("tr", { class: "usage", dataset: { usage: query } }, el("td", null), el("td", { colspan: 5 }, text));
  }

  async function peek(query) {
    try {
      usageShown.set(query, await api("GET", "/v1/usage?" + query));
      refresh();
    } catch (error) {
      if (!(error instanceof Locked)) showError(error.message);
    }
  }

  async function reset(query) {
    await api("DELETE", "/v1/usage?" + query);
    usageShown.set(query, { reset: true });
    refresh();
  }

  // ---- upstreams ---------------------------------------------------------------

  function renderUpstreams(data) {
    fill("upstreams", data.upstreams.map(renderUpstream));
  }

  function renderUpstream(upstream) {
    const recent = upstream.errors.recent;
    const since = upstream.errors.since_built;
    const errors = recent
      ? `${recent.bad_gateway} × 502, ${recent.gateway_timeout} × 504 in the last ${seconds(recent.seconds)}`
      : "–";
    const settings = [
      field("Balance", upstream.balance),
      field("Health check", upstream.health_check_seconds ? "every " + seconds(upstream.health_check_seconds) : "none (passive only)"),
      field(
        "Passive",
        upstream.max_fails
          ? `out after ${upstream.max_fails} ${upstream.max_fails === 1 ? "failure" : "failures"} within ${seconds(upstream.fail_timeout_seconds)}`
          : "off"
      ),
      field("DNS refresh", upstream.dns_refresh_seconds ? "every " + seconds(upstream.dns_refresh_seconds) : "at load only"),
      field("Errors", errors, el("span", { class: "muted" }, ` (${since.bad_gateway} × 502, ${since.gateway_timeout} × 504 in all)`)),
    ];
    const rows = [];
    for (const server of upstream.servers) {
      const addresses = server.addresses.length ? server.addresses : [null];
      addresses.forEach((address, i) => {
        const up = address ? address.up : false;
        rows.push(
          el(
            "tr",
            { dataset: { server: server.server, address: address ? address.address : "", state: up ? "up" : "out" } },
            el("td", null, i === 0 ? server.server : ""),
            el("td", { class: "num" }, i === 0 ? String(server.weight) : ""),
            el("td", null, address ? el("code", null, address.address) : el("span", { class: "muted" }, "not resolved")),
            el("td", null, up ? badge("ok", "up") : badge("bad", "out")),
            el("td", null, address && address.health_check !== null ? (address.health_check ? "passes" : "fails") : "–"),
            el("td", null, address && address.why ? address.why : ""),
            el(
              "td",
              address && address.out_until ? { title: "until " + when(address.out_until) } : null,
              address && address.out_for_seconds !== null ? "back in " + seconds(address.out_for_seconds) : ""
            )
          )
        );
      });
    }
    return el(
      "article",
      { class: "upstream card", dataset: { upstream: upstream.name } },
      el("h3", null, upstream.name),
      el("dl", null, settings),
      el(
        "table",
        null,
        el("thead", null, el("tr", null, ["Server", "Weight", "Address", "State", "Health check", "Why", "Out"].map((h) => el("th", null, h)))),
        el("tbody", null, rows)
      )
    );
  }

  // ---- consumers -----------------------------------------------------------------

  function consumersOff(reason) {
    $("consumers-off").hidden = !reason;
    $("consumers-off").textContent = reason || "";
    $("create").hidden = Boolean(reason);
  }

  async function loadConsumers() {
    let data;
    try {
      data = await api("GET", "/v1/consumers", undefined, true);
    } catch (error) {
      if (error.status === 401) {
        lock(401, error.data);
        throw new Locked("locked");
      }
      if (error.status === 403 || error.status === 404) {
        consumersOff(error.data && error.data.reason ? error.data.reason : error.message);
        fill("consumers");
        return;
      }
      throw error;
    }
    consumersOff("");
    // The periodic refresh leaves an unchanged list alone: an opened row,
    // or a plan being chosen, stays as it is.
    const seen = JSON.stringify(data);
    if (seen === shownConsumers && $("consumers").childElementCount) return;
    shownConsumers = seen;
    plans = data.plans || [];
    const choice = $("create-plan");
    const chosen = choice.value;
    choice.replaceChildren(el("option", { value: "" }, "(none)"), ...plans.map((p) => el("option", { value: p }, p)));
    choice.value = plans.includes(chosen) ? chosen : "";
    const rows = data.consumers.map((id) =>
      el(
        "tr",
        { dataset: { consumer: id } },
        el("td", null, el("code", null, id)),
        el("td", { class: "plan" }),
        el("td", { class: "keys" }),
        el("td", null, el("button", { type: "button", onclick: (event) => showKeys(id, event.target.closest("tr")) }, "Keys"))
      )
    );
    fill(
      "consumers",
      rows.length
        ? el("table", null, el("thead", null, el("tr", null, el("th", null, "Consumer"), el("th", null, "Plan"), el("th", null, "Keys (id: the first 12 hex of the key's SHA-256)"), el("th", null))), el("tbody", null, rows))
        : el("p", { class: "muted" }, "No consumer has a key made here yet.")
    );
  }

  async function showKeys(consumer, row) {
    try {
      const data = await api("GET", "/v1/consumers/" + encodeURIComponent(consumer), undefined, true);
      const cell = row.querySelector(".keys");
      cell.replaceChildren();
      append(
        cell,
        data.keys.length
          ? data.keys.map((key) =>
              el(
                "div",
                { class: "key-id", dataset: { key: key.key_id } },
                el("code", null, key.key_id),
                key.created ? el("span", { class: "muted" }, " made " + new Date(key.created * 1000).toISOString().slice(0, 16).replace("T", " ")) : "",
                key.plan && !data.plan ? el("span", { class: "muted" }, " (its own plan: " + key.plan + ")") : "",
                " ",
                twoStep("Revoke", "Revoke: sure?", () => revoke(consumer, key.key_id))
              )
            )
          : el("span", { class: "muted" }, "no key")
      );
      showPlan(consumer, row, data);
    } catch (error) {
      if (!(error instanceof Locked)) showError(error.message);
    }
  }

  // A consumer's plan, and a change of it (two clicks, like a revocation).
  function showPlan(consumer, row, data) {
    const cell = row.querySelector(".plan");
    const current = data.applied_plan || "";
    const choice = el("select", { class: "plan-choice" }, el("option", { value: "" }, "(none)"), ...plans.map((p) => el("option", { value: p }, p)));
    choice.value = plans.includes(current) ? current : "";
    const shown = el("strong", { class: "plan-name" }, current || "(none)");
    const warning = data.plan_known === false ? el("span", { class: "badge warn" }, "not in any limit's plans: gets each limit's own number") : "";
    cell.replaceChildren();
    append(cell, [
      shown,
      warning,
      " ",
      choice,
      " ",
      twoStep("Change plan", "Change plan: sure?", async () => {
        const plan = choice.value === "" ? null : choice.value;
        await api("PUT", "/v1/consumers/" + encodeURIComponent(consumer), { plan }, true);
        await showKeys(consumer, row);
      }),
    ]);
  }

  async function revoke(consumer, id) {
    await api("DELETE", "/v1/consumers/" + encodeURIComponent(consumer) + "/keys/" + encodeURIComponent(id), undefined, true);
    $("created").hidden = true;
    shownConsumers = null;
    await loadConsumers();
  }

  // The plans a consumer may have (from GET /v1/consumers).
  let plans = [];
  // The consumers list last drawn (its JSON).
  let shownConsumers = null;

  async function create(event) {
    event.preventDefault();
    const consumer = $("create-consumer").value.trim();
    const plan = $("create-plan").value.trim();
    try {
      const made = await api("POST", "/v1/consumers/" + encodeURIComponent(consumer) + "/keys", plan ? { plan } : {}, true);
      $("created-consumer").textContent = consumer;
      $("created-key").textContent = made.key;
      $("created").hidden = false;
      shownConsumers = null;
      await loadConsumers();
    } catch (error) {
      if (!(error instanceof Locked)) showError("Could not create the key: " + error.message);
    }
  }

  // ---- start -----------------------------------------------------------------------

  function start() {
    takeTokenFromFragment();
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
      refresh();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      refresh();
    });
    $("create").addEventListener("submit", create);
    $("top-filter").addEventListener("change", () => refresh());
    $("top-form").addEventListener("submit", (event) => event.preventDefault());
    // A token handed in the fragment of the page already open.
    window.addEventListener("hashchange", () => {
      takeTokenFromFragment();
      refresh();
    });
    for (const button of $("tabs").querySelectorAll("button")) {
      button.addEventListener("click", () => show(button.dataset.view));
    }
    show(view);
  }

  start();
})();
