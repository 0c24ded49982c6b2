/**
 * The MessagePack codec, a separate entry point so that it costs nothing to
 * applications that use JSON:
 *
 * ```ts
 * import { createClient } from '@statecast/sdk';
 * import { msgpackCodec } from '@statecast/sdk/msgpack';
 * const client = createClient({ url, codec: msgpackCodec });
 * ```
 *
 * Needs the optional peer dependency `@msgpack/msgpack` (3.x). Values read
 * back as the same values as through JSON (PROTOCOL.md §2); note that a JS
 * number with an integer value (`1.0`) is sent as a MessagePack integer.
 * @packageDocumentation
 */
import * as mp from '@msgpack/msgpack';
import type { Codec } from './codec.js';

// A namespace import, not named ones: where the optional peer dependency is
// missing, a bundler that stubs it with an empty module (Vite) still builds,
// and importing this entry then says what to install.
if (typeof mp.decodeMulti !== 'function' || typeof mp.encode !== 'function')
  throw new Error('@statecast/sdk/msgpack needs the optional peer dependency @msgpack/msgpack 3.x: npm install @msgpack/msgpack');

/** The MessagePack codec (`statecast.v1.msgpack`, binary frames, messages concatenated). */
export const msgpackCodec: Codec = {
  subprotocol: 'statecast.v1.msgpack',
  encode: (message) => mp.encode(message, { ignoreUndefined: true }),
  decode: (frame) =>
    Array.from(
      mp.decodeMulti(typeof frame === 'string' ? new TextEncoder().encode(frame) : frame instanceof Uint8Array ? frame : new Uint8Array(frame)),
    ),
};
