// The TypeScript (JavaScript + JSDoc) client against real `pyllamaopt serve` processes, every test over
// both transports: the server at PYLLAMAOPT_URL (HTTP) and PYLLAMAOPT_GRPC_URL (its --grpc-port), for
// the TTL test one started with --session-ttl 3 at PYLLAMAOPT_TTL_URL and PYLLAMAOPT_TTL_GRPC_URL, for
// API keys one with --api-key at PYLLAMAOPT_KEY_URL and PYLLAMAOPT_KEY_GRPC_URL (key "sesame"), if set
// (tests/test_grpc.py runs this file that way, on the tiny test model); else they are started here on
// free ports (PYTHON, default python3; the model: LLAMA_OPT_MODEL, default gemma3-270m).
import { spawn, spawnSync } from "node:child_process";
import { createServer } from "node:net";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import {
  AuthenticationError, Client, ContextOverflowError, InvalidArgumentError, InvalidTokenError, PyllamaoptError,
  ServerError, SessionBusyError, SessionClosedError,
} from "../src/index.js";

/** @type {import("node:child_process").ChildProcess[]} */
const servers = [];
/** @typedef {{ http: string, grpc: string }} Urls  a server's two transports */
/** @type {Urls} */
const urls = { http: process.env.PYLLAMAOPT_URL || "", grpc: process.env.PYLLAMAOPT_GRPC_URL || "" };
const TRANSPORTS = /** @type {const} */ (["http", "grpc"]);
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
 * A server process on free ports; resolves to its URLs once it answers.
 * @param {string[]} args  more options of `pyllamaopt serve`
 * @returns {Promise<Urls>}
 */
async function startServer(args = []) {
  const [port, grpcPort] = [await freePort(), await freePort()];
  const started = { http: `http://127.0.0.1:${port}`, grpc: `127.0.0.1:${grpcPort}` };
  const server = spawn(process.env.PYTHON || "python3",
    ["-m", "pyllamaopt.cli", "serve", "--port", String(port), "--grpc-port", String(grpcPort),
      "--model", process.env.LLAMA_OPT_MODEL || "gemma3-270m", "--n-ctx", "1024", "--threads", "2", ...args],
    { stdio: "inherit", cwd: "/" });
  servers.push(server);
  const deadline = Date.now() + 120_000;
  for (;;) {
    try {
      if ((await fetch(`${started.http}/health`)).ok) return started;
    } catch { /* not up yet */ }
    if (Date.now() > deadline || server.exitCode !== null) throw new Error("the server did not start");
    await sleep(200);
  }
}

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

before(async () => {
  if (!urls.http || !urls.grpc) Object.assign(urls, await startServer());
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

/** @type {Record<string, number | string>} the HTTP status and the gRPC code of each error checked below */
const BUSY = { http: 409, grpc: "ABORTED" }, NOT_FOUND = { http: 404, grpc: "NOT_FOUND" };

/**
 * The transport's part of an error: its HTTP status or its gRPC code.
 * @param {"http" | "grpc"} transport
 * @param {unknown} err
 */
const answered = (transport, err) =>
  err instanceof PyllamaoptError ? (transport === "http" ? err.status : err.grpcCode) : undefined;

for (const transport of TRANSPORTS) {
  test(`${transport}: INV-3: initial tokens, one append, many appends generate the same tokens`, async () => {
    const client = new Client(urls[transport]);
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

  test(`${transport}: a generation's attributes, sync, fork, tokenize, info`, async () => {
    const client = new Client(urls[transport]);
    const words = await client.tokenize("hello world");
    assert.ok(words.length > 0 && words.every(Number.isInteger));
    const withBos = await client.tokenize("hello world", { addBos: true }); // BOS first, if the model uses one
    assert.deepEqual(withBos.slice(withBos.length - words.length), words);
    const session = await client.createSession({ tokens: PROMPT.slice(0, 100) });
    await session.sync(PROMPT.slice(0, 70));
    const forked = await session.fork();
    await forked.append([5]);
    const info = await session.info();
    assert.equal(info.n_tokens, 70);
    assert.equal(info.session_id, session.id);
    assert.equal(info.busy, null);
    assert.equal(info.approx_from, null);
    assert.ok(info.kv_bytes > 0 && Number.isInteger(info.stats.tokens_prefilled), JSON.stringify(info.stats));
    assert.equal((await forked.info()).n_tokens, 71);
    const generation = session.generate({ maxTokens: 4 });
    const tokens = [];
    for await (const t of generation) tokens.push(t);
    assert.equal(generation.finishReason, "length");
    assert.equal(generation.stopString, null);
    assert.deepEqual(generation.tokens, tokens.map((t) => t.id));
    assert.equal(generation.text, tokens.map((t) => t.text).join(""));
    assert.equal(generation.usage && generation.usage.completion_tokens, 4);
    assert.equal(generation.usage && generation.usage.approximate, false);
    await forked.close();
    await session.close();
  });

  test(`${transport}: sampling options, stop strings, grammars and JSON Schemas reach the server`, async () => {
    const client = new Client(urls[transport]);
    const session = await client.createSession({ tokens: PROMPT.slice(0, 30) });
    const sampled = async () => {
      const g = session.generate({ maxTokens: 6, temperature: 0.9, topP: 0.8, topK: 20, minP: 0.01, seed: 1234 });
      for await (const _ of g); // eslint-disable-line no-unused-vars
      await session.sync(PROMPT.slice(0, 30));
      return g.tokens;
    };
    assert.deepEqual(await sampled(), await sampled()); // the same seed, the same tokens
    const stopped = session.generate({ maxTokens: 40, grammar: 'root ::= "ab" "cd" [a-z]*', stop: ["cd"] });
    for await (const _ of stopped); // eslint-disable-line no-unused-vars
    assert.equal(stopped.finishReason, "stop");
    assert.equal(stopped.stopString, "cd");
    assert.equal(stopped.text, "ab");
    await session.sync(PROMPT.slice(0, 30));
    const schema = { type: "object", properties: { n: { type: "integer" } }, required: ["n"], additionalProperties: false };
    const json = session.generate({ maxTokens: 40, jsonSchema: schema });
    for await (const _ of json); // eslint-disable-line no-unused-vars
    assert.ok(Number.isInteger(JSON.parse(json.text).n), json.text); // the schema reached the server: its
    // grammar forced an object of one integer (the tiny model alone writes no JSON)
    await session.sync(PROMPT.slice(0, 30));
    const unbounded = session.generate({ maxTokens: null, grammar: 'root ::= "x"' });
    for await (const _ of unbounded); // eslint-disable-line no-unused-vars
    assert.equal(unbounded.text, "x");
    await session.close();
  });

  test(`${transport}: logit bias and penalties reach the server: the answer of /v1/completions`, async () => {
    const client = new Client(urls[transport]);
    const prompt = PROMPT.slice(0, 90);
    const session = await client.createSession({ tokens: prompt });
    /** @param {import("../src/index.js").GenerateOptions} options */
    const generated = async (options) => {
      await session.sync(prompt);
      const g = session.generate(options);
      for await (const _ of g); // eslint-disable-line no-unused-vars
      return g;
    };
    const plain = await generated({ maxTokens: 16 });
    const banned = [...new Set(plain.tokens.slice(0, 6))];
    const logitBias = Object.fromEntries(banned.map((t) => [t, -100]));
    for (const sampling of [{}, { temperature: 1.5, seed: 3 }]) {
      const biased = await generated({ maxTokens: 16, logitBias, ...sampling });
      assert.ok(!biased.tokens.some((t) => banned.includes(t)), `${biased.tokens} has one of ${banned}`);
    }
    const penalties = { frequencyPenalty: 1.5, presencePenalty: 0.5, repeatPenalty: 1.25, repeatLastN: 32 };
    const penalized = await generated({ maxTokens: 24, ...penalties });
    const completion = await (await fetch(`${urls.http}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt, max_tokens: 24, frequency_penalty: 1.5, presence_penalty: 0.5, repeat_penalty: 1.25,
        repeat_last_n: 32 }),
    })).json();
    assert.equal(penalized.text, completion.choices[0].text);
    assert.notEqual(penalized.text, (await generated({ maxTokens: 24 })).text); // the penalties changed it
    await assert.rejects(generated({ maxTokens: 2, frequencyPenalty: 3 }),
      (err) => err instanceof InvalidArgumentError && /frequency_penalty/.test(err.message));
    await assert.rejects(generated({ maxTokens: 2, logitBias: { 5: 101 } }),
      (err) => err instanceof InvalidArgumentError && /logit_bias/.test(err.message));
    await session.close();
  });

  test(`${transport}: cancelling mid-stream stops the generation; the session stays usable`, async () => {
    const client = new Client(urls[transport]);
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
    // an AbortSignal cancels as well
    const controller = new AbortController();
    const aborted = session.generate({ maxTokens: 250, grammar: "root ::= [a-z] root", signal: controller.signal });
    let n = 0;
    for await (const _ of aborted) if (++n === 2) controller.abort(); // eslint-disable-line no-unused-vars
    assert.equal(aborted.finishReason, "interrupted");
    assert.ok(n < 100, `${n} tokens after the abort`);
    assert.equal((await greedy(session, 2)).length, 2); // busy answers right after a cancel are retried
    const already = new AbortController();
    already.abort();
    const never = session.generate({ maxTokens: 5, signal: already.signal }); // (it ran to its end)
    for await (const _ of never) assert.fail("a generation whose signal was aborted before it started"); // eslint-disable-line no-unused-vars
    assert.equal(never.finishReason, "interrupted");
    await session.close();
  });

  test(`${transport}: cancelled after any number of tokens, the session takes the next generation at once`, async () => {
    // the cancel and the next call race to the server: the next must never meet the cancelled one
    const client = new Client(urls[transport]);
    const session = await client.createSession({ tokens: PROMPT.slice(0, 40) });
    for (let k = 1; k <= 16; k++) {
      await session.sync(PROMPT.slice(0, 40));
      const controller = new AbortController(); // half of them cancelled by the signal, half by leaving the loop
      const generation = session.generate({ maxTokens: 250, grammar: "root ::= [a-z] root", signal: controller.signal });
      const read = [];
      for await (const t of generation) {
        read.push(t.id);
        if (read.length < k) continue;
        if (k % 2) break;
        controller.abort();
      }
      assert.equal(generation.finishReason, "interrupted");
      assert.equal((await greedy(session, 1)).length, 1);
      assert.deepEqual((await session.info()).tokens.slice(40, 40 + k), read);
    }
    await session.close();
  });

  test(`${transport}: errors are the pyllamaopt classes`, async () => {
    const client = new Client(urls[transport]);
    await assert.rejects(client.session("no-such-session").info(),
      (err) => err instanceof SessionClosedError && answered(transport, err) === NOT_FOUND[transport]);
    const session = await client.createSession({ tokens: PROMPT.slice(0, 40) });
    await assert.rejects(session.append([5, 10 ** 7]), InvalidTokenError);
    await assert.rejects(greedy(session, -1), InvalidArgumentError);
    await assert.rejects(session.append(new Array(2000).fill(7)), ContextOverflowError);
    // a grammar that never ends keeps the generation going (for about a second; over gRPC a stalled
    // reader holds it after a few dozen tokens, still generating: busy)
    const running = session.generate({ maxTokens: 250, grammar: "root ::= [a-z] root" });
    const iterator = running[Symbol.asyncIterator]();
    await iterator.next();
    await assert.rejects(session.append([5]),
      (err) => err instanceof SessionBusyError && answered(transport, err) === BUSY[transport]);
    await iterator.return(undefined);
    await session.close();
    await assert.rejects(session.info(), (err) => err instanceof SessionClosedError && err instanceof PyllamaoptError);
    await session.close(); // closing what is gone is not an error
    assert.deepEqual((await client.tokenize("")).length, 0); // the client still works after its errors
  });

  test(`${transport}: a session idle beyond the TTL is not found: SessionClosedError`, async () => {
    const ttl = process.env.PYLLAMAOPT_TTL_URL
      ? { http: process.env.PYLLAMAOPT_TTL_URL, grpc: process.env.PYLLAMAOPT_TTL_GRPC_URL || "" }
      : await startServer(["--session-ttl", "3"]);
    const client = new Client(ttl[transport]);
    const session = await client.createSession({ tokens: PROMPT.slice(0, 10) });
    assert.equal((await session.info()).n_tokens, 10);
    await sleep(5000); // idle beyond the TTL; the server sweeps every TTL/4
    await assert.rejects(session.info(),
      (err) => err instanceof SessionClosedError && answered(transport, err) === NOT_FOUND[transport]);
    await assert.rejects(session.append([5]), SessionClosedError);
    await session.close(); // closing what is gone is not an error
  });

  test(`${transport}: a server with an API key answers only calls that carry it`, async () => {
    const keyed = process.env.PYLLAMAOPT_KEY_URL
      ? { http: process.env.PYLLAMAOPT_KEY_URL, grpc: process.env.PYLLAMAOPT_KEY_GRPC_URL || "" }
      : await startServer(["--api-key", "sesame"]);
    await assert.rejects(new Client(keyed[transport]).createSession(), AuthenticationError);
    await assert.rejects(new Client(keyed[transport], { apiKey: "wrong" }).tokenize("a"), AuthenticationError);
    const session = await new Client(keyed[transport], { apiKey: "sesame" }).createSession({ tokens: [5, 6] });
    assert.equal((await session.info()).n_tokens, 2);
    await session.close();
  });
}

test("a server that is not there: ServerError saying which, over both transports", async () => {
  const port = await freePort(); // closed again: nothing listens there
  for (const url of [`http://127.0.0.1:${port}`, `grpc://127.0.0.1:${port}`]) {
    await assert.rejects(new Client(url).createSession(), (err) =>
      err instanceof ServerError && err.message.includes(`127.0.0.1:${port}`) && /cannot reach/.test(err.message));
  }
  // the HTTP port is not the gRPC port
  await assert.rejects(new Client(`grpc://${urls.http.replace(/^http:\/\//, "")}`).tokenize("a"), ServerError);
  assert.throws(() => new Client("ftp://127.0.0.1:1"), InvalidArgumentError);
});

test("grpc: a client's idle connection does not keep Node running; client.close() ends it", () => {
  const script = `
    import { Client } from ${JSON.stringify(new URL("../src/index.js", import.meta.url).href)};
    const client = new Client(${JSON.stringify(urls.grpc)});
    const ids = await client.tokenize("hello");
    console.log(ids.length > 0 ? "answered" : "no tokens");`;
  const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 30_000 });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(run.stdout.trim(), "answered"); // and it exited by itself, within the timeout
});

test("grpc: a client the machine stops running holds its generation; it cancels when it runs again", async () => {
  // what a loaded machine does to a client between two tokens, for longer than the whole generation
  // takes: the generation ran on to its end (250 tokens) while the HTTP/2 window was Node's 64 KiB
  const client = new Client(urls.grpc);
  const session = await client.createSession({ tokens: PROMPT.slice(0, 40) });
  const script = `
    import { Client } from ${JSON.stringify(new URL("../src/index.js", import.meta.url).href)};
    const session = new Client(${JSON.stringify(urls.grpc)}).session(${JSON.stringify(session.id)});
    let n = 0;
    for await (const _ of session.generate({ maxTokens: 250, grammar: "root ::= [a-z] root" })) {
      if (++n < 3) continue;
      console.log("read 3");
      process.kill(process.pid, "SIGSTOP");
      break; // (once continued) cancels
    }`;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  await new Promise((resolve) => child.stdout.once("data", resolve));
  let generated = -1; // until the server has generated nothing more for a second, or has finished
  for (let stable = 0; stable < 1000; stable += 100) {
    const info = await session.info();
    if (info.busy === null) break;
    if (info.stats.tokens_generated !== generated) [generated, stable] = [info.stats.tokens_generated, 0];
    await sleep(100);
  }
  const held = await session.info();
  child.kill("SIGCONT");
  assert.equal(await exited, 0);
  assert.equal(held.busy, "generating", `the generation did not wait for its reader: ${held.stats.tokens_generated} tokens`);
  assert.ok(held.stats.tokens_generated < 125, `${held.stats.tokens_generated} tokens for a reader that read 3`);
  const deadline = Date.now() + 10_000;
  while ((await session.info()).busy !== null) {
    assert.ok(Date.now() < deadline, "the generation did not stop after the cancel");
    await sleep(50);
  }
  await session.close();
  client.close();
});

test("grpc: a call on the connection after client.close() keeps Node running to its end", () => {
  // the first generation is still on the closed connection when the second opens a new one and the
  // first ends: the second's connection must keep Node running (it did not: a count of calls shared
  // by both connections never referenced the new one, and Node left in the middle of the call)
  const script = `
    import { Client } from ${JSON.stringify(new URL("../src/index.js", import.meta.url).href)};
    const client = new Client(${JSON.stringify(urls.grpc)});
    const session = await client.createSession({ tokens: ${JSON.stringify(PROMPT.slice(0, 40))} });
    const other = await client.createSession({ tokens: ${JSON.stringify(PROMPT.slice(0, 30))} });
    const first = session.generate({ maxTokens: 3 })[Symbol.asyncIterator]();
    await first.next();
    client.close();
    const second = (async () => {
      let n = 0;
      for await (const _ of other.generate({ maxTokens: 200, grammar: "root ::= [a-z] root" })) n++;
      return n;
    })();
    while (!(await first.next()).done);
    console.log(await second);`;
  const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 60_000 });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(run.stdout.trim(), "200");
});
