// Bundle-size budget: the public entry, bundled and minified as a browser
// app would (esbuild), must stay within 10.5 KB gzip (10 KB until protocol
// v2's decoder, about 470 B, made it 10.2), and must not contain
// @msgpack/msgpack (it lives in the separate `./msgpack` entry). The React
// entry adds at most 3 KB gzip: its own code and the typed rooms it builds
// on, without React and the core (which an app has anyway). The persistence
// entry, tabs included, adds at most 4 KB gzip.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build, type Plugin } from 'esbuild';

const BUDGET_GZIP = 10.5 * 1024;
const MSGPACK_BUDGET_GZIP = 8 * 1024;
const REACT_BUDGET_GZIP = 3 * 1024;
const PERSIST_BUDGET_GZIP = 4 * 1024;
const dist = (f: string) => fileURLToPath(new URL(`../dist/${f}`, import.meta.url));

/** Leaves every module but `own` (files of dist/) out of the bundle. */
const only = (own: string[]): Plugin => ({
  name: 'only',
  setup(b) {
    b.onResolve({ filter: /.*/ }, (a) => (a.kind === 'entry-point' || own.includes(basename(a.path)) ? undefined : { path: a.path, external: true }));
  },
});

async function measure(entry: string, plugins: Plugin[] = []) {
  const out = await build({
    entryPoints: [dist(entry)],
    bundle: true,
    minify: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2020',
    write: false,
    metafile: true,
    logLevel: 'silent',
    plugins,
  });
  const code = out.outputFiles[0]!.contents;
  return { min: code.byteLength, gzip: gzipSync(code, { level: 9 }).byteLength, inputs: Object.keys(out.metafile.inputs) };
}

test('size: the default bundle (JSON) is within 10.5 KB gzip and excludes @msgpack/msgpack', async (t) => {
  const m = await measure('index.js');
  t.diagnostic(`@statecast/sdk (index.js): ${m.min} B min, ${m.gzip} B gzip (budget ${BUDGET_GZIP} B)`);
  assert.ok(m.gzip <= BUDGET_GZIP, `${m.gzip} B gzip is over the budget of ${BUDGET_GZIP} B`);
  assert.deepEqual(m.inputs.filter((i) => i.includes('node_modules')), [], 'the default entry bundles no dependency');
});

test('size: the msgpack codec entry (with @msgpack/msgpack) is within 8 KB gzip', async (t) => {
  const m = await measure('msgpack.js');
  t.diagnostic(`@statecast/sdk/msgpack: ${m.min} B min, ${m.gzip} B gzip (budget ${MSGPACK_BUDGET_GZIP} B)`);
  assert.ok(m.gzip <= MSGPACK_BUDGET_GZIP, `${m.gzip} B gzip is over the budget`);
  assert.ok(m.inputs.some((i) => i.includes('@msgpack/msgpack')));
});

test('size: the React entry adds at most 3 KB gzip (its code and typed rooms; React and the core excluded)', async (t) => {
  const m = await measure('react.js', [only(['react.js', 'typed.js'])]);
  t.diagnostic(`@statecast/sdk/react: ${m.min} B min, ${m.gzip} B gzip (budget ${REACT_BUDGET_GZIP} B)`);
  assert.ok(m.gzip <= REACT_BUDGET_GZIP, `${m.gzip} B gzip is over the budget`);
  assert.deepEqual(m.inputs.map((i) => basename(i)).sort(), ['react.js', 'typed.js']);
});

test('size: the persistence entry (with tabs) adds at most 4 KB gzip (the core excluded)', async (t) => {
  const m = await measure('persist.js', [only(['persist.js', 'tabs.js'])]);
  t.diagnostic(`@statecast/sdk/persist: ${m.min} B min, ${m.gzip} B gzip (budget ${PERSIST_BUDGET_GZIP} B)`);
  assert.ok(m.gzip <= PERSIST_BUDGET_GZIP, `${m.gzip} B gzip is over the budget`);
  assert.deepEqual(m.inputs.map((i) => basename(i)).sort(), ['persist.js', 'tabs.js'], 'it bundles no code of the core');
});
