/**
 * 256 ranks: the first render, and a 5 Hz diff stream that touches only the tiles it names.
 *
 * happy-dom creates elements some 50-100 times slower than a browser (about 0.3 ms a tile
 * here), so the budgets below are loose; tests/browser/test_mesh_perf.py holds the bundled
 * view to 100 ms for the first render in Chromium. What this test pins down is the work done:
 * one build, then only the named tiles touched, the same elements kept.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { MeshView } from '../src/view/render';
import { IDiffMessage } from '../src/view/protocol';
import { snapshot } from './fixtures';

afterEach(() => document.body.replaceChildren());

describe('256 ranks', () => {
  it('renders in under 100 ms and updates incrementally', () => {
    // warm up the DOM implementation and the JIT once
    const warm = new MeshView({ schedule: () => () => undefined, tickMs: 0 });
    warm.handle(snapshot({ hosts: 4, gpus: 8 }, 1));
    warm.flush();
    warm.dispose();

    const view = new MeshView({ send: () => undefined, schedule: () => () => undefined, tickMs: 0 });
    document.body.append(view.node);
    const t0 = performance.now();
    view.handle(snapshot({ hosts: 32, gpus: 8 }, 1));
    view.flush();
    const first = performance.now() - t0;
    expect(view.node.querySelectorAll('.viceroy-tile')).toHaveLength(256);
    expect(first).toBeLessThan(1500);

    // 10 s of a 5 Hz stream: each diff moves 16 ranks along
    const tiles = [...view.node.querySelectorAll('.viceroy-tile')];
    let worst = 0;
    for (let i = 0; i < 50; i++) {
      const ranks: IDiffMessage['ranks'] = {};
      for (let k = 0; k < 16; k++) {
        const r = (i * 16 + k) % 256;
        ranks[String(r)] = { state: i % 2 ? 'done' : 'running', last_line: `step ${i}`, rss: 1000 * i };
      }
      const t = performance.now();
      view.handle({ type: 'diff', seq: i + 2, ranks, summary: { total: 256, alive: 256, running: 16, failed: 0 } });
      view.flush();
      worst = Math.max(worst, performance.now() - t);
      expect(view.lastTouched).toBe(16);
    }
    expect(worst).toBeLessThan(100); // a 5 Hz stream leaves 200 ms a frame
    expect([...view.node.querySelectorAll('.viceroy-tile')]).toEqual(tiles);
    view.dispose();
  });
});
