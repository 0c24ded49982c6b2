// Renders React trees in Node with react-dom/client, without a DOM library:
// the test components render nothing (null) and report what their hooks
// returned, so a container that is only a node with event listeners and an
// owner document is all react-dom needs. Effects and StrictMode's double
// mount run as in a browser, on React's own scheduler (no act(): updates
// come from the socket, so tests wait for what they expect with until()).
// Import this module before anything else that loads react-dom: it sets the
// globals react-dom reads when it loads.
import type { ReactElement } from 'react';

const noop = () => {};
const document = { nodeType: 9, activeElement: null, addEventListener: noop, removeEventListener: noop };
const window = { document, event: undefined, HTMLIFrameElement: class {} };
Object.assign(document, { defaultView: window });
Object.assign(globalThis, { window });

const { createRoot } = await import('react-dom/client');

/** A mounted tree: `render` replaces it, `unmount` removes it (synchronously, with its effects' cleanups). */
export interface Mounted {
  render(el: ReactElement): void;
  unmount(): void;
}

/** Renders `el` in a fresh root; it commits and runs its effects soon after (React's scheduler). */
export function mount(el: ReactElement): Mounted {
  const container = { nodeType: 1, nodeName: 'DIV', tagName: 'DIV', textContent: '', ownerDocument: document, addEventListener: noop, removeEventListener: noop };
  const root = createRoot(container as unknown as Element);
  root.render(el);
  return { render: (next) => root.render(next), unmount: () => root.unmount() };
}
