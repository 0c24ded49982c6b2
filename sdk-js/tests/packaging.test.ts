// The published package (issue 13, defect 9): the README's links resolve
// inside the tarball, and the msgpack entry builds when the optional peer
// dependency is missing and a bundler stubs it out (as Vite does), failing
// at import with a message that says what to install.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';

const sdk = fileURLToPath(new URL('..', import.meta.url));

test('packaging: every relative link of README.md points to a file in the npm tarball', () => {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: sdk, encoding: 'utf8' });
  const files = new Set((JSON.parse(out)[0].files as { path: string }[]).map((f) => f.path));
  assert.ok(files.has('README.md') && files.has('dist/index.js'));
  const readme = readFileSync(join(sdk, 'README.md'), 'utf8');
  const links = [...readme.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!).filter((l) => !/^[a-z]+:|^#/.test(l));
  const missing = links.filter((l) => !files.has(l.split('#')[0]!.replace(/^\.\//, '')));
  assert.deepEqual(missing, [], 'links to files not in the tarball (use an absolute URL)');
});

test('packaging: the msgpack entry builds with @msgpack/msgpack stubbed out (a missing optional peer), and importing it says to install it', async () => {
  const out = await build({
    entryPoints: [join(sdk, 'dist/msgpack.js')],
    bundle: true,
    format: 'esm',
    write: false,
    logLevel: 'silent',
    // What Vite does with a missing optional peer dependency: an empty module.
    plugins: [
      {
        name: 'missing-peer',
        setup(b) {
          b.onResolve({ filter: /^@msgpack\/msgpack$/ }, () => ({ path: 'stub', namespace: 'stub' }));
          b.onLoad({ filter: /.*/, namespace: 'stub' }, () => ({ contents: 'export default {}' }));
        },
      },
    ],
  });
  const dir = mkdtempSync(join(tmpdir(), 'statecast-pkg-'));
  try {
    const file = join(dir, 'msgpack.mjs');
    writeFileSync(file, out.outputFiles[0]!.text);
    await assert.rejects(import(pathToFileURL(file).href), /npm install @msgpack\/msgpack/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('packaging: package.json states the module formats it ships (ESM only) and its files', () => {
  const pkg = JSON.parse(readFileSync(join(sdk, 'package.json'), 'utf8'));
  assert.equal(pkg.type, 'module');
  assert.ok(!JSON.stringify(pkg.exports).includes('"require"'), 'no CommonJS entry is claimed');
  const readme = readFileSync(join(sdk, 'README.md'), 'utf8');
  assert.match(readme, /CommonJS/);
  assert.match(readme, /React Native/);
});
