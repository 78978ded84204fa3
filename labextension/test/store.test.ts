import { describe, expect, it, vi } from 'vitest';
import { MeshStore, computeSummary, normalizeRank } from '../src/view/store';
import { summaryText } from '../src/view/format';
import { snapshot } from './fixtures';

describe('MeshStore', () => {
  it('applies a snapshot', () => {
    const store = new MeshStore();
    const listener = vi.fn();
    store.subscribe(listener);
    const result = store.apply(snapshot({ gpus: 4 }, 7));
    expect(result.kind).toBe('applied');
    expect(store.seq).toBe(7);
    expect(store.ranks).toEqual([0, 1, 2, 3]);
    expect(store.dims).toEqual({ gpus: 4 });
    expect(store.rank(2)?.coords).toEqual({ gpus: 2 });
    expect(listener).toHaveBeenCalledWith({ full: true, ranks: new Set([0, 1, 2, 3]) });
  });

  it('applies diffs in sequence and reports only the ranks that changed', () => {
    const store = new MeshStore();
    store.apply(snapshot({ gpus: 4 }, 1));
    const listener = vi.fn();
    store.subscribe(listener);
    const result = store.apply({
      type: 'diff',
      seq: 2,
      ranks: { '1': { state: 'running', label: 'cell 3' }, '3': { state: 'idle' } },
      calls: [{ call: 5, label: 'cell 3', ranks: [1], started: 100 }],
      auto: true,
      summary: { total: 4, alive: 4, running: 1, failed: 0 }
    });
    expect(result).toEqual({ kind: 'applied', change: { full: false, ranks: new Set([1]) } });
    expect(store.rank(1)?.state).toBe('running');
    expect(store.rank(1)?.label).toBe('cell 3');
    expect(store.rank(3)?.state).toBe('idle');
    expect(store.calls[0].label).toBe('cell 3');
    expect(store.auto).toBe(true);
    expect(store.summary.running).toBe(1);
    expect(store.seq).toBe(2);
    expect(listener).toHaveBeenCalledTimes(1);
  });

  it('detects a gap and waits for a snapshot', () => {
    const store = new MeshStore();
    store.apply(snapshot({ gpus: 2 }, 10));
    expect(store.apply({ type: 'diff', seq: 12, ranks: { '0': { state: 'done' } } })).toEqual({
      kind: 'gap'
    });
    expect(store.rank(0)?.state).toBe('idle');
    expect(store.seq).toBe(10);
    // an old diff is dropped
    expect(store.apply({ type: 'diff', seq: 9, ranks: { '0': { state: 'done' } } })).toEqual({
      kind: 'stale'
    });
    // a snapshot resyncs, even one with a lower seq (a restarted kernel)
    store.apply(snapshot({ gpus: 2 }, 3, { 0: 'done' }));
    expect(store.seq).toBe(3);
    expect(store.apply({ type: 'diff', seq: 4, ranks: { '1': { state: 'done' } } }).kind).toBe(
      'applied'
    );
  });

  it('needs a snapshot before any diff, and one for an unknown rank', () => {
    const store = new MeshStore();
    expect(store.apply({ type: 'diff', seq: 1, ranks: {} }).kind).toBe('gap');
    store.apply(snapshot({ gpus: 2 }, 1));
    expect(store.apply({ type: 'diff', seq: 2, ranks: { '5': { state: 'done' } } }).kind).toBe(
      'gap'
    );
    expect(store.seq).toBe(1);
  });

  it('rejects what is not a state message', () => {
    const store = new MeshStore();
    expect(store.apply(null).kind).toBe('invalid');
    expect(store.apply({ type: 'logs', rank: 0, text: '' }).kind).toBe('invalid');
    expect(store.apply({ type: 'diff', ranks: {} }).kind).toBe('invalid');
  });

  it('fills defaults for fields an older kernel leaves out, and ignores bad values', () => {
    const r = normalizeRank({ rank: 3, state: 'bogus', rss: 'x', coords: { gpus: 3 } });
    expect(r.state).toBe('idle');
    expect(r.rss).toBeNull();
    expect(r.last_line).toBe('');
    expect(r.coords).toEqual({ gpus: 3 });
  });

  it('computes the summary when the kernel sends none', () => {
    const snap = snapshot({ gpus: 4 }, 1, { 0: 'running', 2: 'error', 3: 'dead' });
    const rest: Record<string, unknown> = { ...snap };
    delete rest.summary;
    const store = new MeshStore();
    store.apply(rest);
    expect(store.summary).toEqual({ total: 4, alive: 3, running: 1, starting: 0, failed: 2 });
    expect(computeSummary([])).toEqual({ total: 0, alive: 0, running: 0, starting: 0, failed: 0 });
  });

  it('keeps the kernel summary\'s starting ranks, so the header says "N starting"', () => {
    const snap = snapshot({ gpus: 4 }, 1, { 0: 'starting', 1: 'starting' });
    const store = new MeshStore();
    store.apply({ ...snap, summary: { total: 4, alive: 4, running: 0, starting: 2, failed: 0 } });
    expect(store.summary.starting).toBe(2);
    expect(summaryText(store.summary)).toBe('mesh 4/4 · 2 starting');
    store.apply({ type: 'diff', seq: 2, ranks: { '0': { state: 'idle' } },
      summary: { total: 4, alive: 4, running: 0, starting: 1, failed: 0 } });
    expect(summaryText(store.summary)).toBe('mesh 4/4 · 1 starting');
    const rest: Record<string, unknown> = { ...snap, seq: 5 };
    delete rest.summary;
    store.apply(rest);
    expect(summaryText(store.summary)).toBe('mesh 4/4 · 2 starting');
  });

  it('clears', () => {
    const store = new MeshStore();
    store.apply(snapshot({ gpus: 2 }, 1));
    store.clear();
    expect(store.hasState).toBe(false);
    expect(store.ranks).toEqual([]);
    expect(store.summary.total).toBe(0);
  });
});
