/** The view's header: the mesh's summary, the calls in flight, and the mesh-wide actions. */

import { button, el, setText } from './dom';
import { formatRankSet, summaryText } from './format';
import { ICallRecord, ISummary } from './protocol';

/** What the header's buttons do. */
export interface IHeaderActions {
  interrupt(): void;
  restartFailed(): void;
  showStacks(): void;
}

/** Ranks whose process is gone: those `Restart failed` brings back. */
export function deadCount(summary: Readonly<ISummary>): number {
  return Math.max(0, summary.total - summary.alive);
}

export class Header {
  readonly node: HTMLElement;

  constructor(doc: Document, actions: IHeaderActions) {
    this.node = el(doc, 'div', 'viceroy-header');
    this._summary = el(doc, 'span', 'viceroy-summary', 'no mesh');
    this._calls = el(doc, 'span', 'viceroy-calls');
    const buttons = el(doc, 'span', 'viceroy-actions');
    this._interrupt = button(doc, 'viceroy-interrupt', 'Interrupt', 'Interrupt the mesh', () =>
      actions.interrupt()
    );
    this._restart = button(
      doc,
      'viceroy-restart',
      'Restart failed',
      'Restart the dead ranks; the others keep their state',
      () => actions.restartFailed()
    );
    this._stacks = button(doc, 'viceroy-stacks', 'Stacks', "Every rank's Python stack", () =>
      actions.showStacks()
    );
    buttons.append(this._interrupt, this._restart, this._stacks);
    this.node.append(this._summary, this._calls, buttons);
  }

  /** Show the summary and calls; the buttons work only with ranks and a channel (`canSend`). */
  update(summary: Readonly<ISummary>, calls: readonly ICallRecord[], canSend: boolean): void {
    setText(this._summary, summaryText(summary));
    this._summary.dataset.failed = String(summary.failed);
    this._summary.dataset.running = String(summary.running);
    setText(
      this._calls,
      calls
        .map(c => `${c.label || `call ${c.call}`} [ranks ${formatRankSet(c.ranks)}]`)
        .join(' · ')
    );
    const connected = canSend && summary.total > 0;
    this._interrupt.disabled = !connected;
    // Only dead ranks are restarted (`mesh.restart(failed_only=True)`): a rank whose call
    // raised is alive and keeps its state.
    this._restart.disabled = !connected || deadCount(summary) === 0;
    this._stacks.disabled = !connected;
  }

  private _summary: HTMLElement;
  private _calls: HTMLElement;
  private _interrupt: HTMLButtonElement;
  private _restart: HTMLButtonElement;
  private _stacks: HTMLButtonElement;
}
