/**
 * The mesh view: a grid of rank tiles laid out by the mesh's dims, a header with the summary
 * and actions, and a detail pane for a rank's log or traceback. The same class runs in the
 * anywidget `MeshView` and in the JupyterLab side panel.
 *
 * Updates are incremental: a diff marks its ranks dirty, and the next frame rewrites only the
 * text of those tiles whose values changed. A snapshot with the same layout does the same; a
 * snapshot with a new layout (dims or rank set) rebuilds the grid.
 *
 * This module ties the parts together (messages, requests, selection, keyboard, scheduling):
 * header.ts and notice.ts draw the top, layout.ts places the ranks, grid.ts and tile.ts draw
 * the tiles, detail.ts the pane.
 */

import { DetailPane } from './detail';
import { el } from './dom';
import { formatRankSet } from './format';
import { TileGrid } from './grid';
import { Header } from './header';
import { computeLayout } from './layout';
import { Notice } from './notice';
import { IChange, MeshStore } from './store';
import { IRequest, SendRequest, isObject } from './protocol';

export { formatRankSet } from './format';
export { deadCount } from './header';
export { MAX_GRID_COLS, computeLayout } from './layout';
export type { ILayout } from './layout';

/** Above this many ranks the tiles drop their metrics and last line (kept in the tooltip). */
export const COMPACT_ABOVE = 64;
export const LOG_TAIL = 200;

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

function defaultSchedule(callback: () => void): () => void {
  if (typeof requestAnimationFrame === 'function') {
    const id = requestAnimationFrame(() => callback());
    return () => cancelAnimationFrame(id);
  }
  const id = setTimeout(callback, 16);
  return () => clearTimeout(id);
}

export class MeshView {
  readonly node: HTMLElement;
  readonly store: MeshStore;

  constructor(options: IMeshViewOptions = {}, doc: Document = document) {
    this._send = options.send ?? null;
    this._now = options.now ?? (() => Date.now() / 1000);
    this._schedule = options.schedule ?? defaultSchedule;
    this._emptyText = options.emptyText ?? 'No mesh is up. Run %mesh up gpus=4 to start one.';
    this.store = new MeshStore();

    const root = el(doc, 'div', 'viceroy-mesh');
    this._header = new Header(doc, {
      interrupt: () => this.interrupt(),
      restartFailed: () => this.restartFailed(),
      showStacks: () => this.showStacks()
    });
    this._notice = new Notice(doc);
    this._empty = el(doc, 'div', 'viceroy-empty', this._emptyText);
    this._grid = new TileGrid(doc, this.store, this._now);
    this._grid.node.addEventListener('click', this._onClick);
    this._grid.node.addEventListener('keydown', this._onKey);

    this._detail = new DetailPane(doc, {
      showLogs: () => {
        if (this._selected !== null) {
          this.select(this._selected, 'logs');
        }
      },
      showTraceback: () => {
        if (this._selected !== null) {
          this.select(this._selected, 'traceback');
        }
      },
      close: () => this.select(null)
    });
    this._detail.node.addEventListener('keydown', this._onKey);

    root.append(
      this._header.node,
      this._notice.node,
      this._empty,
      this._grid.node,
      this._detail.node
    );
    this.node = root;

    this._unsubscribe = this.store.subscribe(change => this._onChange(change));
    const tickMs = options.tickMs ?? 1000;
    if (tickMs > 0) {
      this._tick = setInterval(() => this._grid.tick(), tickMs);
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
        if (message.rank === this._selected) {
          this._detail.showText(message.type, message.text);
        }
        return;
      case 'stacks':
        this._detail.showStacks(message.stacks);
        return;
      case 'interrupted': {
        const ranks = numbers(message.ranks);
        this._notice.show(
          ranks.length ? `interrupted ranks ${formatRankSet(ranks)}` : 'no rank was running'
        );
        return;
      }
      case 'restarted': {
        const ranks = numbers(message.ranks);
        this._notice.show(
          ranks.length
            ? `restarted ranks ${formatRankSet(ranks)}`
            : 'no rank is dead: nothing to restart (a rank that raised keeps running)'
        );
        return;
      }
      case 'error': {
        const text = typeof message.message === 'string' ? message.message : 'error';
        const request = typeof message.request === 'string' ? message.request : '';
        if (!this._detail.showError(request, text)) {
          this._notice.show(request ? `${request}: ${text}` : text, true);
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

  /**
   * The view lost its kernel (a restart, a closed widget): forget the mesh, disable the
   * buttons, and say why where the mesh was; `null` connects it again with `send`.
   */
  setDisconnected(reason: string | null, send: SendRequest | null = null): void {
    this._empty.textContent = reason ?? this._emptyText;
    this.node.classList.toggle('viceroy-disconnected', reason !== null);
    if (reason !== null) {
      this.setSend(null);
      this.clear();
      this._notice.show(reason, true);
    } else {
      this.setSend(send);
    }
  }

  /** Open the detail pane for a rank (its traceback if it failed, else its log), or close it. */
  select(rank: number | null, kind?: 'logs' | 'traceback'): void {
    this._selected = rank;
    this._grid.highlight(rank);
    if (rank === null) {
      this._detail.close();
      return;
    }
    const record = this.store.rank(rank);
    this._remember([rank]);
    const what = kind ?? (record?.state === 'error' ? 'traceback' : 'logs');
    this._detail.open(what, `rank ${rank} · ${what === 'logs' ? 'log' : 'traceback'}`, rank);
    this._request(
      what === 'logs' ? { request: 'logs', rank, tail: LOG_TAIL } : { request: 'traceback', rank }
    );
  }

  showStacks(): void {
    this._selected = null;
    this._remember([...this.store.ranks]);
    this._detail.open('stacks', 'stacks', null);
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
      this._lastTouched = this._grid.renderRanks(this._dirty);
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
    this._notice.dispose();
    this._grid.node.removeEventListener('click', this._onClick);
    this._grid.node.removeEventListener('keydown', this._onKey);
    this._detail.node.removeEventListener('keydown', this._onKey);
    this.node.remove();
  }

  // --- requests ---------------------------------------------------------------------------

  private _request(request: IRequest): void {
    if (this._send) {
      try {
        this._send(request);
      } catch (err) {
        // a comm closed under the view (the kernel restarted): say so rather than throw
        this._notice.show(`could not reach the kernel: ${(err as Error)?.message ?? err}`, true);
      }
    } else if (request.request !== 'snapshot') {
      this._notice.show('not connected to a Viceroy kernel', true);
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

  // --- rendering --------------------------------------------------------------------------

  private _onChange(change: IChange): void {
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
  private _remember(ranks: number[]): void {
    this._shownPids.clear();
    for (const r of ranks) {
      const pid = this.store.rank(r)?.pid;
      if (typeof pid === 'number') {
        this._shownPids.set(r, pid);
      }
    }
  }

  /**
   * Close the detail pane once what it shows belongs to processes that are gone: the mesh went
   * down, or a rank it shows was restarted (a new pid). A rank that died keeps its pane: its
   * log and traceback are what the user looks for.
   */
  private _closeStaleDetail(): void {
    if (this._detail.kind === null) {
      return;
    }
    const gone =
      this.store.dims === null ||
      [...this._shownPids].some(([r, pid]) => {
        const now = this.store.rank(r);
        return now === undefined || (typeof now.pid === 'number' && now.pid !== pid);
      });
    if (gone) {
      this.select(null);
    }
  }

  private _updateHeader(): void {
    this._header.update(this.store.summary, this.store.calls, this._send !== null);
  }

  private _renderAll(): void {
    const store = this.store;
    const layout = computeLayout(store.dims, store.ranks, r => store.rank(r)?.coords);
    this._empty.hidden = store.ranks.length > 0;
    this._grid.node.hidden = store.ranks.length === 0;
    this.node.classList.toggle('viceroy-compact', store.ranks.length > COMPACT_ABOVE);
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

  // --- events -----------------------------------------------------------------------------

  private _onClick = (event: Event): void => {
    const rank = this._grid.rankAt(event.target);
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
        this._grid.focus(was);
      }
      return;
    }
    if (key !== 'Enter' && key !== ' ') {
      return;
    }
    const rank = this._grid.rankAt(event.target);
    if (rank !== null) {
      event.preventDefault();
      this.select(rank);
    }
  };

  private _send: SendRequest | null;
  private _now: () => number;
  private _schedule: (callback: () => void) => () => void;
  private _emptyText: string;
  private _header: Header;
  private _notice: Notice;
  private _empty: HTMLElement;
  private _grid: TileGrid;
  private _detail: DetailPane;
  private _selected: number | null = null;
  private _shownPids = new Map<number, number>(); // what the detail pane shows: rank -> pid
  private _dirty = new Set<number>();
  private _fullPending = false;
  private _cancelFrame: (() => void) | null = null;
  private _tick: ReturnType<typeof setInterval> | null = null;
  private _awaitingSnapshot = false;
  private _snapshotAskedAt = 0;
  private _lastTouched = 0;
  private _disposed = false;
  private _unsubscribe: () => void;
}

function numbers(value: unknown): number[] {
  return Array.isArray(value) ? value.filter((v): v is number => typeof v === 'number') : [];
}
