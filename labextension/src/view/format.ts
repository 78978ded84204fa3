/** Text for the tiles, the header, the notices and the status bar. */

import { IRankRecord, ISummary } from './protocol';

/** 1536 -> "1.5 KiB". */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || !Number.isFinite(bytes) || bytes < 0) {
    return '';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** 75.2 -> "1:15"; 4000 -> "1:06:40"; 3.25 -> "3.2s". */
export function formatDuration(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds)) {
    return '';
  }
  const s = Math.max(0, seconds);
  if (s < 10) {
    return `${(Math.floor(s * 10) / 10).toFixed(1)}s`;
  }
  const whole = Math.floor(s);
  const h = Math.floor(whole / 3600);
  const m = Math.floor((whole % 3600) / 60);
  const sec = whole % 60;
  const pad = (n: number): string => String(n).padStart(2, '0');
  return h > 0 ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

/** Seconds a rank has spent on its call: ticking from `started` while running. */
export function elapsedOf(record: Readonly<IRankRecord>, nowSeconds: number): number | null {
  if (record.state === 'running' && record.started !== null) {
    return Math.max(0, nowSeconds - record.started);
  }
  return record.elapsed;
}

/**
 * "mesh 4/4 · running", "mesh 3/4 · 1 failed", "mesh 4/4 · 2 starting", "mesh 4/4 · idle";
 * "no mesh" without ranks.
 */
export function summaryText(summary: ISummary): string {
  if (summary.total === 0) {
    return 'no mesh';
  }
  let what: string;
  if (summary.failed > 0) {
    what = `${summary.failed} failed`;
  } else if (summary.running > 0) {
    what = 'running';
  } else if ((summary.starting ?? 0) > 0) {
    what = `${summary.starting} starting`;
  } else {
    what = 'idle';
  }
  return `mesh ${summary.alive}/${summary.total} · ${what}`;
}

/** The tooltip of a tile. */
export function tileTitle(record: Readonly<IRankRecord>): string {
  const lines = [`rank ${record.rank}: ${record.state}`];
  const coords = Object.entries(record.coords)
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
  if (coords) {
    lines.push(coords);
  }
  if (record.host) {
    lines.push(`host ${record.host}${record.pid !== null ? `, pid ${record.pid}` : ''}`);
  } else if (record.pid !== null) {
    lines.push(`pid ${record.pid}`);
  }
  if (record.exit) {
    lines.push(`exit: ${record.exit}`);
  }
  if (record.error) {
    lines.push(record.error);
  }
  lines.push(record.state === 'error' ? 'click for the traceback' : 'click for the log');
  return lines.join('\n');
}

/** [0, 1, 2, 5] -> "0-2,5". */
export function formatRankSet(ranks: readonly number[]): string {
  const sorted = [...new Set(ranks)].sort((a, b) => a - b);
  const parts: string[] = [];
  let i = 0;
  while (i < sorted.length) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) {
      j += 1;
    }
    parts.push(j > i ? `${sorted[i]}-${sorted[j]}` : `${sorted[i]}`);
    i = j + 1;
  }
  return parts.join(',');
}
