// Errors of @sm-supervisor/client: every failure a caller can switch on is an
// SmError with a stable `code`, the manager's own error codes (docs/protocol.md,
// "Error codes") or one of the few the package adds for local failures.

/** Error codes of protocol v1 and the package, as constants. */
export const Codes = Object.freeze({
  BAD_FRAME: 'bad_frame',
  FRAME_TOO_LARGE: 'frame_too_large',
  NOT_REGISTERED: 'not_registered',
  FORBIDDEN: 'forbidden',
  UNKNOWN_TARGET: 'unknown_target',
  UNAVAILABLE: 'unavailable',
  TIMEOUT: 'timeout',
  BUSY: 'busy',
  DEPLOY_IN_PROGRESS: 'deploy_in_progress',
  UNKNOWN_ID: 'unknown_id',
  BAD_CONFIG: 'bad_config',
  SHUTTING_DOWN: 'shutting_down',
  UNKNOWN_OP: 'unknown_op',
  INTERNAL: 'internal',
  BUDGET_REFUSED: 'budget_refused',
  CANCELLED: 'cancelled',
  // The package's: a business handler threw an error without a code.
  HANDLER_ERROR: 'handler_error',
});

/**
 * An error with a stable code: a manager's REPLY error (code and message as
 * sent), or a local failure (`unavailable` without a connection, `timeout`
 * when the local deadline passes, `frame_too_large` before sending).
 */
export class SmError extends Error {
  constructor(code, message, options) {
    super(message || code, options);
    this.name = 'SmError';
    this.code = code;
  }

  /** The wire form, {code, message}. */
  toJSON() {
    return { code: this.code, message: this.message };
  }

  /** An SmError from a REPLY's error object (tolerating a malformed one). */
  static from(wire) {
    if (wire && typeof wire === 'object') {
      const code = typeof wire.code === 'string' && wire.code !== '' ? wire.code : Codes.INTERNAL;
      const message = typeof wire.message === 'string' ? wire.message : '';
      return new SmError(code, message);
    }
    return new SmError(Codes.INTERNAL, `malformed error in REPLY: ${JSON.stringify(wire)}`);
  }
}

// REGISTER refusals worth retrying: the same frame may be accepted later
// (docs/protocol.md: "unavailable, busy and shutting_down are worth retrying").
const RETRYABLE_REGISTER = new Set([Codes.UNAVAILABLE, Codes.BUSY, Codes.SHUTTING_DOWN]);

/** Whether a REGISTER refused with this code may be sent again. */
export function retryableRegister(code) {
  return RETRYABLE_REGISTER.has(code);
}
