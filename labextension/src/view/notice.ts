/** The notice under the header: what a request did, or why it failed; it hides after a while. */

import { el } from './dom';

const NOTICE_MS = 6000;

export class Notice {
  readonly node: HTMLElement;

  constructor(doc: Document) {
    this.node = el(doc, 'div', 'viceroy-notice');
    this.node.setAttribute('role', 'status'); // read out when it changes
    this.node.hidden = true;
  }

  show(text: string, isError = false): void {
    this.node.textContent = text;
    this.node.hidden = false;
    this.node.classList.toggle('viceroy-notice-error', isError);
    if (this._timer !== null) {
      clearTimeout(this._timer);
    }
    this._timer = setTimeout(() => {
      this.node.hidden = true;
      this._timer = null;
    }, NOTICE_MS);
  }

  /** Stop the pending hide. */
  dispose(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
    }
  }

  private _timer: ReturnType<typeof setTimeout> | null = null;
}
