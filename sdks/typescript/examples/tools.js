// A tool-calling loop on one session, the model's replies constrained by a JSON Schema (the grammar
// engine forces valid JSON: the loop never parses a malformed call).
//
//   pyllamaopt serve --model smollm2-135m
//   node sdks/typescript/examples/tools.js "What is the weather in Paris?"
//
// Each round the model replies with a call of one of the tools it has not called yet, or with its
// answer: the schema of the round says which (the list shrinks as tools are used, the last round allows
// only the answer, and with --tool-choice required the first one only a call). The application runs the call and appends the result as the next turn;
// the session keeps everything before it.
import { commandLine, detect, tokens } from "./chatformat.js";

/** @type {Record<string, { description: string, parameters: object, run: (args: any) => unknown }>} */
const TOOLS = {
  get_weather: {
    description: "The current weather in a city",
    parameters: {
      type: "object", properties: { city: { type: "string", maxLength: 40 } }, required: ["city"],
      additionalProperties: false,
    },
    run: ({ city }) => ({ city, sky: "sunny", celsius: 21 }),
  },
  add: {
    description: "The sum of two numbers",
    parameters: {
      type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"],
      additionalProperties: false,
    },
    run: ({ a, b }) => a + b,
  },
};
const ANSWER = {
  type: "object", properties: { answer: { type: "string", maxLength: 300 } }, required: ["answer"],
  additionalProperties: false,
};
const SYSTEM = "You can call these tools:\n" +
  Object.entries(TOOLS).map(([name, t]) => JSON.stringify({ name, description: t.description, parameters: t.parameters }))
    .join("\n") +
  '\nReply with JSON only: {"tool": NAME, "arguments": {...}} to call a tool, or {"answer": "..."} to answer ' +
  "the user. A tool's result comes back as {\"result\": ...}.";

/**
 * A call of one of `tools` (its arguments an instance of its parameters' schema), or an answer.
 * @param {string[]} tools
 * @param {boolean} answer
 */
function replySchema(tools, answer) {
  const calls = tools.map((name) => ({
    type: "object", properties: { tool: { const: name }, arguments: TOOLS[name].parameters },
    required: ["tool", "arguments"], additionalProperties: false,
  }));
  return { anyOf: answer ? [...calls, ANSWER] : calls };
}

const { client, values, positionals } = commandLine({
  "max-rounds": { type: "string", default: "4" },
  "tool-choice": { type: "string", default: "auto" }, // required: the first reply is a call
});
const question = positionals[0] || "What is the weather in Paris?";
const maxRounds = Number(values["max-rounds"]);

const fmt = await detect(client);
const prompt = [...fmt.opening(SYSTEM), ...fmt.userTurn(question, SYSTEM)];
const session = await client.createSession({ tokens: await tokens(client, prompt, { bos: fmt.bos }) });
try {
  const unused = Object.keys(TOOLS);
  let round = 1;
  for (; round <= maxRounds; round++) {
    const required = round === 1 && values["tool-choice"] === "required";
    const generation = session.generate({
      maxTokens: 256, jsonSchema: round < maxRounds ? replySchema(unused, !required) : ANSWER,
    });
    for await (const _ of generation); // eslint-disable-line no-unused-vars
    if (generation.finishReason === "length") { // a string or number the model kept writing
      console.log(`round ${round}: the reply did not end within 256 tokens: ${generation.text}`);
      break;
    }
    const reply = JSON.parse(generation.text);
    if ("answer" in reply) {
      console.log(`answer: ${reply.answer}`);
      break;
    }
    const result = TOOLS[reply.tool].run(reply.arguments);
    console.log(`round ${round}: ${reply.tool}(${JSON.stringify(reply.arguments)}) -> ${JSON.stringify(result)}`);
    unused.splice(unused.indexOf(reply.tool), 1);
    await session.append(await tokens(client, [
      ...fmt.afterReply(generation.finishReason), ...fmt.userTurn(JSON.stringify({ result })),
    ]));
  }
  console.log(`[session ${session.id}: ${(await session.info()).n_tokens} tokens, ${Math.min(round, maxRounds)} rounds]`);
} finally {
  await session.close();
}
