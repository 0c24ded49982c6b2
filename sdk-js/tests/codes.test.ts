// The close-code table of src/codes.ts must match the server's: the Go
// constants in server/wire/wire.go and the table of PROTOCOL.md §8; and
// every error code of §4 must be one the SDK knows.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { resolve } from 'node:path';
import {
  CloseCode,
  closeAction,
  ConflictError,
  ForbiddenError,
  InvalidFilterError,
  OutcomeUnknownError,
  RateLimitedError,
  StatecastError,
  TooLargeError,
  UnauthorizedError,
} from '../dist/index.js';
import { errorFromReply } from '../dist/errors.js';

const sdkDir = fileURLToPath(new URL('..', import.meta.url));
const read = (rel: string) => readFileSync(resolve(sdkDir, rel), 'utf8');

test('codes: every Close… constant of server/wire/wire.go is in CloseCode, same name and value', () => {
  const go = read('../server/wire/wire.go');
  const found = [...go.matchAll(/^\s*Close(\w+)\s+websocket\.StatusCode\s*=\s*(\d+)/gm)].map((m) => [m[1]!, Number(m[2])] as const);
  assert.ok(found.length >= 9, `found only ${found.length} close constants in wire.go`);
  for (const [name, code] of found) {
    assert.equal((CloseCode as Record<string, number>)[name], code, `CloseCode.${name} should be ${code}`);
  }
  // And nothing in the 4xxx range that the server does not define.
  const goCodes = new Set(found.map(([, c]) => c));
  for (const [name, code] of Object.entries(CloseCode)) {
    if (code >= 4000) assert.ok(goCodes.has(code), `CloseCode.${name} = ${code} is not in wire.go`);
  }
});

test('codes: CloseCode has exactly the codes of PROTOCOL.md §8, and closeAction follows its "client action" column', () => {
  const md = read('../server/PROTOCOL.md');
  const start = md.indexOf('## 8. Close codes');
  assert.ok(start >= 0, 'PROTOCOL.md has no "## 8. Close codes" section');
  const section = md.slice(start, md.indexOf('\n## ', start + 5));
  const rows = [...section.matchAll(/^\|\s*(\d{4})\s*\|([^|]*)\|([^|]*)\|/gm)].map((m) => ({ code: Number(m[1]), action: m[3]!.trim() }));
  assert.ok(rows.length >= 14, `found only ${rows.length} rows in §8`);
  assert.deepEqual(
    rows.map((r) => r.code).sort(),
    Object.values(CloseCode).sort(),
    'the codes of PROTOCOL.md §8 and CloseCode differ',
  );
  for (const { code, action } of rows) {
    const a = action.toLowerCase();
    const want = /new token/.test(a) ? 'reauth' : /do not reconnect/.test(a) ? 'stop' : /at once/.test(a) ? 'now' : 'backoff';
    assert.equal(closeAction(code), want, `close ${code} ("${action}")`);
  }
  // The ranges of the spec's last paragraph.
  assert.match(section, /4000–4499 mean "reconnect with backoff and resume"; 4500–4999 mean "do not reconnect/);
  assert.equal(closeAction(4099), 'backoff');
  assert.equal(closeAction(4599), 'stop');
  assert.equal(closeAction(1006), 'backoff');
});

test('codes: every error code of PROTOCOL.md §4 is known, and a reply with it becomes its typed error', () => {
  const md = read('../server/PROTOCOL.md');
  const start = md.indexOf('### Error codes');
  assert.ok(start >= 0, 'PROTOCOL.md has no "### Error codes" section');
  const section = md.slice(start, md.indexOf('\n#', start + 5));
  const codes = [...section.matchAll(/^\|\s*`(\w+)`\s*\|/gm)].map((m) => m[1]!);
  // A code with fields of its own has a class that carries them; the others are plain StatecastErrors.
  const known: Record<string, Function> = {
    bad_request: StatecastError,
    invalid_room: StatecastError,
    invalid_key: StatecastError,
    invalid_value: StatecastError,
    invalid_filter: InvalidFilterError,
    too_large: TooLargeError,
    conflict: ConflictError,
    wid_reused: StatecastError, // the SDK never reuses an id: a plain error, rolled back
    quota_exceeded: StatecastError,
    unauthorized: UnauthorizedError,
    forbidden: ForbiddenError,
    rate_limited: RateLimitedError,
    too_many_subscriptions: StatecastError,
    not_found: StatecastError,
    outcome_unknown: OutcomeUnknownError,
    unavailable: StatecastError,
    internal: StatecastError,
  };
  assert.ok(codes.length >= 15, `found only ${codes.length} codes in §4`);
  assert.deepEqual(codes.filter((c) => !(c in known)), [], 'codes of §4 the SDK does not know');
  for (const code of codes) {
    const err = errorFromReply({ t: 'err', id: 1, code, message: `msg ${code}`, key: 'k', mod_rev: 2, rev: 3, line: 1, column: 14 });
    assert.ok(err instanceof known[code]!, `${code}: ${err.name}`);
    assert.deepEqual([err.code, err.message], [code, `msg ${code}`]);
  }
  const f = errorFromReply({ t: 'err', id: 1, code: 'invalid_filter', message: 'bad', line: 2, column: 7 }) as InvalidFilterError;
  assert.deepEqual([f.line, f.column], [2, 7]);
});
