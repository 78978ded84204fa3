import { describe, expect, it } from 'vitest';
import { elapsedOf, formatBytes, formatDuration, summaryText, tileTitle } from '../src/view/format';
import { formatRankSet } from '../src/view/render';
import { rank } from './fixtures';

describe('format', () => {
  it('formats bytes', () => {
    expect(formatBytes(null)).toBe('');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.50 KiB');
    expect(formatBytes(250 * 1024 * 1024)).toBe('250 MiB');
    expect(formatBytes(12.5 * 1024 ** 3)).toBe('12.5 GiB');
  });

  it('formats durations', () => {
    expect(formatDuration(null)).toBe('');
    expect(formatDuration(3.27)).toBe('3.2s');
    expect(formatDuration(75.2)).toBe('1:15');
    expect(formatDuration(4000)).toBe('1:06:40');
    expect(formatDuration(-1)).toBe('0.0s');
  });

  it('ticks elapsed time from started while running', () => {
    expect(elapsedOf(rank(0, { gpus: 1 }, { state: 'running', started: 100 }), 112.5)).toBe(12.5);
    expect(elapsedOf(rank(0, { gpus: 1 }, { state: 'done', started: 100, elapsed: 3 }), 200)).toBe(3);
  });

  it('summarises for the status bar', () => {
    expect(summaryText({ total: 0, alive: 0, running: 0, failed: 0 })).toBe('no mesh');
    expect(summaryText({ total: 4, alive: 4, running: 2, failed: 0 })).toBe('mesh 4/4 · running');
    expect(summaryText({ total: 4, alive: 4, running: 0, failed: 1 })).toBe('mesh 4/4 · 1 failed');
    expect(summaryText({ total: 4, alive: 4, running: 0, failed: 0 })).toBe('mesh 4/4 · idle');
    // a restart in progress is not idle
    expect(summaryText({ total: 4, alive: 4, running: 0, starting: 2, failed: 0 })).toBe('mesh 4/4 · 2 starting');
  });

  it('compresses rank sets', () => {
    expect(formatRankSet([5, 0, 1, 2])).toBe('0-2,5');
    expect(formatRankSet([])).toBe('');
  });

  it('writes a tooltip', () => {
    const title = tileTitle(rank(2, { gpus: 4 }, { state: 'error', error: 'ZeroDivisionError: division by zero' }));
    expect(title).toContain('rank 2: error');
    expect(title).toContain('gpus=2');
    expect(title).toContain('ZeroDivisionError');
    expect(title).toContain('traceback');
  });
});
