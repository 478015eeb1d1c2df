// The errors of the client: the pyllamaopt exception classes of the Python package (errors.py), by
// the name the server sends (HTTP: error.pyllamaopt_error; gRPC: the trailer "pyllamaopt-error"),
// else by HTTP status or gRPC status code.

/** Base class of every error of this client. */
export class PyllamaoptError extends Error {
  /**
   * @param {string} message
   * @param {number | null} status  the HTTP status (null: no answer, or over gRPC)
   * @param {string | null} type  the server's error type over HTTP ("not_found_error", ...)
   * @param {string | null} grpcCode  the gRPC status over gRPC ("NOT_FOUND", ...)
   */
  constructor(message, status = null, type = null, grpcCode = null) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.type = type;
    this.grpcCode = grpcCode;
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
/** @type {Record<string, typeof PyllamaoptError>} */
const BY_GRPC_CODE = {
  INVALID_ARGUMENT: InvalidArgumentError, UNAUTHENTICATED: AuthenticationError, NOT_FOUND: SessionClosedError,
  ABORTED: SessionBusyError, FAILED_PRECONDITION: InvariantViolationError, RESOURCE_EXHAUSTED: ServerOverloadedError,
};

/** @param {unknown} name  a class name a server sent @returns {typeof PyllamaoptError | null} */
const byName = (name) => (typeof name === "string" && Object.hasOwn(BY_NAME, name) ? BY_NAME[name] : null);

/**
 * The error of an HTTP answer.
 * @param {number} status
 * @param {any} body  its JSON, if it was
 * @returns {PyllamaoptError}
 */
export function httpError(status, body) {
  const error = (body && body.error) || {};
  const cls = byName(error.pyllamaopt_error) || BY_STATUS[status] || ServerError;
  return new cls(error.message || `HTTP ${status}`, status, error.type || null);
}

/**
 * The error of a gRPC status.
 * @param {string} code  its name ("NOT_FOUND")
 * @param {string} message
 * @param {string | undefined} name  the trailer "pyllamaopt-error"
 * @returns {PyllamaoptError}
 */
export function grpcError(code, message, name) {
  const cls = byName(name) || (Object.hasOwn(BY_GRPC_CODE, code) ? BY_GRPC_CODE[code] : null) || ServerError;
  return new cls(message || `gRPC status ${code}`, null, null, code);
}
