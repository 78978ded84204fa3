/**
 * The tiles in the view's body, placed by a layout (layout.ts): built anew when the layout
 * changes, otherwise updated tile by tile. Keeps the running ranks, whose elapsed times tick.
 */

import { el } from './dom';
import { ILayout } from './layout';
import { IRankRecord } from './protocol';
import { MeshStore } from './store';
import { ITile, fillTile, makeTile, tickTile } from './tile';

export class TileGrid {
  /** The `.viceroy-body` element the tiles are drawn in. */
  readonly node: HTMLElement;

  /** `now`: seconds since the epoch. */
  constructor(doc: Document, store: MeshStore, now: () => number) {
    this._doc = doc;
    this._store = store;
    this._now = now;
    this.node = el(doc, 'div', 'viceroy-body');
  }

  /** The key of the layout the tiles were last built for ('' before the first build). */
  get layoutKey(): string {
    return this._layoutKey;
  }

  /** Replace every tile with new ones placed by `layout`, the `selected` one marked so. */
  build(layout: ILayout, selected: number | null): void {
    const doc = this._doc;
    this._layoutKey = layout.key;
    this._tiles.clear();
    this._running.clear();
    const fragment = doc.createDocumentFragment();
    const caption = el(doc, 'div', 'viceroy-axes');
    if (layout.rowDim && layout.colDim) {
      caption.textContent = `rows: ${layout.rowDim} · columns: ${layout.colDim}`;
    } else if (layout.colDim) {
      caption.textContent = `${layout.colDim} →`;
    }
    fragment.append(caption);
    const facets = el(doc, 'div', 'viceroy-facets');
    for (const facet of layout.facets) {
      const box = el(doc, 'div', 'viceroy-facet');
      if (facet.title) {
        box.append(el(doc, 'div', 'viceroy-facet-title', facet.title));
      }
      const grid = el(doc, 'div', 'viceroy-grid');
      if (layout.rowDim && layout.colDim) {
        grid.classList.add('viceroy-grid-2d');
        grid.style.gridTemplateColumns = `repeat(${layout.cols}, minmax(var(--viceroy-tile-min, 7.5em), 1fr))`;
      }
      for (const r of facet.ranks) {
        const record = this._store.rank(r)!;
        const tile = makeTile(doc, record);
        if (layout.rowDim && layout.colDim) {
          tile.el.style.gridRow = String(record.coords[layout.rowDim] + 1);
          tile.el.style.gridColumn = String(record.coords[layout.colDim] + 1);
        }
        this._tiles.set(r, tile);
        this._fill(tile, record);
        grid.append(tile.el);
      }
      box.append(grid);
      facets.append(box);
    }
    fragment.append(facets);
    this.node.replaceChildren(fragment);
    if (selected !== null) {
      this._tiles.get(selected)?.el.classList.add('viceroy-selected');
    }
  }

  /** Bring these ranks' tiles up to date; returns how many of them had their DOM changed. */
  renderRanks(ranks: Iterable<number>): number {
    let touched = 0;
    for (const r of ranks) {
      const tile = this._tiles.get(r);
      const record = this._store.rank(r);
      if (tile && record && this._fill(tile, record)) {
        touched += 1;
      }
    }
    return touched;
  }

  /** Advance the elapsed times of the running ranks. */
  tick(): void {
    for (const r of this._running) {
      const tile = this._tiles.get(r);
      const record = this._store.rank(r);
      if (tile && record) {
        tickTile(tile, record, this._now);
      }
    }
  }

  /** Mark `rank`'s tile as the selected one (none for null). */
  highlight(rank: number | null): void {
    for (const tile of this._tiles.values()) {
      tile.el.classList.remove('viceroy-selected');
    }
    if (rank !== null) {
      this._tiles.get(rank)?.el.classList.add('viceroy-selected');
    }
  }

  focus(rank: number): void {
    this._tiles.get(rank)?.el.focus();
  }

  /** The rank of the tile an event happened in, or null outside the tiles. */
  rankAt(target: EventTarget | null): number | null {
    const node = target as Element | null;
    const tile = node?.closest?.('.viceroy-tile') as HTMLElement | null | undefined;
    if (!tile || !this.node.contains(tile)) {
      return null;
    }
    const rank = Number(tile.dataset.rank);
    return Number.isInteger(rank) ? rank : null;
  }

  /** Fill a tile, and note whether its rank is running. */
  private _fill(tile: ITile, record: Readonly<IRankRecord>): boolean {
    const changed = fillTile(tile, record, this._now);
    if (record.state === 'running' && record.started !== null) {
      this._running.add(record.rank);
    } else {
      this._running.delete(record.rank);
    }
    return changed;
  }

  private _doc: Document;
  private _store: MeshStore;
  private _now: () => number;
  private _tiles = new Map<number, ITile>();
  private _running = new Set<number>();
  private _layoutKey = '';
}
