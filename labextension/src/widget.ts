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

export function render({ model, el }: IRenderProps): () => void {
  const view = new MeshView({ send: request => model.send(request) }, el.ownerDocument);
  el.classList.add('viceroy-widget');
  el.append(view.node);
  const onState = (): void => view.handle(model.get('state'));
  const onMessage = (message: unknown): void => view.handle(message);
  model.on('change:state', onState);
  model.on('msg:custom', onMessage);
  onState();
  // The trait holds the last full snapshot, which may be long past: the diffs since went
  // as messages to the views open then. A view rendered now (a page reload, a second view of
  // the output) asks for the state of now.
  model.send({ request: 'snapshot' });
  return () => {
    model.off('change:state', onState);
    model.off('msg:custom', onMessage);
    view.dispose();
  };
}

export default { render };
