/** Fake mesh states and a fake anywidget model for the tests. */

import { MeshView } from '../src/view/render';
import { IRankRecord, IRequest, IStateMessage, RankState } from '../src/view/protocol';

export function rank(r: number, dims: Record<string, number>, extra: Partial<IRankRecord> = {}): IRankRecord {
  const coords: Record<string, number> = {};
  let rest = r;
  for (const name of Object.keys(dims).reverse()) {
    coords[name] = rest % dims[name];
    rest = Math.floor(rest / dims[name]);
  }
  const ordered: Record<string, number> = {};
  for (const name of Object.keys(dims)) {
    ordered[name] = coords[name];
  }
  return {
    rank: r,
    coords: ordered,
    host: 'localhost',
    state: 'idle',
    call: null,
    label: '',
    started: null,
    elapsed: null,
    rss: 100 * 1024 * 1024,
    gpu_mem: null,
    gpu_util: null,
    last_line: '',
    pid: 1000 + r,
    exit: null,
    error: null,
    ...extra
  };
}

export function snapshot(
  dims: Record<string, number>,
  seq = 1,
  states: Partial<Record<number, RankState>> = {}
): IStateMessage {
  const total = Object.values(dims).reduce((a, b) => a * b, 1);
  const ranks = Array.from({ length: total }, (_, r) => rank(r, dims, { state: states[r] ?? 'idle' }));
  return {
    type: 'state',
    seq,
    dims,
    ranks,
    calls: [],
    auto: false,
    summary: {
      total,
      alive: ranks.filter(r => r.state !== 'dead').length,
      running: ranks.filter(r => r.state === 'running').length,
      failed: ranks.filter(r => r.state === 'error' || r.state === 'dead').length
    }
  };
}

type Callback = (...args: unknown[]) => void;

/** Just enough of anywidget's model: get/on/off/send, and a way to play the kernel. */
export class FakeModel {
  constructor(state: unknown) {
    this._state = state;
  }

  sent: IRequest[] = [];

  get(name: string): unknown {
    return name === 'state' ? this._state : undefined;
  }

  on(event: string, callback: Callback): void {
    let set = this._handlers.get(event);
    if (!set) {
      set = new Set();
      this._handlers.set(event, set);
    }
    set.add(callback);
  }

  off(event?: string | null, callback?: Callback | null): void {
    if (!event) {
      this._handlers.clear();
    } else if (!callback) {
      this._handlers.delete(event);
    } else {
      this._handlers.get(event)?.delete(callback);
    }
  }

  send(content: IRequest): void {
    if (this.commClosed) {
      throw new Error('Cannot send'); // as @jupyterlab/services' comm does once disposed
    }
    this.sent.push(content);
  }

  /** The comm under the model is gone (the kernel restarted), as `send` finds out. */
  commClosed = false;

  /** ipywidgets' model events: 'comm_live_update' (kernel restarting), 'comm:close'. */
  trigger(event: string): void {
    this._emit(event);
  }

  /** The kernel sets the `state` trait. */
  setState(state: unknown): void {
    this._state = state;
    this._emit('change:state', state);
  }

  /** The kernel sends a custom message. */
  custom(message: unknown): void {
    this._emit('msg:custom', message, []);
  }

  listenerCount(): number {
    let n = 0;
    for (const set of this._handlers.values()) {
      n += set.size;
    }
    return n;
  }

  private _emit(event: string, ...args: unknown[]): void {
    for (const callback of [...(this._handlers.get(event) ?? [])]) {
      callback(...args);
    }
  }

  private _state: unknown;
  private _handlers = new Map<string, Set<Callback>>();
}

/**
 * The MeshViews of a test: attached to the document, rendering only on flush(), on a clock
 * the test moves, their requests kept in `sent`. `done()` (after each test) disposes them
 * and starts afresh.
 */
export class Views {
  sent: IRequest[] = [];
  clock = 1000;

  constructor(private readonly tickMs: number) {}

  make(): MeshView {
    const view = new MeshView({
      send: r => this.sent.push(r),
      now: () => this.clock,
      schedule: () => () => undefined, // render only on flush()
      tickMs: this.tickMs
    });
    document.body.append(view.node);
    return this.keep(view);
  }

  /** A view the test made itself, disposed with the others. */
  keep(view: MeshView): MeshView {
    this._made.push(view);
    return view;
  }

  done(): void {
    for (const v of this._made) {
      v.dispose();
    }
    this._made = [];
    this.sent = [];
    this.clock = 1000;
    document.body.replaceChildren();
  }

  private _made: MeshView[] = [];
}

/** The text of the first element under `view` that `selector` matches ("" if none). */
export function text(view: MeshView, selector: string): string {
  return view.node.querySelector(selector)?.textContent ?? '';
}
