/**
 * WebSocket close codes of protocol v1 (server/PROTOCOL.md §8), mirrored from
 * the server's table (`Close…` in server/wire/wire.go). This is the one place
 * the SDK knows them; a test checks it against both Go and the spec.
 */
export const CloseCode = {
  /** 1000: normal close. */
  Normal: 1000,
  /** 1003: a frame of the wrong type (binary on JSON, text on msgpack); do not reconnect in a loop. */
  UnsupportedData: 1003,
  /** 1007: a message could not be decoded; do not reconnect in a loop. */
  InvalidPayload: 1007,
  /** 1009: a frame was larger than the server's limit. */
  FrameTooLarge: 1009,
  /** 1011: server error; reconnect with backoff. */
  ServerError: 1011,
  /** 1012: server shutting down; reconnect at once and resume. */
  ServiceRestart: 1012,
  /** 1013: try again later (the application's connect hook did not answer); reconnect with backoff. */
  TryAgainLater: 1013,
  /** 4000: the socket did not drain within the server's write timeout. */
  SlowConsumer: 4000,
  /** 4001: nothing received for two ping intervals. */
  HeartbeatTimeout: 4001,
  /** 4002: the token expired; get a new one and reconnect. */
  TokenExpired: 4002,
  /** 4003: rate limited (sustained abuse). */
  RateLimited: 4003,
  /** 4004: the server is full. */
  ServerFull: 4004,
  /** 4005: no `connect` message in time. */
  ConnectTimeout: 4005,
  /** 4500: protocol error; do not reconnect automatically. */
  ProtocolError: 4500,
  /** 4501: the token is missing or invalid; reconnect only with a new one. */
  Unauthorized: 4501,
  /** 4502: the page's Origin is not allowed (start the server with `--allow-origin`); do not reconnect. */
  OriginRefused: 4502,
  /** 4503: another connection took this session over; do not reconnect. */
  SessionReplaced: 4503,
} as const;

/** One of the close codes of {@link CloseCode}. */
export type CloseCode = (typeof CloseCode)[keyof typeof CloseCode];

/**
 * What the client does after a close:
 * - `backoff`: reconnect after an exponential, jittered delay and resume;
 * - `now`: reconnect at once (a small jitter only) and resume;
 * - `reauth`: get a new token from the token callback and reconnect; stop
 *   if there is no callback or it returns the token that was refused;
 * - `stop`: do not reconnect; the client becomes `disconnected`.
 */
export type CloseAction = 'backoff' | 'now' | 'reauth' | 'stop';

/**
 * The client's action for a close code. 4000–4499 reconnect with backoff,
 * 4500–4999 do not reconnect automatically, 1003 and 1007 stop, 1012 reconnects at
 * once, 4002 and 4501 need a new token; any other code (such as 1006, a
 * dropped network) reconnects with backoff.
 */
export function closeAction(code: number): CloseAction {
  switch (code) {
    case CloseCode.ServiceRestart:
      return 'now';
    case CloseCode.TokenExpired:
    case CloseCode.Unauthorized:
      return 'reauth';
    case CloseCode.UnsupportedData:
    case CloseCode.InvalidPayload:
      return 'stop';
  }
  return code >= 4500 && code <= 4999 ? 'stop' : 'backoff';
}
