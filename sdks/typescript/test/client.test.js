// The TypeScript (JavaScript + JSDoc) client against real `pyllamaopt serve` processes: the one at
// PYLLAMAOPT_URL and, for the TTL test, one started with --session-ttl 1 at PYLLAMAOPT_TTL_URL, if set
// (tests/test_grpc.py runs this file that way, on the tiny test model); else they are started here on
// free ports (PYTHON, default python3; the model: LLAMA_OPT_MODEL, default gemma3-270m).
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import {
  Client, ContextOverflowError, InvalidArgumentError, InvalidTokenError, PyllamaoptError, SessionBusyError,
  SessionClosedError,
} from "../src/index.js";

/** @type {import("node:child_process").ChildProcess[]} */
const servers = [];
let url = process.env.PYLLAMAOPT_URL || "";
const PROMPT = Array.from({ length: 200 }, (_, i) => 10 + i);

/** @returns {Promise<number>} */
function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const address = s.address();
      s.close(() => (address && typeof address === "object" ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/**
 * A server process on a free port; resolves to its URL once it answers.
 * @param {string[]} args  more options of `pyllamaopt serve`
 * @returns {Promise<string>}
 */
async function startServer(args = []) {
  const port = await freePort();
  const started = `http://127.0.0.1:${port}`;
  const server = spawn(process.env.PYTHON || "python3",
    ["-m", "pyllamaopt.cli", "serve", "--port", String(port), "--model", process.env.LLAMA_OPT_MODEL || "gemma3-270m",
      "--n-ctx", "1024", "--threads", "2", ...args], { stdio: "inherit", cwd: "/" });
  servers.push(server);
  const deadline = Date.now() + 120_000;
  for (;;) {
    try {
      if ((await fetch(`${started}/health`)).ok) return started;
    } catch { /* not up yet */ }
    if (Date.now() > deadline || server.exitCode !== null) throw new Error("the server did not start");
    await sleep(200);
  }
}

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

before(async () => {
  if (!url) url = await startServer();
});

after(() => {
  for (const server of servers) server.kill("SIGTERM");
});

/**
 * @param {import("../src/index.js").RemoteSession} session
 * @param {number} n
 */
async function greedy(session, n) {
  const ids = [];
  for await (const t of session.generate({ maxTokens: n })) ids.push(t.id);
  return ids;
}

test("INV-3: initial tokens, one append, many appends generate the same tokens", async () => {
  const client = new Client(url);
  const initial = await client.createSession({ tokens: PROMPT });
  const one = await client.createSession();
  await one.append(PROMPT);
  const many = await client.createSession();
  for (let i = 0; i < PROMPT.length; i += 37) await many.append(PROMPT.slice(i, i + 37));
  const answers = [];
  for (const session of [initial, one, many]) {
    assert.deepEqual((await session.info()).tokens, PROMPT);
    answers.push(await greedy(session, 10));
    await session.close();
  }
  assert.equal(answers[0].length, 10);
  assert.deepEqual(answers[1], answers[0]);
  assert.deepEqual(answers[2], answers[0]);
});

test("a generation's attributes, sync, fork, tokenize", async () => {
  const client = new Client(url);
  const words = await client.tokenize("hello world");
  assert.ok(words.length > 0 && words.every(Number.isInteger));
  const withBos = await client.tokenize("hello world", { addBos: true }); // BOS first, if the model uses one
  assert.deepEqual(withBos.slice(withBos.length - words.length), words);
  const session = await client.createSession({ tokens: PROMPT.slice(0, 100) });
  await session.sync(PROMPT.slice(0, 70));
  const forked = await session.fork();
  await forked.append([5]);
  assert.equal((await session.info()).n_tokens, 70);
  assert.equal((await forked.info()).n_tokens, 71);
  const generation = session.generate({ maxTokens: 4 });
  const tokens = [];
  for await (const t of generation) tokens.push(t);
  assert.equal(generation.finishReason, "length");
  assert.deepEqual(generation.tokens, tokens.map((t) => t.id));
  assert.equal(generation.text, tokens.map((t) => t.text).join(""));
  assert.equal(generation.usage && generation.usage.completion_tokens, 4);
  await forked.close();
  await session.close();
});

test("cancelling mid-stream stops the generation; the session stays usable", async () => {
  const client = new Client(url);
  const session = await client.createSession({ tokens: PROMPT.slice(0, 40) });
  // a grammar that never ends: about a second of generation, unless cancelled
  const generation = session.generate({ maxTokens: 250, grammar: "root ::= [a-z] root" });
  const first = [];
  for await (const t of generation) {
    first.push(t.id);
    if (first.length === 3) break; // cancels on the server
  }
  assert.equal(generation.finishReason, "interrupted");
  const deadline = Date.now() + 10_000;
  while ((await session.info()).busy !== null) {
    assert.ok(Date.now() < deadline, "the generation did not stop");
    await sleep(50);
  }
  const info = await session.info();
  assert.ok(info.stats.tokens_generated < 125, `it did not stop early: ${info.stats.tokens_generated} tokens`);
  assert.deepEqual(info.tokens.slice(0, 43), [...PROMPT.slice(0, 40), ...first]);
  assert.equal((await greedy(session, 2)).length, 2);
  await session.close();
});

test("errors are the pyllamaopt classes", async () => {
  const client = new Client(url);
  await assert.rejects(client.session("no-such-session").info(), SessionClosedError);
  const session = await client.createSession({ tokens: PROMPT.slice(0, 40) });
  await assert.rejects(session.append([5, 10 ** 7]), InvalidTokenError);
  await assert.rejects(greedy(session, -1), InvalidArgumentError);
  await assert.rejects(session.append(new Array(2000).fill(7)), ContextOverflowError);
  // a grammar that never ends keeps the generation going for about a second (a stalled reader does not
  // pause it: the connection buffers far more than the server's 16 tokens ahead)
  const running = session.generate({ maxTokens: 250, grammar: "root ::= [a-z] root" });
  const iterator = running[Symbol.asyncIterator]();
  await iterator.next();
  await assert.rejects(session.append([5]), (err) => err instanceof SessionBusyError && err.status === 409);
  await iterator.return(undefined);
  await session.close();
  await assert.rejects(session.info(), (err) => err instanceof SessionClosedError && err instanceof PyllamaoptError);
  await session.close(); // closing what is gone is not an error
});

test("a session idle beyond the TTL is not found: SessionClosedError (404)", async () => {
  const client = new Client(process.env.PYLLAMAOPT_TTL_URL || await startServer(["--session-ttl", "1"]));
  const session = await client.createSession({ tokens: PROMPT.slice(0, 10) });
  assert.equal((await session.info()).n_tokens, 10);
  await sleep(2000); // idle beyond the TTL; the server sweeps every TTL/4
  await assert.rejects(session.info(), (err) => err instanceof SessionClosedError && err.status === 404);
  await assert.rejects(session.append([5]), SessionClosedError);
  await session.close(); // closing what is gone is not an error
});
