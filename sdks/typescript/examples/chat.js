// A multi-turn chat that keeps one session: each turn appends only its new tokens, and the server
// computes only those (the previous turns' KV stays in the session).
//
//   pyllamaopt serve --model smollm2-135m                     # a model with a chat format
//   node sdks/typescript/examples/chat.js "What is the capital of France?" "And of Italy?"
//   node sdks/typescript/examples/chat.js                     # type the messages; an empty line ends
//
// An https:// --url (a server with --tls-cert) works as is; trust a self-signed certificate with
// NODE_EXTRA_CA_CERTS=cert.pem.
import { createInterface } from "node:readline";

import { commandLine, detect, tokens } from "./chatformat.js";

const { client, values, positionals } = commandLine({
  // long enough (more than one 64-token block) that the turns after the first show the reuse
  system: {
    type: "string",
    default: "You are a helpful assistant for travellers. Answer in one short sentence, with facts only: no " +
      "greetings, no questions back, no lists. If you do not know, say so in a few words. Names of places " +
      "are written in English. Numbers are written as digits. Keep the tone friendly and plain.",
  },
  "max-tokens": { type: "string", default: "96" },
});
const system = String(values.system);

/** @returns {AsyncGenerator<string>} */
async function* messages() {
  yield* positionals;
  if (positionals.length > 0) return;
  const terminal = createInterface({ input: process.stdin, output: process.stdout, prompt: "> " });
  terminal.prompt();
  for await (const line of terminal) { // lines typed (or piped) during a reply wait their turn
    if (!line.trim()) break;
    yield line.trim();
    terminal.prompt();
  }
  terminal.close();
}

const fmt = await detect(client);
console.log(`[chat format: ${fmt.name}]`);
const session = await client.createSession({ tokens: await tokens(client, fmt.opening(system), { bos: fmt.bos }) });
try {
  /** @type {string | null} */
  let finishReason = null;
  let computed = (await session.info()).stats.tokens_prefilled;
  let turn = 0;
  for await (const text of messages()) {
    turn += 1;
    const appended = [
      ...(turn > 1 ? await tokens(client, fmt.afterReply(finishReason)) : []),
      ...(await tokens(client, fmt.userTurn(text, turn === 1 ? system : null))),
    ];
    await session.append(appended);
    const generation = session.generate({ maxTokens: Number(values["max-tokens"]), stop: fmt.stop });
    for await (const token of generation) process.stdout.write(token.text);
    finishReason = generation.finishReason;
    const info = await session.info();
    console.log(`\n[turn ${turn}: ${appended.length} tokens appended, ${generation.tokens.length} generated ` +
      `(${finishReason}); history ${info.n_tokens} tokens, ${info.stats.tokens_prefilled - computed} computed this turn]`);
    computed = info.stats.tokens_prefilled;
  }
  console.log(`[session ${session.id}: ${(await session.info()).n_tokens} tokens]`);
} finally {
  await session.close();
}
