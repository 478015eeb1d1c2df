// The session protocol over gRPC (`pyllamaopt serve --grpc-port`, proto/pyllamaopt/v1/runtime.proto),
// with Node's own HTTP/2 client: gRPC's framing (a 5-byte prefix per message, the status in the
// trailers) over one connection, the messages by ./protobuf.js. The specification names
// @grpc/grpc-js; it is not reachable from this project's machines, and the protocol needs no more.
import http2 from "node:http2";

import { ServerError, grpcError } from "./errors.js";
import { MESSAGES, decode, encode } from "./protobuf.js";

/**
 * @typedef {import("./index.js").GenerateOptions} GenerateOptions
 * @typedef {import("./index.js").GenerateEvent} GenerateEvent
 * @typedef {import("./index.js").SessionInfo} SessionInfo
 * @typedef {import("./protobuf.js").MessageType} MessageType
 */

const SERVICE = "/pyllamaopt.v1.Runtime/";
const CODES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
  "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"];
const INT32_MAX = 2 ** 31 - 1;
const READ_AHEAD = 16; // messages received and not yet read before the stream is paused
// The HTTP/2 stream window of generations (bytes; a token's message is about 16): what the server may
// send that this process has not taken yet. A reader that stalls, or a process the machine does not
// run for a while, holds the server's generation after about this much (plus READ_AHEAD and the
// server's own 16 tokens ahead), not after Node's default 64 KiB (thousands of tokens: a cancel came
// after the whole answer was computed). Unary calls keep the default window on a connection of their
// own: a long history's SessionInfo would take a round trip per window.
const GENERATION_WINDOW = 512;
/** @type {Record<string, string>} */
const REQUEST_TYPES = {
  CreateSession: "CreateSessionRequest", AppendTokens: "AppendTokensRequest", Sync: "SyncRequest",
  Fork: "ForkRequest", GetSessionInfo: "GetSessionInfoRequest", CloseSession: "CloseSessionRequest",
  Tokenize: "TokenizeRequest", Generate: "GenerateRequest",
};

export class GrpcTransport {
  /**
   * @param {string} origin  "http://host:port" (plaintext) or "https://host:port" (TLS)
   * @param {string | undefined} apiKey
   */
  constructor(origin, apiKey) {
    this.origin = origin;
    /** @type {Record<string, string>} */
    this.metadata = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
    /** @type {Record<"unary" | "generation", import("node:http2").ClientHttp2Session | null>} one of each, opened when first used */
    this.connections = { unary: null, generation: null };
    /** @type {WeakMap<import("node:http2").ClientHttp2Session, Error>} a connection's own error (its streams only say they were cancelled) */
    this.connectionErrors = new WeakMap();
    /** @type {WeakMap<import("node:http2").ClientHttp2Session, number>} calls in flight: a connection keeps Node running only while it has some */
    this.calls = new WeakMap();
  }

  /** @param {number[]} tokens @returns {Promise<string>} */
  async createSession(tokens) {
    return (await this.unary("CreateSession", { tokens }, "CreateSessionResponse")).session_id;
  }

  /** @param {string} text @param {boolean} addBos @param {boolean} special @returns {Promise<number[]>} */
  async tokenize(text, addBos, special) {
    return (await this.unary("Tokenize", { text, add_bos: addBos, special }, "TokenizeResponse")).tokens;
  }

  /** @param {string} id @param {number[]} tokens */
  async append(id, tokens) {
    await this.unary("AppendTokens", { session_id: id, tokens }, "SessionInfo");
  }

  /** @param {string} id @param {number[]} tokens */
  async sync(id, tokens) {
    await this.unary("Sync", { session_id: id, tokens }, "SessionInfo");
  }

  /** @param {string} id @returns {Promise<string>} */
  async fork(id) {
    return (await this.unary("Fork", { session_id: id }, "ForkResponse")).session_id;
  }

  /** @param {string} id @returns {Promise<SessionInfo>} */
  async info(id) {
    const info = await this.unary("GetSessionInfo", { session_id: id }, "SessionInfo");
    return /** @type {SessionInfo} */ ({ ...info, busy: info.busy || null }); // as over HTTP: null when idle
  }

  /** @param {string} id */
  async close(id) {
    await this.unary("CloseSession", { session_id: id }, "CloseSessionResponse");
  }

  /**
   * The generation's events; aborting `signal` cancels the call (the server stops between two steps).
   * @param {string} id
   * @param {GenerateOptions} options
   * @param {AbortSignal} signal
   * @returns {AsyncGenerator<GenerateEvent, void, undefined>}
   */
  async *generate(id, options, signal) {
    const request = generateRequest(id, options);
    for await (const event of this.call("Generate", request, "GenerateResponse", "generation", signal)) {
      if (event.token) {
        yield { token: { id: event.token.id, text: event.token.text } };
      } else if (event.done) {
        yield { done: { finishReason: event.done.finish_reason, usage: event.done.usage, stopString: event.done.stop_string } };
      }
    }
  }

  /** Closes the connections (a later call opens another). */
  disconnect() {
    for (const connection of Object.values(this.connections)) connection?.close();
    this.connections = { unary: null, generation: null };
  }

  /**
   * The one answer of a unary call.
   * @param {string} method
   * @param {Record<string, any>} request  its fields by their .proto names
   * @param {string} responseType
   * @returns {Promise<Record<string, any>>}
   */
  async unary(method, request, responseType) {
    /** @type {Record<string, any> | null} */
    let answer = null;
    for await (const message of this.call(method, request, responseType, "unary")) answer = message;
    if (answer === null) throw new ServerError(`the server answered ${method} with no message`);
    return answer;
  }

  /**
   * @param {"unary" | "generation"} kind
   * @returns {import("node:http2").ClientHttp2Session}
   */
  connect(kind) {
    const open = this.connections[kind];
    if (open && !open.closed && !open.destroyed) return open;
    const connection = http2.connect(this.origin,
      kind === "generation" ? { settings: { initialWindowSize: GENERATION_WINDOW } } : {});
    connection.on("error", (err) => { this.connectionErrors.set(connection, err); });
    connection.on("close", () => { if (this.connections[kind] === connection) this.connections[kind] = null; });
    connection.unref();
    this.connections[kind] = connection;
    return connection;
  }

  /**
   * The messages a call answers, then its status: an error unless OK.
   * @param {string} method
   * @param {Record<string, any>} request
   * @param {string} responseType
   * @param {"unary" | "generation"} kind  the connection it goes on
   * @param {AbortSignal} [signal]
   * @returns {AsyncGenerator<Record<string, any>, void, undefined>}
   */
  async *call(method, request, responseType, kind, signal) {
    let payload;
    try {
      payload = encode(MESSAGES[REQUEST_TYPES[method]], request);
    } catch (err) {
      throw grpcError("INVALID_ARGUMENT", `${method}: ${err instanceof Error ? err.message : err}`, undefined);
    }
    signal?.throwIfAborted();
    /** @type {import("node:http2").ClientHttp2Session} */
    let connection;
    /** @type {import("node:http2").ClientHttp2Stream} */
    let stream;
    try {
      connection = this.connect(kind);
      stream = connection.request({
        ":method": "POST", ":path": SERVICE + method, "content-type": "application/grpc", te: "trailers",
        ...this.metadata,
      });
    } catch (err) { // a bad address, a connection closing
      throw new ServerError(`cannot reach ${this.origin} over gRPC: ${err instanceof Error ? err.message : err}`);
    }
    const frame = new Uint8Array(5 + payload.length);
    new DataView(frame.buffer).setUint32(1, payload.length);
    frame.set(payload, 5);
    stream.end(frame);
    const inFlight = (this.calls.get(connection) || 0) + 1;
    this.calls.set(connection, inFlight);
    if (inFlight === 1) connection.ref();

    const state = {
      /** @type {Uint8Array[]} */ messages: [],
      /** @type {Uint8Array} the bytes of a message not whole yet */ partial: new Uint8Array(0),
      /** @type {Record<string, any>} the trailers, or the headers of a trailers-only answer */ status: {},
      /** @type {Error | null} */ failure: null,
      ended: false,
      /** @type {(() => void) | null} */ wake: null,
    };
    const notify = () => { if (state.wake) { state.wake(); state.wake = null; } };
    const onAbort = () => stream.close(http2.constants.NGHTTP2_CANCEL);
    signal?.addEventListener("abort", onAbort, { once: true });
    stream.on("response", (headers) => {
      if (headers["grpc-status"] !== undefined) state.status = headers; // trailers-only: an error before any message
      else if (headers[":status"] !== 200) {
        state.failure = new ServerError(`${this.origin} answered HTTP ${headers[":status"]}: is it the --grpc-port?`);
      }
      notify();
    });
    stream.on("data", (chunk) => {
      state.partial = concat(state.partial, chunk);
      for (;;) {
        const bytes = state.partial;
        if (bytes.length < 5) break;
        const length = new DataView(bytes.buffer, bytes.byteOffset).getUint32(1);
        if (bytes.length < 5 + length) break;
        if (bytes[0] !== 0) state.failure = new ServerError("the server sent a compressed message (not asked for)");
        state.messages.push(bytes.subarray(5, 5 + length));
        state.partial = bytes.subarray(5 + length);
      }
      // a reader that stops reading stops taking messages: what waits for it is bounded here, and
      // HTTP/2's flow control holds the server once the stream's window is full
      if (state.messages.length >= READ_AHEAD) stream.pause();
      notify();
    });
    stream.on("trailers", (trailers) => { state.status = trailers; });
    stream.on("error", (err) => { state.failure = state.failure || err; notify(); });
    stream.on("close", () => { state.ended = true; notify(); });
    try {
      for (;;) {
        if (state.failure || signal?.aborted) break; // (cancelled: what came after is not the caller's)
        const message = state.messages.shift();
        if (state.messages.length < READ_AHEAD / 2 && stream.isPaused()) stream.resume();
        if (message) {
          yield decodeAnswer(responseType, message);
          continue;
        }
        if (state.ended) break;
        await new Promise((resolve) => { state.wake = () => resolve(undefined); });
      }
      if (signal?.aborted) throw signal.reason;
      const { status, failure } = state;
      if (failure instanceof ServerError) throw failure;
      if (status["grpc-status"] === undefined) {
        await new Promise((resolve) => setTimeout(resolve, 0)); // the connection's error comes after its streams'
        const why = this.connectionErrors.get(connection) || failure;
        throw new ServerError(`cannot reach ${this.origin} over gRPC: ${why ? why.message : "the call ended without a status"}`);
      }
      const code = CODES[Number(status["grpc-status"])] || `status ${status["grpc-status"]}`;
      if (code !== "OK") {
        throw grpcError(code, percentDecoded(String(status["grpc-message"] || "")), status["pyllamaopt-error"]);
      }
      if (failure) throw new ServerError(`the call failed after its status: ${failure.message}`);
    } finally {
      signal?.removeEventListener("abort", onAbort);
      if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL); // left early: cancel on the server
      const left = (this.calls.get(connection) || 1) - 1;
      this.calls.set(connection, left);
      if (left === 0 && !connection.destroyed) connection.unref();
    }
  }
}

/** @param {Uint8Array} a @param {Uint8Array} b */
function concat(a, b) {
  if (a.length === 0) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** @param {string} type @param {Uint8Array} bytes */
function decodeAnswer(type, bytes) {
  try {
    return decode(MESSAGES[type], bytes);
  } catch (err) {
    throw new ServerError(`the server sent a ${type} this client cannot read: ${err instanceof Error ? err.message : err}`);
  }
}

/**
 * gRPC sends its status message percent-encoded.
 * @param {string} text
 */
function percentDecoded(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/**
 * @param {string} id
 * @param {GenerateOptions} o
 * @returns {Record<string, any>}
 */
function generateRequest(id, o) {
  return {
    session_id: id,
    max_tokens: o.maxTokens === null ? INT32_MAX : o.maxTokens, // the server clamps it to the context
    temperature: o.temperature, top_p: o.topP, top_k: o.topK, min_p: o.minP, seed: o.seed,
    stop: o.stop === undefined ? [] : typeof o.stop === "string" ? [o.stop] : o.stop,
    grammar: o.grammar,
    json_schema: o.jsonSchema === undefined ? undefined : JSON.stringify(o.jsonSchema),
    logit_bias: o.logitBias, frequency_penalty: o.frequencyPenalty, presence_penalty: o.presencePenalty,
    repeat_penalty: o.repeatPenalty, repeat_last_n: o.repeatLastN,
  };
}
