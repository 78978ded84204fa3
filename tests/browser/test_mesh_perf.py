"""The bundled anywidget ESM (viceroy/extension/static/mesh_view.js) in Chromium with a fake
model, no Jupyter: 256 ranks render within 100 ms, and a stream of diffs touches only the tiles
it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import REPO

pytestmark = pytest.mark.browser

STATIC = REPO / "viceroy" / "extension" / "static"
ORIGIN = "http://viceroy.test"

PAGE = """<!doctype html><html><head><meta charset="utf-8">
<link rel="stylesheet" href="mesh_view.css"></head>
<body><div id="out" style="width: 1200px"></div>
<script type="module">
import widget from './mesh_view.js';
window.meshWidget = widget;
document.body.dataset.ready = '1';
</script></body></html>"""

# Runs in the page: a fake anywidget model, `total` ranks, then a stream of diffs. Times are the
# main thread's work (script, then a forced style and layout), not the wait for the next frame:
# a rAF callback queued before the view's own frame callback and one queued after it bracket
# the view's flush.
SCENARIO = """async ({ dims, diffs, perDiff, keep }) => {
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  const handlers = {};
  const sent = [];
  const total = Object.values(dims).reduce((a, b) => a * b, 1);
  const names = Object.keys(dims);
  const ranks = [];
  for (let r = 0; r < total; r++) {
    const coords = {}; let rest = r;
    for (const n of [...names].reverse()) { coords[n] = rest % dims[n]; rest = Math.floor(rest / dims[n]); }
    ranks.push({ rank: r, coords, host: 'h' + coords[names[0]], state: 'idle', call: null, label: '',
      started: null, elapsed: null, rss: 2 ** 28, gpu_mem: 2 ** 33, gpu_util: 50, last_line: 'ready',
      pid: 1000 + r, exit: null, error: null });
  }
  const state = { type: 'state', seq: 1, dims, ranks, calls: [], auto: false,
    summary: { total, alive: total, running: 0, failed: 0 } };
  const model = {
    get: () => state,
    on: (e, cb) => { (handlers[e] = handlers[e] || []).push(cb); },
    off: (e, cb) => { handlers[e] = (handlers[e] || []).filter(h => h !== cb); },
    send: m => sent.push(m),
  };
  const el = document.getElementById('out');
  el.replaceChildren();
  await frame();
  // Work between `before` (sync) and the end of a forced layout, minus the idle wait.
  const measure = async (act) => {
    let tA = 0, tC = 0;
    requestAnimationFrame(() => { tA = performance.now(); });
    const t0 = performance.now();
    const out = act();
    const tSync = performance.now() - t0;
    await new Promise(r => requestAnimationFrame(() => { tC = performance.now(); r(); }));
    void el.offsetHeight;
    const tLayout = performance.now() - tC;
    return { ms: tSync + (tC - tA) + tLayout, out };
  };
  const { ms: first, out: cleanup } = await measure(() => window.meshWidget.render({ model, el }));
  const tiles = el.querySelectorAll('.viceroy-tile').length;

  const before = [...el.querySelectorAll('.viceroy-tile')];
  const updates = []; let strayTiles = 0; let touchedTiles = 0;
  for (let i = 0; i < diffs; i++) {
    const patch = {}; const named = new Set();
    for (let k = 0; k < perDiff; k++) {
      const r = (i * 37 + k * 11) % total; named.add(String(r));
      patch[String(r)] = { state: i % 2 ? 'done' : 'running', started: Date.now() / 1000,
        last_line: 'step ' + i, rss: 2 ** 28 + i };
    }
    const records = [];
    const observer = new MutationObserver(m => records.push(...m));
    observer.observe(el, { subtree: true, childList: true, characterData: true, attributes: true });
    const { ms } = await measure(() => {
      for (const cb of handlers['msg:custom'] || []) {
        cb({ type: 'diff', seq: i + 2, ranks: patch,
             summary: { total, alive: total, running: perDiff, failed: 0 } }, []);
      }
    });
    updates.push(ms);
    records.push(...observer.takeRecords());
    observer.disconnect();
    const touched = new Set();
    for (const rec of records) {
      const node = rec.target.nodeType === 1 ? rec.target : rec.target.parentElement;
      if (node && node.closest('.viceroy-elapsed')) continue; // running ranks' clocks tick
      const tile = node && node.closest('.viceroy-tile');
      if (tile) touched.add(tile.dataset.rank);
    }
    touchedTiles += touched.size;
    for (const r of touched) if (!named.has(r)) strayTiles++;
  }
  updates.sort((a, b) => a - b);
  const same = [...el.querySelectorAll('.viceroy-tile')].every((t, i) => t === before[i]);
  if (!keep) cleanup();
  return { first, tiles, median: updates[updates.length >> 1], worst: updates[updates.length - 1],
           strayTiles, touchedTiles, same, sent };
}"""


def test_256_ranks_render_fast_and_update_incrementally(browser: Any, artifacts: Path) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        files = {
            "/index.html": (PAGE, "text/html"),
            "/mesh_view.js": ((STATIC / "mesh_view.js").read_text(), "text/javascript"),
            "/mesh_view.css": ((STATIC / "mesh_view.css").read_text(), "text/css"),
        }

        def serve(route: Any) -> None:
            path = route.request.url.removeprefix(ORIGIN)
            body, ctype = files.get(path, ("", "text/plain"))
            route.fulfill(status=200 if path in files else 404, body=body, content_type=ctype)

        page.route(f"{ORIGIN}/**", serve)
        page.goto(f"{ORIGIN}/index.html")
        page.wait_for_function("() => document.body.dataset.ready === '1'")
        # A warm-up (as a page that has shown a widget already), then three runs; the best of
        # each timing counts, as in any micro-benchmark on a shared machine.
        page.evaluate(SCENARIO, {"dims": {"gpus": 8}, "diffs": 2, "perDiff": 4})
        runs = [
            page.evaluate(SCENARIO, {"dims": {"hosts": 32, "gpus": 8}, "diffs": 25, "perDiff": 16})
            for _ in range(3)
        ]
        result = {
            "first": min(r["first"] for r in runs),
            "median": min(r["median"] for r in runs),
            "worst": min(r["worst"] for r in runs),
            "runs": runs,
        }
        page.evaluate(SCENARIO, {"dims": {"hosts": 32, "gpus": 8}, "diffs": 3, "perDiff": 40, "keep": True})
        page.screenshot(path=str(artifacts / "mesh-view-256.png"), full_page=False)
        (artifacts / "mesh-view-256.json").write_text(json.dumps(result, indent=1))
    finally:
        context.close()

    runs = result["runs"]
    assert all(r["tiles"] == 256 for r in runs)
    assert result["first"] <= 100, f"first render of 256 ranks took {result['first']:.1f} ms"
    # a 5 Hz stream leaves 200 ms between diffs; a diff of 16 ranks costs a few ms
    assert result["median"] <= 20, f"a diff took {result['median']:.1f} ms (median) to show"
    assert result["worst"] <= 100, f"a diff took {result['worst']:.1f} ms to show"
    assert all(r["strayTiles"] == 0 for r in runs), "a diff touched tiles it did not name"
    assert all(r["touchedTiles"] > 0 for r in runs)
    assert all(r["same"] for r in runs), "a diff rebuilt the grid"
    # The one request every render makes (the trait's snapshot may be old); no gap, so no other.
    assert all(r["sent"] == [{"request": "snapshot"}] for r in runs), [r["sent"] for r in runs]
