// Client of `pyllamaopt serve`'s session protocol (specification 003 §2.2) for Node 20+, over its
// HTTP/JSON transport (/v1/sessions) with Node's own fetch and streams: no dependencies.
//
//   import { Client } from "pyllamaopt-client";
//   const client = new Client("http://127.0.0.1:8080");
//   const session = await client.createSession({ tokens: promptIds });
//   await session.append(moreIds);
//   for await (const t of session.generate({ maxTokens: 64 })) process.stdout.write(t.text);
//   await session.close();
//
// Errors are the pyllamaopt exception classes of the Python package (errors.py), by the name the
// server sends (error.pyllamaopt_error), else by HTTP status.

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
 * @property {AbortSignal} [signal]  aborting it cancels the generation
 */

/** Base class of every error of this client. */
export class PyllamaoptError extends Error {
  /**
   * @param {string} message
   * @param {number | null} status  the HTTP status (null: no answer)
   * @param {string | null} type  the server's error type ("not_found_error", ...)
   */
  constructor(message, status = null, type = null) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.type = type;
  }
}
export class InvalidArgumentError extends PyllamaoptError {}
export class InvalidTokenError extends PyllamaoptError {}
export class GrammarError extends PyllamaoptError {}
export class ContextOverflowError extends PyllamaoptError {}
/** The session was never created, or was closed, expired or evicted: create a new one. */
export class SessionClosedError extends PyllamaoptError {}
export class SessionEvictedError extends SessionClosedError {}
/** Errors only a server gives. */
export class ServerError extends PyllamaoptError {}
/** A generation (or prefill) is in progress on the session: retry when it ends. */
export class SessionBusyError extends ServerError {}
/** The server has no room now: retry later. */
export class ServerOverloadedError extends ServerError {}
/** 003 §2.8: the session's KV was found inconsistent (a bug); it was closed. */
export class InvariantViolationError extends ServerError {}
export class AuthenticationError extends ServerError {}

/** @type {Record<string, typeof PyllamaoptError>} */
const BY_NAME = {
  InvalidArgumentError, InvalidTokenError, GrammarError, ContextOverflowError, SessionClosedError,
  SessionEvictedError, SessionBusyError, ServerOverloadedError, InvariantViolationError, AuthenticationError,
};
/** @type {Record<number, typeof PyllamaoptError>} */
const BY_STATUS = {
  400: InvalidArgumentError, 401: AuthenticationError, 404: SessionClosedError, 409: SessionBusyError,
  500: InvariantViolationError, 503: ServerOverloadedError,
};

/**
 * @param {number} status
 * @param {any} body
 * @returns {PyllamaoptError}
 */
function toError(status, body) {
  const error = (body && body.error) || {};
  const cls = BY_NAME[error.pyllamaopt_error] || BY_STATUS[status] || ServerError;
  return new cls(error.message || `HTTP ${status}`, status, error.type || null);
}

// seconds after a cancel during which the session's "busy" answers are retried (the server stops the
// generation a moment later, between two steps)
const CANCEL_SETTLES_MS = 5000;
const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class Client {
  /**
   * @param {string} url  the server, e.g. "http://127.0.0.1:8080", or "https://..." for one started with
   *   --tls-cert (a private CA or self-signed certificate: start node with NODE_EXTRA_CA_CERTS=cert.pem)
   * @param {{ apiKey?: string }} [options]  apiKey: the server's --api-key
   */
  constructor(url, options = {}) {
    this.url = url.replace(/\/+$/, "");
    /** @type {Record<string, string>} */
    this.headers = { "content-type": "application/json" };
    if (options.apiKey) this.headers.authorization = `Bearer ${options.apiKey}`;
  }

  /**
   * A new session, its history set to `tokens`.
   * @param {{ tokens?: number[] }} [options]
   * @returns {Promise<RemoteSession>}
   */
  async createSession(options = {}) {
    const body = await this.request("POST", "/v1/sessions", { tokens: options.tokens || [] });
    return new RemoteSession(this, body.session_id);
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
    const body = await this.request("POST", "/v1/tokenize",
      { text, add_bos: options.addBos || false, special: options.special || false });
    return body.tokens;
  }

  /**
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @param {AbortSignal} [signal]
   * @returns {Promise<any>}
   */
  async request(method, path, body, signal) {
    const response = await this.fetch(method, path, body, signal);
    const text = await response.text();
    return text ? JSON.parse(text) : {};
  }

  /**
   * The response of a request that succeeded (its body unread), else the error it answered.
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @param {AbortSignal} [signal]
   * @returns {Promise<Response>}
   */
  async fetch(method, path, body, signal) {
    let response;
    try {
      response = await fetch(this.url + path, {
        method, headers: this.headers, body: body === undefined ? undefined : JSON.stringify(body), signal,
      });
    } catch (err) {
      if (err instanceof Error && err.name === "AbortError") throw err;
      throw new ServerError(`cannot reach ${this.url}: ${err instanceof Error ? err.message : err}`);
    }
    if (!response.ok) {
      const text = await response.text();
      let parsed = null;
      try { parsed = JSON.parse(text); } catch { /* not JSON */ }
      throw toError(response.status, parsed);
    }
    return response;
  }
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
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @returns {Promise<any>}
   */
  async call(method, path, body) {
    for (;;) {
      try {
        return await this.client.request(method, `/v1/sessions/${encodeURIComponent(this.id)}${path}`, body);
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
    await this.call("POST", "/tokens", { tokens });
  }

  /**
   * Sets the history to `tokens` (the common prefix kept).
   * @param {number[]} tokens
   * @returns {Promise<void>}
   */
  async sync(tokens) {
    await this.call("POST", "/sync", { tokens });
  }

  /** A new session with the same history, sharing its KV. @returns {Promise<RemoteSession>} */
  async fork() {
    const body = await this.call("POST", "/fork");
    return new RemoteSession(this.client, body.session_id);
  }

  /** @returns {Promise<SessionInfo>} */
  async info() {
    return await this.call("GET", "");
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
      await this.call("DELETE", "");
    } catch (err) {
      if (!(err instanceof SessionClosedError)) throw err;
    }
  }
}

/** One generation: an async iterable of tokens; afterwards `tokens`, `text`, `finishReason`, `usage`. */
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
    this.failed = false; // the request ended in an error
    this.controller = new AbortController();
    if (options.signal) options.signal.addEventListener("abort", () => this.cancel(), { once: true });
  }

  body() {
    const o = this.options;
    /** @type {Record<string, unknown>} */
    const body = { stream: true, max_tokens: o.maxTokens === undefined ? 256 : o.maxTokens };
    if (o.temperature !== undefined) body.temperature = o.temperature;
    if (o.topP !== undefined) body.top_p = o.topP;
    if (o.topK !== undefined) body.top_k = o.topK;
    if (o.minP !== undefined) body.min_p = o.minP;
    if (o.seed !== undefined) body.seed = o.seed;
    if (o.stop !== undefined) body.stop = o.stop;
    if (o.grammar !== undefined) body.grammar = o.grammar;
    if (o.jsonSchema !== undefined) {
      body.response_format = { type: "json_schema", json_schema: { schema: o.jsonSchema } };
    }
    return body;
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
    }
  }

  /** @returns {AsyncGenerator<Token, void, undefined>} */
  async *events() {
    const path = `/v1/sessions/${encodeURIComponent(this.session.id)}/generate`;
    let response;
    for (;;) {
      try {
        response = await this.session.client.fetch("POST", path, this.body(), this.controller.signal);
        break;
      } catch (err) {
        if (!(err instanceof SessionBusyError) || !this.session.settling()) throw err;
      }
      await sleep(10);
    }
    if (!response.body) throw new ServerError("the server's answer has no body");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = JSON.parse(line.slice(6));
          if (data.error) throw toError(200, data); // after the stream started: the last event
          if (data.finish_reason !== undefined) {
            this.finishReason = data.finish_reason;
            this.usage = data.usage;
          } else {
            this.tokens.push(data.token);
            this.text += data.text;
            yield { id: data.token, text: data.text };
          }
        }
      }
    }
  }
}
