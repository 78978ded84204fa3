/**
 * The anywidget front end of `viceroy.extension.widget.MeshView`, bundled by esbuild into
 * viceroy/extension/static/mesh_view.js.
 *
 * The synced trait `state` holds the full snapshot; diffs and replies arrive as custom
 * messages; requests go out with `model.send`.
 */

import { MeshView } from './view/render';
import { IRequest } from './view/protocol';

/** The part of anywidget's model that the view uses. */
export interface IMeshModel {
  get(name: 'state'): unknown;
  on(event: string, callback: (...args: unknown[]) => void): void;
  off(event?: string | null, callback?: ((...args: unknown[]) => void) | null): void;
  send(content: IRequest, callbacks?: unknown, buffers?: unknown[]): void;
}

export interface IRenderProps {
  model: IMeshModel;
  el: HTMLElement;
}

/** What a view whose kernel went away says where the mesh was. */
const DISCONNECTED = 'Disconnected from the kernel (restarted or shut down): no mesh. Run %mesh status for a live view.';

function render({ model, el }: IRenderProps): () => void {
  let connected = true;
  // model.send throws once the comm is closed (the kernel restarted): the view goes
  // disconnected instead of leaving an uncaught error behind a click.
  const send = (request: IRequest): void => {
    if (!connected) {
      return;
    }
    try {
      model.send(request);
    } catch {
      onDisconnect();
    }
  };
  const view = new MeshView({ send }, el.ownerDocument);
  el.classList.add('viceroy-widget');
  el.append(view.node);
  const onDisconnect = (): void => {
    if (connected) {
      connected = false;
      view.setDisconnected(DISCONNECTED);
    }
  };
  const onState = (): void => {
    if (connected) {
      view.handle(model.get('state'));
    }
  };
  const onMessage = (message: unknown): void => {
    if (!connected) {
      // a message from the kernel: the comm lives after all (a reconnect, not a restart)
      connected = true;
      view.setDisconnected(null, send);
    }
    view.handle(message);
  };
  model.on('change:state', onState);
  model.on('msg:custom', onMessage);
  // ipywidgets sets comm_live false (this event) when the kernel restarts, and closes the
  // model when the kernel closes its comm: the mesh shown is gone either way.
  model.on('comm_live_update', onDisconnect);
  model.on('comm:close', onDisconnect);
  onState();
  // The trait holds the last full snapshot, which may be long past: the diffs since went
  // as messages to the views open then. A view rendered now (a page reload, a second view of
  // the output) asks for the state of now.
  send({ request: 'snapshot' });
  return () => {
    model.off('change:state', onState);
    model.off('msg:custom', onMessage);
    model.off('comm_live_update', onDisconnect);
    model.off('comm:close', onDisconnect);
    view.dispose();
  };
}

export default { render };
