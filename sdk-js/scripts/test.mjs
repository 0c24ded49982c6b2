// `npm test` after the TypeScript builds: builds the Go server once (unless
// STATECAST_BIN names one), then runs every test file (unit, integration,
// size, WHATWG WebSocket) in one node:test run with the TAP reporter, which
// ends with `# pass N` / `# fail N`. Exits non-zero when anything fails.
// Arguments, if any, replace the default test directory (build-test/).
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const sdk = fileURLToPath(new URL('..', import.meta.url));
const env = { ...process.env };
let tmp;
if (!env.STATECAST_BIN) {
  tmp = mkdtempSync(join(tmpdir(), 'statecast-sdk-'));
  const bin = join(tmp, 'statecast');
  const t0 = Date.now();
  // Built as the Dockerfile builds it: the Go tests build the same, so the
  // build cache already holds every package.
  const r = spawnSync('go', ['build', '-trimpath', '-ldflags=-s -w', '-o', bin, './cmd/statecast'],
    { cwd: resolve(sdk, '..'), stdio: 'inherit', env: { ...process.env, CGO_ENABLED: '0' } });
  if (r.error || r.status !== 0) {
    console.error(`go build of the server failed (${r.error?.message ?? `exit ${r.status}`}); set STATECAST_BIN to a built binary`);
    rmSync(tmp, { recursive: true, force: true });
    process.exit(1);
  }
  console.error(`built ${bin} in ${Date.now() - t0} ms`);
  env.STATECAST_BIN = bin;
}
// Node 20 has a WHATWG (browser-like) WebSocket only behind a flag (from 20.10); whatwg.test uses it.
const [major, minor] = process.versions.node.split('.').map(Number);
const flags = typeof WebSocket === 'undefined' && (major > 20 || (major === 20 && minor >= 10)) ? ['--experimental-websocket'] : [];
const files = process.argv.length > 2 ? process.argv.slice(2) : [join(sdk, 'build-test')];
const child = spawn(process.execPath, [...flags, '--test', '--test-reporter=tap', ...files], { cwd: sdk, env, stdio: 'inherit' });
child.on('exit', (code, signal) => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
  process.exit(code ?? (signal ? 1 : 0));
});
