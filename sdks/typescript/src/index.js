// Client of `pyllamaopt serve`'s session protocol (specification 003 §2.2) for Node 20+, over gRPC
// (its --grpc-port; ./grpc.js, Node's HTTP/2) or its HTTP/JSON routes (/v1/sessions; ./http.js, Node's
// fetch): no dependencies. The URL picks the transport; the sessions behave the same over both.
//
//   import { Client } from "pyllamaopt-client";
//   const client = new Client("127.0.0.1:50051");  // or "http://127.0.0.1:8080"
//   const session = await client.createSession({ tokens: promptIds });
//   await session.append(moreIds);
//   for await (const t of session.generate({ maxTokens: 64 })) process.stdout.write(t.text);
//   await session.close();
//
// Errors are the pyllamaopt exception classes of the Python package (./errors.js).

/** @typedef {{ id: number, text: string }} Token */

/**
 * @typedef {object} Usage
 * @property {number} prompt_tokens
 * @property {number} completion_tokens
 * @property {number} cached_tokens
 * @property {number} computed_tokens
 * @property {number} restored_tokens
 * @property {number} drafted_tokens
 * @property {number} grammar_forced_tokens
 * @property {boolean} approximate
 */

/**
 * @typedef {object} SessionInfo
 * @property {string} session_id
 * @property {number} n_tokens
 * @property {number[]} tokens
 * @property {number} kv_bytes
 * @property {number | null} approx_from  Tier 2: where the KV starts being approximate (null: all exact)
 * @property {boolean} generating
 * @property {string | null} busy  "generating", "prefilling" or null
 * @property {Record<string, number>} stats
 */

/**
 * @typedef {object} GenerateOptions
 * @property {number | null} [maxTokens]  default 256; null: until the end of the answer or a full context
 * @property {number} [temperature]  default 0: greedy
 * @property {number} [topP]
 * @property {number} [topK]
 * @property {number} [minP]
 * @property {number} [seed]
 * @property {string | string[]} [stop]
 * @property {string} [grammar]  GBNF with a root rule
 * @property {object | boolean} [jsonSchema]  a JSON Schema the output must match (true: any JSON value)
 * @property {Record<number, number>} [logitBias]  token id -> bias in [-100, 100], added to its logit first
 * @property {number} [frequencyPenalty]  in [-2, 2], default 0: less this per occurrence in the window
 * @property {number} [presencePenalty]  in [-2, 2], default 0: less this once if in the window
 * @property {number} [repeatPenalty]  > 0, default 1 (off): a repeated token's logit divided by it
 * @property {number} [repeatLastN]  the penalties' window: the history's last N tokens (default 64; 0: off)
 * @property {AbortSignal} [signal]  aborting it cancels the generation
 */

import { InvalidArgumentError, SessionBusyError, SessionClosedError } from "./errors.js";
import { GrpcTransport } from "./grpc.js";
import { HttpTransport } from "./http.js";

export * from "./errors.js";

/**
 * An event of a generation, as a transport reads it.
 * @typedef {{ token: Token } | { done: { finishReason: string, usage: Usage, stopString: string | null } }} GenerateEvent
 */

/**
 * What the client needs of a transport: the session protocol's calls (HttpTransport, GrpcTransport).
 * @typedef {object} Transport
 * @property {(tokens: number[]) => Promise<string>} createSession
 * @property {(text: string, addBos: boolean, special: boolean) => Promise<number[]>} tokenize
 * @property {(id: string, tokens: number[]) => Promise<void>} append
 * @property {(id: string, tokens: number[]) => Promise<void>} sync
 * @property {(id: string) => Promise<string>} fork
 * @property {(id: string) => Promise<SessionInfo>} info
 * @property {(id: string) => Promise<void>} close
 * @property {(id: string, options: GenerateOptions, signal: AbortSignal) => AsyncGenerator<GenerateEvent, void, undefined>} generate
 * @property {() => void} disconnect
 */

// seconds after a cancel during which the session's "busy" answers are retried (the server stops the
// generation a moment later, between two steps)
const CANCEL_SETTLES_MS = 5000;
const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class Client {
  /**
   * @param {string} url  the server: "http://127.0.0.1:8080" (its HTTP/JSON routes), "grpc://127.0.0.1:50051"
   *   or "127.0.0.1:50051" (its --grpc-port); "https://..." or "grpcs://..." for one started with --tls-cert (a
   *   private CA or self-signed certificate: start node with NODE_EXTRA_CA_CERTS=cert.pem)
   * @param {{ apiKey?: string }} [options]  apiKey: the server's --api-key
   */
  constructor(url, options = {}) {
    const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(url);
    const rest = scheme ? url.slice(scheme[0].length) : url;
    const name = scheme ? scheme[1].toLowerCase() : "grpc";
    /** @type {Transport} */
    this.transport =
      name === "http" || name === "https" ? new HttpTransport(url, options.apiKey)
      : name === "grpc" || name === "grpcs" ? new GrpcTransport(`${name === "grpcs" ? "https" : "http"}://${rest.replace(/\/+$/, "")}`, options.apiKey)
      : invalidUrl(url);
  }

  /**
   * A new session, its history set to `tokens`.
   * @param {{ tokens?: number[] }} [options]
   * @returns {Promise<RemoteSession>}
   */
  async createSession(options = {}) {
    return new RemoteSession(this, await this.transport.createSession(options.tokens || []));
  }

  /**
   * A session created earlier, by its id.
   * @param {string} sessionId
   */
  session(sessionId) {
    return new RemoteSession(this, sessionId);
  }

  /**
   * The server's model's token ids of `text` (no template): the pieces of a history, for a client without a
   * tokenizer of its own. `addBos`: the model's BOS token first (if it uses one); `special`: special-token
   * text such as "<start_of_turn>" parsed as those tokens (keep it off for text users typed).
   * @param {string} text
   * @param {{ addBos?: boolean, special?: boolean }} [options]
   * @returns {Promise<number[]>}
   */
  async tokenize(text, options = {}) {
    return await this.transport.tokenize(text, options.addBos || false, options.special || false);
  }

  /** Closes the gRPC connection (a later call opens another); over HTTP, nothing to do. */
  close() {
    this.transport.disconnect();
  }
}

/** @param {string} url @returns {never} */
function invalidUrl(url) {
  throw new InvalidArgumentError(`${url}: the server's URL starts with http://, https:// (HTTP/JSON), grpc:// or ` +
    "grpcs:// (gRPC), or is host:port (gRPC)");
}

/** A session on the server: the in-process Session's methods (append, sync, fork, generate, close). */
export class RemoteSession {
  /**
   * @param {Client} client
   * @param {string} id
   */
  constructor(client, id) {
    this.client = client;
    this.id = id;
    this.closed = false;
    this.cancelledAt = -Infinity;
  }

  /**
   * A call of this session's, its "busy" answers retried right after this object cancelled a generation.
   * @template T
   * @param {(transport: Transport) => Promise<T>} call
   * @returns {Promise<T>}
   */
  async call(call) {
    for (;;) {
      try {
        return await call(this.client.transport);
      } catch (err) {
        if (!(err instanceof SessionBusyError) || !this.settling()) throw err;
      }
      await sleep(10);
    }
  }

  settling() {
    return Date.now() - this.cancelledAt < CANCEL_SETTLES_MS;
  }

  /**
   * Adds tokens to the history (all or nothing).
   * @param {number[]} tokens
   * @returns {Promise<void>}
   */
  async append(tokens) {
    await this.call((t) => t.append(this.id, tokens));
  }

  /**
   * Sets the history to `tokens` (the common prefix kept).
   * @param {number[]} tokens
   * @returns {Promise<void>}
   */
  async sync(tokens) {
    await this.call((t) => t.sync(this.id, tokens));
  }

  /** A new session with the same history, sharing its KV. @returns {Promise<RemoteSession>} */
  async fork() {
    return new RemoteSession(this.client, await this.call((t) => t.fork(this.id)));
  }

  /** @returns {Promise<SessionInfo>} */
  async info() {
    return await this.call((t) => t.info(this.id));
  }

  /**
   * Streams the generated tokens as the server commits them: `for await (const t of session.generate())`.
   * Leaving the loop early (break, return, throw) cancels the generation on the server.
   * @param {GenerateOptions} [options]
   */
  generate(options = {}) {
    return new RemoteGeneration(this, options);
  }

  /**
   * @param {GenerateOptions} [options]
   * @returns {Promise<string>}
   */
  async generateText(options = {}) {
    const generation = this.generate(options);
    for await (const _ of generation); // eslint-disable-line no-unused-vars
    return generation.text;
  }

  /**
   * Closes the session on the server; nothing happens if it is already gone.
   * @returns {Promise<void>}
   */
  async close() {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.call((t) => t.close(this.id));
    } catch (err) {
      if (!(err instanceof SessionClosedError)) throw err;
    }
  }
}

/**
 * One generation: an async iterable of tokens; afterwards `tokens`, `text`, `finishReason`, `usage`,
 * `stopString`.
 */
export class RemoteGeneration {
  /**
   * @param {RemoteSession} session
   * @param {GenerateOptions} options
   */
  constructor(session, options) {
    this.session = session;
    this.options = options;
    /** @type {number[]} */
    this.tokens = [];
    this.text = "";
    /** @type {string | null} eos, length, stop, context_full, grammar, or interrupted (cancelled) */
    this.finishReason = null;
    /** @type {Usage | null} */
    this.usage = null;
    /** @type {string | null} the stop string that ended it (finishReason "stop") */
    this.stopString = null;
    this.failed = false; // the request ended in an error
    this.controller = new AbortController();
    this.onAbort = () => this.cancel();
    if (options.signal?.aborted) this.cancel(); // (nothing will be asked of the server)
    else options.signal?.addEventListener("abort", this.onAbort, { once: true });
  }

  /** Stops the generation on the server (finishReason "interrupted" unless it was over). */
  cancel() {
    if (this.finishReason !== null || this.failed) return;
    this.finishReason = "interrupted";
    this.session.cancelledAt = Date.now();
    this.controller.abort();
  }

  /** @returns {AsyncGenerator<Token, void, undefined>} */
  async *[Symbol.asyncIterator]() {
    try {
      yield* this.events();
    } catch (err) {
      if (this.finishReason === "interrupted" && err instanceof Error && err.name === "AbortError") return;
      this.failed = true; // nothing left to cancel
      throw err;
    } finally {
      this.cancel(); // left early (break, throw): cancel on the server; a no-op after the end
      this.options.signal?.removeEventListener("abort", this.onAbort);
    }
  }

  /** @returns {AsyncGenerator<Token, void, undefined>} */
  async *events() {
    let started = false;
    for (;;) { // a "busy" answer before the first event is retried right after a cancel of this session's
      try {
        const transport = this.session.client.transport;
        for await (const event of transport.generate(this.session.id, this.options, this.controller.signal)) {
          started = true;
          if ("done" in event) {
            this.finishReason = event.done.finishReason;
            this.usage = event.done.usage;
            this.stopString = event.done.stopString;
          } else {
            this.tokens.push(event.token.id);
            this.text += event.token.text;
            yield event.token;
          }
        }
        return;
      } catch (err) {
        if (started || !(err instanceof SessionBusyError) || !this.session.settling()) throw err;
      }
      await sleep(10);
    }
  }
}
