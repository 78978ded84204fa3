import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { MeshView, computeLayout } from '../src/view/render';
import { Views, rank, snapshot, text } from './fixtures';

const views = new Views(1000);

function tile(view: MeshView, r: number): HTMLElement {
  return view.node.querySelector(`.viceroy-tile[data-rank="${r}"]`) as HTMLElement;
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  views.done();
  vi.useRealTimers();
});

describe('layout', () => {
  const coords = (dims: Record<string, number>) => (r: number) => rank(r, dims).coords;

  it('wraps one dim', () => {
    const layout = computeLayout({ gpus: 4 }, [0, 1, 2, 3], coords({ gpus: 4 }));
    expect(layout.rowDim).toBeNull();
    expect(layout.colDim).toBe('gpus');
    expect(layout.facets).toEqual([{ title: '', ranks: [0, 1, 2, 3] }]);
  });

  it('puts two dims in rows and columns', () => {
    const dims = { hosts: 2, gpus: 3 };
    const layout = computeLayout(dims, [0, 1, 2, 3, 4, 5], coords(dims));
    expect([layout.rowDim, layout.colDim, layout.rows, layout.cols]).toEqual(['hosts', 'gpus', 2, 3]);
    expect(layout.facets).toHaveLength(1);
  });

  it('draws small multiples over the leading dims', () => {
    const dims = { pods: 2, hosts: 2, gpus: 2 };
    const ranks = [0, 1, 2, 3, 4, 5, 6, 7];
    const layout = computeLayout(dims, ranks, coords(dims));
    expect(layout.facets.map(f => f.title)).toEqual(['pods=0', 'pods=1']);
    expect(layout.facets[1].ranks).toEqual([4, 5, 6, 7]);
  });

  it('falls back to a flat grid without coords', () => {
    const layout = computeLayout({ hosts: 2, gpus: 2 }, [0, 1], () => ({}));
    expect(layout.rowDim).toBeNull();
    expect(layout.facets[0].ranks).toEqual([0, 1]);
  });
});

describe('MeshView', () => {
  it('says when there is no mesh', () => {
    const view = views.make();
    expect(view.node.querySelector<HTMLElement>('.viceroy-empty')!.hidden).toBe(false);
    expect(text(view, '.viceroy-summary')).toBe('no mesh');
    expect(view.node.querySelectorAll('.viceroy-tile')).toHaveLength(0);
  });

  it('draws one tile per rank with state in colour and words', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 4 }, 1, { 2: 'error' }));
    view.flush();
    expect(view.node.querySelectorAll('.viceroy-tile')).toHaveLength(4);
    expect(view.node.querySelector<HTMLElement>('.viceroy-empty')!.hidden).toBe(true);
    expect(tile(view, 2).dataset.state).toBe('error');
    expect(tile(view, 2).querySelector('.viceroy-state')!.textContent).toBe('error');
    expect(tile(view, 0).querySelector('.viceroy-mem')!.textContent).toBe('100 MiB');
    expect(text(view, '.viceroy-summary')).toBe('mesh 4/4 · 1 failed');
  });

  it('places a 2-d mesh by its coords', () => {
    const view = views.make();
    view.handle(snapshot({ hosts: 2, gpus: 4 }, 1));
    view.flush();
    const grid = view.node.querySelector<HTMLElement>('.viceroy-grid')!;
    expect(grid.style.gridTemplateColumns).toContain('repeat(4');
    expect(tile(view, 6).style.gridRow).toBe('2');
    expect(tile(view, 6).style.gridColumn).toBe('3');
    expect(text(view, '.viceroy-axes')).toBe('rows: hosts · columns: gpus');
  });

  it('shows small multiples for three dims', () => {
    const view = views.make();
    view.handle(snapshot({ pods: 3, hosts: 2, gpus: 2 }, 1));
    view.flush();
    expect(view.node.querySelectorAll('.viceroy-facet')).toHaveLength(3);
    expect([...view.node.querySelectorAll('.viceroy-facet-title')].map(n => n.textContent)).toEqual([
      'pods=0',
      'pods=1',
      'pods=2'
    ]);
  });

  it('shows the call, the ticking elapsed time, GPU use and the last line', () => {
    const view = views.make();
    const snap = snapshot({ gpus: 2 }, 1);
    snap.ranks[1] = rank(1, { gpus: 2 }, {
      state: 'running',
      label: 'cell [3]',
      started: views.clock - 5,
      gpu_mem: 2 * 1024 ** 3,
      gpu_util: 87,
      last_line: 'step 10 loss 0.5'
    });
    view.handle(snap);
    view.flush();
    const t = tile(view, 1);
    expect(t.querySelector('.viceroy-label')!.textContent).toBe('cell [3]');
    expect(t.querySelector('.viceroy-elapsed')!.textContent).toBe('5.0s');
    expect(t.querySelector('.viceroy-gpu')!.textContent).toBe('GPU 2.00 GiB 87%');
    expect(t.querySelector('.viceroy-last')!.textContent).toBe('step 10 loss 0.5');
    views.clock += 70;
    vi.advanceTimersByTime(1000);
    expect(t.querySelector('.viceroy-elapsed')!.textContent).toBe('1:15');
    // done: the kernel's elapsed replaces the ticking one
    view.handle({ type: 'diff', seq: 2, ranks: { '1': { state: 'done', elapsed: 80 } } });
    view.flush();
    views.clock += 100;
    vi.advanceTimersByTime(1000);
    expect(t.querySelector('.viceroy-elapsed')!.textContent).toBe('1:20');
  });

  it('shows an error summary in place of the last line', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.handle({
      type: 'diff',
      seq: 2,
      ranks: { '1': { state: 'error', error: 'ZeroDivisionError: division by zero' } }
    });
    view.flush();
    expect(tile(view, 1).querySelector('.viceroy-last')!.textContent).toBe(
      'ZeroDivisionError: division by zero'
    );
  });

  it('asks for a snapshot once on a gap, and again if none comes', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.handle({ type: 'diff', seq: 3, ranks: { '0': { state: 'done' } } });
    view.handle({ type: 'diff', seq: 4, ranks: { '0': { state: 'done' } } });
    expect(views.sent).toEqual([{ request: 'snapshot' }]);
    vi.setSystemTime(Date.now() + 2500);
    view.handle({ type: 'diff', seq: 5, ranks: {} });
    expect(views.sent).toHaveLength(2);
    view.handle(snapshot({ gpus: 2 }, 5, { 0: 'done' }));
    view.handle({ type: 'diff', seq: 6, ranks: { '1': { state: 'done' } } });
    view.flush();
    expect(views.sent).toHaveLength(2);
    expect(tile(view, 1).dataset.state).toBe('done');
  });

  it('opens the traceback of a failed rank on click', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 4 }, 1, { 2: 'error' }));
    view.flush();
    tile(view, 2).querySelector<HTMLElement>('.viceroy-last')!.click();
    expect(views.sent).toEqual([{ request: 'traceback', rank: 2 }]);
    const detail = view.node.querySelector<HTMLElement>('.viceroy-detail')!;
    expect(detail.hidden).toBe(false);
    expect(detail.dataset.loading).toBe('true');
    expect(tile(view, 2).classList.contains('viceroy-selected')).toBe(true);
    // a reply for another rank is not ours
    view.handle({ type: 'traceback', rank: 1, text: 'nope' });
    expect(text(view, '.viceroy-detail-text')).toBe('loading…');
    view.handle({ type: 'traceback', rank: 2, text: 'Traceback…\nZeroDivisionError: division by zero' });
    expect(text(view, '.viceroy-detail-title')).toBe('rank 2 · traceback');
    expect(text(view, '.viceroy-detail-text')).toContain('ZeroDivisionError');
    expect(detail.dataset.loading).toBe('false');
    // the log of the same rank
    view.node.querySelector<HTMLElement>('.viceroy-detail-logs')!.click();
    expect(views.sent[1]).toEqual({ request: 'logs', rank: 2, tail: 200 });
    view.handle({ type: 'logs', rank: 2, text: '' });
    expect(text(view, '.viceroy-detail-text')).toBe('(no output yet)');
    view.node.querySelector<HTMLElement>('.viceroy-detail-close')!.click();
    expect(detail.hidden).toBe(true);
    expect(tile(view, 2).classList.contains('viceroy-selected')).toBe(false);
  });

  it('opens the log of a healthy rank, also by keyboard', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.flush();
    tile(view, 1).dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
    expect(views.sent).toEqual([{ request: 'logs', rank: 1, tail: 200 }]);
    view.handle({ type: 'logs', rank: 1, text: 'hello\n' });
    expect(text(view, '.viceroy-detail-text')).toBe('hello\n');
    tile(view, 1).dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
    expect(view.selected).toBeNull();
  });

  it('shows an error reply in the open pane, else as a notice', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.flush();
    tile(view, 0).click();
    view.handle({ type: 'error', request: 'logs', message: 'no mesh is up' });
    expect(text(view, '.viceroy-detail-text')).toBe('no mesh is up');
    view.handle({ type: 'error', request: 'interrupt', message: 'nothing running' });
    const notice = view.node.querySelector<HTMLElement>('.viceroy-notice')!;
    expect(notice.hidden).toBe(false);
    expect(notice.textContent).toBe('interrupt: nothing running');
    vi.advanceTimersByTime(10000);
    expect(notice.hidden).toBe(true);
  });

  it('sends interrupt, restart and stacks from its buttons', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 3 }, 1, { 1: 'dead' }));
    view.flush();
    const button = (c: string) => view.node.querySelector<HTMLButtonElement>(c)!;
    expect(button('.viceroy-restart').disabled).toBe(false);
    button('.viceroy-interrupt').click();
    button('.viceroy-restart').click();
    button('.viceroy-stacks').click();
    expect(views.sent.map(r => r.request)).toEqual(['interrupt', 'restart_failed', 'stacks']);
    view.handle({ type: 'stacks', stacks: { '1': 'frame b', '0': 'frame a' } });
    expect(text(view, '.viceroy-detail-text')).toBe('── rank 0 ──\nframe a\n── rank 1 ──\nframe b');
    view.handle({ type: 'interrupted', ranks: [0, 1, 2] });
    expect(text(view, '.viceroy-notice')).toBe('interrupted ranks 0-2');
    view.handle({ type: 'restarted', ranks: [1] });
    expect(text(view, '.viceroy-notice')).toBe('restarted ranks 1');
  });

  it('closes the detail pane once the processes it shows are gone', () => {
    const view = views.make();
    const detail = view.node.querySelector<HTMLElement>('.viceroy-detail')!;
    view.handle(snapshot({ gpus: 2 }, 1));
    view.flush();
    view.node.querySelector<HTMLButtonElement>('.viceroy-stacks')!.click();
    view.handle({ type: 'stacks', stacks: { '0': 'frame a', '1': 'frame b' } });
    view.handle({ type: 'diff', seq: 2, ranks: { '1': { state: 'running' } } });
    expect(detail.hidden).toBe(false); // the same processes, busy: still theirs
    view.handle({ type: 'diff', seq: 3, ranks: { '1': { pid: 2001 } } }); // rank 1 restarted
    expect(detail.hidden).toBe(true);
    tile(view, 0).click(); // a rank's log
    expect(detail.hidden).toBe(false);
    view.handle({ type: 'diff', seq: 4, ranks: { '0': { state: 'dead', pid: null } } });
    expect(detail.hidden).toBe(false); // a dead rank's log is what one looks for
    view.handle({ ...snapshot({ gpus: 2 }, 5), dims: null, ranks: [] }); // %mesh down
    expect(detail.hidden).toBe(true);
    expect(view.selected).toBeNull();
  });

  it('disables its buttons while disconnected', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1, { 0: 'error' }));
    view.setSend(null);
    expect(view.node.querySelector<HTMLButtonElement>('.viceroy-interrupt')!.disabled).toBe(true);
    expect(view.node.querySelector<HTMLButtonElement>('.viceroy-restart')!.disabled).toBe(true);
  });

  it('lists the running calls', () => {
    const view = views.make();
    const snap = snapshot({ gpus: 4 }, 1);
    snap.calls = [{ call: 3, label: 'cell [7]', ranks: [0, 1, 2, 3], started: 1 }];
    view.handle(snap);
    expect(text(view, '.viceroy-calls')).toBe('cell [7] [ranks 0-3]');
  });

  it('updates only the tiles a diff touches', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 8 }, 1));
    view.flush();
    const before = [...view.node.querySelectorAll('.viceroy-tile')];
    const records: MutationRecord[] = [];
    const observer = new MutationObserver(m => records.push(...m));
    observer.observe(view.node.querySelector('.viceroy-body')!, {
      subtree: true,
      childList: true,
      characterData: true,
      attributes: true
    });
    view.handle({
      type: 'diff',
      seq: 2,
      ranks: { '3': { state: 'running', label: 'cell' }, '5': { last_line: 'hi' }, '6': { state: 'idle' } }
    });
    view.flush();
    records.push(...observer.takeRecords());
    observer.disconnect();
    expect(view.lastTouched).toBe(2); // rank 6 was idle already
    const touched = new Set(
      records.map(r => (r.target instanceof Element ? r.target : r.target.parentElement)!.closest('.viceroy-tile'))
    );
    expect([...touched].map(t => (t as HTMLElement).dataset.rank).sort()).toEqual(['3', '5']);
    // the same elements: no rebuild
    expect([...view.node.querySelectorAll('.viceroy-tile')]).toEqual(before);
    // a snapshot with the same layout keeps the elements too
    view.handle(snapshot({ gpus: 8 }, 3));
    view.flush();
    expect([...view.node.querySelectorAll('.viceroy-tile')]).toEqual(before);
    expect(view.lastTouched).toBe(2); // back to idle, and the last line cleared
    // a new shape rebuilds
    view.handle(snapshot({ gpus: 4 }, 4));
    view.flush();
    expect(view.node.querySelectorAll('.viceroy-tile')).toHaveLength(4);
  });

  it('renders at the next frame without flush()', () => {
    const frames: (() => void)[] = [];
    const view = new MeshView({
      send: r => views.sent.push(r),
      schedule: cb => {
        frames.push(cb);
        return () => undefined;
      }
    });
    views.keep(view);
    view.handle(snapshot({ gpus: 2 }, 1));
    view.handle({ type: 'diff', seq: 2, ranks: { '0': { state: 'done' } } });
    expect(frames).toHaveLength(1); // coalesced
    expect(view.node.querySelectorAll('.viceroy-tile')).toHaveLength(0);
    frames[0]();
    expect(view.node.querySelector<HTMLElement>('.viceroy-tile[data-rank="0"]')!.dataset.state).toBe(
      'done'
    );
  });

  it('stops its timers and listeners on dispose', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.flush();
    view.node.querySelector<HTMLElement>('.viceroy-interrupt')!.click();
    view.handle({ type: 'interrupted', ranks: [0] });
    view.dispose();
    expect(vi.getTimerCount()).toBe(0);
    expect(view.node.isConnected).toBe(false);
    view.handle(snapshot({ gpus: 4 }, 2)); // ignored
    expect(view.store.ranks).toHaveLength(2);
  });
});
