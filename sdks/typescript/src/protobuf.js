// The messages of proto/pyllamaopt/v1/runtime.proto and the protobuf wire format they need (proto3:
// varints, packed repeated scalars, length-delimited strings and messages, fixed32 floats, maps,
// explicit presence for `optional` and `oneof` fields). Written here because the npm registry is out
// of reach of this project's machines (no protobufjs, no generated code); tests/test_grpc.py checks
// these descriptions against the .proto's compiled descriptors and the bytes against Python's protobuf.

/**
 * @typedef {"int32" | "int64" | "bool" | "string" | "float"} ScalarType
 * @typedef {"map<string,int64>" | "map<int32,float>"} MapType  a map's keys and values (a JS object's keys are strings)
 * @typedef {ScalarType | MapType | MessageType} FieldType
 * @typedef {{ no: number, name: string, type: FieldType, repeated?: boolean, optional?: boolean }} Field
 *   optional: the field has presence (proto3 `optional`, or a member of a `oneof`): sent when set, even to 0
 * @typedef {{ name: string, fields: Field[] }} MessageType
 */

/** @param {string} name @param {Field[]} fields @returns {MessageType} */
const message = (name, fields) => ({ name, fields });

const tokensOnly = (/** @type {string} */ name) => message(name, [{ no: 1, name: "tokens", type: "int32", repeated: true }]);
const sessionId = (/** @type {string} */ name) => message(name, [{ no: 1, name: "session_id", type: "string" }]);
const sessionTokens = (/** @type {string} */ name) => message(name, [
  { no: 1, name: "session_id", type: "string" },
  { no: 2, name: "tokens", type: "int32", repeated: true },
]);

const Usage = message("Usage", [
  { no: 1, name: "prompt_tokens", type: "int32" },
  { no: 2, name: "completion_tokens", type: "int32" },
  { no: 3, name: "cached_tokens", type: "int32" },
  { no: 4, name: "computed_tokens", type: "int32" },
  { no: 5, name: "restored_tokens", type: "int32" },
  { no: 6, name: "drafted_tokens", type: "int32" },
  { no: 7, name: "grammar_forced_tokens", type: "int32" },
  { no: 8, name: "approximate", type: "bool" },
]);
const Token = message("Token", [
  { no: 1, name: "id", type: "int32" },
  { no: 2, name: "text", type: "string" },
]);
const Done = message("Done", [
  { no: 1, name: "finish_reason", type: "string" },
  { no: 2, name: "usage", type: Usage },
  { no: 3, name: "stop_string", type: "string", optional: true },
]);

/** @type {Record<string, MessageType>} */
export const MESSAGES = Object.fromEntries([
  tokensOnly("CreateSessionRequest"),
  sessionId("CreateSessionResponse"),
  sessionTokens("AppendTokensRequest"),
  sessionTokens("SyncRequest"),
  sessionId("ForkRequest"),
  sessionId("ForkResponse"),
  sessionId("GetSessionInfoRequest"),
  sessionId("CloseSessionRequest"),
  message("CloseSessionResponse", []),
  message("TokenizeRequest", [
    { no: 1, name: "text", type: "string" },
    { no: 2, name: "add_bos", type: "bool" },
    { no: 3, name: "special", type: "bool" },
  ]),
  tokensOnly("TokenizeResponse"),
  message("SessionInfo", [
    { no: 1, name: "session_id", type: "string" },
    { no: 2, name: "n_tokens", type: "int32" },
    { no: 3, name: "tokens", type: "int32", repeated: true },
    { no: 4, name: "kv_bytes", type: "int64" },
    { no: 5, name: "approx_from", type: "int32", optional: true },
    { no: 6, name: "generating", type: "bool" },
    { no: 7, name: "busy", type: "string" },
    { no: 8, name: "stats", type: "map<string,int64>" },
  ]),
  message("GenerateRequest", [
    { no: 1, name: "session_id", type: "string" },
    { no: 2, name: "max_tokens", type: "int32", optional: true },
    { no: 3, name: "temperature", type: "float", optional: true },
    { no: 4, name: "top_p", type: "float", optional: true },
    { no: 5, name: "top_k", type: "int32", optional: true },
    { no: 6, name: "min_p", type: "float", optional: true },
    { no: 7, name: "seed", type: "int64", optional: true },
    { no: 8, name: "stop", type: "string", repeated: true },
    { no: 9, name: "grammar", type: "string", optional: true },      // oneof constraint
    { no: 10, name: "json_schema", type: "string", optional: true }, // oneof constraint
    { no: 11, name: "logit_bias", type: "map<int32,float>" },
    { no: 12, name: "frequency_penalty", type: "float", optional: true },
    { no: 13, name: "presence_penalty", type: "float", optional: true },
    { no: 14, name: "repeat_penalty", type: "float", optional: true },
    { no: 15, name: "repeat_last_n", type: "int32", optional: true },
  ]),
  Token,
  Usage,
  Done,
  message("GenerateResponse", [
    { no: 1, name: "token", type: Token, optional: true }, // oneof event
    { no: 2, name: "done", type: Done, optional: true },   // oneof event
  ]),
].map((m) => [m.name, m]));

/** @param {FieldType} type @returns {type is MapType} */
const isMap = (type) => typeof type === "string" && type.startsWith("map<");

/**
 * A map is a repeated message of these: its key and its value, both always sent (as protobuf writes
 * a map's entries: a 0 too), so optional here.
 * @param {MapType} type
 * @returns {MessageType}
 */
function mapEntry(type) {
  const [key, value] = /** @type {ScalarType[]} */ (type.slice(4, -1).split(","));
  return message("map entry", [{ no: 1, name: "key", type: key, optional: true },
    { no: 2, name: "value", type: value, optional: true }]);
}

const VARINT = 0, FIXED64 = 1, BYTES = 2, FIXED32 = 5;
const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }); // (a leading U+FEFF is text)

class Writer {
  constructor() {
    /** @type {number[]} */
    this.bytes = [];
  }

  /** @param {bigint | number} value  a varint of the value's 64-bit two's complement */
  varint(value) {
    let v = BigInt.asUintN(64, BigInt(value));
    while (v >= 0x80n) {
      this.bytes.push(Number(v & 0x7fn) | 0x80);
      v >>= 7n;
    }
    this.bytes.push(Number(v));
  }

  /** @param {number} no @param {number} wireType */
  tag(no, wireType) {
    this.varint((no << 3) | wireType);
  }

  /** @param {Uint8Array | number[]} bytes */
  lengthDelimited(bytes) {
    this.varint(bytes.length);
    for (const b of bytes) this.bytes.push(b);
  }
}

/**
 * One value of a scalar type, as its wire type's payload.
 * @param {Writer} w @param {FieldType} type @param {any} value
 */
function writeScalar(w, type, value) {
  switch (type) {
    case "int32":
    case "int64": {
      const bits = type === "int32" ? 32 : 64;
      if (!(Number.isSafeInteger(value) || typeof value === "bigint") ||
          BigInt.asIntN(bits, BigInt(value)) !== BigInt(value)) {
        throw new RangeError(`${value} is not an ${type}`);
      }
      w.varint(value);
      break;
    }
    case "bool":
      w.varint(value ? 1 : 0);
      break;
    case "float": {
      const bytes = new Uint8Array(4);
      new DataView(bytes.buffer).setFloat32(0, value, true);
      for (const b of bytes) w.bytes.push(b);
      break;
    }
    default:
      throw new TypeError(`not a scalar type: ${type}`);
  }
}

/** @param {FieldType} type */
const wireTypeOf = (type) =>
  type === "float" ? FIXED32 : type === "string" || isMap(type) || typeof type === "object" ? BYTES : VARINT;

/** @param {FieldType} type @param {any} value */
const isDefault = (type, value) =>
  value === undefined || value === null || value === 0 || value === 0n || value === false || value === "" ||
  (Array.isArray(value) && value.length === 0) || (isMap(type) && Object.keys(value).length === 0);

/**
 * The message's bytes; its fields by their .proto names (absent, null or undefined: not sent).
 * @param {MessageType} type
 * @param {Record<string, any>} value
 * @returns {Uint8Array}
 */
export function encode(type, value) {
  const w = new Writer();
  for (const field of type.fields) {
    const v = value[field.name];
    if (field.optional ? v === undefined || v === null : isDefault(field.type, v)) continue;
    if (isMap(field.type)) {
      const entry = mapEntry(field.type);
      for (const [key, n] of Object.entries(v)) {
        w.tag(field.no, BYTES);
        w.lengthDelimited(encode(entry, { key: entry.fields[0].type === "string" ? key : Number(key), value: n }));
      }
    } else if (field.repeated && wireTypeOf(field.type) !== BYTES) { // packed
      const packed = new Writer();
      for (const item of v) writeScalar(packed, field.type, item);
      w.tag(field.no, BYTES);
      w.lengthDelimited(packed.bytes);
    } else {
      for (const item of field.repeated ? v : [v]) {
        w.tag(field.no, wireTypeOf(field.type));
        if (field.type === "string") w.lengthDelimited(utf8.encode(item));
        else if (typeof field.type === "object") w.lengthDelimited(encode(field.type, item));
        else writeScalar(w, field.type, item);
      }
    }
  }
  return Uint8Array.from(w.bytes);
}

class Reader {
  /** @param {Uint8Array} bytes */
  constructor(bytes) {
    this.bytes = bytes;
    this.at = 0;
  }

  done() {
    return this.at >= this.bytes.length;
  }

  /** @returns {bigint} */
  varint() {
    let value = 0n;
    for (let shift = 0n; ; shift += 7n) {
      if (this.at >= this.bytes.length || shift > 63n) throw new RangeError("a truncated or overlong varint");
      const b = this.bytes[this.at++];
      value |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return BigInt.asUintN(64, value);
    }
  }

  /** @param {number} n */
  take(n) {
    if (this.at + n > this.bytes.length) throw new RangeError("a truncated message");
    const out = this.bytes.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }

  /** @param {number} wireType */
  skip(wireType) {
    if (wireType === VARINT) this.varint();
    else if (wireType === FIXED64) this.take(8);
    else if (wireType === BYTES) this.take(Number(this.varint()));
    else if (wireType === FIXED32) this.take(4);
    else throw new RangeError(`unknown wire type ${wireType}`);
  }
}

/**
 * One value of a scalar type from its payload (int64 as a Number: the counters it carries stay far
 * below 2**53).
 * @param {Reader} r @param {FieldType} type
 */
function readScalar(r, type) {
  switch (type) {
    case "int32":
      return Number(BigInt.asIntN(32, r.varint()));
    case "int64":
      return Number(BigInt.asIntN(64, r.varint()));
    case "bool":
      return r.varint() !== 0n;
    case "float": {
      const b = r.take(4);
      return new DataView(b.buffer, b.byteOffset, 4).getFloat32(0, true);
    }
    default:
      throw new TypeError(`not a scalar type: ${type}`);
  }
}

/** @param {FieldType} type */
function defaultOf(type) {
  if (type === "string") return "";
  if (type === "bool") return false;
  if (isMap(type)) return {};
  return typeof type === "object" ? null : 0;
}

/**
 * The message of these bytes: every field by its .proto name (unset: its default, or null for a field
 * with presence or a message); unknown fields skipped.
 * @param {MessageType} type
 * @param {Uint8Array} bytes
 * @returns {Record<string, any>}
 */
export function decode(type, bytes) {
  /** @type {Record<string, any>} */
  const out = {};
  for (const field of type.fields) {
    out[field.name] = field.repeated ? [] : field.optional ? null : defaultOf(field.type);
  }
  const r = new Reader(bytes);
  while (!r.done()) {
    const tag = Number(r.varint());
    const no = tag >>> 3, wireType = tag & 7;
    const field = type.fields.find((f) => f.no === no);
    if (!field) {
      r.skip(wireType);
      continue;
    }
    const packed = field.repeated && wireTypeOf(field.type) !== BYTES && wireType === BYTES;
    if (!packed && wireType !== wireTypeOf(field.type)) {
      throw new RangeError(`field ${field.name} of ${type.name} came with wire type ${wireType}`);
    }
    if (isMap(field.type)) {
      const entryType = mapEntry(field.type);
      const entry = decode(entryType, r.take(Number(r.varint())));
      const [key, value] = entryType.fields.map((f) => entry[f.name] ?? defaultOf(f.type)); // (absent: the default)
      out[field.name][key] = value;
    } else if (field.type === "string") {
      const text = fromUtf8.decode(r.take(Number(r.varint())));
      if (field.repeated) out[field.name].push(text);
      else out[field.name] = text;
    } else if (typeof field.type === "object") {
      out[field.name] = decode(field.type, r.take(Number(r.varint())));
    } else if (packed) {
      const items = new Reader(r.take(Number(r.varint())));
      while (!items.done()) out[field.name].push(readScalar(items, field.type));
    } else {
      const value = readScalar(r, field.type);
      if (field.repeated) out[field.name].push(value);
      else out[field.name] = value;
    }
  }
  return out;
}
