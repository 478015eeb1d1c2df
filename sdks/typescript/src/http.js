// The session protocol over `pyllamaopt serve`'s HTTP/JSON routes (/v1/sessions), with Node's fetch.
import { ServerError, httpError } from "./errors.js";

/**
 * @typedef {import("./index.js").GenerateOptions} GenerateOptions
 * @typedef {import("./index.js").GenerateEvent} GenerateEvent
 * @typedef {import("./index.js").SessionInfo} SessionInfo
 */

export class HttpTransport {
  /**
   * @param {string} url  "http://host:port" or "https://host:port"
   * @param {string | undefined} apiKey
   */
  constructor(url, apiKey) {
    this.url = url.replace(/\/+$/, "");
    /** @type {Record<string, string>} */
    this.headers = { "content-type": "application/json" };
    if (apiKey) this.headers.authorization = `Bearer ${apiKey}`;
  }

  /** @param {number[]} tokens @returns {Promise<string>} */
  async createSession(tokens) {
    return (await this.request("POST", "/v1/sessions", { tokens })).session_id;
  }

  /** @param {string} text @param {boolean} addBos @param {boolean} special @returns {Promise<number[]>} */
  async tokenize(text, addBos, special) {
    return (await this.request("POST", "/v1/tokenize", { text, add_bos: addBos, special })).tokens;
  }

  /** @param {string} id @param {number[]} tokens */
  async append(id, tokens) {
    await this.request("POST", sessionPath(id, "/tokens"), { tokens });
  }

  /** @param {string} id @param {number[]} tokens */
  async sync(id, tokens) {
    await this.request("POST", sessionPath(id, "/sync"), { tokens });
  }

  /** @param {string} id @returns {Promise<string>} */
  async fork(id) {
    return (await this.request("POST", sessionPath(id, "/fork"))).session_id;
  }

  /** @param {string} id @returns {Promise<SessionInfo>} */
  async info(id) {
    return await this.request("GET", sessionPath(id, ""));
  }

  /** @param {string} id */
  async close(id) {
    await this.request("DELETE", sessionPath(id, ""));
  }

  /**
   * The generation's events as the server sends them (an SSE stream); aborting `signal` cancels it.
   * @param {string} id
   * @param {GenerateOptions} options
   * @param {AbortSignal} signal
   * @returns {AsyncGenerator<GenerateEvent, void, undefined>}
   */
  async *generate(id, options, signal) {
    const response = await this.fetch("POST", sessionPath(id, "/generate"), generateBody(options), signal);
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
          signal.throwIfAborted(); // cancelled: the rest of what came in the same read is not the caller's
          if (!line.startsWith("data: ")) continue;
          const data = JSON.parse(line.slice(6));
          if (data.error) throw httpError(200, data); // after the stream started: the last event
          if (data.finish_reason !== undefined) {
            yield { done: { finishReason: data.finish_reason, usage: data.usage, stopString: data.stop_string ?? null } };
          } else {
            yield { token: { id: data.token, text: data.text } };
          }
        }
      }
    }
  }

  disconnect() {} // nothing to release: fetch keeps its own connections

  /**
   * @param {string} method
   * @param {string} path
   * @param {object} [body]
   * @returns {Promise<any>}
   */
  async request(method, path, body) {
    const response = await this.fetch(method, path, body);
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
      throw httpError(response.status, parsed);
    }
    return response;
  }
}

/** @param {string} id @param {string} rest */
const sessionPath = (id, rest) => `/v1/sessions/${encodeURIComponent(id)}${rest}`;

/** @param {GenerateOptions} o */
function generateBody(o) {
  /** @type {Record<string, unknown>} */
  const body = { stream: true, max_tokens: o.maxTokens === undefined ? 256 : o.maxTokens };
  if (o.temperature !== undefined) body.temperature = o.temperature;
  if (o.topP !== undefined) body.top_p = o.topP;
  if (o.topK !== undefined) body.top_k = o.topK;
  if (o.minP !== undefined) body.min_p = o.minP;
  if (o.seed !== undefined) body.seed = o.seed;
  if (o.stop !== undefined) body.stop = o.stop;
  if (o.grammar !== undefined) body.grammar = o.grammar;
  if (o.logitBias !== undefined) body.logit_bias = o.logitBias;
  if (o.frequencyPenalty !== undefined) body.frequency_penalty = o.frequencyPenalty;
  if (o.presencePenalty !== undefined) body.presence_penalty = o.presencePenalty;
  if (o.repeatPenalty !== undefined) body.repeat_penalty = o.repeatPenalty;
  if (o.repeatLastN !== undefined) body.repeat_last_n = o.repeatLastN;
  if (o.jsonSchema !== undefined) {
    body.response_format = { type: "json_schema", json_schema: { schema: o.jsonSchema } };
  }
  return body;
}
