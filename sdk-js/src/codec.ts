/**
 * Wire codecs. JSON is built in; MessagePack lives in the separate entry
 * `@statecast/sdk/msgpack`, so that applications that do not import it do
 * not bundle it.
 * @packageDocumentation
 */

/**
 * How messages are framed on the socket. A codec is chosen by WebSocket
 * subprotocol (PROTOCOL.md §2); a frame carries one or more messages.
 */
export interface Codec {
  /** The WebSocket subprotocol that selects this codec on the server. */
  readonly subprotocol: string;
  /** Encodes one message as one frame (a string is sent as a text frame). */
  encode(message: object): string | Uint8Array;
  /** Decodes one received frame into its messages. */
  decode(frame: string | ArrayBuffer | Uint8Array): unknown[];
}

/** @internal Frame data as a string (JSON text). */
function text(frame: string | ArrayBuffer | Uint8Array): string {
  return typeof frame === 'string' ? frame : new TextDecoder().decode(frame);
}

/**
 * The JSON codec (`statecast.v1.json`, text frames, messages separated by
 * `\n`). The default.
 */
export const jsonCodec: Codec = {
  subprotocol: 'statecast.v1.json',
  encode: (message) => JSON.stringify(message),
  decode: (frame) =>
    text(frame)
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => JSON.parse(line)),
};

/** @internal Whether an encoded frame is larger than `limit` bytes. */
export function frameTooLarge(frame: string | Uint8Array, limit: number): boolean {
  if (typeof frame !== 'string') return frame.byteLength > limit;
  if (frame.length * 3 <= limit) return false; // UTF-8 takes at most 3 bytes per UTF-16 unit
  return frame.length > limit || new TextEncoder().encode(frame).byteLength > limit;
}
