// Bundle the mesh view into the anywidget ESM and its stylesheet:
//   viceroy/extension/static/mesh_view.js, mesh_view.css
// With --check, build into memory and fail if the committed files differ.
import { build } from 'esbuild';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const outDir = join(root, '..', 'viceroy', 'extension', 'static');
const check = process.argv.includes('--check');

const banner =
  '// Generated from labextension/src/widget.ts by labextension/scripts/build-widget.mjs;\n' +
  '// do not edit. Rebuild with `make frontend` (or `jlpm build:widget` in labextension/).';

const result = await build({
  entryPoints: [join(root, 'src', 'widget.ts')],
  bundle: true,
  format: 'esm',
  target: 'es2020',
  platform: 'browser',
  legalComments: 'none',
  banner: { js: banner },
  write: false,
  logLevel: 'warning'
});
const outputs = {
  'mesh_view.js': result.outputFiles[0].text,
  'mesh_view.css':
    '/* Generated from labextension/style/view.css; do not edit. */\n' +
    readFileSync(join(root, 'style', 'view.css'), 'utf8')
};

let stale = [];
for (const [name, text] of Object.entries(outputs)) {
  const path = join(outDir, name);
  let current = null;
  try {
    current = readFileSync(path, 'utf8');
  } catch {
    current = null;
  }
  if (current === text) {
    continue;
  }
  if (check) {
    stale.push(path);
  } else {
    mkdirSync(outDir, { recursive: true });
    writeFileSync(path, text);
    console.log(`wrote ${path}`);
  }
}
if (stale.length) {
  console.error(`out of date (run \`make frontend\`): ${stale.join(', ')}`);
  process.exit(1);
}
