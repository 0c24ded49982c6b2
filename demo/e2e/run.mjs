// `npm test` in demo/: builds the statecast binary once (unless
// STATECAST_BIN names one), then runs every e2e/*.test.mjs file, one at a
// time, in one node:test run with the TAP reporter (ends with `# pass N` /
// `# fail N`; non-zero exit on any failure). Without Chromium the tests are
// skipped, except with CI=true, where that is a failure.
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CHROMIUM } from './support.mjs';

const here = fileURLToPath(new URL('.', import.meta.url));
const repo = resolve(here, '../..');

if (!existsSync(CHROMIUM)) {
  const msg = `no Chromium at ${CHROMIUM} (install it: apt-get install --no-install-recommends chromium, or set CHROMIUM_PATH)`;
  if (process.env.CI === 'true') {
    console.error(`demo e2e: FAIL: ${msg}`);
    process.exit(1);
  }
  console.log(`# demo e2e skipped: ${msg}`);
  if (process.env.STATECAST_SKIPPED) appendFileSync(process.env.STATECAST_SKIPPED, `demo browser tests (${msg})\n`);
  process.exit(0);
}

const env = { ...process.env };
let tmp;
if (!env.STATECAST_BIN) {
  tmp = mkdtempSync(join(tmpdir(), 'statecast-e2e-'));
  env.STATECAST_BIN = join(tmp, 'statecast');
  const t0 = Date.now();
  // Built as the Dockerfile builds it: the Go tests build the same, so the
  // build cache already holds every package.
  const r = spawnSync('go', ['build', '-trimpath', '-ldflags=-s -w', '-o', env.STATECAST_BIN, './cmd/statecast'],
    { cwd: repo, stdio: 'inherit', env: { ...process.env, CGO_ENABLED: '0' } });
  if (r.error || r.status !== 0) {
    console.error(`go build failed (${r.error?.message ?? `exit ${r.status}`}); set STATECAST_BIN to a built binary`);
    rmSync(tmp, { recursive: true, force: true });
    process.exit(1);
  }
  console.error(`built ${env.STATECAST_BIN} in ${Date.now() - t0} ms`);
}
const files = process.argv.length > 2 ? process.argv.slice(2) : [here];
const child = spawn(process.execPath, ['--test', '--test-reporter=tap', '--test-concurrency=2', '--test-timeout=120000', ...files],
  { cwd: resolve(here, '..'), env, stdio: 'inherit' });
child.on('exit', (code, signal) => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
  process.exit(code ?? (signal ? 1 : 0));
});
