/**
 * What a user meets beyond the happy path: a mesh brought up again with other dims, wide
 * meshes, restart and interrupt with nothing to act on, and the keyboard.
 */

import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { MeshView, computeLayout } from '../src/view/render';
import { Views, rank, snapshot, text } from './fixtures';

const views = new Views(0);

function button(view: MeshView, selector: string): HTMLButtonElement {
  return view.node.querySelector<HTMLButtonElement>(selector)!;
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  views.done();
  vi.useRealTimers();
});

describe('a mesh brought up again', () => {
  it('names the new dim after %mesh down; %mesh up with another dim of the same size', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 4 }, 1));
    view.flush();
    expect(text(view, '.viceroy-axes')).toBe('gpus →');
    view.handle({ ...snapshot({ gpus: 1 }, 2), dims: null, ranks: [] });
    view.handle(snapshot({ dp: 4 }, 3));
    view.flush();
    expect(text(view, '.viceroy-axes')).toBe('dp →');
    expect(view.node.querySelector<HTMLElement>('.viceroy-tile[data-rank="1"]')!.title).toContain(
      'dp=1'
    );
  });
});

describe('a wide mesh', () => {
  const coords = (dims: Record<string, number>) => (r: number) => rank(r, dims).coords;

  it('wraps each row of a grid too wide to fit, under its own title', () => {
    const dims = { hosts: 2, gpus: 64 };
    const ranks = Array.from({ length: 128 }, (_, r) => r);
    const layout = computeLayout(dims, ranks, coords(dims));
    expect([layout.rowDim, layout.colDim]).toEqual([null, 'gpus']);
    expect(layout.facets.map(f => [f.title, f.ranks.length])).toEqual([
      ['hosts=0', 64],
      ['hosts=1', 64]
    ]);
    const view = views.make();
    view.handle(snapshot(dims, 1));
    view.flush();
    const grids = view.node.querySelectorAll<HTMLElement>('.viceroy-grid');
    expect(grids).toHaveLength(2);
    for (const grid of grids) {
      expect(grid.style.gridTemplateColumns).toBe(''); // the stylesheet's wrapping grid
    }
    expect(text(view, '.viceroy-axes')).toBe('gpus →');
  });

  it('keeps rows and columns for a grid of 16 columns or fewer', () => {
    const dims = { hosts: 16, gpus: 8 };
    const ranks = Array.from({ length: 128 }, (_, r) => r);
    const layout = computeLayout(dims, ranks, coords(dims));
    expect([layout.rowDim, layout.colDim, layout.rows, layout.cols]).toEqual(['hosts', 'gpus', 16, 8]);
  });
});

describe('actions with nothing to act on', () => {
  it('offers Restart failed only when a rank is dead: a rank that raised is alive', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 4 }, 1, { 2: 'error' }));
    view.flush();
    expect(text(view, '.viceroy-summary')).toBe('mesh 4/4 · 1 failed');
    expect(button(view, '.viceroy-restart').disabled).toBe(true);
    view.handle({ type: 'diff', seq: 2, ranks: { '3': { state: 'dead' } },
      summary: { total: 4, alive: 3, running: 0, failed: 2 } });
    expect(button(view, '.viceroy-restart').disabled).toBe(false);
  });

  it('says so when an interrupt or a restart found nothing to do', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.handle({ type: 'interrupted', ranks: [] });
    expect(text(view, '.viceroy-notice')).toBe('no rank was running');
    view.handle({ type: 'restarted', ranks: [] });
    expect(text(view, '.viceroy-notice')).toBe(
      'no rank is dead: nothing to restart (a rank that raised keeps running)'
    );
    view.handle({ type: 'restarted', ranks: [1, 0] });
    expect(text(view, '.viceroy-notice')).toBe('restarted ranks 0-1');
  });
});

describe('accessibility', () => {
  it('names its buttons and announces its notices', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.flush();
    for (const b of view.node.querySelectorAll<HTMLButtonElement>('button')) {
      const name = b.getAttribute('aria-label') ?? b.textContent ?? '';
      expect(name).toMatch(/[a-z]{3,}/i);
    }
    expect(button(view, '.viceroy-detail-close').getAttribute('aria-label')).toBe('Close');
    expect(view.node.querySelector('.viceroy-notice')!.getAttribute('role')).toBe('status');
  });

  it('closes the pane with Escape from inside it and gives focus back to the tile', () => {
    const view = views.make();
    view.handle(snapshot({ gpus: 2 }, 1));
    view.flush();
    const tile = view.node.querySelector<HTMLElement>('.viceroy-tile[data-rank="1"]')!;
    tile.focus();
    tile.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
    const close = button(view, '.viceroy-detail-close');
    close.focus();
    close.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
    expect(view.node.querySelector<HTMLElement>('.viceroy-detail')!.hidden).toBe(true);
    expect(document.activeElement).toBe(tile);
  });
});
