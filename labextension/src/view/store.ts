/**
 * Applies the kernel's snapshots and diffs to a local copy of the mesh state, detects gaps in
 * the sequence numbers, and tells listeners which ranks changed.
 */

import {
  ICallRecord,
  IDiffMessage,
  IRankRecord,
  IStateMessage,
  ISummary,
  RANK_STATES,
  RankState,
  isObject
} from './protocol';

/** What one applied message changed. */
export interface IChange {
  /** A snapshot: everything may have changed, the layout too. */
  full: boolean;
  /** The ranks whose records changed (all of them for a snapshot). */
  ranks: ReadonlySet<number>;
}

/** What the store did with a message. */
export type ApplyResult =
  | { kind: 'applied'; change: IChange }
  | { kind: 'gap' } // a diff arrived out of sequence; a snapshot is needed
  | { kind: 'stale' } // an old diff, dropped
  | { kind: 'invalid' };

export type ChangeListener = (change: IChange) => void;

const NUMBER_FIELDS = ['started', 'elapsed', 'rss', 'gpu_mem', 'gpu_util', 'pid', 'call'] as const;
const STRING_FIELDS = ['host', 'label', 'last_line'] as const;
const NULLABLE_STRING_FIELDS = ['exit', 'error'] as const;

function numberOrNull(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

function stateOf(value: unknown): RankState {
  return RANK_STATES.includes(value as RankState) ? (value as RankState) : 'idle';
}

/** A full rank record from whatever the kernel sent, with defaults for missing fields. */
export function normalizeRank(raw: Record<string, unknown>): IRankRecord {
  const coords: Record<string, number> = {};
  if (isObject(raw.coords)) {
    for (const [k, v] of Object.entries(raw.coords)) {
      if (typeof v === 'number') {
        coords[k] = v;
      }
    }
  }
  const record: IRankRecord = {
    rank: typeof raw.rank === 'number' ? raw.rank : -1,
    coords,
    host: '',
    state: stateOf(raw.state),
    call: null,
    label: '',
    started: null,
    elapsed: null,
    rss: null,
    gpu_mem: null,
    gpu_util: null,
    last_line: '',
    pid: null,
    exit: null,
    error: null
  };
  mergeFields(record, raw);
  return record;
}

/** Copy the known fields present in `patch` onto `record`; true if anything changed. */
function mergeFields(record: IRankRecord, patch: Record<string, unknown>): boolean {
  let changed = false;
  const assign = <K extends keyof IRankRecord>(key: K, value: IRankRecord[K]): void => {
    if (record[key] !== value) {
      record[key] = value;
      changed = true;
    }
  };
  if ('state' in patch) {
    assign('state', stateOf(patch.state));
  }
  for (const key of NUMBER_FIELDS) {
    if (key in patch) {
      assign(key, numberOrNull(patch[key]));
    }
  }
  for (const key of STRING_FIELDS) {
    if (key in patch) {
      assign(key, typeof patch[key] === 'string' ? patch[key] : '');
    }
  }
  for (const key of NULLABLE_STRING_FIELDS) {
    if (key in patch) {
      const v = patch[key];
      assign(key, typeof v === 'string' ? v : null);
    }
  }
  if ('coords' in patch && isObject(patch.coords)) {
    const coords: Record<string, number> = {};
    for (const [k, v] of Object.entries(patch.coords)) {
      if (typeof v === 'number') {
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

function normalizeCalls(raw: unknown): ICallRecord[] {
  if (!Array.isArray(raw)) {
    return [];
  }
  return raw.filter(isObject).map(c => ({
    call: typeof c.call === 'number' ? c.call : -1,
    label: typeof c.label === 'string' ? c.label : '',
    ranks: Array.isArray(c.ranks) ? c.ranks.filter((r): r is number => typeof r === 'number') : [],
    started: numberOrNull(c.started)
  }));
}

function normalizeSummary(raw: unknown): ISummary | null {
  if (!isObject(raw)) {
    return null;
  }
  const n = (v: unknown): number => (typeof v === 'number' ? v : 0);
  return {
    total: n(raw.total),
    alive: n(raw.alive),
    running: n(raw.running),
    starting: n(raw.starting),
    failed: n(raw.failed)
  };
}

/** The summary computed from the records, for kernels that send none. */
export function computeSummary(ranks: Iterable<IRankRecord>): ISummary {
  const s: ISummary = { total: 0, alive: 0, running: 0, starting: 0, failed: 0 };
  for (const r of ranks) {
    s.total += 1;
    if (r.state !== 'dead') {
      s.alive += 1;
    }
    if (r.state === 'running') {
      s.running += 1;
    }
    if (r.state === 'starting') {
      s.starting = (s.starting ?? 0) + 1;
    }
    if (r.state === 'error' || r.state === 'dead') {
      s.failed += 1;
    }
  }
  return s;
}

export class MeshStore {
  /** The sequence number of the last message applied; null before the first snapshot. */
  get seq(): number | null {
    return this._seq;
  }

  /** True once a snapshot has arrived. */
  get hasState(): boolean {
    return this._seq !== null || this._ranks.size > 0 || this._dims !== null;
  }

  get dims(): Readonly<Record<string, number>> | null {
    return this._dims;
  }

  /** Rank numbers in ascending order. */
  get ranks(): readonly number[] {
    return this._order;
  }

  get calls(): readonly ICallRecord[] {
    return this._calls;
  }

  get auto(): boolean {
    return this._auto;
  }

  get summary(): ISummary {
    return this._summary ?? computeSummary(this._ranks.values());
  }

  rank(rank: number): Readonly<IRankRecord> | undefined {
    return this._ranks.get(rank);
  }

  records(): IterableIterator<Readonly<IRankRecord>> {
    return this._ranks.values();
  }

  /** Listen for applied changes; returns the function that stops listening. */
  subscribe(listener: ChangeListener): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /** Apply a snapshot or a diff (anything else is `invalid`). */
  apply(message: unknown): ApplyResult {
    if (!isObject(message)) {
      return { kind: 'invalid' };
    }
    if (message.type === 'state') {
      return this.applySnapshot(message as unknown as IStateMessage);
    }
    if (message.type === 'diff') {
      return this.applyDiff(message as unknown as IDiffMessage);
    }
    return { kind: 'invalid' };
  }

  applySnapshot(message: IStateMessage): ApplyResult {
    const raw = message as unknown as Record<string, unknown>;
    // A snapshot always wins, even with a lower seq: the kernel may have restarted.
    this._seq = typeof raw.seq === 'number' ? raw.seq : null;
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
    const change: IChange = { full: true, ranks: new Set(this._order) };
    this._emit(change);
    return { kind: 'applied', change };
  }

  applyDiff(message: IDiffMessage): ApplyResult {
    const raw = message as unknown as Record<string, unknown>;
    const seq = raw.seq;
    if (typeof seq !== 'number') {
      return { kind: 'invalid' };
    }
    if (this._seq === null) {
      return { kind: 'gap' };
    }
    if (seq <= this._seq) {
      return { kind: 'stale' };
    }
    if (seq !== this._seq + 1) {
      return { kind: 'gap' };
    }
    const patches = isObject(raw.ranks) ? raw.ranks : {};
    // Check before touching anything: a diff about a rank we don't know needs a snapshot.
    for (const key of Object.keys(patches)) {
      const r = Number(key);
      const patch = patches[key];
      if (!Number.isInteger(r) || !isObject(patch)) {
        return { kind: 'invalid' };
      }
      if (!this._ranks.has(r)) {
        return { kind: 'gap' };
      }
    }
    const changed = new Set<number>();
    for (const [key, patch] of Object.entries(patches)) {
      const r = Number(key);
      if (mergeFields(this._ranks.get(r)!, patch as Record<string, unknown>)) {
        changed.add(r);
      }
    }
    if ('calls' in raw) {
      this._calls = normalizeCalls(raw.calls);
    }
    if ('auto' in raw) {
      this._auto = raw.auto === true;
    }
    if ('summary' in raw) {
      this._summary = normalizeSummary(raw.summary);
    }
    this._seq = seq;
    const change: IChange = { full: false, ranks: changed };
    this._emit(change);
    return { kind: 'applied', change };
  }

  /** Forget everything (the kernel went away). */
  clear(): void {
    this._seq = null;
    this._dims = null;
    this._ranks.clear();
    this._order = [];
    this._calls = [];
    this._auto = false;
    this._summary = null;
    this._emit({ full: true, ranks: new Set() });
  }

  private _emit(change: IChange): void {
    for (const listener of [...this._listeners]) {
      listener(change);
    }
  }

  private _seq: number | null = null;
  private _dims: Record<string, number> | null = null;
  private _ranks = new Map<number, IRankRecord>();
  private _order: number[] = [];
  private _calls: ICallRecord[] = [];
  private _auto = false;
  private _summary: ISummary | null = null;
  private _listeners = new Set<ChangeListener>();
}

function normalizeDims(raw: Record<string, unknown>): Record<string, number> {
  const dims: Record<string, number> = {};
  for (const [k, v] of Object.entries(raw)) {
    if (typeof v === 'number' && v > 0) {
      dims[k] = v;
    }
  }
  return dims;
}
