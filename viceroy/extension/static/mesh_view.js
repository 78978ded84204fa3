// Generated from labextension/src/widget.ts by labextension/scripts/build-widget.mjs;
// do not edit. Rebuild with `make frontend` (or `jlpm build:widget` in labextension/).

// src/view/dom.ts
function el(doc, tag, className, text) {
  const node = doc.createElement(tag);
  node.className = className;
  if (text !== void 0) {
    node.textContent = text;
  }
  return node;
}
function button(doc, className, text, title, onClick) {
  const node = el(doc, "button", `viceroy-button ${className}`, text);
  node.type = "button";
  node.title = title;
  node.addEventListener("click", (event) => {
    event.stopPropagation();
    onClick();
  });
  return node;
}
function setText(node, text) {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

// src/view/protocol.ts
var RANK_STATES = [
  "starting",
  "idle",
  "running",
  "done",
  "error",
  "dead",
  "interrupted"
];
function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

// src/view/detail.ts
var DetailPane = class {
  constructor(doc, actions) {
    this._kind = null;
    this.node = el(doc, "div", "viceroy-detail");
    this.node.hidden = true;
    const head = el(doc, "div", "viceroy-detail-head");
    this._title = el(doc, "span", "viceroy-detail-title");
    this._logs = button(
      doc,
      "viceroy-detail-logs",
      "Log",
      "Show the log tail",
      () => actions.showLogs()
    );
    this._traceback = button(
      doc,
      "viceroy-detail-traceback",
      "Traceback",
      "Show the traceback",
      () => actions.showTraceback()
    );
    const close = button(doc, "viceroy-detail-close", "\xD7", "Close", () => actions.close());
    close.setAttribute("aria-label", "Close");
    head.append(this._title, this._logs, this._traceback, close);
    this._text = el(doc, "pre", "viceroy-detail-text");
    this.node.append(head, this._text);
  }
  /** What the open pane shows or waits for; null while closed. */
  get kind() {
    return this._kind;
  }
  /**
   * Show the pane loading `kind` under `title`: a rank's (with its Log and Traceback buttons)
   * or, for a null rank, the whole mesh's.
   */
  open(kind, title, rank) {
    this._kind = kind;
    this.node.hidden = false;
    this.node.dataset.kind = kind;
    this.node.dataset.loading = "true";
    this._title.textContent = title;
    this._text.textContent = "loading\u2026";
    if (rank !== null) {
      this.node.dataset.rank = String(rank);
    } else {
      delete this.node.dataset.rank;
    }
    this._logs.hidden = rank === null;
    this._traceback.hidden = rank === null;
  }
  close() {
    this.node.hidden = true;
    this._kind = null;
  }
  /** A log or traceback reply for the selected rank: shown if the pane is open on that kind. */
  showText(kind, text) {
    if (this.node.hidden || this._kind !== kind) {
      return;
    }
    const body = typeof text === "string" ? text : "";
    this._text.textContent = body || (kind === "logs" ? "(no output yet)" : "(no traceback: the rank did not fail)");
    this.node.dataset.loading = "false";
  }
  showStacks(stacks) {
    if (this.node.hidden || this._kind !== "stacks" || !isObject(stacks)) {
      return;
    }
    const parts = Object.entries(stacks).sort(([a], [b]) => Number(a) - Number(b)).map(([rank, text]) => `\u2500\u2500 rank ${rank} \u2500\u2500
${typeof text === "string" ? text : ""}`);
    this._text.textContent = parts.join("\n") || "(no stacks)";
    this.node.dataset.loading = "false";
  }
  /** An error reply: shown in the pane if it answers what the pane waits for; else false. */
  showError(request, text) {
    if (this.node.hidden || request !== this._kind) {
      return false;
    }
    this._text.textContent = text;
    this.node.dataset.loading = "false";
    return true;
  }
};

// src/view/format.ts
function formatBytes(bytes) {
  if (bytes === null || !Number.isFinite(bytes) || bytes < 0) {
    return "";
  }
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}
function formatDuration(seconds) {
  if (seconds === null || !Number.isFinite(seconds)) {
    return "";
  }
  const s = Math.max(0, seconds);
  if (s < 10) {
    return `${(Math.floor(s * 10) / 10).toFixed(1)}s`;
  }
  const whole = Math.floor(s);
  const h = Math.floor(whole / 3600);
  const m = Math.floor(whole % 3600 / 60);
  const sec = whole % 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h > 0 ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}
function elapsedOf(record, nowSeconds) {
  if (record.state === "running" && record.started !== null) {
    return Math.max(0, nowSeconds - record.started);
  }
  return record.elapsed;
}
function summaryText(summary) {
  if (summary.total === 0) {
    return "no mesh";
  }
  let what;
  if (summary.failed > 0) {
    what = `${summary.failed} failed`;
  } else if (summary.running > 0) {
    what = "running";
  } else if ((summary.starting ?? 0) > 0) {
    what = `${summary.starting} starting`;
  } else {
    what = "idle";
  }
  return `mesh ${summary.alive}/${summary.total} \xB7 ${what}`;
}
function tileTitle(record) {
  const lines = [`rank ${record.rank}: ${record.state}`];
  const coords = Object.entries(record.coords).map(([k, v]) => `${k}=${v}`).join(", ");
  if (coords) {
    lines.push(coords);
  }
  if (record.host) {
    lines.push(`host ${record.host}${record.pid !== null ? `, pid ${record.pid}` : ""}`);
  } else if (record.pid !== null) {
    lines.push(`pid ${record.pid}`);
  }
  if (record.exit) {
    lines.push(`exit: ${record.exit}`);
  }
  if (record.error) {
    lines.push(record.error);
  }
  lines.push(record.state === "error" ? "click for the traceback" : "click for the log");
  return lines.join("\n");
}
function formatRankSet(ranks) {
  const sorted = [...new Set(ranks)].sort((a, b) => a - b);
  const parts = [];
  let i = 0;
  while (i < sorted.length) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) {
      j += 1;
    }
    parts.push(j > i ? `${sorted[i]}-${sorted[j]}` : `${sorted[i]}`);
    i = j + 1;
  }
  return parts.join(",");
}

// src/view/tile.ts
function makeTile(doc, record) {
  const tile = el(doc, "div", "viceroy-tile");
  tile.dataset.rank = String(record.rank);
  tile.tabIndex = 0;
  tile.setAttribute("role", "button");
  const head = el(doc, "div", "viceroy-tile-head");
  head.append(el(doc, "span", "viceroy-rank", String(record.rank)));
  const state = el(doc, "span", "viceroy-state");
  head.append(state);
  const label = el(doc, "div", "viceroy-label");
  const metrics = el(doc, "div", "viceroy-metrics");
  const elapsed = el(doc, "span", "viceroy-elapsed");
  const mem = el(doc, "span", "viceroy-mem");
  const gpu = el(doc, "span", "viceroy-gpu");
  metrics.append(elapsed, mem, gpu);
  const last = el(doc, "div", "viceroy-last");
  tile.append(head, label, metrics, last);
  return { el: tile, state, label, elapsed, mem, gpu, last, shown: /* @__PURE__ */ new Map() };
}
function fillTile(tile, record, now) {
  let changed = false;
  const put = (key, apply, value) => {
    if (tile.shown.get(key) !== value) {
      tile.shown.set(key, value);
      apply(value);
      changed = true;
    }
  };
  put("state", (v) => tile.el.dataset.state = v, record.state);
  put("stateText", (v) => tile.state.textContent = v, record.state);
  put("label", (v) => tile.label.textContent = v, record.label);
  put("elapsed", (v) => tile.elapsed.textContent = v, elapsedText(record, now));
  put("mem", (v) => tile.mem.textContent = v, record.rss !== null ? formatBytes(record.rss) : "");
  put("gpu", (v) => tile.gpu.textContent = v, gpuText(record));
  put(
    "last",
    (v) => tile.last.textContent = v,
    record.state === "error" && record.error ? record.error : record.last_line
  );
  put("title", (v) => tile.el.title = v, tileTitle(record));
  return changed;
}
function tickTile(tile, record, now) {
  const text = elapsedText(record, now);
  if (tile.shown.get("elapsed") !== text) {
    tile.shown.set("elapsed", text);
    tile.elapsed.textContent = text;
  }
}
function elapsedText(record, now) {
  const seconds = elapsedOf(record, now());
  return seconds === null ? "" : formatDuration(seconds);
}
function gpuText(record) {
  const parts = [];
  if (record.gpu_mem !== null) {
    parts.push(`GPU ${formatBytes(record.gpu_mem)}`);
  }
  if (record.gpu_util !== null) {
    parts.push(`${Math.round(record.gpu_util)}%`);
  }
  return parts.join(" ");
}

// src/view/grid.ts
var TileGrid = class {
  /** `now`: seconds since the epoch. */
  constructor(doc, store, now) {
    this._tiles = /* @__PURE__ */ new Map();
    this._running = /* @__PURE__ */ new Set();
    this._layoutKey = "";
    this._doc = doc;
    this._store = store;
    this._now = now;
    this.node = el(doc, "div", "viceroy-body");
  }
  /** The key of the layout the tiles were last built for ('' before the first build). */
  get layoutKey() {
    return this._layoutKey;
  }
  /** Replace every tile with new ones placed by `layout`, the `selected` one marked so. */
  build(layout, selected) {
    const doc = this._doc;
    this._layoutKey = layout.key;
    this._tiles.clear();
    this._running.clear();
    const fragment = doc.createDocumentFragment();
    const caption = el(doc, "div", "viceroy-axes");
    if (layout.rowDim && layout.colDim) {
      caption.textContent = `rows: ${layout.rowDim} \xB7 columns: ${layout.colDim}`;
    } else if (layout.colDim) {
      caption.textContent = `${layout.colDim} \u2192`;
    }
    fragment.append(caption);
    const facets = el(doc, "div", "viceroy-facets");
    for (const facet of layout.facets) {
      const box = el(doc, "div", "viceroy-facet");
      if (facet.title) {
        box.append(el(doc, "div", "viceroy-facet-title", facet.title));
      }
      const grid = el(doc, "div", "viceroy-grid");
      if (layout.rowDim && layout.colDim) {
        grid.classList.add("viceroy-grid-2d");
        grid.style.gridTemplateColumns = `repeat(${layout.cols}, minmax(var(--viceroy-tile-min, 7.5em), 1fr))`;
      }
      for (const r of facet.ranks) {
        const record = this._store.rank(r);
        const tile = makeTile(doc, record);
        if (layout.rowDim && layout.colDim) {
          tile.el.style.gridRow = String(record.coords[layout.rowDim] + 1);
          tile.el.style.gridColumn = String(record.coords[layout.colDim] + 1);
        }
        this._tiles.set(r, tile);
        this._fill(tile, record);
        grid.append(tile.el);
      }
      box.append(grid);
      facets.append(box);
    }
    fragment.append(facets);
    this.node.replaceChildren(fragment);
    if (selected !== null) {
      this._tiles.get(selected)?.el.classList.add("viceroy-selected");
    }
  }
  /** Bring these ranks' tiles up to date; returns how many of them had their DOM changed. */
  renderRanks(ranks) {
    let touched = 0;
    for (const r of ranks) {
      const tile = this._tiles.get(r);
      const record = this._store.rank(r);
      if (tile && record && this._fill(tile, record)) {
        touched += 1;
      }
    }
    return touched;
  }
  /** Advance the elapsed times of the running ranks. */
  tick() {
    for (const r of this._running) {
      const tile = this._tiles.get(r);
      const record = this._store.rank(r);
      if (tile && record) {
        tickTile(tile, record, this._now);
      }
    }
  }
  /** Mark `rank`'s tile as the selected one (none for null). */
  highlight(rank) {
    for (const tile of this._tiles.values()) {
      tile.el.classList.remove("viceroy-selected");
    }
    if (rank !== null) {
      this._tiles.get(rank)?.el.classList.add("viceroy-selected");
    }
  }
  focus(rank) {
    this._tiles.get(rank)?.el.focus();
  }
  /** The rank of the tile an event happened in, or null outside the tiles. */
  rankAt(target) {
    const node = target;
    const tile = node?.closest?.(".viceroy-tile");
    if (!tile || !this.node.contains(tile)) {
      return null;
    }
    const rank = Number(tile.dataset.rank);
    return Number.isInteger(rank) ? rank : null;
  }
  /** Fill a tile, and note whether its rank is running. */
  _fill(tile, record) {
    const changed = fillTile(tile, record, this._now);
    if (record.state === "running" && record.started !== null) {
      this._running.add(record.rank);
    } else {
      this._running.delete(record.rank);
    }
    return changed;
  }
};

// src/view/header.ts
function deadCount(summary) {
  return Math.max(0, summary.total - summary.alive);
}
var Header = class {
  constructor(doc, actions) {
    this.node = el(doc, "div", "viceroy-header");
    this._summary = el(doc, "span", "viceroy-summary", "no mesh");
    this._calls = el(doc, "span", "viceroy-calls");
    const buttons = el(doc, "span", "viceroy-actions");
    this._interrupt = button(
      doc,
      "viceroy-interrupt",
      "Interrupt",
      "Interrupt the mesh",
      () => actions.interrupt()
    );
    this._restart = button(
      doc,
      "viceroy-restart",
      "Restart failed",
      "Restart the dead ranks; the others keep their state",
      () => actions.restartFailed()
    );
    this._stacks = button(
      doc,
      "viceroy-stacks",
      "Stacks",
      "Every rank's Python stack",
      () => actions.showStacks()
    );
    buttons.append(this._interrupt, this._restart, this._stacks);
    this.node.append(this._summary, this._calls, buttons);
  }
  /** Show the summary and calls; the buttons work only with ranks and a channel (`canSend`). */
  update(summary, calls, canSend) {
    setText(this._summary, summaryText(summary));
    this._summary.dataset.failed = String(summary.failed);
    this._summary.dataset.running = String(summary.running);
    setText(
      this._calls,
      calls.map((c) => `${c.label || `call ${c.call}`} [ranks ${formatRankSet(c.ranks)}]`).join(" \xB7 ")
    );
    const connected = canSend && summary.total > 0;
    this._interrupt.disabled = !connected;
    this._restart.disabled = !connected || deadCount(summary) === 0;
    this._stacks.disabled = !connected;
  }
};

// src/view/layout.ts
var MAX_GRID_COLS = 16;
function computeLayout(dims, ranks, coordsOf) {
  const names = dims ? Object.keys(dims) : [];
  const hasCoords = ranks.every((r) => {
    const c = coordsOf(r);
    return c !== void 0 && names.every((n) => typeof c[n] === "number");
  });
  if (!dims || names.length < 2 || !hasCoords) {
    return {
      key: `flat|${JSON.stringify(dims)}|${ranks.join(",")}`,
      rowDim: null,
      colDim: names.length === 1 ? names[0] : null,
      rows: 0,
      cols: 0,
      facets: [{ title: "", ranks: [...ranks] }]
    };
  }
  let rowDim = names[names.length - 2];
  const colDim = names[names.length - 1];
  const wide = dims[colDim] > MAX_GRID_COLS;
  const leading = wide ? names.slice(0, -1) : names.slice(0, -2);
  const facets = /* @__PURE__ */ new Map();
  for (const r of ranks) {
    const c = coordsOf(r);
    const title = leading.map((n) => `${n}=${c[n]}`).join(" \xB7 ");
    let list = facets.get(title);
    if (!list) {
      list = [];
      facets.set(title, list);
    }
    list.push(r);
  }
  if (wide) {
    rowDim = null;
  }
  return {
    key: `grid|${JSON.stringify(dims)}|${ranks.join(",")}`,
    rowDim,
    colDim,
    rows: rowDim ? dims[rowDim] : 0,
    cols: rowDim ? dims[colDim] : 0,
    facets: [...facets].map(([title, list]) => ({ title, ranks: list }))
  };
}

// src/view/notice.ts
var NOTICE_MS = 6e3;
var Notice = class {
  constructor(doc) {
    this._timer = null;
    this.node = el(doc, "div", "viceroy-notice");
    this.node.setAttribute("role", "status");
    this.node.hidden = true;
  }
  show(text, isError = false) {
    this.node.textContent = text;
    this.node.hidden = false;
    this.node.classList.toggle("viceroy-notice-error", isError);
    if (this._timer !== null) {
      clearTimeout(this._timer);
    }
    this._timer = setTimeout(() => {
      this.node.hidden = true;
      this._timer = null;
    }, NOTICE_MS);
  }
  /** Stop the pending hide. */
  dispose() {
    if (this._timer !== null) {
      clearTimeout(this._timer);
    }
  }
};

// src/view/store.ts
var NUMBER_FIELDS = ["started", "elapsed", "rss", "gpu_mem", "gpu_util", "pid", "call"];
var STRING_FIELDS = ["host", "label", "last_line"];
var NULLABLE_STRING_FIELDS = ["exit", "error"];
function numberOrNull(value) {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}
function stateOf(value) {
  return RANK_STATES.includes(value) ? value : "idle";
}
function normalizeRank(raw) {
  const coords = {};
  if (isObject(raw.coords)) {
    for (const [k, v] of Object.entries(raw.coords)) {
      if (typeof v === "number") {
        coords[k] = v;
      }
    }
  }
  const record = {
    rank: typeof raw.rank === "number" ? raw.rank : -1,
    coords,
    host: "",
    state: stateOf(raw.state),
    call: null,
    label: "",
    started: null,
    elapsed: null,
    rss: null,
    gpu_mem: null,
    gpu_util: null,
    last_line: "",
    pid: null,
    exit: null,
    error: null
  };
  mergeFields(record, raw);
  return record;
}
function mergeFields(record, patch) {
  let changed = false;
  const assign = (key, value) => {
    if (record[key] !== value) {
      record[key] = value;
      changed = true;
    }
  };
  if ("state" in patch) {
    assign("state", stateOf(patch.state));
  }
  for (const key of NUMBER_FIELDS) {
    if (key in patch) {
      assign(key, numberOrNull(patch[key]));
    }
  }
  for (const key of STRING_FIELDS) {
    if (key in patch) {
      assign(key, typeof patch[key] === "string" ? patch[key] : "");
    }
  }
  for (const key of NULLABLE_STRING_FIELDS) {
    if (key in patch) {
      const v = patch[key];
      assign(key, typeof v === "string" ? v : null);
    }
  }
  if ("coords" in patch && isObject(patch.coords)) {
    const coords = {};
    for (const [k, v] of Object.entries(patch.coords)) {
      if (typeof v === "number") {
        coords[k] = v;
      }
    }
    if (JSON.stringify(coords) !== JSON.stringify(record.coords)) {
      record.coords = coords;
      changed = true;
    }
  }
  return changed;
}
function normalizeCalls(raw) {
  if (!Array.isArray(raw)) {
    return [];
  }
  return raw.filter(isObject).map((c) => ({
    call: typeof c.call === "number" ? c.call : -1,
    label: typeof c.label === "string" ? c.label : "",
    ranks: Array.isArray(c.ranks) ? c.ranks.filter((r) => typeof r === "number") : [],
    started: numberOrNull(c.started)
  }));
}
function normalizeSummary(raw) {
  if (!isObject(raw)) {
    return null;
  }
  const n = (v) => typeof v === "number" ? v : 0;
  return {
    total: n(raw.total),
    alive: n(raw.alive),
    running: n(raw.running),
    starting: n(raw.starting),
    failed: n(raw.failed)
  };
}
function computeSummary(ranks) {
  const s = { total: 0, alive: 0, running: 0, starting: 0, failed: 0 };
  for (const r of ranks) {
    s.total += 1;
    if (r.state !== "dead") {
      s.alive += 1;
    }
    if (r.state === "running") {
      s.running += 1;
    }
    if (r.state === "starting") {
      s.starting = (s.starting ?? 0) + 1;
    }
    if (r.state === "error" || r.state === "dead") {
      s.failed += 1;
    }
  }
  return s;
}
var MeshStore = class {
  constructor() {
    this._seq = null;
    this._dims = null;
    this._ranks = /* @__PURE__ */ new Map();
    this._order = [];
    this._calls = [];
    this._auto = false;
    this._summary = null;
    this._listeners = /* @__PURE__ */ new Set();
  }
  /** The sequence number of the last message applied; null before the first snapshot. */
  get seq() {
    return this._seq;
  }
  /** True once a snapshot has arrived. */
  get hasState() {
    return this._seq !== null || this._ranks.size > 0 || this._dims !== null;
  }
  get dims() {
    return this._dims;
  }
  /** Rank numbers in ascending order. */
  get ranks() {
    return this._order;
  }
  get calls() {
    return this._calls;
  }
  get auto() {
    return this._auto;
  }
  get summary() {
    return this._summary ?? computeSummary(this._ranks.values());
  }
  rank(rank) {
    return this._ranks.get(rank);
  }
  records() {
    return this._ranks.values();
  }
  /** Listen for applied changes; returns the function that stops listening. */
  subscribe(listener) {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }
  /** Apply a snapshot or a diff (anything else is `invalid`). */
  apply(message) {
    if (!isObject(message)) {
      return { kind: "invalid" };
    }
    if (message.type === "state") {
      return this.applySnapshot(message);
    }
    if (message.type === "diff") {
      return this.applyDiff(message);
    }
    return { kind: "invalid" };
  }
  applySnapshot(message) {
    const raw = message;
    this._seq = typeof raw.seq === "number" ? raw.seq : null;
    this._dims = isObject(raw.dims) ? normalizeDims(raw.dims) : null;
    this._ranks.clear();
    for (const r of Array.isArray(raw.ranks) ? raw.ranks : []) {
      if (isObject(r)) {
        const record = normalizeRank(r);
        this._ranks.set(record.rank, record);
      }
    }
    this._order = [...this._ranks.keys()].sort((a, b) => a - b);
    this._calls = normalizeCalls(raw.calls);
    this._auto = raw.auto === true;
    this._summary = normalizeSummary(raw.summary);
    const change = { full: true, ranks: new Set(this._order) };
    this._emit(change);
    return { kind: "applied", change };
  }
  applyDiff(message) {
    const raw = message;
    const seq = raw.seq;
    if (typeof seq !== "number") {
      return { kind: "invalid" };
    }
    if (this._seq === null) {
      return { kind: "gap" };
    }
    if (seq <= this._seq) {
      return { kind: "stale" };
    }
    if (seq !== this._seq + 1) {
      return { kind: "gap" };
    }
    const patches = isObject(raw.ranks) ? raw.ranks : {};
    for (const key of Object.keys(patches)) {
      const r = Number(key);
      const patch = patches[key];
      if (!Number.isInteger(r) || !isObject(patch)) {
        return { kind: "invalid" };
      }
      if (!this._ranks.has(r)) {
        return { kind: "gap" };
      }
    }
    const changed = /* @__PURE__ */ new Set();
    for (const [key, patch] of Object.entries(patches)) {
      const r = Number(key);
      if (mergeFields(this._ranks.get(r), patch)) {
        changed.add(r);
      }
    }
    if ("calls" in raw) {
      this._calls = normalizeCalls(raw.calls);
    }
    if ("auto" in raw) {
      this._auto = raw.auto === true;
    }
    if ("summary" in raw) {
      this._summary = normalizeSummary(raw.summary);
    }
    this._seq = seq;
    const change = { full: false, ranks: changed };
    this._emit(change);
    return { kind: "applied", change };
  }
  /** Forget everything (the kernel went away). */
  clear() {
    this._seq = null;
    this._dims = null;
    this._ranks.clear();
    this._order = [];
    this._calls = [];
    this._auto = false;
    this._summary = null;
    this._emit({ full: true, ranks: /* @__PURE__ */ new Set() });
  }
  _emit(change) {
    for (const listener of [...this._listeners]) {
      listener(change);
    }
  }
};
function normalizeDims(raw) {
  const dims = {};
  for (const [k, v] of Object.entries(raw)) {
    if (typeof v === "number" && v > 0) {
      dims[k] = v;
    }
  }
  return dims;
}

// src/view/render.ts
var COMPACT_ABOVE = 64;
var LOG_TAIL = 200;
function defaultSchedule(callback) {
  if (typeof requestAnimationFrame === "function") {
    const id2 = requestAnimationFrame(() => callback());
    return () => cancelAnimationFrame(id2);
  }
  const id = setTimeout(callback, 16);
  return () => clearTimeout(id);
}
var MeshView = class {
  constructor(options = {}, doc = document) {
    // --- events -----------------------------------------------------------------------------
    this._onClick = (event) => {
      const rank = this._grid.rankAt(event.target);
      if (rank !== null) {
        this.select(rank);
      }
    };
    this._onKey = (event) => {
      const key = event.key;
      if (key === "Escape") {
        const was = this._selected;
        this.select(null);
        if (was !== null) {
          this._grid.focus(was);
        }
        return;
      }
      if (key !== "Enter" && key !== " ") {
        return;
      }
      const rank = this._grid.rankAt(event.target);
      if (rank !== null) {
        event.preventDefault();
        this.select(rank);
      }
    };
    this._selected = null;
    this._shownPids = /* @__PURE__ */ new Map();
    // what the detail pane shows: rank -> pid
    this._dirty = /* @__PURE__ */ new Set();
    this._fullPending = false;
    this._cancelFrame = null;
    this._tick = null;
    this._awaitingSnapshot = false;
    this._snapshotAskedAt = 0;
    this._lastTouched = 0;
    this._disposed = false;
    this._send = options.send ?? null;
    this._now = options.now ?? (() => Date.now() / 1e3);
    this._schedule = options.schedule ?? defaultSchedule;
    this._emptyText = options.emptyText ?? "No mesh is up. Run %mesh up gpus=4 to start one.";
    this.store = new MeshStore();
    const root = el(doc, "div", "viceroy-mesh");
    this._header = new Header(doc, {
      interrupt: () => this.interrupt(),
      restartFailed: () => this.restartFailed(),
      showStacks: () => this.showStacks()
    });
    this._notice = new Notice(doc);
    this._empty = el(doc, "div", "viceroy-empty", this._emptyText);
    this._grid = new TileGrid(doc, this.store, this._now);
    this._grid.node.addEventListener("click", this._onClick);
    this._grid.node.addEventListener("keydown", this._onKey);
    this._detail = new DetailPane(doc, {
      showLogs: () => {
        if (this._selected !== null) {
          this.select(this._selected, "logs");
        }
      },
      showTraceback: () => {
        if (this._selected !== null) {
          this.select(this._selected, "traceback");
        }
      },
      close: () => this.select(null)
    });
    this._detail.node.addEventListener("keydown", this._onKey);
    root.append(
      this._header.node,
      this._notice.node,
      this._empty,
      this._grid.node,
      this._detail.node
    );
    this.node = root;
    this._unsubscribe = this.store.subscribe((change) => this._onChange(change));
    const tickMs = options.tickMs ?? 1e3;
    if (tickMs > 0) {
      this._tick = setInterval(() => this._grid.tick(), tickMs);
    }
    this._renderAll();
  }
  /** The number of tiles whose DOM the last render touched (for tests and the perf check). */
  get lastTouched() {
    return this._lastTouched;
  }
  get selected() {
    return this._selected;
  }
  /** Connect or disconnect the request channel. */
  setSend(send) {
    this._send = send;
    this._updateHeader();
  }
  /**
   * Handle any message from the kernel: a snapshot or diff goes to the store (a gap asks for
   * a snapshot), a reply goes to the detail pane or the notice.
   */
  handle(message) {
    if (!isObject(message) || this._disposed) {
      return;
    }
    switch (message.type) {
      case "state":
        this._awaitingSnapshot = false;
        this.store.apply(message);
        return;
      case "diff": {
        const result = this.store.apply(message);
        if (result.kind === "gap") {
          this._requestSnapshot();
        }
        return;
      }
      case "logs":
      case "traceback":
        if (message.rank === this._selected) {
          this._detail.showText(message.type, message.text);
        }
        return;
      case "stacks":
        this._detail.showStacks(message.stacks);
        return;
      case "interrupted": {
        const ranks = numbers(message.ranks);
        this._notice.show(
          ranks.length ? `interrupted ranks ${formatRankSet(ranks)}` : "no rank was running"
        );
        return;
      }
      case "restarted": {
        const ranks = numbers(message.ranks);
        this._notice.show(
          ranks.length ? `restarted ranks ${formatRankSet(ranks)}` : "no rank is dead: nothing to restart (a rank that raised keeps running)"
        );
        return;
      }
      case "error": {
        const text = typeof message.message === "string" ? message.message : "error";
        const request = typeof message.request === "string" ? message.request : "";
        if (!this._detail.showError(request, text)) {
          this._notice.show(request ? `${request}: ${text}` : text, true);
        }
        return;
      }
    }
  }
  /** The kernel went away: forget the mesh. */
  clear() {
    this.select(null);
    this.store.clear();
  }
  /**
   * The view lost its kernel (a restart, a closed widget): forget the mesh, disable the
   * buttons, and say why where the mesh was; `null` connects it again with `send`.
   */
  setDisconnected(reason, send = null) {
    this._empty.textContent = reason ?? this._emptyText;
    this.node.classList.toggle("viceroy-disconnected", reason !== null);
    if (reason !== null) {
      this.setSend(null);
      this.clear();
      this._notice.show(reason, true);
    } else {
      this.setSend(send);
    }
  }
  /** Open the detail pane for a rank (its traceback if it failed, else its log), or close it. */
  select(rank, kind) {
    this._selected = rank;
    this._grid.highlight(rank);
    if (rank === null) {
      this._detail.close();
      return;
    }
    const record = this.store.rank(rank);
    this._remember([rank]);
    const what = kind ?? (record?.state === "error" ? "traceback" : "logs");
    this._detail.open(what, `rank ${rank} \xB7 ${what === "logs" ? "log" : "traceback"}`, rank);
    this._request(
      what === "logs" ? { request: "logs", rank, tail: LOG_TAIL } : { request: "traceback", rank }
    );
  }
  showStacks() {
    this._selected = null;
    this._remember([...this.store.ranks]);
    this._detail.open("stacks", "stacks", null);
    this._request({ request: "stacks" });
  }
  interrupt() {
    this._request({ request: "interrupt" });
  }
  restartFailed() {
    this._request({ request: "restart_failed" });
  }
  /** Render what is pending now rather than at the next frame. */
  flush() {
    this._cancelFrame?.();
    this._cancelFrame = null;
    if (this._fullPending) {
      this._renderAll();
    } else if (this._dirty.size > 0) {
      this._lastTouched = this._grid.renderRanks(this._dirty);
    }
    this._fullPending = false;
    this._dirty.clear();
  }
  dispose() {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._unsubscribe();
    this._cancelFrame?.();
    if (this._tick !== null) {
      clearInterval(this._tick);
    }
    this._notice.dispose();
    this._grid.node.removeEventListener("click", this._onClick);
    this._grid.node.removeEventListener("keydown", this._onKey);
    this._detail.node.removeEventListener("keydown", this._onKey);
    this.node.remove();
  }
  // --- requests ---------------------------------------------------------------------------
  _request(request) {
    if (this._send) {
      try {
        this._send(request);
      } catch (err) {
        this._notice.show(`could not reach the kernel: ${err?.message ?? err}`, true);
      }
    } else if (request.request !== "snapshot") {
      this._notice.show("not connected to a Viceroy kernel", true);
    }
  }
  _requestSnapshot() {
    const now = Date.now();
    if (this._awaitingSnapshot && now - this._snapshotAskedAt < 2e3) {
      return;
    }
    this._awaitingSnapshot = true;
    this._snapshotAskedAt = now;
    this._request({ request: "snapshot" });
  }
  // --- rendering --------------------------------------------------------------------------
  _onChange(change) {
    this._closeStaleDetail();
    if (change.full) {
      this._fullPending = true;
    } else {
      for (const r of change.ranks) {
        this._dirty.add(r);
      }
    }
    this._updateHeader();
    if (!this._cancelFrame) {
      this._cancelFrame = this._schedule(() => {
        this._cancelFrame = null;
        this.flush();
      });
    }
  }
  /** Note the processes the detail pane is about to describe (see `_closeStaleDetail`). */
  _remember(ranks) {
    this._shownPids.clear();
    for (const r of ranks) {
      const pid = this.store.rank(r)?.pid;
      if (typeof pid === "number") {
        this._shownPids.set(r, pid);
      }
    }
  }
  /**
   * Close the detail pane once what it shows belongs to processes that are gone: the mesh went
   * down, or a rank it shows was restarted (a new pid). A rank that died keeps its pane: its
   * log and traceback are what the user looks for.
   */
  _closeStaleDetail() {
    if (this._detail.kind === null) {
      return;
    }
    const gone = this.store.dims === null || [...this._shownPids].some(([r, pid]) => {
      const now = this.store.rank(r);
      return now === void 0 || typeof now.pid === "number" && now.pid !== pid;
    });
    if (gone) {
      this.select(null);
    }
  }
  _updateHeader() {
    this._header.update(this.store.summary, this.store.calls, this._send !== null);
  }
  _renderAll() {
    const store = this.store;
    const layout = computeLayout(store.dims, store.ranks, (r) => store.rank(r)?.coords);
    this._empty.hidden = store.ranks.length > 0;
    this._grid.node.hidden = store.ranks.length === 0;
    this.node.classList.toggle("viceroy-compact", store.ranks.length > COMPACT_ABOVE);
    if (layout.key !== this._grid.layoutKey) {
      this._grid.build(layout, this._selected);
      this._lastTouched = store.ranks.length;
    } else {
      this._lastTouched = this._grid.renderRanks(store.ranks);
    }
    if (this._selected !== null && !store.rank(this._selected)) {
      this.select(null);
    }
    this._updateHeader();
  }
};
function numbers(value) {
  return Array.isArray(value) ? value.filter((v) => typeof v === "number") : [];
}

// src/widget.ts
var DISCONNECTED = "Disconnected from the kernel (restarted or shut down): no mesh. Run %mesh status for a live view.";
function render({ model, el: el2 }) {
  let connected = true;
  const send = (request) => {
    if (!connected) {
      return;
    }
    try {
      model.send(request);
    } catch {
      onDisconnect();
    }
  };
  const view = new MeshView({ send }, el2.ownerDocument);
  el2.classList.add("viceroy-widget");
  el2.append(view.node);
  const onDisconnect = () => {
    if (connected) {
      connected = false;
      view.setDisconnected(DISCONNECTED);
    }
  };
  const onState = () => {
    if (connected) {
      view.handle(model.get("state"));
    }
  };
  const onMessage = (message) => {
    if (!connected) {
      connected = true;
      view.setDisconnected(null, send);
    }
    view.handle(message);
  };
  model.on("change:state", onState);
  model.on("msg:custom", onMessage);
  model.on("comm_live_update", onDisconnect);
  model.on("comm:close", onDisconnect);
  onState();
  send({ request: "snapshot" });
  return () => {
    model.off("change:state", onState);
    model.off("msg:custom", onMessage);
    model.off("comm_live_update", onDisconnect);
    model.off("comm:close", onDisconnect);
    view.dispose();
  };
}
var widget_default = { render };
export {
  widget_default as default
};
