/**
 * The mesh view: a grid of rank tiles laid out by the mesh's dims, a header with the summary
 * and actions, and a detail pane for a rank's log or traceback. The same class runs in the
 * anywidget `MeshView` and in the JupyterLab side panel.
 *
 * Updates are incremental: a diff marks its ranks dirty, and the next frame rewrites only the
 * text of those tiles whose values changed. A snapshot with the same layout does the same; a
 * snapshot with a new layout (dims or rank set) rebuilds the grid.
 */

import { elapsedOf, formatBytes, formatDuration, summaryText, tileTitle } from './format';
import { IChange, MeshStore } from './store';
import { IRankRecord, IRequest, ISummary, SendRequest, isObject } from './protocol';

/** Above this many ranks the tiles drop their metrics and last line (kept in the tooltip). */
export const COMPACT_ABOVE = 64;
/** A 2-d grid with more columns than this is drawn as one wrapped grid per row instead. */
export const MAX_GRID_COLS = 16;
export const LOG_TAIL = 200;
const NOTICE_MS = 6000;

export interface IMeshViewOptions {
  /** Carries requests to the kernel; null while disconnected. */
  send?: SendRequest | null;
  /** Seconds since the epoch (tests pass a fake clock). */
  now?: () => number;
  /** Schedules a render; defaults to requestAnimationFrame. Returns a canceller. */
  schedule?: (callback: () => void) => () => void;
  /** Milliseconds between ticks of the running ranks' elapsed times (0: no ticking). */
  tickMs?: number;
  /** What the empty view says. */
  emptyText?: string;
}

type DetailKind = 'logs' | 'traceback' | 'stacks';

interface ITile {
  el: HTMLElement;
  state: HTMLElement;
  label: HTMLElement;
  elapsed: HTMLElement;
  mem: HTMLElement;
  gpu: HTMLElement;
  last: HTMLElement;
  /** What each part shows now, so that unchanged parts are not touched. */
  shown: Map<string, string>;
}

function defaultSchedule(callback: () => void): () => void {
  if (typeof requestAnimationFrame === 'function') {
    const id = requestAnimationFrame(() => callback());
    return () => cancelAnimationFrame(id);
  }
  const id = setTimeout(callback, 16);
  return () => clearTimeout(id);
}

function el<K extends keyof HTMLElementTagNameMap>(
  doc: Document,
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = doc.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** [0, 1, 2, 5] -> "0-2,5". */
export function formatRankSet(ranks: readonly number[]): string {
  const sorted = [...new Set(ranks)].sort((a, b) => a - b);
  const parts: string[] = [];
  let i = 0;
  while (i < sorted.length) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) {
      j += 1;
    }
    parts.push(j > i ? `${sorted[i]}-${sorted[j]}` : `${sorted[i]}`);
    i = j + 1;
  }
  return parts.join(',');
}

/** How ranks are placed: facets (small multiples) of grids. */
export interface ILayout {
  key: string;
  /** Names of the row and column dims of each grid (empty: a wrapped flat grid). */
  rowDim: string | null;
  colDim: string | null;
  rows: number;
  cols: number;
  facets: { title: string; ranks: number[] }[];
}

export function computeLayout(
  dims: Readonly<Record<string, number>> | null,
  ranks: readonly number[],
  coordsOf: (rank: number) => Readonly<Record<string, number>> | undefined
): ILayout {
  const names = dims ? Object.keys(dims) : [];
  const hasCoords = ranks.every(r => {
    const c = coordsOf(r);
    return c !== undefined && names.every(n => typeof c[n] === 'number');
  });
  if (!dims || names.length < 2 || !hasCoords) {
    return {
      key: `flat|${JSON.stringify(dims)}|${ranks.join(',')}`,
      rowDim: null,
      colDim: names.length === 1 ? names[0] : null,
      rows: 0,
      cols: 0,
      facets: [{ title: '', ranks: [...ranks] }]
    };
  }
  let rowDim: string | null = names[names.length - 2];
  const colDim = names[names.length - 1];
  // Too many columns to fit beside each other: each row wraps on its own, under its title.
  const wide = dims[colDim] > MAX_GRID_COLS;
  const leading = wide ? names.slice(0, -1) : names.slice(0, -2);
  const facets = new Map<string, number[]>();
  for (const r of ranks) {
    const c = coordsOf(r)!;
    const title = leading.map(n => `${n}=${c[n]}`).join(' · ');
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
    key: `grid|${JSON.stringify(dims)}|${ranks.join(',')}`,
    rowDim,
    colDim,
    rows: rowDim ? dims[rowDim] : 0,
    cols: rowDim ? dims[colDim] : 0,
    facets: [...facets].map(([title, list]) => ({ title, ranks: list }))
  };
}

export class MeshView {
  readonly node: HTMLElement;
  readonly store: MeshStore;

  constructor(options: IMeshViewOptions = {}, doc: Document = document) {
    this._doc = doc;
    this._send = options.send ?? null;
    this._now = options.now ?? (() => Date.now() / 1000);
    this._schedule = options.schedule ?? defaultSchedule;
    this._emptyText = options.emptyText ?? 'No mesh is up. Run %mesh up gpus=4 to start one.';
    this.store = new MeshStore();

    const root = el(doc, 'div', 'viceroy-mesh');
    const header = el(doc, 'div', 'viceroy-header');
    this._summary = el(doc, 'span', 'viceroy-summary', 'no mesh');
    this._calls = el(doc, 'span', 'viceroy-calls');
    const actions = el(doc, 'span', 'viceroy-actions');
    this._interruptButton = this._button('viceroy-interrupt', 'Interrupt', 'Interrupt the mesh', () =>
      this.interrupt()
    );
    this._restartButton = this._button(
      'viceroy-restart',
      'Restart failed',
      'Restart the dead ranks; the others keep their state',
      () => this.restartFailed()
    );
    this._stacksButton = this._button('viceroy-stacks', 'Stacks', "Every rank's Python stack", () =>
      this.showStacks()
    );
    actions.append(this._interruptButton, this._restartButton, this._stacksButton);
    header.append(this._summary, this._calls, actions);

    this._notice = el(doc, 'div', 'viceroy-notice');
    this._notice.setAttribute('role', 'status'); // read out when it changes
    this._notice.hidden = true;
    this._empty = el(doc, 'div', 'viceroy-empty', this._emptyText);
    this._body = el(doc, 'div', 'viceroy-body');
    this._body.addEventListener('click', this._onClick);
    this._body.addEventListener('keydown', this._onKey);

    this._detail = el(doc, 'div', 'viceroy-detail');
    this._detail.hidden = true;
    const detailHead = el(doc, 'div', 'viceroy-detail-head');
    this._detailTitle = el(doc, 'span', 'viceroy-detail-title');
    this._detailLogs = this._button('viceroy-detail-logs', 'Log', 'Show the log tail', () => {
      if (this._selected !== null) {
        this.select(this._selected, 'logs');
      }
    });
    this._detailTraceback = this._button(
      'viceroy-detail-traceback',
      'Traceback',
      'Show the traceback',
      () => {
        if (this._selected !== null) {
          this.select(this._selected, 'traceback');
        }
      }
    );
    const close = this._button('viceroy-detail-close', '×', 'Close', () => this.select(null));
    close.setAttribute('aria-label', 'Close');
    detailHead.append(this._detailTitle, this._detailLogs, this._detailTraceback, close);
    this._detailText = el(doc, 'pre', 'viceroy-detail-text');
    this._detail.append(detailHead, this._detailText);
    this._detail.addEventListener('keydown', this._onKey);

    root.append(header, this._notice, this._empty, this._body, this._detail);
    this.node = root;

    this._unsubscribe = this.store.subscribe(change => this._onChange(change));
    const tickMs = options.tickMs ?? 1000;
    if (tickMs > 0) {
      this._tick = setInterval(() => this._tickElapsed(), tickMs);
    }
    this._renderAll();
  }

  /** The number of tiles whose DOM the last render touched (for tests and the perf check). */
  get lastTouched(): number {
    return this._lastTouched;
  }

  get selected(): number | null {
    return this._selected;
  }

  /** Connect or disconnect the request channel. */
  setSend(send: SendRequest | null): void {
    this._send = send;
    this._updateHeader();
  }

  /**
   * Handle any message from the kernel: a snapshot or diff goes to the store (a gap asks for
   * a snapshot), a reply goes to the detail pane or the notice.
   */
  handle(message: unknown): void {
    if (!isObject(message) || this._disposed) {
      return;
    }
    switch (message.type) {
      case 'state':
        this._awaitingSnapshot = false;
        this.store.apply(message);
        return;
      case 'diff': {
        const result = this.store.apply(message);
        if (result.kind === 'gap') {
          this._requestSnapshot();
        }
        return;
      }
      case 'logs':
      case 'traceback':
        this._onText(message.type, message.rank, message.text);
        return;
      case 'stacks':
        this._onStacks(message.stacks);
        return;
      case 'interrupted': {
        const ranks = numbers(message.ranks);
        this._showNotice(
          ranks.length ? `interrupted ranks ${formatRankSet(ranks)}` : 'no rank was running'
        );
        return;
      }
      case 'restarted': {
        const ranks = numbers(message.ranks);
        this._showNotice(
          ranks.length
            ? `restarted ranks ${formatRankSet(ranks)}`
            : 'no rank is dead: nothing to restart (a rank that raised keeps running)'
        );
        return;
      }
      case 'error': {
        const text = typeof message.message === 'string' ? message.message : 'error';
        const request = typeof message.request === 'string' ? message.request : '';
        if (!this._detail.hidden && request === this._detailKind) {
          this._detailText.textContent = text;
          this._detail.dataset.loading = 'false';
        } else {
          this._showNotice(request ? `${request}: ${text}` : text, true);
        }
        return;
      }
    }
  }

  /** The kernel went away: forget the mesh. */
  clear(): void {
    this.select(null);
    this.store.clear();
  }

  /** Open the detail pane for a rank (its traceback if it failed, else its log), or close it. */
  select(rank: number | null, kind?: 'logs' | 'traceback'): void {
    this._selected = rank;
    for (const tile of this._tiles.values()) {
      tile.el.classList.remove('viceroy-selected');
    }
    if (rank === null) {
      this._detail.hidden = true;
      this._detailKind = null;
      return;
    }
    const record = this.store.rank(rank);
    const what = kind ?? (record?.state === 'error' ? 'traceback' : 'logs');
    this._tiles.get(rank)?.el.classList.add('viceroy-selected');
    this._openDetail(what, `rank ${rank} · ${what === 'logs' ? 'log' : 'traceback'}`);
    this._detail.dataset.rank = String(rank);
    this._detailLogs.hidden = false;
    this._detailTraceback.hidden = false;
    this._request(
      what === 'logs' ? { request: 'logs', rank, tail: LOG_TAIL } : { request: 'traceback', rank }
    );
  }

  showStacks(): void {
    this._selected = null;
    this._openDetail('stacks', 'stacks');
    delete this._detail.dataset.rank;
    this._detailLogs.hidden = true;
    this._detailTraceback.hidden = true;
    this._request({ request: 'stacks' });
  }

  interrupt(): void {
    this._request({ request: 'interrupt' });
  }

  restartFailed(): void {
    this._request({ request: 'restart_failed' });
  }

  /** Render what is pending now rather than at the next frame. */
  flush(): void {
    this._cancelFrame?.();
    this._cancelFrame = null;
    if (this._fullPending) {
      this._renderAll();
    } else if (this._dirty.size > 0) {
      this._renderRanks(this._dirty);
    }
    this._fullPending = false;
    this._dirty.clear();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._unsubscribe();
    this._cancelFrame?.();
    if (this._tick !== null) {
      clearInterval(this._tick);
    }
    if (this._noticeTimer !== null) {
      clearTimeout(this._noticeTimer);
    }
    this._body.removeEventListener('click', this._onClick);
    this._body.removeEventListener('keydown', this._onKey);
    this._detail.removeEventListener('keydown', this._onKey);
    this.node.remove();
  }

  // --- requests ---------------------------------------------------------------------------

  private _request(request: IRequest): void {
    if (this._send) {
      this._send(request);
    } else if (request.request !== 'snapshot') {
      this._showNotice('not connected to a Viceroy kernel', true);
    }
  }

  private _requestSnapshot(): void {
    const now = Date.now();
    // One request at a time; ask again if the answer is slow to come.
    if (this._awaitingSnapshot && now - this._snapshotAskedAt < 2000) {
      return;
    }
    this._awaitingSnapshot = true;
    this._snapshotAskedAt = now;
    this._request({ request: 'snapshot' });
  }

  // --- replies ----------------------------------------------------------------------------

  private _openDetail(kind: DetailKind, title: string): void {
    this._detailKind = kind;
    this._detail.hidden = false;
    this._detail.dataset.kind = kind;
    this._detail.dataset.loading = 'true';
    this._detailTitle.textContent = title;
    this._detailText.textContent = 'loading…';
  }

  private _onText(kind: 'logs' | 'traceback', rank: unknown, text: unknown): void {
    if (this._detail.hidden || this._detailKind !== kind || rank !== this._selected) {
      return;
    }
    const body = typeof text === 'string' ? text : '';
    this._detailText.textContent =
      body || (kind === 'logs' ? '(no output yet)' : '(no traceback: the rank did not fail)');
    this._detail.dataset.loading = 'false';
  }

  private _onStacks(stacks: unknown): void {
    if (this._detail.hidden || this._detailKind !== 'stacks' || !isObject(stacks)) {
      return;
    }
    const parts = Object.entries(stacks)
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([rank, text]) => `── rank ${rank} ──\n${typeof text === 'string' ? text : ''}`);
    this._detailText.textContent = parts.join('\n') || '(no stacks)';
    this._detail.dataset.loading = 'false';
  }

  private _showNotice(text: string, isError = false): void {
    this._notice.textContent = text;
    this._notice.hidden = false;
    this._notice.classList.toggle('viceroy-notice-error', isError);
    if (this._noticeTimer !== null) {
      clearTimeout(this._noticeTimer);
    }
    this._noticeTimer = setTimeout(() => {
      this._notice.hidden = true;
      this._noticeTimer = null;
    }, NOTICE_MS);
  }

  // --- rendering --------------------------------------------------------------------------

  private _onChange(change: IChange): void {
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

  private _updateHeader(): void {
    const summary = this.store.summary;
    setText(this._summary, summaryText(summary));
    this._summary.dataset.failed = String(summary.failed);
    this._summary.dataset.running = String(summary.running);
    const calls = this.store.calls;
    setText(
      this._calls,
      calls
        .map(c => `${c.label || `call ${c.call}`} [ranks ${formatRankSet(c.ranks)}]`)
        .join(' · ')
    );
    const connected = this._send !== null && summary.total > 0;
    this._interruptButton.disabled = !connected;
    // Only dead ranks are restarted (`mesh.restart(failed_only=True)`): a rank whose call
    // raised is alive and keeps its state.
    this._restartButton.disabled = !connected || deadCount(summary) === 0;
    this._stacksButton.disabled = !connected;
  }

  private _renderAll(): void {
    const store = this.store;
    const layout = computeLayout(store.dims, store.ranks, r => store.rank(r)?.coords);
    this._empty.hidden = store.ranks.length > 0;
    this._body.hidden = store.ranks.length === 0;
    this.node.classList.toggle('viceroy-compact', store.ranks.length > COMPACT_ABOVE);
    if (layout.key !== this._layoutKey) {
      this._build(layout);
      this._lastTouched = store.ranks.length;
    } else {
      this._renderRanks(store.ranks);
    }
    if (this._selected !== null && !store.rank(this._selected)) {
      this.select(null);
    }
    this._updateHeader();
  }

  private _build(layout: ILayout): void {
    const doc = this._doc;
    this._layoutKey = layout.key;
    this._tiles.clear();
    this._running.clear();
    const fragment = doc.createDocumentFragment();
    const caption = el(doc, 'div', 'viceroy-axes');
    if (layout.rowDim && layout.colDim) {
      caption.textContent = `rows: ${layout.rowDim} · columns: ${layout.colDim}`;
    } else if (layout.colDim) {
      caption.textContent = `${layout.colDim} →`;
    }
    fragment.append(caption);
    const facets = el(doc, 'div', 'viceroy-facets');
    for (const facet of layout.facets) {
      const box = el(doc, 'div', 'viceroy-facet');
      if (facet.title) {
        box.append(el(doc, 'div', 'viceroy-facet-title', facet.title));
      }
      const grid = el(doc, 'div', 'viceroy-grid');
      if (layout.rowDim && layout.colDim) {
        grid.classList.add('viceroy-grid-2d');
        grid.style.gridTemplateColumns = `repeat(${layout.cols}, minmax(var(--viceroy-tile-min, 7.5em), 1fr))`;
      }
      for (const r of facet.ranks) {
        const record = this.store.rank(r)!;
        const tile = this._makeTile(record);
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
    this._body.replaceChildren(fragment);
    if (this._selected !== null) {
      this._tiles.get(this._selected)?.el.classList.add('viceroy-selected');
    }
  }

  private _makeTile(record: Readonly<IRankRecord>): ITile {
    const doc = this._doc;
    const tile = el(doc, 'div', 'viceroy-tile');
    tile.dataset.rank = String(record.rank);
    tile.tabIndex = 0;
    tile.setAttribute('role', 'button');
    const head = el(doc, 'div', 'viceroy-tile-head');
    head.append(el(doc, 'span', 'viceroy-rank', String(record.rank)));
    const state = el(doc, 'span', 'viceroy-state');
    head.append(state);
    const label = el(doc, 'div', 'viceroy-label');
    const metrics = el(doc, 'div', 'viceroy-metrics');
    const elapsed = el(doc, 'span', 'viceroy-elapsed');
    const mem = el(doc, 'span', 'viceroy-mem');
    const gpu = el(doc, 'span', 'viceroy-gpu');
    metrics.append(elapsed, mem, gpu);
    const last = el(doc, 'div', 'viceroy-last');
    tile.append(head, label, metrics, last);
    return { el: tile, state, label, elapsed, mem, gpu, last, shown: new Map() };
  }

  private _renderRanks(ranks: Iterable<number>): void {
    let touched = 0;
    for (const r of ranks) {
      const tile = this._tiles.get(r);
      const record = this.store.rank(r);
      if (tile && record && this._fill(tile, record)) {
        touched += 1;
      }
    }
    this._lastTouched = touched;
  }

  /** Bring a tile up to date; true if any of its DOM changed. */
  private _fill(tile: ITile, record: Readonly<IRankRecord>): boolean {
    let changed = false;
    const put = (key: string, apply: (value: string) => void, value: string): void => {
      if (tile.shown.get(key) !== value) {
        tile.shown.set(key, value);
        apply(value);
        changed = true;
      }
    };
    put('state', v => (tile.el.dataset.state = v), record.state);
    put('stateText', v => (tile.state.textContent = v), record.state);
    put('label', v => (tile.label.textContent = v), record.label);
    put('elapsed', v => (tile.elapsed.textContent = v), this._elapsedText(record));
    put('mem', v => (tile.mem.textContent = v), record.rss !== null ? formatBytes(record.rss) : '');
    put('gpu', v => (tile.gpu.textContent = v), gpuText(record));
    put(
      'last',
      v => (tile.last.textContent = v),
      record.state === 'error' && record.error ? record.error : record.last_line
    );
    put('title', v => (tile.el.title = v), tileTitle(record));
    if (record.state === 'running' && record.started !== null) {
      this._running.add(record.rank);
    } else {
      this._running.delete(record.rank);
    }
    return changed;
  }

  private _elapsedText(record: Readonly<IRankRecord>): string {
    const seconds = elapsedOf(record, this._now());
    return seconds === null ? '' : formatDuration(seconds);
  }

  private _tickElapsed(): void {
    for (const r of this._running) {
      const tile = this._tiles.get(r);
      const record = this.store.rank(r);
      if (tile && record) {
        const text = this._elapsedText(record);
        if (tile.shown.get('elapsed') !== text) {
          tile.shown.set('elapsed', text);
          tile.elapsed.textContent = text;
        }
      }
    }
  }

  // --- events -----------------------------------------------------------------------------

  private _tileRank(target: EventTarget | null): number | null {
    const node = target as Element | null;
    const tile = node?.closest?.('.viceroy-tile') as HTMLElement | null | undefined;
    if (!tile || !this._body.contains(tile)) {
      return null;
    }
    const rank = Number(tile.dataset.rank);
    return Number.isInteger(rank) ? rank : null;
  }

  private _onClick = (event: Event): void => {
    const rank = this._tileRank(event.target);
    if (rank !== null) {
      this.select(rank);
    }
  };

  private _onKey = (event: Event): void => {
    const key = (event as KeyboardEvent).key;
    if (key === 'Escape') {
      // Back to the tile whose pane closes, so the keyboard user is not left on nothing.
      const was = this._selected;
      this.select(null);
      if (was !== null) {
        this._tiles.get(was)?.el.focus();
      }
      return;
    }
    if (key !== 'Enter' && key !== ' ') {
      return;
    }
    const rank = this._tileRank(event.target);
    if (rank !== null) {
      event.preventDefault();
      this.select(rank);
    }
  };

  private _button(
    className: string,
    text: string,
    title: string,
    onClick: () => void
  ): HTMLButtonElement {
    const button = el(this._doc, 'button', `viceroy-button ${className}`, text);
    button.type = 'button';
    button.title = title;
    button.addEventListener('click', event => {
      event.stopPropagation();
      onClick();
    });
    return button;
  }

  private _doc: Document;
  private _send: SendRequest | null;
  private _now: () => number;
  private _schedule: (callback: () => void) => () => void;
  private _emptyText: string;
  private _summary: HTMLElement;
  private _calls: HTMLElement;
  private _interruptButton: HTMLButtonElement;
  private _restartButton: HTMLButtonElement;
  private _stacksButton: HTMLButtonElement;
  private _notice: HTMLElement;
  private _empty: HTMLElement;
  private _body: HTMLElement;
  private _detail: HTMLElement;
  private _detailTitle: HTMLElement;
  private _detailText: HTMLElement;
  private _detailLogs: HTMLButtonElement;
  private _detailTraceback: HTMLButtonElement;
  private _detailKind: DetailKind | null = null;
  private _selected: number | null = null;
  private _tiles = new Map<number, ITile>();
  private _running = new Set<number>();
  private _layoutKey = '';
  private _dirty = new Set<number>();
  private _fullPending = false;
  private _cancelFrame: (() => void) | null = null;
  private _tick: ReturnType<typeof setInterval> | null = null;
  private _noticeTimer: ReturnType<typeof setTimeout> | null = null;
  private _awaitingSnapshot = false;
  private _snapshotAskedAt = 0;
  private _lastTouched = 0;
  private _disposed = false;
  private _unsubscribe: () => void;
}

/** Ranks whose process is gone: those `Restart failed` brings back. */
export function deadCount(summary: Readonly<ISummary>): number {
  return Math.max(0, summary.total - summary.alive);
}

function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

function numbers(value: unknown): number[] {
  return Array.isArray(value) ? value.filter((v): v is number => typeof v === 'number') : [];
}

function gpuText(record: Readonly<IRankRecord>): string {
  const parts: string[] = [];
  if (record.gpu_mem !== null) {
    parts.push(`GPU ${formatBytes(record.gpu_mem)}`);
  }
  if (record.gpu_util !== null) {
    // Percent, 0-100, as nvidia-smi and NVML report it.
    parts.push(`${Math.round(record.gpu_util)}%`);
  }
  return parts.join(' ');
}
