import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ALIVE_MS, MeshClient } from '../src/client';

/** The kernel connection's comm, as MeshClient uses it: what was opened, sent and closed. */
class FakeComm {
  opened: unknown[] = [];
  sent: unknown[] = [];
  closed = false;
  isDisposed = false;
  onMsg: ((msg: unknown) => void) | null = null;
  onClose: ((msg: unknown) => void) | null = null;
  open(data: unknown): void {
    this.opened.push(data);
  }
  send(data: unknown): void {
    this.sent.push(data);
  }
  dispose(): void {
    this.isDisposed = true;
  }
  close(): void {
    // as @jupyterlab/services' comm does: closing calls its own onClose
    this.closed = true;
    this.isDisposed = true;
    this.onClose?.({});
  }
}

function client(): { c: MeshClient; comm: FakeComm } {
  const comm = new FakeComm();
  const kernel = { createComm: () => comm };
  return { c: new MeshClient(kernel as never), comm };
}

describe('MeshClient', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('tells the kernel it is alive, now and every 30 s, until disposed', () => {
    const { c, comm } = client();
    expect(comm.opened).toEqual([{ request: 'snapshot' }]);
    expect(comm.sent).toEqual([{ request: 'alive' }]);
    vi.advanceTimersByTime(ALIVE_MS * 3);
    expect(comm.sent).toHaveLength(4);
    c.dispose();
    expect(comm.closed).toBe(true);
    vi.advanceTimersByTime(ALIVE_MS * 3);
    expect(comm.sent).toHaveLength(4);
  });

  it('knows when the kernel closed its comm', () => {
    const { c, comm } = client();
    const seen: boolean[] = [];
    c.connectedChanged.connect((_, connected) => seen.push(connected));
    comm.onMsg?.({ content: { data: { type: 'state', seq: 1 } } });
    comm.onClose?.({}); // the kernel took this page for gone
    expect(seen).toEqual([true, false]);
    expect(c.closedByKernel).toBe(true);
    expect(c.isDisposed).toBe(true);
  });

  it('says so at once when its tab is shown again, and closes its comm when the page goes', () => {
    const { c, comm } = client();
    Object.defineProperty(document, 'visibilityState', { value: 'visible', configurable: true });
    document.dispatchEvent(new Event('visibilitychange'));
    expect(comm.sent).toEqual([{ request: 'alive' }, { request: 'alive' }]);
    window.dispatchEvent(new Event('pagehide'));
    expect(comm.closed).toBe(true);
    expect(c.isDisposed).toBe(true);
    expect(c.closedByKernel).toBe(false); // the panel must not connect again from a page going away
    document.dispatchEvent(new Event('visibilitychange'));
    expect(comm.sent).toHaveLength(2);
  });

  it('opens its comm only once the comm\'s subshell started, so the open skips a running cell', async () => {
    const comm = new FakeComm() as FakeComm & { subshellStarted: Promise<void>; commsOverSubshells: string };
    let started!: () => void;
    comm.subshellStarted = new Promise<void>(resolve => (started = resolve));
    comm.commsOverSubshells = 'perCommTarget';
    const kernel = { createComm: () => comm, info: Promise.resolve({}), supportsSubshells: true };
    const c = new MeshClient(kernel as never);
    await Promise.resolve();
    await Promise.resolve();
    expect(comm.opened).toEqual([]); // on the main shell it would wait behind the cell
    c.send({ request: 'stacks' });
    expect(comm.sent).toEqual([]); // nothing before the open
    started();
    await c.opened;
    expect(comm.opened).toEqual([{ request: 'snapshot' }]);
    expect(comm.sent).toEqual([{ request: 'alive' }]);
    c.dispose();
  });

  it('opens at once on a kernel without subshells', async () => {
    const comm = new FakeComm() as FakeComm & { subshellStarted: Promise<void>; commsOverSubshells: string };
    comm.subshellStarted = new Promise<void>(() => {}); // never, as services leaves it
    comm.commsOverSubshells = 'perCommTarget';
    const kernel = { createComm: () => comm, info: Promise.resolve({}), supportsSubshells: false };
    const c = new MeshClient(kernel as never);
    await c.opened;
    expect(comm.opened).toEqual([{ request: 'snapshot' }]);
    c.dispose();
  });

  it('does not open a comm disposed while it waited for its subshell', async () => {
    const comm = new FakeComm() as FakeComm & { subshellStarted: Promise<void>; commsOverSubshells: string };
    let started!: () => void;
    comm.subshellStarted = new Promise<void>(resolve => (started = resolve));
    const kernel = { createComm: () => comm, info: Promise.resolve({}), supportsSubshells: true };
    const c = new MeshClient(kernel as never);
    c.dispose();
    started();
    await c.opened;
    expect(comm.opened).toEqual([]);
  });
});
