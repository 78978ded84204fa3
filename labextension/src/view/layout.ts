/**
 * Where each rank goes: the mesh's dims laid out as facets (small multiples) of grids, computed
 * from the dims and coords alone (grid.ts builds the DOM from it).
 */

/** A 2-d grid with more columns than this is drawn as one wrapped grid per row instead. */
export const MAX_GRID_COLS = 16;

/** How ranks are placed: facets (small multiples) of grids. */
export interface ILayout {
  key: string;
  /** Names of the row and column dims of each grid (empty: a wrapped flat grid). */
  rowDim: string | null;
  colDim: string | null;
  rows: number;
  cols: number;
  facets: { title: string; ranks: number[] }[];
}

export function computeLayout(
  dims: Readonly<Record<string, number>> | null,
  ranks: readonly number[],
  coordsOf: (rank: number) => Readonly<Record<string, number>> | undefined
): ILayout {
  const names = dims ? Object.keys(dims) : [];
  const hasCoords = ranks.every(r => {
    const c = coordsOf(r);
    return c !== undefined && names.every(n => typeof c[n] === 'number');
  });
  if (!dims || names.length < 2 || !hasCoords) {
    return {
      key: `flat|${JSON.stringify(dims)}|${ranks.join(',')}`,
      rowDim: null,
      colDim: names.length === 1 ? names[0] : null,
      rows: 0,
      cols: 0,
      facets: [{ title: '', ranks: [...ranks] }]
    };
  }
  let rowDim: string | null = names[names.length - 2];
  const colDim = names[names.length - 1];
  // Too many columns to fit beside each other: each row wraps on its own, under its title.
  const wide = dims[colDim] > MAX_GRID_COLS;
  const leading = wide ? names.slice(0, -1) : names.slice(0, -2);
  const facets = new Map<string, number[]>();
  for (const r of ranks) {
    const c = coordsOf(r)!;
    const title = leading.map(n => `${n}=${c[n]}`).join(' · ');
    let list = facets.get(title);
    if (!list) {
      list = [];
      facets.set(title, list);
    }
    list.push(r);
  }
  if (wide) {
    rowDim = null;
  }
  return {
    key: `grid|${JSON.stringify(dims)}|${ranks.join(',')}`,
    rowDim,
    colDim,
    rows: rowDim ? dims[rowDim] : 0,
    cols: rowDim ? dims[colDim] : 0,
    facets: [...facets].map(([title, list]) => ({ title, ranks: list }))
  };
}
