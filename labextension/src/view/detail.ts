/** The detail pane under the tiles: one rank's log or traceback, or every rank's stack. */

import { button, el } from './dom';
import { isObject } from './protocol';

export type DetailKind = 'logs' | 'traceback' | 'stacks';

/** What the pane's buttons do (the view knows which rank is selected). */
export interface IDetailActions {
  showLogs(): void;
  showTraceback(): void;
  close(): void;
}

export class DetailPane {
  readonly node: HTMLElement;

  constructor(doc: Document, actions: IDetailActions) {
    this.node = el(doc, 'div', 'viceroy-detail');
    this.node.hidden = true;
    const head = el(doc, 'div', 'viceroy-detail-head');
    this._title = el(doc, 'span', 'viceroy-detail-title');
    this._logs = button(doc, 'viceroy-detail-logs', 'Log', 'Show the log tail', () =>
      actions.showLogs()
    );
    this._traceback = button(
      doc,
      'viceroy-detail-traceback',
      'Traceback',
      'Show the traceback',
      () => actions.showTraceback()
    );
    const close = button(doc, 'viceroy-detail-close', '×', 'Close', () => actions.close());
    close.setAttribute('aria-label', 'Close');
    head.append(this._title, this._logs, this._traceback, close);
    this._text = el(doc, 'pre', 'viceroy-detail-text');
    this.node.append(head, this._text);
  }

  /** What the open pane shows or waits for; null while closed. */
  get kind(): DetailKind | null {
    return this._kind;
  }

  /**
   * Show the pane loading `kind` under `title`: a rank's (with its Log and Traceback buttons)
   * or, for a null rank, the whole mesh's.
   */
  open(kind: DetailKind, title: string, rank: number | null): void {
    this._kind = kind;
    this.node.hidden = false;
    this.node.dataset.kind = kind;
    this.node.dataset.loading = 'true';
    this._title.textContent = title;
    this._text.textContent = 'loading…';
    if (rank !== null) {
      this.node.dataset.rank = String(rank);
    } else {
      delete this.node.dataset.rank;
    }
    this._logs.hidden = rank === null;
    this._traceback.hidden = rank === null;
  }

  close(): void {
    this.node.hidden = true;
    this._kind = null;
  }

  /** A log or traceback reply for the selected rank: shown if the pane is open on that kind. */
  showText(kind: 'logs' | 'traceback', text: unknown): void {
    if (this.node.hidden || this._kind !== kind) {
      return;
    }
    const body = typeof text === 'string' ? text : '';
    this._text.textContent =
      body || (kind === 'logs' ? '(no output yet)' : '(no traceback: the rank did not fail)');
    this.node.dataset.loading = 'false';
  }

  showStacks(stacks: unknown): void {
    if (this.node.hidden || this._kind !== 'stacks' || !isObject(stacks)) {
      return;
    }
    const parts = Object.entries(stacks)
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([rank, text]) => `── rank ${rank} ──\n${typeof text === 'string' ? text : ''}`);
    this._text.textContent = parts.join('\n') || '(no stacks)';
    this.node.dataset.loading = 'false';
  }

  /** An error reply: shown in the pane if it answers what the pane waits for; else false. */
  showError(request: string, text: string): boolean {
    if (this.node.hidden || request !== this._kind) {
      return false;
    }
    this._text.textContent = text;
    this.node.dataset.loading = 'false';
    return true;
  }

  private _title: HTMLElement;
  private _text: HTMLElement;
  private _logs: HTMLButtonElement;
  private _traceback: HTMLButtonElement;
  private _kind: DetailKind | null = null;
}
