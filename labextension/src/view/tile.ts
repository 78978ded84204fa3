/** One rank's tile: its DOM, and bringing it up to date by rewriting only the parts that changed. */

import { el } from './dom';
import { elapsedOf, formatBytes, formatDuration, tileTitle } from './format';
import { IRankRecord } from './protocol';

export interface ITile {
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

export function makeTile(doc: Document, record: Readonly<IRankRecord>): ITile {
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

/** Bring a tile up to date; true if any of its DOM changed. `now`: seconds since the epoch. */
export function fillTile(tile: ITile, record: Readonly<IRankRecord>, now: () => number): boolean {
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
  put('elapsed', v => (tile.elapsed.textContent = v), elapsedText(record, now));
  put('mem', v => (tile.mem.textContent = v), record.rss !== null ? formatBytes(record.rss) : '');
  put('gpu', v => (tile.gpu.textContent = v), gpuText(record));
  put(
    'last',
    v => (tile.last.textContent = v),
    record.state === 'error' && record.error ? record.error : record.last_line
  );
  put('title', v => (tile.el.title = v), tileTitle(record));
  return changed;
}

/** Rewrite a running rank's elapsed time, if the clock has moved it. */
export function tickTile(tile: ITile, record: Readonly<IRankRecord>, now: () => number): void {
  const text = elapsedText(record, now);
  if (tile.shown.get('elapsed') !== text) {
    tile.shown.set('elapsed', text);
    tile.elapsed.textContent = text;
  }
}

function elapsedText(record: Readonly<IRankRecord>, now: () => number): string {
  const seconds = elapsedOf(record, now());
  return seconds === null ? '' : formatDuration(seconds);
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
