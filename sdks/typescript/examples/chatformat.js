// How a conversation becomes the tokens of one session: a model family's turn markup, kept in the
// application (specification 003 §2.4, §3.4: the server applies no chat template). The examples
// only ever *append* to their session: the model's replies stay in the history as the very tokens
// it wrote (no re-rendering of earlier turns), so each turn computes only its own new tokens.
//
// Tokens come from the server's tokenizer (client.tokenize): markup with special: true (so that
// "<|im_start|>" is that one token), what a user typed with special: false (so that a user cannot
// forge markup). detect() picks the format the served model's vocabulary has.
import { parseArgs } from "node:util";

import { Client } from "../src/index.js";

/** @typedef {[string, boolean]} Piece  text, and whether special-token text in it is parsed as those tokens */

export class ChatFormat {
  /**
   * @param {string} name
   * @param {{ begin: string, end: string, separator: string, roles: Record<string, string>, marker?: string,
   *           bos?: boolean, stop?: string[] }} markup
   *   begin opens a turn ({role}: the format's name of the role); end closes it (the marker the model writes
   *   when its reply is over), separator follows it; bos: the history starts with the model's BOS token;
   *   stop: for a model that ends its reply with text, not a token
   */
  constructor(name, markup) {
    this.name = name;
    this.begin = markup.begin;
    this.end = markup.end;
    this.separator = markup.separator;
    this.roles = markup.roles;
    this.marker = markup.marker || "";
    this.bos = markup.bos || false;
    this.stop = markup.stop || [];
  }

  /**
   * The system message, where the family has a role for it (else userTurn puts it before the first user
   * message); tokens(..., { bos: fmt.bos }) adds the BOS token.
   * @param {string | null} system
   * @returns {Piece[]}
   */
  opening(system) {
    return system && "system" in this.roles ? this.turn("system", system) : [];
  }

  /**
   * @param {string} role
   * @param {string} text
   * @returns {Piece[]}
   */
  turn(role, text) {
    return [[this.begin.replace("{role}", this.roles[role]), true], [text, false], [this.end + this.separator, true]];
  }

  /**
   * A user message and the header of the reply that follows it (the generation prompt).
   * @param {string} text
   * @param {string | null} [system]
   * @returns {Piece[]}
   */
  userTurn(text, system = null) {
    if (system && !("system" in this.roles)) text = `${system}\n\n${text}`;
    return [...this.turn("user", text), [this.begin.replace("{role}", this.roles.assistant), true]];
  }

  /**
   * What closes the model's turn in the history: the separator after the end marker the model wrote, or
   * the end marker too when the reply was cut short (maxTokens, a cancel).
   * @param {string | null} finishReason
   * @returns {Piece[]}
   */
  afterReply(finishReason) {
    const wroteEnd = finishReason === "eos" || (finishReason === "stop" && this.stop.length > 0);
    return [[wroteEnd ? this.separator : this.end + this.separator, true]];
  }
}

export const FORMATS = [
  new ChatFormat("chatml", { // SmolLM2, Qwen...
    begin: "<|im_start|>{role}\n", end: "<|im_end|>", separator: "\n", marker: "<|im_start|>",
    roles: { system: "system", user: "user", assistant: "assistant" },
  }),
  new ChatFormat("gemma", { // no system role
    begin: "<start_of_turn>{role}\n", end: "<end_of_turn>", separator: "\n", marker: "<start_of_turn>", bos: true,
    roles: { user: "user", assistant: "model" },
  }),
];
// a model without chat markup (a base model, the test suite's tiny model): one line per turn
export const PLAIN = new ChatFormat("plain", {
  begin: "{role}: ", end: "\n", separator: "", bos: true, stop: ["\n"],
  roles: { system: "System", user: "User", assistant: "Assistant" },
});

/**
 * The format whose marker the served model's vocabulary has as one special token.
 * @param {Client} client
 */
export async function detect(client) {
  for (const fmt of FORMATS) {
    if ((await client.tokenize(fmt.marker, { special: true })).length === 1) return fmt;
  }
  return PLAIN;
}

/**
 * The token ids of the pieces, after the model's BOS token with bos (the start of a history).
 * @param {Client} client
 * @param {Piece[]} pieces
 * @param {{ bos?: boolean }} [options]
 */
export async function tokens(client, pieces, options = {}) {
  const ids = options.bos ? await client.tokenize("", { addBos: true }) : [];
  for (const [text, special] of pieces) {
    if (text) ids.push(...(await client.tokenize(text, { special })));
  }
  return ids;
}

/**
 * The command line every example takes: --url (the server: its HTTP address, or host:port of its
 * --grpc-port), --api-key, and the example's
 * own options; positionals follow.
 * @param {Record<string, { type: "string" | "boolean", default?: string | boolean }>} [options]
 */
export function commandLine(options = {}) {
  const { values, positionals } = parseArgs({
    options: { url: { type: "string", default: "http://127.0.0.1:8080" }, "api-key": { type: "string" }, ...options },
    allowPositionals: true,
  });
  const apiKey = values["api-key"];
  const client = new Client(String(values.url), typeof apiKey === "string" ? { apiKey } : {});
  return { client, values, positionals };
}
