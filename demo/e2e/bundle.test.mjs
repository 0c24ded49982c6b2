// The board page's bundle is committed (app/board.js, served by the Go
// binary with no npm): it must be what `npm run build:board` builds from
// the current sources (board/*.tsx, app/common.js, sdk-js/src, React).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildBoard } from '../scripts/build-board.mjs';

const FRESHNESS = 'freshness check: run `npm run build:board` in demo and commit app/board.js';

test(`app/board.js is a fresh build of the board page (${FRESHNESS})`, async () => {
  const tmp = mkdtempSync(join(tmpdir(), 'statecast-board-'));
  try {
    await buildBoard(join(tmp, 'board.js'));
    const committed = readFileSync(new URL('../app/board.js', import.meta.url), 'utf8');
    assert.ok(committed === readFileSync(join(tmp, 'board.js'), 'utf8'), `app/board.js differs from a fresh build — ${FRESHNESS}`);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
