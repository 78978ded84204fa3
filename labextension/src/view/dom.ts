/** DOM helpers shared by the parts of the mesh view. */

export function el<K extends keyof HTMLElementTagNameMap>(
  doc: Document,
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = doc.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A `.viceroy-button`; its clicks stop here rather than reach the tiles' handler. */
export function button(
  doc: Document,
  className: string,
  text: string,
  title: string,
  onClick: () => void
): HTMLButtonElement {
  const node = el(doc, 'button', `viceroy-button ${className}`, text);
  node.type = 'button';
  node.title = title;
  node.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return node;
}

/** Set a node's text only if it differs, so that an unchanged node is not touched. */
export function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}
