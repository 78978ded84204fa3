/** The side panel's connection to a kernel: the `viceroy.mesh` comm. */

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';
import { IRequest } from './view/protocol';

export const COMM_TARGET = 'viceroy.mesh';
/** How often the panel tells the kernel it is still there (viceroy/extension/comm.py). */
export const ALIVE_MS = 30_000;
/** How long the comm waits for its subshell before it opens on the main shell anyway. */
export const SUBSHELL_WAIT_MS = 10_000;

function delay(ms: number): Promise<void> {
  return new Promise(resolve => window.setTimeout(resolve, ms));
}

export class MeshClient {
  constructor(kernel: Kernel.IKernelConnection) {
    this.kernel = kernel;
    this._comm = kernel.createComm(COMM_TARGET);
    this._comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      if (!this._connected) {
        this._connected = true;
        this._connectedChanged.emit(true);
      }
      this._message.emit(msg.content.data);
    };
    // A kernel without the target closes the comm at once: not a Viceroy kernel (yet).
    this._comm.onClose = () => {
      this._closedByKernel = !this._closing;
      this._finish();
    };
    // A page that goes away (a reload, a closed tab) says so: the kernel cannot tell a comm
    // whose page is gone from a live one, and would send it every change for good. One that
    // dies cannot: it stops saying it is alive, and the kernel closes its comm after a while.
    window.addEventListener('pagehide', this._onPageHide);
    document.addEventListener('visibilitychange', this._onVisible);
    this._alive = window.setInterval(() => this.send({ request: 'alive' }), ALIVE_MS);
    this.opened = this._open();
  }

  /**
   * Resolves once the comm is opened (or the client was disposed first).
   *
   * @jupyterlab/services (7.6) gives a comm its own subshell, created asynchronously after
   * `createComm`; a comm opened before it exists goes on the main shell, where it waits
   * behind a running cell, and the panel says "no mesh" until the cell ends. So the comm
   * opens once its subshell started, at once where the kernel has no subshells.
   */
  readonly opened: Promise<void>;

  private async _open(): Promise<void> {
    const comm = this._comm as Kernel.IComm & {
      subshellStarted?: Promise<void>;
      commsOverSubshells?: string;
    };
    if (comm.subshellStarted !== undefined && comm.commsOverSubshells !== 'disabled') {
      try {
        await this.kernel.info;
        if (this.kernel.supportsSubshells) {
          await Promise.race([comm.subshellStarted, delay(SUBSHELL_WAIT_MS)]);
        }
      } catch {
        // no kernel info, or no subshell: open on the main shell
      }
    }
    if (this._disposed || this._comm.isDisposed) {
      return;
    }
    this._comm.open({ request: 'snapshot' });
    this._isOpen = true;
    this.send({ request: 'alive' });
  }

  readonly kernel: Kernel.IKernelConnection;

  /** Each message of the kernel (snapshots, diffs, replies). */
  get message(): ISignal<this, unknown> {
    return this._message;
  }

  /** True once the kernel answered (it has the target); false when the comm closed. */
  get connectedChanged(): ISignal<this, boolean> {
    return this._connectedChanged;
  }

  get connected(): boolean {
    return this._connected;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** True when the kernel closed the comm (not this page, as it went or was disposed). */
  get closedByKernel(): boolean {
    return this._closedByKernel;
  }

  send(request: IRequest): void {
    if (this._isOpen && !this._disposed && !this._comm.isDisposed) {
      this._comm.send(request as unknown as KernelMessage.ICommMsgMsg['content']['data']);
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._closing = true; // closing the comm calls onClose here too
    if (!this._isOpen && !this._comm.isDisposed) {
      // never opened (still waiting for its subshell): nothing to close in the kernel
      try {
        this._comm.dispose();
      } catch {
        // the kernel is gone already
      }
    } else if (!this._comm.isDisposed) {
      try {
        this._comm.close();
      } catch {
        // the kernel is gone already
      }
    }
    this._finish();
  }

  private _finish(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    window.removeEventListener('pagehide', this._onPageHide);
    document.removeEventListener('visibilitychange', this._onVisible);
    window.clearInterval(this._alive);
    this._connected = false;
    this._connectedChanged.emit(false);
    Signal.clearData(this);
  }

  private _onPageHide = (): void => this.dispose();
  // A hidden tab's timers may run once a minute: say it at once when the tab is back.
  private _onVisible = (): void => {
    if (document.visibilityState === 'visible') {
      this.send({ request: 'alive' });
    }
  };
  private _alive: number;
  private _isOpen = false;
  private _closing = false;
  private _closedByKernel = false;
  private _comm: Kernel.IComm;
  private _connected = false;
  private _disposed = false;
  private _message = new Signal<this, unknown>(this);
  private _connectedChanged = new Signal<this, boolean>(this);
}
