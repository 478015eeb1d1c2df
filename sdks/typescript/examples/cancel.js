// Cancelling a generation, by leaving the `for await` loop (break) and by an AbortSignal (a deadline):
// the server stops generating between two steps and the session stays usable; its history keeps the
// tokens generated until then.
//
//   pyllamaopt serve --model smollm2-135m
//   node sdks/typescript/examples/cancel.js
import { commandLine, detect, tokens } from "./chatformat.js";

const PROMPT = "Count from 1 to 1000, one number per line.";
const LONG = 1000; // tokens: more than the deadlines let through

const { client, values } = commandLine({
  "after-tokens": { type: "string", default: "20" }, // the loop is left here
  "after-ms": { type: "string", default: "1000" }, // the signal's deadline
});

const fmt = await detect(client);
const prompt = await tokens(client, [...fmt.opening(null), ...fmt.userTurn(PROMPT)], { bos: fmt.bos });
const nextTurn = await tokens(client, [...fmt.afterReply("interrupted"), ...fmt.userTurn("Go on.")]);
const session = await client.createSession({ tokens: prompt });
try {
  // leaving the loop (break, return, throw) cancels the request, and the server stops the generation
  const generation = session.generate({ maxTokens: LONG });
  for await (const token of generation) {
    process.stdout.write(token.text);
    if (generation.tokens.length === Number(values["after-tokens"])) break;
  }
  console.log(`\nbreak: ${generation.finishReason} after ${generation.tokens.length} tokens`);
  await session.append(nextTurn); // right after a cancel, "busy" is retried until the server has stopped
  const kept = (await session.info()).n_tokens - prompt.length - nextTurn.length;
  console.log(`break: appended the next turn; the history kept the ${kept} tokens generated before the stop ` +
    "(the server may have made one more than this client read)");

  // an AbortSignal: here a deadline; a UI's "stop" button would abort its own AbortController
  const timed = session.generate({ maxTokens: LONG, signal: AbortSignal.timeout(Number(values["after-ms"])) });
  let received = 0;
  for await (const _ of timed) received += 1; // eslint-disable-line no-unused-vars
  console.log(timed.finishReason === "interrupted"
    ? `signal: cancelled at the ${values["after-ms"]} ms deadline, ${received} tokens received`
    : `signal: the generation ended by itself (${timed.finishReason}) after ${received} tokens`);
  await session.append(nextTurn);
  console.log(`signal: appended the next turn; the session has ${(await session.info()).n_tokens} tokens`);

  console.log(`after: ${JSON.stringify(await session.generateText({ maxTokens: 16, stop: fmt.stop }))}`); // still usable
} finally {
  await session.close();
}
