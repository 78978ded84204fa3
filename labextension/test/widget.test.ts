import { afterEach, describe, expect, it } from 'vitest';
import widget from '../src/widget';
import { FakeModel, snapshot } from './fixtures';

afterEach(() => document.body.replaceChildren());

async function frame(): Promise<void> {
  await new Promise(resolve => requestAnimationFrame(() => resolve(undefined)));
}

describe('anywidget render()', () => {
  it('renders the state trait and follows diffs and replies', async () => {
    const model = new FakeModel(snapshot({ gpus: 4 }, 1));
    const el = document.createElement('div');
    document.body.append(el);
    const cleanup = widget.render({ model, el });
    await frame();
    expect(el.querySelectorAll('.viceroy-tile')).toHaveLength(4);
    expect(model.sent).toEqual([{ request: 'snapshot' }]);
    model.sent = [];

    model.custom({ type: 'diff', seq: 2, ranks: { '2': { state: 'error', error: 'ZeroDivisionError' } } });
    await frame();
    expect(el.querySelector<HTMLElement>('.viceroy-tile[data-rank="2"]')!.dataset.state).toBe('error');

    el.querySelector<HTMLElement>('.viceroy-tile[data-rank="2"]')!.click();
    expect(model.sent).toEqual([{ request: 'traceback', rank: 2 }]);
    model.custom({ type: 'traceback', rank: 2, text: 'ZeroDivisionError: division by zero' });
    expect(el.querySelector('.viceroy-detail-text')!.textContent).toContain('ZeroDivisionError');

    // a gap asks for a snapshot; the kernel answers by setting the trait
    model.custom({ type: 'diff', seq: 9, ranks: {} });
    expect(model.sent.at(-1)).toEqual({ request: 'snapshot' });
    model.setState(snapshot({ hosts: 2, gpus: 4 }, 10));
    await frame();
    expect(el.querySelectorAll('.viceroy-tile')).toHaveLength(8);

    cleanup();
    expect(model.listenerCount()).toBe(0);
    expect(el.querySelector('.viceroy-mesh')).toBeNull();
  });

  it('shows the state of now, not the trait left from an old snapshot, when rendered later', async () => {
    // %mesh up set the trait; rank 1 died since (a diff to the views open then); the page
    // is reloaded and the output renders again from the trait
    const model = new FakeModel(snapshot({ gpus: 2 }, 1));
    const el = document.createElement('div');
    document.body.append(el);
    const cleanup = widget.render({ model, el });
    expect(model.sent).toEqual([{ request: 'snapshot' }]);
    model.setState(snapshot({ gpus: 2 }, 7, { 1: 'dead' }));
    await frame();
    expect(el.querySelector<HTMLElement>('.viceroy-tile[data-rank="1"]')!.dataset.state).toBe('dead');
    cleanup();
  });

  it('asks for a snapshot when the trait is still empty', () => {
    const model = new FakeModel({});
    const el = document.createElement('div');
    const cleanup = widget.render({ model, el });
    expect(model.sent).toEqual([{ request: 'snapshot' }]);
    expect(el.querySelector('.viceroy-summary')!.textContent).toBe('no mesh');
    cleanup();
  });

  it('exports only the default module, as anywidget wants (a named render is deprecated)', async () => {
    const mod: Record<string, unknown> = await import('../src/widget');
    expect(Object.keys(mod)).toEqual(['default']);
  });

  for (const event of ['comm_live_update', 'comm:close']) {
    it(`shows no mesh and disables its buttons once the kernel goes (${event})`, async () => {
      const model = new FakeModel(snapshot({ gpus: 4 }, 1, { 1: 'dead' }));
      const el = document.createElement('div');
      document.body.append(el);
      const cleanup = widget.render({ model, el });
      await frame();
      const button = (c: string) => el.querySelector<HTMLButtonElement>(c)!;
      expect(button('.viceroy-interrupt').disabled).toBe(false);
      model.sent = [];

      model.commClosed = true;
      model.trigger(event); // the kernel restarted
      await frame();
      expect(el.querySelectorAll('.viceroy-tile')).toHaveLength(0);
      expect(el.querySelector('.viceroy-summary')!.textContent).toBe('no mesh');
      expect(el.querySelector('.viceroy-empty')!.textContent).toContain('Disconnected from the kernel');
      for (const c of ['.viceroy-interrupt', '.viceroy-restart', '.viceroy-stacks']) {
        expect(button(c).disabled).toBe(true);
        button(c).click(); // nothing is sent, nothing throws
      }
      expect(model.sent).toEqual([]);
      cleanup();
      expect(model.listenerCount()).toBe(0);
    });
  }

  it('goes disconnected, not an uncaught error, when a click finds the comm closed', async () => {
    const model = new FakeModel(snapshot({ gpus: 2 }, 1));
    const el = document.createElement('div');
    document.body.append(el);
    const cleanup = widget.render({ model, el });
    await frame();
    model.commClosed = true; // restarted with no event seen (yet)
    expect(() => el.querySelector<HTMLElement>('.viceroy-tile[data-rank="1"]')!.click()).not.toThrow();
    expect(() => el.querySelector<HTMLButtonElement>('.viceroy-interrupt')!.click()).not.toThrow();
    await frame();
    expect(el.querySelector('.viceroy-summary')!.textContent).toBe('no mesh');
    expect(el.querySelector<HTMLButtonElement>('.viceroy-interrupt')!.disabled).toBe(true);

    // a message from the kernel after all: the view follows it again
    model.commClosed = false;
    model.custom(snapshot({ gpus: 2 }, 5));
    await frame();
    expect(el.querySelectorAll('.viceroy-tile')).toHaveLength(2);
    expect(el.querySelector<HTMLButtonElement>('.viceroy-interrupt')!.disabled).toBe(false);
    cleanup();
  });
});
