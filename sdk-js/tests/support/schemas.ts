// Hand-written Standard Schema validators (what zod, valibot or arktype
// provide), counting their calls.
import type { StandardSchema } from '../../dist/typed.js';

export interface Todo {
  text: string;
  done: boolean;
}
export interface Cursor {
  x: number;
  y: number;
}
export interface Meta {
  title: string;
}

/** A schema accepting what `ok` accepts; `out` turns the value into the schema's output (default: as is). */
export function schema<T, O = T>(ok: (v: any) => boolean, out: (v: T) => O = (v) => v as unknown as O): StandardSchema<T, O> & { calls: number } {
  const s = {
    calls: 0,
    '~standard': {
      version: 1 as const,
      vendor: 'test',
      validate: (v: unknown) => {
        s.calls++;
        return ok(v) ? { value: out(v as T) } : { issues: [{ message: `not a valid value: ${JSON.stringify(v)}` }] };
      },
    },
  };
  return s;
}

export const isTodo = (v: any) => typeof v?.text === 'string' && typeof v?.done === 'boolean';
export const isCursor = (v: any) => typeof v?.x === 'number' && typeof v?.y === 'number';
export const isMeta = (v: any) => typeof v?.title === 'string';
