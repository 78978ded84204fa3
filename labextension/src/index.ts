/**
 * The Viceroy JupyterLab / Notebook 7 extension: a Mesh side panel for the current notebook's
 * kernel, a status bar item, and palette commands. It talks to the kernel's `viceroy.mesh`
 * comm and needs no server extension. Only INotebookTracker is required, so it activates in
 * Notebook 7 too (which has no ILabShell, ILayoutRestorer or status bar).
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, InputDialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage, KernelSpec } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { MeshClient } from './client';
import { summaryText } from './view/format';
import { MeshView, deadCount } from './view/render';

const PLUGIN_ID = 'viceroy-labextension:plugin';
const PANEL_ID = 'viceroy-mesh-panel';

/** Code that loads Viceroy into a plain kernel: worth trying the comm again afterwards. */
const MESH_HINT = /%%?(mesh|px|autopx)\b|viceroy/;

export namespace CommandIDs {
  export const openPanel = 'viceroy:open-mesh-panel';
  export const interrupt = 'viceroy:interrupt-mesh';
  export const restartFailed = 'viceroy:restart-failed';
  export const showLog = 'viceroy:show-rank-log';
  export const showStacks = 'viceroy:show-stacks';
}

export const meshIcon = new LabIcon({
  name: 'viceroy:mesh',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="1" y="1" width="6" height="6" rx="1"/><rect x="9" y="1" width="6" height="6" rx="1"/>' +
    '<rect x="1" y="9" width="6" height="6" rx="1"/><rect x="9" y="9" width="6" height="6" rx="1"/>' +
    '</g></svg>'
});

/** The side panel: the shared mesh view in a Lumino widget. */
export class MeshPanel extends Widget {
  constructor() {
    super();
    this.id = PANEL_ID;
    this.addClass('viceroy-panel');
    this.title.icon = meshIcon;
    this.title.caption = 'Viceroy mesh';
    this.view = new MeshView({
      emptyText: 'No Viceroy mesh in the current notebook. Run %mesh up gpus=4 there.'
    });
    this.node.append(this.view.node);
  }

  readonly view: MeshView;

  dispose(): void {
    this.view.dispose();
    super.dispose();
  }
}

/** The status bar item: "mesh 4/4 · running", "mesh 4/4 · 1 failed". */
class MeshStatus extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('viceroy-statusbar');
    this.node.title = 'Viceroy mesh: click to show the panel';
    // A button for the keyboard and screen readers too.
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        onClick();
      }
    });
  }

  setSummary(text: string, failed: number, running: number): void {
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.dataset.failed = String(failed);
    this.node.dataset.running = String(running);
  }
}

function kernelOf(panel: NotebookPanel | null): Kernel.IKernelConnection | null {
  return panel?.sessionContext.session?.kernel ?? null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Mesh side panel, status bar item and commands for the Viceroy kernel',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new MeshPanel();
    const view = panel.view;
    app.shell.add(panel, 'left', { rank: 700, type: 'Viceroy mesh' });
    restorer?.add(panel, PANEL_ID);

    let client: MeshClient | null = null;
    let watched: Kernel.IKernelConnection | null = null;
    let retry = false; // code that may load Viceroy ran in a kernel without the comm target
    const activeChanged = new Signal<unknown, void>(panel);

    const openPanel = (): void => {
      app.shell.activateById(PANEL_ID);
    };

    const status = new MeshStatus(openPanel);
    const hasMesh = (): boolean => client !== null && client.connected && view.store.hasState;
    let active = false;
    const refreshStatus = (): void => {
      const summary = view.store.summary;
      status.setSummary(summaryText(summary), summary.failed, summary.running);
      if (hasMesh() !== active) {
        active = !active;
        activeChanged.emit();
      }
      app.commands.notifyCommandChanged();
    };
    view.store.subscribe(() => refreshStatus());
    statusBar?.registerStatusItem('viceroy-labextension:status', {
      item: status,
      align: 'left',
      rank: 4,
      isActive: hasMesh,
      activeStateChanged: activeChanged
    });

    const drop = (): void => {
      if (client) {
        const old = client;
        client = null;
        old.dispose();
      }
      view.setSend(null);
      view.clear();
      refreshStatus();
    };

    const onAnyMessage = (
      _: Kernel.IKernelConnection,
      args: Kernel.IAnyMessageArgs
    ): void => {
      const msg = args.msg;
      if (args.direction !== 'recv' || client !== null) {
        return;
      }
      if (KernelMessage.isExecuteInputMsg(msg) && MESH_HINT.test(msg.content.code)) {
        retry = true;
      }
    };

    const onStatus = (kernel: Kernel.IKernelConnection, st: Kernel.Status): void => {
      if (st === 'restarting' || st === 'autorestarting' || st === 'dead') {
        drop();
        retry = true;
      } else if (st === 'idle' && client === null && retry) {
        retry = false;
        void connect(kernel);
      }
    };

    const watch = (kernel: Kernel.IKernelConnection | null): void => {
      if (watched === kernel) {
        return;
      }
      if (watched) {
        watched.statusChanged.disconnect(onStatus);
        watched.anyMessage.disconnect(onAnyMessage);
      }
      watched = kernel;
      if (kernel) {
        kernel.statusChanged.connect(onStatus);
        kernel.anyMessage.connect(onAnyMessage);
      }
    };

    const connect = async (kernel: Kernel.IKernelConnection): Promise<void> => {
      let spec: KernelSpec.ISpecModel | undefined;
      try {
        spec = await kernel.spec;
      } catch {
        return;
      }
      if (kernel !== watched || client !== null || kernel.isDisposed) {
        return;
      }
      const isViceroy = spec?.name === 'viceroy' || /viceroy/i.test(spec?.display_name ?? '');
      if (!isViceroy && spec?.language !== 'python') {
        return;
      }
      const c = new MeshClient(kernel);
      client = c;
      let served = false;
      c.message.connect((_, msg) => view.handle(msg));
      c.connectedChanged.connect((_, connected) => {
        if (client !== c) {
          return;
        }
        if (connected) {
          served = true;
          view.setSend(request => c.send(request));
        } else {
          // Closed: no target in this kernel (yet), or the kernel went away, or it took this
          // page for gone (no word from it for minutes: a laptop asleep). Then connect again.
          client = null;
          view.setSend(null);
          view.clear();
          if (served && c.closedByKernel && kernel === watched && !kernel.isDisposed) {
            retry = true;
            if (kernel.status === 'idle') {
              retry = false;
              void connect(kernel);
            }
          }
        }
        refreshStatus();
      });
    };

    const attach = (): void => {
      const kernel = kernelOf(tracker.currentWidget);
      if (kernel === watched && (client !== null || kernel === null)) {
        return;
      }
      drop();
      watch(kernel);
      retry = false;
      if (kernel) {
        void connect(kernel);
      }
    };

    tracker.widgetAdded.connect((_, nb) => {
      nb.sessionContext.kernelChanged.connect(() => {
        if (nb === tracker.currentWidget) {
          attach();
        }
      });
    });
    tracker.currentChanged.connect(() => attach());
    attach();

    // The commands act on the current notebook's mesh: none without one.
    const requireClient = (): boolean =>
      client !== null && client.connected && view.store.summary.total > 0;
    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show the Viceroy Mesh Panel',
      caption: 'The ranks of the current notebook’s mesh',
      icon: meshIcon,
      execute: openPanel
    });
    app.commands.addCommand(CommandIDs.interrupt, {
      label: 'Interrupt the Mesh',
      caption: 'Interrupt every rank of the current notebook’s mesh',
      isEnabled: requireClient,
      execute: () => view.interrupt()
    });
    app.commands.addCommand(CommandIDs.restartFailed, {
      label: 'Restart Failed Ranks',
      caption: 'Restart the dead ranks; the others keep their state',
      isEnabled: () => requireClient() && deadCount(view.store.summary) > 0,
      execute: () => view.restartFailed()
    });
    app.commands.addCommand(CommandIDs.showStacks, {
      label: 'Show Every Rank’s Stack',
      isEnabled: requireClient,
      execute: () => {
        openPanel();
        view.showStacks();
      }
    });
    app.commands.addCommand(CommandIDs.showLog, {
      label: 'Show a Rank’s Log…',
      isEnabled: requireClient,
      describedBy: {
        args: {
          type: 'object',
          properties: { rank: { type: 'number', description: 'The rank' } }
        }
      },
      execute: async args => {
        let rank = typeof args.rank === 'number' ? args.rank : null;
        if (rank === null) {
          const result = await InputDialog.getNumber({ title: 'Show the log of rank', value: 0 });
          if (!result.button.accept || result.value === null) {
            return;
          }
          rank = result.value;
        }
        openPanel();
        view.select(rank, 'logs');
      }
    });
    if (palette) {
      const category = 'Viceroy';
      for (const command of [
        CommandIDs.openPanel,
        CommandIDs.interrupt,
        CommandIDs.restartFailed,
        CommandIDs.showLog,
        CommandIDs.showStacks
      ]) {
        palette.addItem({ command, category });
      }
    }
    refreshStatus();
    document.body.dataset.viceroyExtension = 'activated';
  }
};

export default plugin;
