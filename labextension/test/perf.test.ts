/**
 * 256 ranks under a diff stream: one build, then only the tiles each diff names are touched,
 * the same elements kept.
 *
 * This pins down the *work*; the time budget (first render of 256 ranks within 100 ms, a
 * diff in a few ms) is checked in Chromium by tests/browser/test_mesh_perf.py on the bundled
 * ESM. happy-dom builds elements some 50-100 times slower than a browser, and on a shared
 * machine its timings say little, so they are only printed here.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { MeshView } from '../src/view/render';
import { IDiffMessage } from '../src/view/protocol';
import { snapshot } from './fixtures';

afterEach(() => document.body.replaceChildren());

describe('256 ranks', () => {
  it('builds once and then updates only the touched tiles', () => {
    const view = new MeshView({ send: () => undefined, schedule: () => () => undefined, tickMs: 0 });
    document.body.append(view.node);
    const t0 = performance.now();
    view.handle(snapshot({ hosts: 32, gpus: 8 }, 1));
    view.flush();
    const first = performance.now() - t0;
    expect(view.node.querySelectorAll('.viceroy-tile')).toHaveLength(256);
    expect(view.node.classList.contains('viceroy-compact')).toBe(true);

    // 10 s of a 5 Hz stream: each diff moves 16 ranks along
    const tiles = [...view.node.querySelectorAll('.viceroy-tile')];
    const body = view.node.querySelector('.viceroy-body')!;
    const times: number[] = [];
    for (let i = 0; i < 50; i++) {
      const ranks: IDiffMessage['ranks'] = {};
      for (let k = 0; k < 16; k++) {
        const r = (i * 16 + k) % 256;
        ranks[String(r)] = { state: i % 2 ? 'done' : 'running', last_line: `step ${i}`, rss: 1000 * i };
      }
      const records: MutationRecord[] = [];
      const observer = new MutationObserver(m => records.push(...m));
      observer.observe(body, { subtree: true, childList: true, characterData: true, attributes: true });
      const t = performance.now();
      view.handle({ type: 'diff', seq: i + 2, ranks, summary: { total: 256, alive: 256, running: 16, failed: 0 } });
      view.flush();
      times.push(performance.now() - t);
      records.push(...observer.takeRecords());
      observer.disconnect();
      expect(view.lastTouched).toBe(16);
      const touched = new Set(
        records.map(
          rec => (rec.target instanceof Element ? rec.target : rec.target.parentElement)!.closest('.viceroy-tile')
        )
      );
      expect(touched.size).toBe(16);
      for (const tile of touched) {
        expect(Object.keys(ranks)).toContain((tile as HTMLElement).dataset.rank);
      }
    }
    expect([...view.node.querySelectorAll('.viceroy-tile')]).toEqual(tiles);
    times.sort((a, b) => a - b);
    console.info(
      `happy-dom: first render ${first.toFixed(0)} ms, diff median ${times[25].toFixed(1)} ms`
    );
    view.dispose();
  });
});
