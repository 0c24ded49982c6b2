// The README's API reference must not drift from the code (issue 13, "Docs"):
// every export of the five entry points, and every public member of an
// exported class or interface, is named in it. The names are read from the
// sources with the TypeScript compiler, so a new export fails this test until
// it is documented. `@internal` declarations are not part of the API.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const sdk = fileURLToPath(new URL('..', import.meta.url));
const entries = ['index', 'msgpack', 'react', 'typed', 'persist'].map((e) => join(sdk, 'src', `${e}.ts`));

/** The public names of the entry points: their exports and the public members of exported classes and interfaces. */
function apiNames(): Map<string, string[]> {
  const program = ts.createProgram(entries, { module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext, strict: true, skipLibCheck: true });
  const checker = program.getTypeChecker();
  const names = new Map<string, string[]>();
  const add = (name: string, where: string) => names.set(name, [...(names.get(name) ?? []), where]);
  for (const file of entries) {
    const module = checker.getSymbolAtLocation(program.getSourceFile(file)!)!;
    for (const exp of checker.getExportsOfModule(module)) {
      const sym = exp.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(exp) : exp;
      if (internal(sym)) continue;
      add(exp.name, file);
      if (!(sym.flags & (ts.SymbolFlags.Class | ts.SymbolFlags.Interface))) continue;
      const type = checker.getDeclaredTypeOfSymbol(sym);
      for (const member of checker.getPropertiesOfType(type)) if (isPublic(member)) add(member.name, `${exp.name}.${member.name}`);
    }
  }
  return names;
}

function internal(sym: ts.Symbol): boolean {
  return sym.getJsDocTags().some((t) => t.name === 'internal');
}

/** A member declared in the SDK (not inherited from Error), not private, protected, `_`-named or `@internal`. */
function isPublic(member: ts.Symbol): boolean {
  if (member.name.startsWith('_') || internal(member)) return false;
  if (!member.declarations?.some((d) => d.getSourceFile().fileName.startsWith(join(sdk, 'src')))) return false;
  const mods = member.declarations?.flatMap((d) => (ts.canHaveModifiers(d) ? (ts.getModifiers(d) ?? []) : [])) ?? [];
  return !mods.some((m) => m.kind === ts.SyntaxKind.PrivateKeyword || m.kind === ts.SyntaxKind.ProtectedKeyword);
}

/** The "## API reference" section of the README. */
function reference(readme: string): string {
  const start = readme.indexOf('\n## API reference\n');
  assert.ok(start >= 0, 'README.md has no "## API reference" section');
  const end = readme.indexOf('\n## ', start + 1);
  return readme.slice(start, end < 0 ? undefined : end);
}

/** The identifiers written in code spans of `md`. */
function codeWords(md: string): Set<string> {
  const words = new Set<string>();
  for (const span of md.matchAll(/`([^`]+)`/g)) for (const w of span[1]!.matchAll(/[A-Za-z_$~][\w$]*/g)) words.add(w[0]);
  return words;
}

/** The names of `api` that `section` does not name in code, with where they are declared. */
function undocumented(api: Map<string, string[]>, section: string): string[] {
  const words = codeWords(section);
  return [...api].filter(([name]) => !words.has(name)).map(([name, where]) => `${name} (${where.map((w) => w.replace(sdk, '')).join(', ')})`);
}

const api = apiNames();
const section = reference(readFileSync(join(sdk, 'README.md'), 'utf8'));

test('docs: the README API reference names every export of the entry points and every public member of their classes and interfaces', () => {
  for (const name of ['createClient', 'Client', 'ClientOptions', 'msgpackCodec', 'useWatch', 'defineRoom', 'SchemaError', 'pendingWrites', 'dispose'])
    assert.ok(api.has(name), `the export list read from src/ lacks ${name}: the parser is broken`);
  assert.ok(!api.has('cached') && !api.has('Checks') && !api.has('_watch'), '@internal and _ members are not API');
  assert.deepEqual(undocumented(api, section), [], 'missing from the "## API reference" section of README.md');
});

test('docs: an export missing from the README API reference is reported', () => {
  const before = undocumented(api, section);
  const without = section.replace(/\buseEntry\b/g, 'useEntri');
  const after = undocumented(api, without).filter((s) => !before.includes(s));
  assert.deepEqual(after.map((s) => s.split(' ')[0]), ['useEntry']);
});
