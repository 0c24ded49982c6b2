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

/** @internal The size of an encoded frame in bytes (UTF-8 for text, as it goes on the wire). */
export function frameBytes(frame: string | Uint8Array): number {
  return typeof frame === 'string' ? new TextEncoder().encode(frame).byteLength : frame.byteLength;
}
