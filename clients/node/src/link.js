// One logical connection to sm-manager, as ipc.Client is in Go: it dials the
// Unix socket, sends REGISTER, correlates requests with their REPLY by id, hands
// every other frame to onFrame, and after a lost connection dials again with
// backoff and sends the same REGISTER (docs/protocol.md, "After a manager
// restart"). Requests in flight when the connection drops fail `unavailable`:
// their replies can no longer arrive.

import net from 'node:net';
import { EventEmitter } from 'node:events';
import { SmError, Codes, retryableRegister } from './errors.js';
import { LineSplitter, decodeFrame, encodeFrame } from './framing.js';

/** ipc.Client's reconnection backoff: 50 ms doubling to 5 s, ±20%. */
export const DEFAULT_BACKOFF = Object.freeze({ minMs: 50, maxMs: 5000, jitter: 0.2 });

/**
 * The delay before reconnection attempt n (0-based): min·2ⁿ capped at max,
 * spread by ±jitter with rnd in [0, 1), as package backoff does in Go.
 */
export function backoffDelay(policy, attempt, rnd) {
  const min = Math.max(0, policy.minMs);
  if (min === 0) return 0;
  let d = min * 2 ** Math.max(0, attempt);
  const ceiling = Math.max(policy.maxMs, min);
  if (!(d <= ceiling)) d = ceiling; // also catches Infinity
  if (policy.jitter > 0) d *= 1 + policy.jitter * (2 * rnd - 1);
  return Math.max(0, Math.round(d));
}

const REGISTER_ID = 'register';

function noop() {}

/**
 * A connection that registers and re-registers. Events: 'registered'
 * (payload, first), 'disconnect' (error or undefined), 'refused' (SmError,
 * only for a re-REGISTER: the first one rejects start()), 'closed'.
 */
export class Link extends EventEmitter {
  /**
   * @param o.path socket path
   * @param o.register () => the REGISTER frame's fields (op and id are set here)
   * @param o.onFrame (frame, epoch) => void for every frame that is not the
   *   REPLY of one of this link's requests
   * @param o.maxFrameBytes, o.backoff, o.registerTimeoutMs, o.connectTimeoutMs,
   *   o.reconnect, o.logger
   */
  constructor(o) {
    super();
    this.path = o.path;
    this.register = o.register;
    this.onFrame = o.onFrame;
    this.max = o.maxFrameBytes;
    // What frames this link sends may be: the smaller of this.max and the
    // manager's own limit from its REGISTER reply, since the manager answers
    // an oversized frame with frame_too_large and no id, which would leave
    // the request waiting for its deadline.
    this.sendMax = o.maxFrameBytes;
    this.backoff = o.backoff;
    this.registerTimeoutMs = o.registerTimeoutMs;
    this.connectTimeoutMs = o.connectTimeoutMs;
    this.reconnect = o.reconnect;
    this.log = o.logger;

    this.connected = false;
    this.closed = false; // by close(), or a final refusal: no more dialling
    this.epoch = 0; // counts registrations; a reply belongs to the one it came on
    this.socket = null; // the registered socket, null while disconnected
    this.pending = new Map(); // id -> request record
    this.nextId = 0;
    this.outq = [];
    this.flushScheduled = false;
    this.attempt = 0;
    this.retryTimer = null;
    this.dialing = null; // the socket being dialled or registering
    this.flush = this.flush.bind(this);
  }

  /**
   * Dials and registers. Resolves with the REGISTER reply's payload; rejects
   * with the refusal (SmError) or, once connectTimeoutMs has passed without a
   * registration, with SmError unavailable. Transient failures (no socket yet,
   * a refused connection, a retryable REGISTER error) are retried meanwhile.
   */
  start() {
    return new Promise((resolve, reject) => {
      this.first = { resolve, reject, deadline: Date.now() + this.connectTimeoutMs, lastError: null };
      this.dial();
    });
  }

  dial() {
    this.retryTimer = null;
    if (this.closed) return;
    const sess = { sock: null, registered: false, error: null, timer: null };
    const sock = net.createConnection({ path: this.path });
    sess.sock = sock;
    this.dialing = sock;
    sock.setEncoding('utf8');
    const splitter = new LineSplitter(
      this.max,
      (line) => this.onLine(sess, line),
      () => this.log.warn('sm: dropped a frame from the manager over max_frame_bytes'),
    );
    sock.on('connect', () => {
      let line;
      try {
        line = encodeFrame({ ...this.register(), op: 'REGISTER', id: REGISTER_ID }, this.max);
      } catch (err) {
        sess.error = err;
        sock.destroy();
        return;
      }
      sock.write(line);
      sess.timer = setTimeout(() => {
        sess.error = new SmError(Codes.UNAVAILABLE, `no REGISTER reply within ${this.registerTimeoutMs} ms`);
        sock.destroy();
      }, this.registerTimeoutMs);
    });
    sock.on('data', (chunk) => splitter.push(chunk));
    sock.on('error', (err) => {
      sess.error ??= err;
    });
    sock.on('close', () => {
      clearTimeout(sess.timer);
      if (this.dialing === sock) this.dialing = null;
      this.sessionEnded(sess);
    });
  }

  onLine(sess, line) {
    let f;
    try {
      f = decodeFrame(line);
    } catch (err) {
      if (!sess.registered) {
        sess.error = new SmError(Codes.UNAVAILABLE, `unreadable REGISTER reply: ${err.message}`);
        sess.sock.destroy();
        return;
      }
      this.log.warn(`sm: dropped an unreadable frame from the manager: ${err.message}`);
      return;
    }
    if (!sess.registered) {
      this.registered(sess, f);
      return;
    }
    if (f.op === 'REPLY' && typeof f.id === 'string' && f.id !== '') {
      const p = this.pending.get(f.id);
      if (p !== undefined) {
        this.pending.delete(f.id);
        p.settle(f);
        return;
      }
    }
    this.onFrame(f, this.epoch);
  }

  // The first frame on a connection answers its REGISTER.
  registered(sess, f) {
    clearTimeout(sess.timer);
    if (f.op !== 'REPLY') {
      sess.error = new SmError(Codes.UNAVAILABLE, `REGISTER answered with ${f.op}, not REPLY`);
      sess.sock.destroy();
      return;
    }
    if (f.error !== undefined && f.error !== null) {
      const err = SmError.from(f.error);
      sess.error = err;
      if (!retryableRegister(err.code)) this.refuse(err);
      sess.sock.destroy();
      return;
    }
    sess.registered = true;
    const limit = f.payload?.max_frame_bytes;
    this.sendMax = Number.isInteger(limit) && limit > 0 ? Math.min(this.max, limit) : this.max;
    this.socket = sess.sock;
    this.connected = true;
    this.epoch++;
    this.attempt = 0;
    const first = this.first;
    this.first = null;
    this.emit('registered', f.payload ?? null, first !== null);
    if (first) first.resolve(f.payload ?? null);
  }

  // A refusal is final: the same REGISTER would be refused again.
  refuse(err) {
    this.closed = true;
    if (this.first) {
      const first = this.first;
      this.first = null;
      first.reject(err);
      return;
    }
    this.emit('refused', err);
  }

  sessionEnded(sess) {
    if (sess.registered) {
      this.connected = false;
      this.socket = null;
      this.outq = [];
      const lost = this.pending;
      this.pending = new Map();
      for (const p of lost.values()) {
        p.fail(new SmError(Codes.UNAVAILABLE, 'connection to the manager lost before the reply'));
      }
      this.emit('disconnect', sess.error ?? undefined);
      if (!this.reconnect) this.closed = true;
    }
    if (this.closed) {
      this.emit('closed');
      return;
    }
    const delay = backoffDelay(this.backoff, this.attempt++, Math.random());
    if (this.first) {
      this.first.lastError = sess.error;
      if (Date.now() + delay > this.first.deadline) {
        const first = this.first;
        this.first = null;
        this.closed = true;
        const why = sess.error ? `: ${sess.error.message}` : '';
        first.reject(new SmError(Codes.UNAVAILABLE, `could not register with the manager within ${this.connectTimeoutMs} ms${why}`));
        this.emit('closed');
        return;
      }
    } else {
      this.log.info(`sm: disconnected from the manager, reconnecting in ${delay} ms`);
    }
    this.retryTimer = setTimeout(() => this.dial(), delay);
  }

  /**
   * Sends frame (a fresh object: its id is set here) and resolves with the
   * REPLY frame, or rejects with the REPLY's error as SmError. Options:
   * timeoutMs (local timer; 0 = none), signal (AbortSignal), onGiveUp(id,
   * reason) called when the timer or the signal ends the wait, and late(frame)
   * which, when given, keeps the id so that the REPLY arriving afterwards goes
   * to it instead of being treated as unexpected.
   */
  request(frame, { timeoutMs = 0, signal, onGiveUp, late } = {}) {
    if (!this.connected) {
      return Promise.reject(new SmError(Codes.UNAVAILABLE, 'not connected to the manager'));
    }
    if (signal?.aborted) return Promise.reject(signal.reason);
    const id = (++this.nextId).toString(36);
    frame.id = id;
    let line;
    try {
      line = encodeFrame(frame, this.sendMax);
    } catch (err) {
      return Promise.reject(err);
    }
    return new Promise((resolve, reject) => {
      let timer = null;
      let onAbort = null;
      const done = () => {
        if (timer !== null) clearTimeout(timer);
        if (onAbort !== null) signal.removeEventListener('abort', onAbort);
      };
      const p = {
        settle(f) {
          done();
          if (f.error !== undefined && f.error !== null) reject(SmError.from(f.error));
          else resolve(f);
        },
        fail(err) {
          done();
          reject(err);
        },
      };
      const giveUp = (err) => {
        done();
        if (late) {
          p.settle = late;
          p.fail = noop;
        } else {
          this.pending.delete(id);
        }
        reject(err);
        if (onGiveUp) onGiveUp(id, err);
      };
      if (timeoutMs > 0) {
        timer = setTimeout(() => {
          timer = null;
          giveUp(new SmError(Codes.TIMEOUT, `no REPLY to ${frame.op} within ${timeoutMs} ms`));
        }, timeoutMs);
      }
      if (signal) {
        onAbort = () => {
          onAbort = null;
          giveUp(signal.reason);
        };
        signal.addEventListener('abort', onAbort, { once: true });
      }
      this.pending.set(id, p);
      this.write(line);
    });
  }

  /** Sends a frame without id. False when not connected (it is dropped). */
  send(frame) {
    if (!this.connected) return false;
    this.write(encodeFrame(frame, this.sendMax));
    return true;
  }

  /** Queues an encoded line (with its newline) on the registered socket. */
  write(line) {
    this.outq.push(line);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      // Coalesces what one turn of the event loop produced (the replies to a
      // chunk of requests, say) into one write.
      setImmediate(this.flush);
    }
  }

  flush() {
    this.flushScheduled = false;
    if (this.outq.length === 0 || this.socket === null) {
      this.outq = [];
      return;
    }
    const data = this.outq.length === 1 ? this.outq[0] : this.outq.join('');
    this.outq = [];
    this.socket.write(data);
  }

  /**
   * Flushes what is queued, half-closes the socket so that the manager reads
   * every byte to EOF, and waits (at most graceMs) for the connection to end.
   * No reconnection follows; requests still waiting fail `unavailable`.
   */
  close(graceMs = 1000) {
    this.closed = true;
    if (this.retryTimer !== null) {
      clearTimeout(this.retryTimer);
      this.retryTimer = null;
    }
    if (this.first) {
      const first = this.first;
      this.first = null;
      first.reject(new SmError(Codes.UNAVAILABLE, 'closed before registering'));
    }
    this.dialing?.destroy();
    const sock = this.socket;
    if (sock === null) return Promise.resolve();
    this.flush();
    return new Promise((resolve) => {
      const t = setTimeout(() => sock.destroy(), graceMs);
      sock.once('close', () => {
        clearTimeout(t);
        resolve();
      });
      sock.end();
    });
  }
}
